"""Segments of one request (an SSML document): checked rows, pauses, pieces joined by silence.

The phonemizer sends rows (end id, voice index, rate, pause seconds after) with the ids;
acoustic runs each segment as an item of its own (its voice's network, its rate) and sends
the vocoder rows (end frame, voice index, pause samples after); the vocoder decodes each piece
with its voice and joins them with exact silence. A row with nothing before it (end equal to
the previous end) is a pause alone (before the first word). Plain text has no rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tts_wire import MAX_PAUSE_S

from ..errors import InvalidInputError
from .batching import is_numpy


@dataclass(frozen=True)
class SegmentRow:
    start: int  # first id (or frame) of the segment
    end: int  # one past its last
    voice: int  # index in the stages' voice table (the order of voices.json)
    rate: float  # speed factor on top of the request's (acoustic rows only; 1.0 else)
    pause: float  # after it: seconds (acoustic's rows) or samples (the vocoder's)


def segment_rows(
    rows: np.ndarray | None, length: int, voices: int, columns: int, what: str
) -> list[SegmentRow]:
    """Checked rows of a ``segments`` (4 columns, over ids) or ``latent_segments`` (3, over
    frames) input; none when absent or empty (plain text)."""
    if rows is None or rows.size == 0:
        return []
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != columns or not np.isfinite(rows).all():
        raise InvalidInputError(f"{what} must be finite rows of {columns} values")
    out: list[SegmentRow] = []
    start = 0
    for row in rows:
        end, voice = int(row[0]), int(row[1])
        rate = float(row[2]) if columns == 4 else 1.0
        pause = float(row[-1])
        if end != row[0] or voice != row[1] or not start <= end <= length:
            raise InvalidInputError(f"{what}: ends must be whole, rising, within 0..{length}")
        if not 0 <= voice < voices:
            raise InvalidInputError(f"{what}: voice index {voice} is not one of 0..{voices - 1}")
        if rate <= 0 or pause < 0:
            raise InvalidInputError(f"{what}: rates must be positive and pauses not negative")
        out.append(SegmentRow(start, end, voice, rate, pause))
        start = end
    if start != length:
        raise InvalidInputError(f"{what}: the last segment must end at {length}, not {start}")
    return out


def check_pauses(seconds: Sequence[float]) -> None:
    if sum(seconds) > MAX_PAUSE_S:
        raise InvalidInputError(f"pauses add up to more than {MAX_PAUSE_S:g} s")


def pauses_before(rows: Sequence[SegmentRow], positions: np.ndarray) -> np.ndarray:
    """Per position (an id), the pauses of the segments that end at or before it."""
    ends = np.array([r.end for r in rows], np.int64)
    total = np.concatenate([[0.0], np.cumsum([r.pause for r in rows])])
    return total[np.searchsorted(ends, positions, side="right")]


def join_with_silence(pieces: Sequence[np.ndarray], pauses: Sequence[int]) -> np.ndarray:
    """The pieces in order, each followed by its pause in zero samples."""
    out: list[np.ndarray] = []
    for piece, pause in zip(pieces, pauses, strict=True):
        out.append(np.asarray(piece, np.float32).reshape(-1))
        out.append(np.zeros(int(pause), np.float32))
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def concat_frames(latents: Sequence) -> np.ndarray:
    """Latents [192, T_i] joined along their frames (a torch tensor stays one on its device)."""
    if len(latents) == 1:
        return latents[0]
    if is_numpy(latents[0]):
        return np.concatenate(latents, axis=1)
    import torch

    return torch.cat(list(latents), dim=1)


def to_host(audio) -> np.ndarray:
    """A numpy array of ``audio``; a torch tensor (the DLPack path) is copied from its device
    as the torch engine copies its own outputs (torch is only imported then)."""
    if is_numpy(audio):
        return audio
    from .torch_engine import to_host as torch_to_host

    return torch_to_host(audio.float())
