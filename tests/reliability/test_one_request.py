"""What one request can do to the door, against the launcher as `make serve` runs it, with a
bystander measured throughout: a request of 64 texts of 4,095 digits held the front door's loop
12 s until the launcher killed it as dead (every request in flight got 502); a request the
HTTP parser refuses, or a malformed tensor header, logged a traceback or answered 500."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as tritongrpc

from tests.support.launcher import LIGHT_WARMUP, Launcher, serving
from tts_client import TTSClient
from tts_client.protocol import NO_RETRY

DIGITS = "123456 " * 585  # 4,095 characters, each group read as a number


@pytest.fixture(scope="module")
def served(exported_repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("one-request") / "launcher.log"
    with serving(Launcher(exported_repository, log, warmup_requests=LIGHT_WARMUP)) as launcher:
        yield launcher


def front_pid(launcher: Launcher) -> int:
    """The launcher's front door process."""
    (pid,) = [
        p for p in launcher.children()
        if b"tts_front" in open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
    ]  # fmt: skip
    return pid


class Bystander:
    """Another client's sentences over gRPC, one after another, while the test runs."""

    def __init__(self, launcher: Launcher) -> None:
        self.url, self.stop = f"grpc://127.0.0.1:{launcher.grpc}", threading.Event()
        self.served, self.errors, self.took = 0, [], []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with TTSClient(self.url, retry=NO_RETRY, timeout=60) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    assert client.synthesize("Still serving everyone else.").duration > 0.5
                    self.served += 1
                    self.took.append(time.monotonic() - started)
                except Exception as e:
                    self.errors.append(f"{type(e).__name__}: {e}")

    def __enter__(self) -> Bystander:
        self.thread.start()
        time.sleep(1)
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join()


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v2/models/tts/infer", body=body, headers=headers)
    response = conn.getresponse()
    answer = response.status, response.read(), time.monotonic() - started
    conn.close()
    return answer


@pytest.mark.parametrize("texts", [64, 1])
def test_a_request_of_long_digit_texts_is_answered_in_seconds_and_the_door_lives(served, texts):
    """64 such texts are refused before any is costed (`tts` takes one a request); one is
    costed within a bound per request off the loop, and Triton refuses it as too long."""
    pid, logged = front_pid(served), len(served.log())
    batch = [DIGITS] * texts
    body = json.dumps(
        {"inputs": [{"name": "text", "shape": [texts, 1], "datatype": "BYTES", "data": batch}]}
    ).encode()
    with Bystander(served) as bystander:
        status, answer, took_http = post(served.http, body, {"Content-Type": "application/json"})
        grpc = tritongrpc.InferenceServerClient(f"127.0.0.1:{served.grpc}")
        tensor = tritongrpc.InferInput("text", [texts, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in batch], dtype=object))
        started = time.monotonic()
        with pytest.raises(Exception) as refused:
            grpc.infer("tts", [tensor], client_timeout=120)
        took_grpc = time.monotonic() - started
        grpc.close()
    print(f"\n{texts} texts: HTTP {status} in {took_http:.2f} s, gRPC in {took_grpc:.2f} s; "
          f"bystander {bystander.served} served, {len(bystander.errors)} errors")  # fmt: skip
    assert status == 400, answer
    message = str(refused.value)
    assert "INVALID_ARG" in message, message
    if texts == 64:
        # The door's own answer (Triton's names the ensemble), before it writes anything out.
        door = "in 'tts', input 'text' has batch size 64; send one item per request"
        assert door.encode() in answer and door in message
    else:
        assert b"too long" in answer and "too long" in message
    # Well inside the launcher's liveness bound (12 s); writing out 64 texts on the loop took
    # 5.6 s on an AVX-512 EPYC, 12 s on an AVX2 one.
    assert took_http < 3 and took_grpc < 3
    assert not bystander.errors and bystander.served >= 1
    assert front_pid(served) == pid
    assert "liveness" not in served.log()[logged:]


