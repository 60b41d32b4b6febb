"""bench.vocoder_engines: a rounded row computes on a padded latent, returns the own audio."""

from __future__ import annotations

import numpy as np

from bench.vocoder_engines import HOP, padded, rounded_up


def test_lengths_round_up_to_the_multiple():
    assert [rounded_up(n, 32) for n in (1, 32, 33, 64, 65)] == [32, 32, 64, 64, 96]
    assert rounded_up(77, 0) == 77


def test_a_padded_call_sees_the_rounded_shape_and_returns_the_items_audio():
    seen = []

    def vocoder(latent: np.ndarray) -> np.ndarray:  # each frame's first channel, HOP times
        seen.append(latent.shape)
        return np.repeat(latent[:, 0, :], HOP, axis=1)

    latent = np.arange(2 * 70, dtype=np.float32).reshape(1, 2, 70)
    audio = padded(vocoder, 32)(latent)
    assert seen == [(1, 2, 96)]
    assert audio.shape == (1, 70 * HOP)
    np.testing.assert_array_equal(audio, np.repeat(latent[:, 0, :], HOP, axis=1))
    padded(vocoder, 32)(latent[:, :, :64])
    assert seen[-1] == (1, 2, 64)  # a length on the multiple is not padded
