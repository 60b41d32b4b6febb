"""bench.cpu_variants' fidelity measures and gates: they must tell a copy from a
noisy copy, and a gate must fail what it is there to catch."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cpu_variants import GATES, RATE, Report, fidelity, pesq_wb, resample


def voiced(seconds: float = 2.0) -> np.ndarray:
    """Harmonics of 150 Hz falling off with frequency, under an envelope."""
    t = np.arange(int(RATE * seconds)) / RATE
    speech = sum(np.sin(2 * np.pi * 150 * k * t) / k**2 for k in range(1, 30))
    return (0.3 * speech * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)


def test_fidelity_tells_noise_from_a_copy():
    rng = np.random.default_rng(1)
    speech = voiced()
    snr, mcd, loud = fidelity(speech, speech.copy())
    assert snr > 100 and mcd == pytest.approx(0.0, abs=1e-6) and loud == pytest.approx(0.0)
    faint = speech + rng.normal(0, 0.003, speech.shape).astype(np.float32)
    loud_noise = speech + rng.normal(0, 0.03, speech.shape).astype(np.float32)
    (snr_faint, mcd_faint, _), (snr_loud, mcd_loud, _) = (
        fidelity(speech, faint),
        fidelity(speech, loud_noise),
    )
    assert snr_faint > snr_loud + 15 and 0 < mcd_faint < mcd_loud
    assert fidelity(speech, 0.5 * speech)[2] == pytest.approx(-6.02, abs=0.01)


def test_resampling_keeps_a_tone_and_the_length():
    t = np.arange(RATE) / RATE
    out = resample(np.sin(2 * np.pi * 440 * t), RATE, 16_000)
    expected = np.sin(2 * np.pi * 440 * np.arange(16_000) / 16_000)
    assert out.shape == (16_000,) and np.max(np.abs(out - expected)) < 1e-6


def test_pesq_scores_a_copy_at_the_top_and_noise_lower():
    rng = np.random.default_rng(2)
    speech = voiced(3.0)
    assert pesq_wb(speech, speech) > 4.5  # 4.64 is P.862.2's ceiling
    faint = pesq_wb(speech, speech + rng.normal(0, 3e-4, speech.shape))
    loud = pesq_wb(speech, speech + rng.normal(0, 1e-2, speech.shape))
    assert loud < faint < 4.5


def report(**changes) -> Report:
    base = dict(pesq=[4.2, 4.0, 3.9], snr=[30.0] * 3, mcd=[1.0] * 3, loudness=[0.1, -0.2, 0.0])
    return Report(**{**base, "same_frames": True, "wer": 0.07, **changes})


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({"pesq": [3.7, 3.7, 4.0]}, "PESQ median"),
        ({"pesq": [4.2, 4.2, 2.9]}, "PESQ worst"),
        ({"loudness": [0.0, 0.6, 0.0]}, "loudness"),
        ({"same_frames": False}, "frame counts"),
        ({"wer": 0.081}, "WER"),
    ],
)
def test_each_gate_fails_what_it_guards(changes, failure):
    assert GATES.failures(report(), float_wer=0.07) == []
    (problem,) = GATES.failures(report(**changes), float_wer=0.07)
    assert problem.startswith(failure), problem
