"""bench.cpu_variants' fidelity measures (issue 28): they must tell a copy from a noisy copy."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cpu_variants import RATE, fidelity


def test_fidelity_tells_noise_from_a_copy():
    rng = np.random.default_rng(1)
    t = np.arange(RATE * 2) / RATE
    # A voiced sound: harmonics of 150 Hz falling off with frequency, under an envelope.
    speech = sum(np.sin(2 * np.pi * 150 * k * t) / k**2 for k in range(1, 30))
    speech = (0.3 * speech * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
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
