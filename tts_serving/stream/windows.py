"""A chunk's latent decoded in windows: its first audio early, without cutting the sentence.

The acoustic model decides a chunk's prosody once, for the whole chunk; the vocoder is a
convolutional network whose output at a frame depends only on the frames within its reach.
So a window of the latent, computed with ``context`` frames more on each side (the reach,
measured by the export, and a margin), gives the same samples there as the whole chunk does,
to float rounding. tts_stream sends a stream's first chunk in windows that double in size
(a short first one, then larger), each decoded as a vocoder request of its own.
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import numpy as np

from ..engines.batching import FrameSpan

# Written by the export beside each voice's vocoder and tts_stream files: the frames each
# side one latent frame changes the vocoder's audio at, measured on the exported network.
REACH_FILE = "vocoder_reach.json"
# Frames of context beyond the measured reach (the measurement uses one random latent).
REACH_MARGIN = 2


def write_reach(path: Path, frames: int) -> None:
    path.write_text(json.dumps({"vocoder_reach_frames": int(frames)}) + "\n")


def read_reach(path: Path) -> int | None:
    """The recorded reach (frames), or None when the file is absent (an older export)."""
    if not path.exists():
        return None
    frames = json.loads(path.read_text())["vocoder_reach_frames"]
    if not isinstance(frames, int) or frames < 0:
        raise ValueError(f"{path}: vocoder_reach_frames must be a whole number >= 0")
    return frames


def windows(frames: int, first: int, context: int) -> list[FrameSpan]:
    """The windows of a ``frames``-long latent: ``first`` frames, then twice as many each time,
    the last taking the rest (a rest shorter than half the window before joins it), each
    computed from ``context`` frames more on each side where the latent has them. One window
    (the whole) when ``first`` is 0 or the latent is not longer than 1.5 ``first``."""
    if first <= 0 or frames <= first + first // 2:
        return [FrameSpan(0, 0, frames, 0, frames)]
    bounds = [0]
    size = first
    while frames - bounds[-1] > size + size // 2:  # past this, the rest would be too short
        bounds.append(bounds[-1] + size)
        size *= 2
    bounds.append(frames)
    return [
        FrameSpan(0, start, end, max(0, start - context), min(frames, end + context))
        for start, end in pairwise(bounds)
    ]


def kept(audio: np.ndarray, window: FrameSpan, hop_length: int) -> np.ndarray:
    """The samples of ``window``'s own frames in the audio decoded from its ``lo:hi``."""
    offset = (window.start - window.lo) * hop_length
    return audio[offset : offset + (window.end - window.start) * hop_length]


def rows_in(
    rows: np.ndarray | None,
    window: FrameSpan,
    last: bool,
    seconds: float,
    span_columns: slice | None = None,
) -> np.ndarray | None:
    """The rows of ``rows`` (column 0: a time in seconds from the chunk's start) that start
    within ``window``'s frames (``seconds`` a frame); the last window takes every row from its
    start on. ``span_columns``: rows in a run with equal values there (the words one token
    became, "W3C" as three) go together, with the window their first row starts in."""
    if rows is None:
        return None
    times = rows[:, 0].copy()
    if span_columns is not None:
        for k in range(1, len(rows)):
            if np.array_equal(rows[k, span_columns], rows[k - 1, span_columns]):
                times[k] = times[k - 1]
    inside = times >= window.start * seconds if window.start else np.ones(len(rows), bool)
    if not last:
        inside &= times < window.end * seconds
    return rows[inside]
