"""Synthesized audio as a typed value."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Audio:
    """Mono float32 samples in [-1, 1] at ``sample_rate`` Hz."""

    samples: np.ndarray
    sample_rate: int

    @property
    def duration(self) -> float:
        """Length in seconds."""
        return len(self.samples) / self.sample_rate

    def write(self, path: str | Path, format: str | None = None) -> Path:
        """Write a WAV or FLAC file (format from the suffix unless given); returns the path."""
        import soundfile

        path = Path(path)
        fmt = (format or path.suffix.lstrip(".") or "wav").upper()
        if fmt not in ("WAV", "FLAC"):
            raise ValueError(f"unsupported audio format {fmt!r}; use .wav or .flac")
        subtype = "PCM_16"
        soundfile.write(str(path), self.samples, self.sample_rate, format=fmt, subtype=subtype)
        return path


@dataclass(frozen=True)
class AudioChunk:
    """One piece of a streamed text: its audio and what it says (usable as a caption)."""

    samples: np.ndarray
    sample_rate: int
    text: str
    index: int

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate


def join_chunks(chunks: list[AudioChunk], sample_rate: int) -> Audio:
    """One Audio from a stream's chunks, in order."""
    samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    return Audio(samples, sample_rate)
