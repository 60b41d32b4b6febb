"""The front door against what Triton alone does: each test sends the same thing straight to
Triton first, where it shows the defect, then through the front door, where it must not.

- oversized gRPC messages and HTTP bodies (plain, compressed, chunked) are refused while they
  are read; Triton's memory does not grow;
- a burst far over capacity is part served, part refused at once, never only queued;
- a stream whose `tts_stream` stub dies ends with an error instead of hanging;
- SIGTERM to `make serve` with an idle keep-alive connection exits 0, without Triton's 30 s
  "Exit timeout expired".
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import aio as grpc_aio
from tritonclient.utils import InferenceServerException

from tests.support.launcher import LIGHT_WARMUP, Launcher
from tests.support.memory import rss_mb
from tests.support.metrics import sample, settled
from tests.support.processes import FrontProcess
from tts_client import ServerOverloaded, ServerUnavailable, TTSClient
from tts_client.protocol import build_inputs
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_triton.probes import stubs_by_model
from tts_wire import TEXT_TOO_LONG

LIMIT_MIB = 1
BIG = 12 * 2**20  # bytes of text in an oversized request


@pytest.fixture(scope="module")
def front(server, tmp_path_factory):
    """The front door before the session's server, with a 1 MiB request limit."""
    log = tmp_path_factory.mktemp("front") / "front.log"
    with FrontProcess(server, log, [f"--max-request-mib={LIMIT_MIB}"]) as f:
        yield f


def big_text_infer(url: str) -> InferenceServerException:
    client = grpcclient.InferenceServerClient(url)
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"a" * BIG]], dtype=object))
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer("tts", [text])
        return e.value
    finally:
        client.close()


