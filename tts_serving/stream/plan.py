"""Long text to ordered audio chunks: lazy chunk planning and finishing each chunk's audio.

The plan is a generator: the text is normalized and split a block at a time and each chunk is
phonemized when the scheduler asks for it, so the first chunk leaves before the rest of a
100,000-character text has been looked at, and no single step blocks the event loop for long.
Each chunk carries its phoneme ids, so the text is phonemized once on its way to ``acoustic``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tts_serving.text.phonemize import Phonemizer

from ..errors import InvalidInputError, PhonemizerCrashError
from ..settings import StreamSettings
from ..text import normalize as normalize_english, split_text
from ..text.split import Chunk

# Raw text is normalized in blocks of about this many characters, cut at whitespace.
BLOCK_CHARACTERS = 2000


@dataclass(frozen=True)
class PlannedChunk:
    """One piece of a stream: its (normalized) text, phoneme ids and place in the text."""

    index: int
    text: str
    ids: list[int]
    sentence_end: bool  # a sentence (or the text) ends here: a pause follows unless last


def text_blocks(text: str, size: int = BLOCK_CHARACTERS) -> Iterator[str]:
    """``text`` in consecutive blocks of about ``size`` characters, cut after a sentence end
    where one is near the cut, else at whitespace; never inside a word."""
    start = 0
    n = len(text)
    while start < n:
        end = start + size
        if end >= n:
            yield text[start:]
            return
        # Prefer the last sentence end in the second half of the block, then any space.
        cut = max(text.rfind(p, start + size // 2, end) for p in (". ", "? ", "! "))
        cut = cut + 1 if cut > start else text.rfind(" ", start, end)
        if cut <= start:  # one enormous word: cut at the next whitespace after it
            nxt = text.find(" ", end)
            cut = n if nxt < 0 else nxt
        yield text[start:cut]
        start = cut


def plan_chunks(
    text: str, settings: StreamSettings, phonemizer: Phonemizer, normalize: bool
) -> Iterator[PlannedChunk]:
    """Chunks of ``text`` in order, each within ``settings.max_phoneme_ids`` phoneme ids.

    Packing uses a cheap estimate; each chunk is then phonemized for real and split further
    (clauses, then words) where the estimate was optimistic. Chunks with nothing speakable
    (a lone symbol) are skipped; a text with nothing speakable at all is an InvalidInputError.
    """
    if len(text) > settings.max_characters:
        raise InvalidInputError(
            f"text is {len(text)} characters; the limit is {settings.max_characters}: "
            "send it in several requests"
        )
    max_ids = settings.max_phoneme_ids
    index = 0
    for block_number, block in enumerate(text_blocks(text)):
        spoken = normalize_english(block) if normalize else " ".join(block.split())
        if not spoken:
            continue
        first = settings.first_chunk_ids if index == 0 and block_number == 0 else None
        for chunk in split_text(spoken, max_ids, target_len=settings.chunk_target_ids,
                                first_len=first):  # fmt: skip
            for piece, ids in _fit(chunk, max_ids, phonemizer):
                yield PlannedChunk(index, piece.text, ids, piece.sentence_end)
                index += 1
    if index == 0:
        raise InvalidInputError("text has nothing speakable after normalization")


def _ids(phonemizer: Phonemizer, text: str) -> list[int]:
    """The phoneme ids of ``text``; empty when it has nothing speakable (a lone symbol). A text
    that crashes espeak-ng is an error, never a silently skipped chunk."""
    try:
        return phonemizer.ids(text)
    except PhonemizerCrashError:
        raise
    except InvalidInputError:
        return []


def _fit(chunk: Chunk, max_ids: int, phonemizer: Phonemizer) -> Iterator[tuple[Chunk, list[int]]]:
    """``chunk`` with its ids, phonemized once; where the real count passes ``max_ids``, its
    pieces (clauses, then words) with theirs. Pieces with nothing speakable are left out."""
    ids = _ids(phonemizer, chunk.text)
    if len(ids) <= max_ids:
        if ids:
            yield chunk, ids
        return
    try:
        pieces = split_text(chunk.text, max_ids, measure=lambda t: len(_ids(phonemizer, t)))
    except ValueError as e:  # one word longer than a whole request
        raise InvalidInputError(str(e)) from None
    for piece in pieces:
        ids = _ids(phonemizer, piece.text)
        if ids:
            yield Chunk(piece.text, piece.sentence_end and chunk.sentence_end), ids


def finish_chunk(
    audio: np.ndarray, sample_rate: int, settings: StreamSettings, pause_after: bool
) -> np.ndarray:
    """Fade the chunk's edges and append the pause that follows a sentence."""
    audio = np.asarray(audio, dtype=np.float32).copy()
    n = min(int(sample_rate * settings.fade_ms / 1000), len(audio) // 2)
    if n > 0:
        ramp = (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, n, dtype=np.float32))).astype(np.float32)
        audio[:n] *= ramp
        audio[-n:] *= ramp[::-1]
    if pause_after:
        silence = np.zeros(int(sample_rate * settings.sentence_silence_ms / 1000), np.float32)
        audio = np.concatenate([audio, silence])
    return audio
