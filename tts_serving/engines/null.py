"""The null engine: BENCHMARK ONLY. No network runs; every output has the real shape and length.

It stands in for ONNX Runtime or torch when ``perf_analyzer_configs.host_ceiling`` measures what
Triton, the Python stubs, the ensemble and the phonemizer can carry at all: the
acoustic half gives each item ``FRAMES_PER_ID`` latent frames per phoneme id (scaled by the
item's length scale, as the real duration predictor is), the vocoder ``hop_length`` samples per
frame. The latents and the audio are zeros: what it serves is silence, so only the baselines of
``bench.baselines`` (in a repository of their own) select it, and the launcher refuses them.
"""

from __future__ import annotations

import numpy as np

from .onnx import LATENT_CHANNELS

# Latent frames per phoneme id (pads included) of en_US-joe-medium at length scale 1: 2.17 over
# the 48 perf_analyzer texts (tts_mixed, short, medium, long; 6,620 ids, 14,392 frames).
FRAMES_PER_ID = 2.17
DESCRIPTION = "the null engine (BENCHMARK ONLY: no network, silent outputs of the real shapes)"


def null_durations(lengths: np.ndarray, length_scales: np.ndarray, width: int) -> np.ndarray:
    """Frames per id [B, width] (int64): ``FRAMES_PER_ID * length_scale`` per id, rounded along
    the item so its total is the rounded product, at least one frame; zero past its length."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    rate = FRAMES_PER_ID * np.asarray(length_scales, np.float64).reshape(-1, 1)
    steps = np.arange(width + 1)[None, :]
    ends = np.round(np.minimum(steps, lengths[:, None]) * rate).astype(np.int64)
    durations = np.diff(ends, axis=1)
    # An item too short for one frame gets it on its first id (the vocoder needs >= 1 frame).
    durations[:, 0] = np.maximum(durations[:, 0], (ends[:, -1] == 0) & (lengths > 0))
    return durations


class _NullNet:
    description = DESCRIPTION

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        return False


class NullAcousticNet(_NullNet):
    """Padded ids [B, L], lengths [B], scales [B, 4] -> zero latent [B, 192, T], frames [B],
    frames per id [B, L]; the same call as ``OrtAcousticNet``."""

    def __call__(
        self, ids: np.ndarray, lengths: np.ndarray, scales: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        speed = scales[:, 3] if scales.shape[1] > 3 else 1.0  # [B, 3]: the voice's own
        durations = null_durations(lengths, scales[:, 1] / speed, ids.shape[1])
        frames = durations.sum(axis=1)
        # Written, not np.zeros' untouched pages: a real engine writes its whole output.
        latent = np.full((ids.shape[0], LATENT_CHANNELS, int(frames.max())), 0.0, np.float32)
        return latent, frames, durations


class NullVocoderNet(_NullNet):
    """Padded latents [B, 192, T] -> zero audio [B, T * hop]; the same call as
    ``OrtVocoderNet``."""

    def __init__(self, hop_length: int) -> None:
        self.hop_length = hop_length

    def __call__(self, latent: np.ndarray) -> np.ndarray:
        return np.full((latent.shape[0], latent.shape[-1] * self.hop_length), 0.0, np.float32)
