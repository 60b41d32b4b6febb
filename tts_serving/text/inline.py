"""Inline phonemes: Piper's ``[[ phonemes ]]`` in plain text, to fix one word's pronunciation.

``Say [[ wˈɪn ]] twice`` speaks the IPA between the brackets as it is (the voice's own phoneme
symbols, as espeak-ng writes them; spaces separate words). Before this module Piper read the
blocks by accident: the normalizer rewrote their content ("[[ 3 ]]" became "three"), the
espeak-ng shaping could strip the brackets, and a symbol the voice lacks was dropped in silence.
Now a block is checked against the voice's ``phoneme_id_map`` (an unknown symbol is an error
naming it), kept out of normalization, and phonemized without espeak-ng; each of its words is
one word for the word timestamps, spanning its characters in the text as sent.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tts_wire.split import PHONEMES_CLOSE, PHONEMES_OPEN, cut_outside_phonemes

from ..errors import InvalidInputError

OPEN, CLOSE = PHONEMES_OPEN, PHONEMES_CLOSE
_BLOCK = re.compile(r"\[\[(.*?)\]\]", re.S)


@dataclass(frozen=True)
class InlineSpan:
    """A stretch of text, or the content of one ``[[ ]]`` block (``phonemes``)."""

    text: str
    phonemes: bool


def pieces(text: str) -> list[InlineSpan]:
    """``text`` as text pieces and phoneme blocks in order; InvalidInputError for a bracket
    without its pair or an empty block (a typo would otherwise be read out as text)."""
    out: list[InlineSpan] = []
    at = 0
    for m in _BLOCK.finditer(text):
        _plain(text, at, m.start(), out)
        if not m.group(1).strip():
            raise InvalidInputError(f"empty [[ ]] at character {m.start()}: put phonemes in it")
        out.append(InlineSpan(m.group(1), True))
        at = m.end()
    _plain(text, at, len(text), out)
    return out


def _plain(text: str, start: int, end: int, out: list[InlineSpan]) -> None:
    stretch = text[start:end]
    for mark, what in ((OPEN, "[[ without ]]"), (CLOSE, "]] without [[")):
        if mark in stretch:
            raise InvalidInputError(
                f"{what} at character {start + stretch.index(mark)}: inline phonemes are "
                "written [[ phonemes ]]"
            )
    if stretch:
        out.append(InlineSpan(stretch, False))


def has_blocks(text: str) -> bool:
    return OPEN in text or CLOSE in text


def check(text: str, id_map: Mapping[str, object]) -> None:
    """Every symbol of every block is one of the voice's phonemes, or InvalidInputError
    naming those that are not."""
    if not has_blocks(text):
        return
    for piece in pieces(text):
        if not piece.phonemes:
            continue
        unknown = sorted({c for c in piece.text if not c.isspace() and c not in id_map})
        if unknown:
            names = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown)
            raise InvalidInputError(
                f"unknown phoneme {names} in [[{piece.text}]]: this voice speaks only the "
                "symbols of its phoneme_id_map (IPA as espeak-ng writes it)"
            )


def outside_blocks(text: str, rewrite: Callable[[str], str] | None = None) -> str:
    """``text`` with ``rewrite`` (the normalizer) applied to its text pieces only and each
    block written as one ``[[word]]`` token per word, so the words of a block stay whole
    through sentence splitting, espeak-ng's shaping and the word alignment."""
    if not has_blocks(text):
        return rewrite(text) if rewrite else text
    out = ""
    for piece in pieces(text):
        if piece.phonemes:
            part = " ".join(f"{OPEN}{w}{CLOSE}" for w in piece.text.split())
        else:
            part = (rewrite(piece.text) if rewrite else piece.text).strip()
            if out.endswith(CLOSE) and part and is_mark(piece.text[0]):
                out += part  # "[[x]], y": the mark stays on the block's word, as on a word's
                continue
        if part:
            out = f"{out} {part}" if out else part
    return out


def is_mark(c: str) -> bool:
    return unicodedata.category(c).startswith("P")


def phoneme_words(block: str) -> list[list[str]]:
    """A block's words as phoneme lists (one symbol each, as Piper reads a block)."""
    return [list(word) for word in block.split()]


def safe_cut(text: str, start: int, cut: int) -> int:
    """``cut`` (an index in ``text``), moved back before a block it would split, or past the
    block when it opens at ``start`` (the text's end when it never closes)."""
    moved = cut_outside_phonemes(text, start, cut)
    return len(text) if moved is None else moved