def infer_body(chars: int) -> bytes:
    inputs = [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a" * chars]}]
    return json.dumps({"inputs": inputs}).encode()


def post(port: int, body: bytes, headers: dict[str, str], chunked: bool = False) -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        if chunked:
            conn.request(
                "POST", "/v2/models/tts/infer", body=iter([body[i : i + 65536] for i in
                range(0, len(body), 65536)]), headers=headers, encode_chunked=True,
            )  # fmt: skip
        else:
            conn.request("POST", "/v2/models/tts/infer", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    except (BrokenPipeError, ConnectionResetError):
        return "closed", b""  # refused while the body was still being sent
    finally:
        conn.close()


def test_oversized_requests_are_refused_before_triton_copies_them(server, front):
    triton = server.process.pid
    # Straight to Triton: the 12 MB message is copied into tritonserver (and the stub's
    # shared memory) before the model refuses it for its length.
    before = rss_mb(triton)
    direct = big_text_infer(f"localhost:{server.grpc_port}")
    # Refused by the model for its length (not failed on the way), naming what to fix.
    assert direct.status() == "StatusCode.INVALID_ARGUMENT", direct
    assert re.search(rf"{TEXT_TOO_LONG}: {BIG} bytes, the limit is \d+ characters", str(direct))
    grown_direct = rss_mb(triton) - before
    assert grown_direct > BIG / 2**20 / 2, f"Triton grew only {grown_direct:.1f} MB"

    before = rss_mb(triton)
    refused = big_text_infer(f"localhost:{front.grpc_port}")
    assert refused.status() == "StatusCode.RESOURCE_EXHAUSTED", refused
    assert "larger than max" in str(refused)

    body = infer_body(BIG)
    gz = gzip.compress(body)
    assert len(gz) < LIMIT_MIB * 2**20  # small on the wire, 12 MB inflated
    json_type = {"Content-Type": "application/json"}
    for name, (status, text) in {
        "plain": post(front.http_port, body, json_type),
        "gzip": post(front.http_port, gz, json_type | {"Content-Encoding": "gzip"}),
        "chunked": post(front.http_port, body, json_type, chunked=True),
    }.items():
        assert status in (413, "closed"), (name, status, text)
        if status == 413:
            assert b"limit" in text, (name, text)
    assert rss_mb(triton) - before < 5, "Triton's memory grew through the front door"
    assert rss_mb(front.process.pid) < 300
    # A compressed body under the limit is inflated and served.
    small = gzip.compress(infer_body(40))
    status, text = post(front.http_port, small, json_type | {"Content-Encoding": "gzip"})
    assert status == 200, text
    with TTSClient(front.grpc_url) as client:
        assert client.synthesize("Still serving.").duration > 0.3


async def burst(url: str, n: int) -> tuple[int, int, list[BaseException]]:
    """``n`` concurrent raw tritonclient requests with no deadline of their own (the server's
    applies): served, refused (UNAVAILABLE), other errors."""
    served = refused = 0
    other: list[BaseException] = []
    client = grpc_aio.InferenceServerClient(url.removeprefix("grpc://"))

    async def one(i: int) -> None:
        nonlocal served, refused
        try:
            await client.infer("tts", build_inputs(grpcclient, SENTENCES[i % len(SENTENCES)]))
            served += 1
        except InferenceServerException as e:
            if e.status() == "StatusCode.UNAVAILABLE":
                refused += 1
            else:
                other.append(e)
        except Exception as e:
            other.append(e)

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
    return served, refused, other


def test_a_burst_over_capacity_is_refused_within_its_deadline_not_queued(server, tmp_path):
    n = 40
    served, refused, other = asyncio.run(burst(server.grpc_url, n))
    assert (served, refused, other) == (n, 0, [])  # straight to Triton: everything queues

    args = ["--deadline-s=1", "--slots=2"]
    with FrontProcess(server, tmp_path / "front.log", args) as front:
        with TTSClient(front.grpc_url) as client:
            client.synthesize("Warm up.")  # one measured request
        served, refused, other = asyncio.run(burst(front.grpc_url, n))
        assert other == [], other
        assert served + refused == n
        # The first takes a free slot (never refused); the second goes on only where the rate
        # measured says it makes the 1 s default deadline (on a busy machine it did not: 1
        # served, 39 refused, none queued past its deadline).
        assert refused > 0 and served >= 1, (served, refused)
        metrics, tts = f"{front.http_url}/metrics", {"model": "tts"}
        assert sample(metrics, "tts_front_refused_total", tts) == refused
        assert sample(metrics, "tts_front_in_flight", tts) == 0  # every admitted one released
        with TTSClient(front.grpc_url) as client:
            assert client.synthesize("Served after the burst.").duration > 0.3


def test_a_stream_whose_stub_dies_ends_with_an_error(exported_repository, tmp_path):
    """Through `make serve`: the stream ends with a clear error, the model is healed, and the
    stop afterwards is clean (closing such a stream while Triton ran aborted it)."""
    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    url = f"grpc://127.0.0.1:{launcher.grpc}"
    try:
        launcher.wait_ready()
        triton = launcher.triton_pid()
        outcome: dict = {}

        def listen() -> None:
            with TTSClient(url, timeout=600) as client:
                try:
                    for i, _ in enumerate(client.stream(PARAGRAPH * 20)):
                        if i == 1:
                            for pid in stubs_by_model(triton, ["tts_stream"])["tts_stream"]:
                                os.kill(pid, signal.SIGKILL)
                            outcome["killed"] = True
                    outcome["result"] = "finished"
                except (ServerOverloaded, ServerUnavailable) as e:
                    outcome["result"] = e

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        # Straight to Triton this stream stayed open for ever (11 minutes in one harness).
        thread.join(120)
        assert outcome.get("killed")
        assert not thread.is_alive(), "the stream hung after its stub died"
        # Triton 2.51 itself sometimes aborts when a stub dies holding one of its IPC locks
        # (boost::interprocess::lock_exception; about 1 run in 8): no code of ours runs in
        # between. Then the stream still ends with an error,
        # never hangs, and the launcher starts tritonserver again instead of the supervisor
        # reloading one model.
        aborted = "lock_exception" in launcher.log()
        if aborted:
            assert isinstance(outcome["result"], ServerUnavailable), outcome
        else:
            assert "serving this stream died" in str(outcome["result"]), outcome
            # Triton keeps calling the model ready while its stub is dead, until the supervisor
            # (it looks every second) reloads it: beside two CPU hogs the readiness below
            # passed before that, and the stream got "Stub process ... is not healthy".
            back = "supervisor: tts_stream is back"
            log = settled(launcher.log, lambda text: back in text, timeout_s=60)
            assert back in log, log[-3000:]
        launcher.wait_ready(120 if aborted else 60)  # healed
        with TTSClient(url) as client:
            assert sum(c.duration for c in client.stream("Back again. Fine.")) > 0.5
        launcher.process.send_signal(signal.SIGTERM)
        code = launcher.process.wait(120)
    finally:
        launcher.close()
    log = launcher.log()
    assert code == 0, log[-3000:]
    if aborted:
        assert "starting it again" in log, log[-3000:]
    else:
        assert "lock_exception" not in log and "Signal (6)" not in log, log[-3000:]
    assert not stubs_by_model(triton, ["tts_stream", "vocoder"])["tts_stream"]


def test_sigterm_with_an_idle_keep_alive_connection_exits_at_once(exported_repository, tmp_path):
    logs = {}
    # Triton's exit timeout shortened from 30 s: the direct run shows the same wait, sooner.
    for mode, args in (("direct", ["--no-front", "--exit-timeout-secs=5"]), ("front", [])):
        warmup = LIGHT_WARMUP if mode == "front" else None  # (direct: no front door)
        launcher = Launcher(exported_repository, tmp_path / f"{mode}.log", args, None, warmup)
        try:
            launcher.wait_ready()
            conn = http.client.HTTPConnection("127.0.0.1", launcher.http, timeout=10)
            conn.request("GET", "/v2/health/ready")
            assert conn.getresponse().read() == b""  # answered; the connection stays open
            launcher.process.send_signal(signal.SIGTERM)
            code = launcher.process.wait(120)
            conn.close()
        finally:
            launcher.close()
        logs[mode] = (code, Path(launcher.log_path).read_text(errors="replace"))
    # Straight to Triton, the idle connection held its exit for the whole timeout, then exit 1.
    assert logs["direct"][0] == 1 and "Exit timeout expired" in logs["direct"][1]
    assert logs["front"][0] == 0, logs["front"][1][-3000:]
    assert "Exit timeout expired" not in logs["front"][1]
