"""Split long text into chunks for synthesis: sentences, then clauses, then words.

Shared by the server (tts_stream plans its chunks with it) and the client (a speech session
finds where buffered text may be spoken with the same sentence and clause marks).

Every chunk measures at most ``max_len`` (in the units of ``measure``, e.g. phoneme ids);
consecutive short sentences are packed together up to ``target_len`` so no chunk is needlessly
tiny, the first chunk only up to ``first_len``. A sentence is cut only where it is longer than
``max_len``: never for an early first audio (the server decodes a chunk's first audio early
instead, tts_serving/stream/windows.py), since a sentence spoken in pieces is heard as two.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
CLAUSE_END = re.compile(r"(?<=[,;:\u2014\u2013])\s+|\s+(?=[\u2014\u2013]\s)|\s+-\s+")
# Inline phonemes, Piper's ``[[ ... ]]``: text is never cut inside a block (the server refuses
# half of one).
PHONEMES_OPEN, PHONEMES_CLOSE = "[[", "]]"


def inside_phonemes(text: str, cut: int, start: int = 0) -> bool:
    """Whether ``cut`` falls inside a ``[[ ]]`` block that opened after ``start``."""
    return text.rfind(PHONEMES_OPEN, start, cut) > text.rfind(PHONEMES_CLOSE, start, cut)


class PhonemeBlocks:
    """``inside_phonemes(text, cut, start)`` for cuts asked in increasing order, reading each
    character once: a scan over every boundary of a long text stays linear in it."""

    def __init__(self, text: str, start: int = 0) -> None:
        self.text, self.start, self.seen = text, start, start
        self.opened = self.closed = -1  # the last ``[[`` and ``]]`` before ``seen``

    def inside(self, cut: int) -> bool:
        if cut < self.seen:
            raise ValueError(f"cuts must not go back: {cut} after {self.seen}")
        low = max(self.start, self.seen - 1)  # a mark may straddle the last cut
        opened = self.text.rfind(PHONEMES_OPEN, low, cut)
        closed = self.text.rfind(PHONEMES_CLOSE, low, cut)
        self.opened = opened if opened >= 0 else self.opened
        self.closed = closed if closed >= 0 else self.closed
        self.seen = cut
        return self.opened > self.closed


def cut_outside_phonemes(text: str, start: int, cut: int) -> int | None:
    """``cut``; or, inside a block, the block's start, or just past its end when it opens at
    ``start``; None when that block is not closed yet."""
    if not inside_phonemes(text, cut, start):
        return cut
    opened = text.rfind(PHONEMES_OPEN, start, cut)
    if opened > start:
        return opened
    closed = text.find(PHONEMES_CLOSE, cut)
    return None if closed < 0 else closed + len(PHONEMES_CLOSE)


@dataclass(frozen=True)
class Chunk:
    text: str
    sentence_end: bool  # True when a sentence (or the text) ends with this chunk


def estimate_ids(text: str) -> int:
    """A rough phoneme-id count for English (about 2.3 per character, plus BOS/EOS)."""
    return int(len(text) * 2.3) + 2


def _pack(parts: list[str], limit: int, measure: Callable[[str], int]) -> list[str]:
    """Greedily join consecutive parts with spaces while the joined text fits ``limit``."""
    out: list[str] = []
    for part in parts:
        if out and measure(out[-1] + " " + part) <= limit:
            out[-1] = out[-1] + " " + part
        else:
            out.append(part)
    return out


def _split_long(sentence: str, max_len: int, measure: Callable[[str], int]) -> list[str]:
    """Clauses first, then words, so each piece fits ``max_len``."""
    if measure(sentence) <= max_len:
        return [sentence]
    pieces: list[str] = []
    for clause in _pack(CLAUSE_END.split(sentence), max_len, measure):
        if measure(clause) <= max_len:
            pieces.append(clause)
            continue
        words = []
        for word in clause.split():
            words.extend(_split_word(word, max_len, measure) if measure(word) > max_len else [word])
        pieces.extend(_pack(words, max_len, measure))
    return pieces


def _split_word(word: str, max_len: int, measure: Callable[[str], int]) -> list[str]:
    """A "word" longer than a chunk (a run of dotted letters, a long code): cut it into pieces
    that fit, after a '.', '-' or '/' where one is near the cut. A few ``measure`` calls per
    piece (cuts are proportional), so the cost stays linear in the word."""
    pieces: list[str] = []
    rest = word
    while rest:
        size = measure(rest)
        if size <= max_len:
            pieces.append(rest)
            break
        cut = max(1, int(len(rest) * max_len / size * 0.9))
        while cut > 1 and measure(rest[:cut]) > max_len:
            cut = max(1, int(cut * 0.8))
        mark = max(rest.rfind(c, 0, cut) for c in ".-/")
        if mark >= cut // 2:
            cut = mark + 1
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return pieces


def split_text(
    text: str,
    max_len: int,
    measure: Callable[[str], int] = estimate_ids,
    target_len: int | None = None,
    first_len: int | None = None,
) -> list[Chunk]:
    """Chunks of ``text`` in order, each with ``measure(chunk) <= max_len``."""
    target_len = min(target_len or max_len, max_len)
    chunks: list[Chunk] = []
    for sentence in (s.strip() for s in SENTENCE_END.split(text)):
        if not sentence:
            continue
        pieces = _split_long(sentence, max_len, measure)
        for i, piece in enumerate(pieces):
            chunks.append(Chunk(piece, sentence_end=i == len(pieces) - 1))
    if not chunks:
        return []
    # Pack whole short sentences together up to target_len (the first chunk up to first_len).
    packed: list[Chunk] = [chunks[0]]
    for chunk in chunks[1:]:
        last = packed[-1]
        limit = first_len if len(packed) == 1 and first_len else target_len
        joined = last.text + " " + chunk.text
        if last.sentence_end and chunk.sentence_end and measure(joined) <= limit:
            packed[-1] = Chunk(joined, True)
        else:
            packed.append(chunk)
    return packed
