"""Texts that crash espeak-ng, sent through every interface with normal traffic beside them:
no stub dies (the supervisor heals nothing), each crasher is spoken wherever its length
allows (over HTTP, which cannot stream, a text over the phoneme limit is refused as too long,
as any other text is), and every normal request is served. The worker pool's own tests are in
tests/unit/serving/text/test_espeak_pool.py."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import pytest

from tts_client import InvalidInput, TTSClient
from tts_triton.probes import stubs_by_model
from tts_wire import MAX_SPEED

# Shapes that killed the phonemizer's stub before the worker pool (each crashes espeak-ng unshaped).
CRASHERS = [
    "é . " * 60,
    "a . " * 100,
    "Ａ." * 150,
    "I.B.M.-" * 50,
    "http://a.'" * 30,
    "ǅ . ı . " * 30,
]
NORMAL = ["Hello there, how are you today?", "The meeting is at ten.", "Read it again."]
MODELS = ["phonemizer", "tts_stream"]
# The crashers are spoken at the fastest speed: what crashed espeak-ng is the text (the
# phonemizer's stage); at speed 1 this test took 64 CPU-seconds here (the "a . " * 100 kind is
# long audio), at 3x 38.
FAST = MAX_SPEED


def workers(stub_pids: set[int]) -> set[int]:
    """The espeak-ng worker processes (tts_serving.text.espeak_pool) of these stubs."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (proc / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if ppid in stub_pids and b"tts_serving.text.espeak_pool" in cmdline:
                found.add(int(proc.name))
    return found


def spoken_or_refused(call) -> str:
    """Either "spoken" (audio came) or "too long" (refused over the phoneme limit, the one refusal
    a crasher may get: never for what it does to espeak-ng)."""
    try:
        audio = call()
    except InvalidInput as e:
        assert str(e).startswith("text is too long: "), e
        return "too long"
    assert len(audio) > 0
    return "spoken"


@pytest.mark.slow
def test_crashers_through_every_interface_cost_no_stage(server, gateway):
    stubs = stubs_by_model(server.process.pid, MODELS)
    outages = server.supervisor.outages
    grpc = TTSClient(server.grpc_url)

    def http_call(text):
        with TTSClient(server.http_url) as http:  # tritonclient's HTTP client is per thread
            return spoken_or_refused(
                lambda: http.synthesize(text, normalize=True, speed=FAST).samples
            )

    def gateway_call(text):
        body = {"model": "tts-1", "voice": "alloy", "input": text, "speed": FAST}
        body["response_format"] = "pcm"
        response = httpx.post(f"{gateway.url}/v1/audio/speech", json=body, timeout=300)
        assert response.status_code == 200, (response.status_code, response.text)
        assert len(response.content) > 0
        return "spoken"

    def stream_call(text):
        return spoken_or_refused(
            lambda: [c.samples for c in grpc.stream(text, normalize=False, speed=FAST)]
        )

    jobs, expected = [], []
    for i, text in enumerate(CRASHERS):
        # gRPC streams a text too long for one request; HTTP cannot, and every crasher is
        # over the phoneme limit (hundreds of ids): there it is refused as too long.
        jobs.append(
            lambda t=text: spoken_or_refused(
                lambda: grpc.synthesize(t, normalize=False, speed=FAST).samples
            )
        )
        jobs.append(lambda t=text: http_call(t))
        jobs.append(lambda t=text: gateway_call(t))
        expected += ["spoken", "too long", "spoken"]
        if i < 3:
            jobs.append(lambda t=text: stream_call(t))
            expected.append("spoken")
        jobs.append(lambda t=NORMAL[i % 3]: len(grpc.synthesize(t).samples) > 0 and "normal")
        expected.append("normal")
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda job: job(), jobs))
    grpc.close()
    assert outcomes == expected
    assert server.supervisor.outages == outages  # nothing to heal
    assert stubs_by_model(server.process.pid, MODELS) == stubs  # the same stubs, alive


def test_a_dead_worker_costs_no_request(server, grpc_client):
    stubs = stubs_by_model(server.process.pid, MODELS)
    victims = workers(set().union(*stubs.values()))
    assert len(victims) == 2, victims  # one espeak-ng worker per instance (espeak_workers 1)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)  # as a crash (or the OOM killer) would
    with ThreadPoolExecutor(4) as pool:
        audio = list(pool.map(grpc_client.synthesize, NORMAL + NORMAL[:1]))
    assert all(len(a.samples) > 0 for a in audio)
    assert len(list(grpc_client.stream("One more sentence, streamed."))) >= 1
    assert stubs_by_model(server.process.pid, MODELS) == stubs
    replacements = workers(set().union(*stubs.values()))
    assert len(replacements) == 2 and not replacements & victims