def test_requests_the_parser_refuses_log_one_line_not_a_traceback_each(served):
    """HTTP/1.0 without Host passes the edge and aiohttp refuses it, logging its traceback
    (718 B of log for a 33 B request); now one line a minute whatever their number."""
    pid, logged = front_pid(served), len(served.log())
    request = b"POST /v2/models/tts/infer HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", served.http), timeout=30) as raw:
            raw.sendall(request)
            answer = raw.recv(65536)
        assert answer.startswith(b"HTTP/1.1 400"), answer
    time.sleep(1)
    log = served.log()[logged:]
    assert "Traceback" not in log and log.count("refused: a malformed HTTP request") <= 1, log
    assert len(log) < 1000, log
    assert front_pid(served) == pid


@pytest.mark.parametrize("size", [-5, True, 1.5])
def test_a_lying_binary_data_size_is_a_400(served, size):
    header = json.dumps(
        {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES",
                     "parameters": {"binary_data_size": size}}]}
    ).encode()  # fmt: skip
    status, answer, _ = post(
        served.http,
        header + b"\x03\x00\x00\x00Hi.",
        {"Content-Type": "application/octet-stream",
         "Inference-Header-Content-Length": str(len(header))},
    )  # fmt: skip
    assert status == 400 and b"binary_data_size must be a non-negative integer" in answer


def test_one_request_cannot_expand_without_bound(served):
    """ "7" 4,096 times through the gateway streamed 307 s, 58.7 MB of WAV (22 minutes) from
    one 4 KB request: now a 400 naming the bound and the value, before any audio, through the
    gateway (HTTP and SSE) and a gRPC stream alike."""
    import httpx2 as httpx

    from tts_client import InvalidInput

    body = {"model": "tts-1", "voice": "alloy", "input": "7" * 4096, "response_format": "wav"}
    url = f"{served.url}/v1/audio/speech"
    for extra in ({}, {"response_format": "pcm", "stream_format": "sse"}):
        answer = httpx.post(url, json=body | extra, timeout=60)
        assert answer.status_code == 400, answer.text[:300]
        message = answer.json()["error"]["message"]
        assert "speaks as 24,575 characters" in message and "limit of 17,384" in message
    with TTSClient(f"grpc://127.0.0.1:{served.grpc}", retry=NO_RETRY, timeout=60) as client:
        with pytest.raises(InvalidInput, match="max_expansion"):
            next(iter(client.stream("7" * 4096)))
        # Numbers in ordinary text are well inside it.
        assert next(iter(client.stream("Call 555-1234 at 9:30 on 2026-12-04. " * 20))).duration


def test_a_light_clients_closed_loop_does_not_starve_long_text_streams(served):
    """Found probing 30 addresses that each asked the longest WAV at once beside one client's
    closed loop of sentences: that client is light, so its requests are interactive, and
    interactive work was in the server all the time; a stream's chunks after its first are
    bulk, which ran only when none was, so no stream got audio after its first chunk for
    120 s and the gateway cut all 16. Now bulk work waits at most a second for its turn."""
    import json

    import httpx2 as httpx

    from tts_front.sample_texts import PARAGRAPH

    seconds, deltas = 30.0, {}

    def stream(k: int) -> None:
        body = {"model": "tts-1", "voice": "alloy", "input": PARAGRAPH * 2}
        body |= {"response_format": "pcm", "stream_format": "sse"}
        count, started = 0, time.monotonic()
        with httpx.stream("POST", f"{served.url}/v1/audio/speech", json=body, timeout=180) as r:
            for line in r.iter_lines():
                if line and json.loads(line[6:])["type"] == "speech.audio.delta":
                    count += 1
                if time.monotonic() - started > seconds:
                    break
        deltas[k] = count

    with Bystander(served) as bystander:
        streams = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
        for t in streams:
            t.start()
        for t in streams:
            t.join(120)
    took = sorted(bystander.took)
    print(f"\naudio pieces in {seconds:g} s: {deltas}; the closed loop's p50 "
          f"{took[len(took) // 2]:.3f} s over {len(took)}")  # fmt: skip
    assert not bystander.errors, bystander.errors[:3]
    # Starved, each got its first piece alone (1); with its turns, a piece every few seconds.
    assert all(n >= 4 for n in deltas.values()), deltas
