"""The voice's loudness: one gain per voice, measured at export, applied to every item."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelConfigError

# One gain per voice, so every request and every stream chunk has the same level. Measured at
# export on fixed sentences: the raw VITS level is steady (about -24 to -28 dBFS RMS for joe),
# while normalizing each item's peak, as Piper does, moved chunks of one paragraph from -16 to
# -23 dBFS. The target is EBU R128's -23 (as RMS), capped so the loudest peak stays under 0.95.
LOUDNESS_FILE = "loudness.json"
TARGET_RMS_DBFS = -23.0
PEAK_CEILING = 0.95


@dataclass(frozen=True)
class VoiceLoudness:
    gain: float
    rms_dbfs: float  # the voice's median raw level on the calibration sentences
    peak: float  # the loudest raw peak there

    @classmethod
    def measure(cls, audios: Sequence[np.ndarray]) -> VoiceLoudness:
        levels = [rms_dbfs(a) for a in audios]
        median = float(np.median(levels))
        peak = max(float(np.max(np.abs(a))) for a in audios)
        gain = min(10 ** ((TARGET_RMS_DBFS - median) / 20), PEAK_CEILING / peak)
        return cls(round(gain, 4), round(median, 2), round(peak, 4))

    @classmethod
    def read(cls, path: str | Path) -> VoiceLoudness:
        data = json.loads(Path(path).read_text())
        loudness = cls(float(data["gain"]), float(data["rms_dbfs"]), float(data["peak"]))
        if not 0 < loudness.gain < 100:
            raise ModelConfigError(f"{path}: gain {loudness.gain} is out of range")
        return loudness

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")


def rms_dbfs(audio: np.ndarray) -> float:
    """Root-mean-square level in dB relative to full scale (-inf for silence)."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    return 20 * np.log10(rms) if rms > 0 else float("-inf")


def active_level_dbfs(audio: np.ndarray, frame: int = 512, gate_dbfs: float = -50.0) -> float:
    """Speech level: the RMS over frames louder than ``gate_dbfs``, so pauses do not count."""
    n = len(audio) // frame
    if n == 0:
        return rms_dbfs(audio)
    power = np.mean(np.square(audio[: n * frame].reshape(n, frame), dtype=np.float64), axis=1)
    active = power[power > 10 ** (gate_dbfs / 10)]
    return 10 * float(np.log10(np.mean(active))) if active.size else float("-inf")


def apply_gain(audio: np.ndarray, gain: float, out: np.ndarray | None = None) -> np.ndarray:
    """``audio`` x ``gain`` clipped to +-1, as float32, into ``out`` (``audio`` itself: no new
    array; ``np.clip``'s wrapper and a fresh array cost a quarter of the vocoder stub's time on
    the null engine)."""
    out = np.multiply(audio, np.float32(gain), out=out, dtype=np.float32)
    np.minimum(out, 1.0, out=out)
    return np.maximum(out, -1.0, out=out)


def peak_normalize(audio: np.ndarray) -> np.ndarray:
    """Scale to a peak of 1.0 and clip, as Piper does for each sentence."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-8:
        return np.zeros_like(audio, dtype=np.float32)
    return np.clip(audio / peak, -1.0, 1.0).astype(np.float32)
