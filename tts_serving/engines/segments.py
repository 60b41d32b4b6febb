"""Segments of one request (an SSML document): checked rows, pauses, pieces joined by silence.

The phonemizer sends rows (end id, voice index, rate, pause seconds after, gain dB, speaker)
with the ids; acoustic runs each segment as an item of its own (its voice's network and
speaker, its rate) and sends the vocoder rows (end frame, voice index, pause samples after, gain
in hundredths of a dB, speaker); the vocoder decodes each piece with its voice and speaker,
applies its gain and joins them with exact silence. Speaker -1: the request's for its own
voice, the first for another voice.
A row with nothing before it (end equal to the previous end) is a pause alone (before the first
word). Plain text has no rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tts_wire import MAX_GAIN_DB, MAX_PAUSE_S, SILENT_DB

from ..errors import InvalidInputError
from .batching import is_numpy
from .loudness import apply_gain

IDS_COLUMNS = 6  # segments: end id, voice, rate, pause s, gain dB, speaker
FRAME_COLUMNS = 5  # latent_segments: end frame, voice, pause samples, gain dB x 100, speaker


@dataclass(frozen=True)
class SegmentRow:
    start: int  # first id (or frame) of the segment
    end: int  # one past its last
    voice: int  # index in the stages' voice table (the order of voices.json)
    rate: float  # speed factor on top of the request's (acoustic rows only; 1.0 else)
    pause: float  # after it: seconds (acoustic's rows) or samples (the vocoder's)
    gain_db: float = 0.0  # <prosody volume>, <emphasis>; SILENT_DB or less: silence
    speaker: int = -1  # <voice name="voice:speaker">; -1: the request's (see the module)

    def speaker_of(self, speakers: list[int]) -> int:
        """Its speaker id: its own, else ``speakers`` (by voice index) says."""
        return self.speaker if self.speaker >= 0 else speakers[self.voice]


def segment_rows(
    rows: np.ndarray | None, length: int, voices: int, columns: int, what: str
) -> list[SegmentRow]:
    """Checked rows of a ``segments`` (IDS_COLUMNS, over ids) or ``latent_segments``
    (FRAME_COLUMNS, over frames) input; none when absent or empty (plain text)."""
    if rows is None or rows.size == 0:
        return []
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != columns or not np.isfinite(rows).all():
        raise InvalidInputError(f"{what} must be finite rows of {columns} values")
    ids = columns == IDS_COLUMNS
    out: list[SegmentRow] = []
    start = 0
    for row in rows:
        end, voice = int(row[0]), int(row[1])
        rate, pause = (float(row[2]), float(row[3])) if ids else (1.0, float(row[2]))
        gain = float(row[-2]) if ids else float(row[-2]) / 100
        speaker = int(row[-1])
        if end != row[0] or voice != row[1] or not start <= end <= length:
            raise InvalidInputError(f"{what}: ends must be whole, rising, within 0..{length}")
        if not 0 <= voice < voices:
            raise InvalidInputError(f"{what}: voice index {voice} is not one of 0..{voices - 1}")
        if rate <= 0 or pause < 0:
            raise InvalidInputError(f"{what}: rates must be positive and pauses not negative")
        if gain > MAX_GAIN_DB:
            raise InvalidInputError(f"{what}: a gain is over {MAX_GAIN_DB:g} dB")
        if speaker != row[-1] or speaker < -1:
            raise InvalidInputError(f"{what}: a speaker must be a whole id >= 0, or -1")
        out.append(SegmentRow(start, end, voice, rate, pause, max(gain, SILENT_DB), speaker))
        start = end
    if start != length:
        raise InvalidInputError(f"{what}: the last segment must end at {length}, not {start}")
    return out


def with_gain(audio: np.ndarray, gain_db: float) -> np.ndarray:
    """A segment's audio at its gain: clipped to +-1, silence at SILENT_DB (in place)."""
    if gain_db == 0.0:
        return audio
    if gain_db <= SILENT_DB:
        audio[...] = 0.0
        return audio
    return apply_gain(audio, 10 ** (gain_db / 20), out=audio if audio.dtype == np.float32 else None)


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
