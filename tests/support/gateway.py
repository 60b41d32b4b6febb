"""Helpers for the gateway tests: a gateway on the test server, loudness, a good request."""

from __future__ import annotations

import json

import httpx2 as httpx
import numpy as np

from tests.support.audio import decode
from tests.support.processes import GatewayProcess

# "joe" as served, plus "joe-exact": the same voice without noise, so two requests for one
# text give the same samples (the format checks compare lengths across requests).
VOICES = [
    {"id": "joe", "aliases": ["alloy", "echo"], "language": "en-us"},
    {"id": "joe-exact", "noise_scale": 0.0, "noise_w": 0.0},
    {"id": "joe-slow", "speed": 0.5, "noise_scale": 0.0, "noise_w": 0.0},
]


def gateway_on(server, tmp_path_factory, *args: str) -> GatewayProcess:
    """A gateway (not started yet) on the test server with the test voices."""
    folder = tmp_path_factory.mktemp("gateway")
    voices = folder / "voices.json"
    voices.write_text(json.dumps(VOICES))
    return GatewayProcess(
        server.grpc_url, folder / "gateway.log", extra_args=[f"--voices-file={voices}", *args]
    )


def rms_dbfs(samples: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(np.square(samples))) + 1e-12)


def good_request(gateway) -> None:
    """The gateway and Triton still serve: a short sentence comes back as playable WAV."""
    response = httpx.post(
        f"{gateway.url}/v1/audio/speech",
        json={"model": "tts-1", "voice": "alloy", "input": "Still here.", "response_format": "wav"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    samples, rate = decode(response.content, "wav")
    assert rate == 22050 and len(samples) > 0.3 * rate
