"""Synthesized audio as a typed value."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Word:
    """One word of the text sent, and when it is spoken (seconds from the audio's start).

    ``text`` is ``sent[char_start:char_end]``: a token the server rewrote before speaking it
    ("$5.50") is one word timed over everything said for it ("five dollars and fifty cents").
    """

    text: str
    start: float
    end: float
    char_start: int
    char_end: int


@dataclass(frozen=True)
class Mark:
    """An SSML ``<mark name="...">`` of the text sent: when the audio reaches it (seconds from
    its start: where the word after it starts, or the end) and where its element starts."""

    name: str
    time: float
    char_start: int


def _timestamp(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, minutes, secs = ms // 3_600_000, ms // 60_000 % 60, ms // 1000 % 60
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms % 1000:03d}"


@dataclass(frozen=True)
class Audio:
    """Mono float32 samples in [-1, 1] at ``sample_rate`` Hz; ``words`` when they were asked
    for (``synthesize(text, word_timestamps=True)``)."""

    samples: np.ndarray
    sample_rate: int
    words: tuple[Word, ...] = field(default=(), compare=False)
    marks: tuple[Mark, ...] = field(default=(), compare=False)  # an SSML document's

    def to_srt(self, words_per_caption: int = 7) -> str:
        """SubRip captions, ``words_per_caption`` words each (needs ``words``)."""
        blocks = []
        for k, group in enumerate(self._captions(words_per_caption), 1):
            span = f"{_timestamp(group[0].start, ',')} --> {_timestamp(group[-1].end, ',')}"
            blocks.append(f"{k}\n{span}\n{' '.join(w.text for w in group)}\n")
        return "\n".join(blocks)

    def to_vtt(self, words_per_caption: int = 7) -> str:
        """WebVTT captions, ``words_per_caption`` words each (needs ``words``)."""
        blocks = ["WEBVTT\n"]
        for group in self._captions(words_per_caption):
            span = f"{_timestamp(group[0].start, '.')} --> {_timestamp(group[-1].end, '.')}"
            blocks.append(f"{span}\n{' '.join(w.text for w in group)}\n")
        return "\n".join(blocks)

    def _captions(self, size: int) -> list[tuple[Word, ...]]:
        if not self.words:
            raise ValueError("no word timings: synthesize(text, word_timestamps=True) gives them")
        if size < 1:
            raise ValueError("words_per_caption must be at least 1")
        return [self.words[k : k + size] for k in range(0, len(self.words), size)]

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
    """One piece of a streamed text: its audio and what it says (usable as a caption);
    ``words`` (asked for with ``word_timestamps=True``) are timed from the stream's start and
    name spans of the whole text sent."""

    samples: np.ndarray
    sample_rate: int
    text: str
    index: int
    words: tuple[Word, ...] = field(default=(), compare=False)
    marks: tuple[Mark, ...] = field(default=(), compare=False)  # the ones this chunk reaches

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate


def join_chunks(chunks: list[AudioChunk], sample_rate: int) -> Audio:
    """One Audio from a stream's chunks, in order."""
    samples = np.concatenate([c.samples for c in chunks]) if chunks else np.zeros(0, np.float32)
    words = merge_words([w for c in chunks for w in c.words])
    return Audio(samples, sample_rate, words, tuple(m for c in chunks for m in c.marks))


def merge_words(words: list[Word]) -> tuple[Word, ...]:
    """Consecutive words with one span (what one token became) as one word over their time."""
    merged: list[Word] = []
    for w in words:
        if merged and (merged[-1].char_start, merged[-1].char_end) == (w.char_start, w.char_end):
            merged[-1] = Word(w.text, merged[-1].start, w.end, w.char_start, w.char_end)
        else:
            merged.append(w)
    return tuple(merged)
