"""Long text to ordered audio chunks: planning the chunks and finishing their audio."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import InvalidInputError
from .text import normalize, split_text
from .text.split import Chunk

DEFAULT_MAX_CHARACTERS = 100_000


@dataclass(frozen=True)
class StreamSettings:
    """``parameters`` of the tts_stream model."""

    max_characters: int = DEFAULT_MAX_CHARACTERS
    max_in_flight: int = 3  # chunks of one stream queued at once: long texts can't flood queues
    chunk_target_ids: int = 300  # pack short sentences up to this many phoneme ids
    first_chunk_ids: int = 120  # a short first chunk so the first audio comes fast
    sentence_silence_ms: float = 200.0
    fade_ms: float = 3.0  # raised-cosine fade at chunk edges: joins without clicks

    def __post_init__(self) -> None:
        if self.max_characters < 1 or self.max_in_flight < 1:
            raise ValueError("max_characters and max_in_flight must be >= 1")
        if self.first_chunk_ids < 10 or self.chunk_target_ids < self.first_chunk_ids:
            raise ValueError("need 10 <= first_chunk_ids <= chunk_target_ids")
        if self.sentence_silence_ms < 0 or self.fade_ms < 0:
            raise ValueError("sentence_silence_ms and fade_ms must be >= 0")


def plan_chunks(
    text: str, settings: StreamSettings, max_ids: int, count_ids: Callable[[str], int]
) -> list[Chunk]:
    """Normalize and split ``text`` so every chunk fits the phonemizer's limit.

    Packing uses a cheap estimate; each chunk is then checked with the real phoneme count and
    split further (clauses, then words) where the estimate was optimistic.
    """
    if len(text) > settings.max_characters:
        raise InvalidInputError(
            f"text is {len(text)} characters; the limit is {settings.max_characters}: "
            "send it in several requests"
        )
    spoken = normalize(text)
    if not spoken:
        raise InvalidInputError("text has nothing speakable after normalization")
    target = min(settings.chunk_target_ids, max_ids)
    chunks = split_text(spoken, max_ids, target_len=target, first_len=settings.first_chunk_ids)
    checked: list[Chunk] = []
    for chunk in chunks:
        if count_ids(chunk.text) <= max_ids:
            checked.append(chunk)
            continue
        pieces = split_text(chunk.text, max_ids, measure=count_ids)
        checked.extend(Chunk(p.text, p.sentence_end and chunk.sentence_end) for p in pieces)
    return checked


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
