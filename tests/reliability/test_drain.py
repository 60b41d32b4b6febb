"""SIGTERM: no client hangs, every request is served or refused with a retryable error, exit 0,
nothing left behind (no stub process, no /dev/shm region).

This is what Triton 2.51 gives, not yet a drain: after SIGTERM each stage refuses new requests,
so a `tts` request between two stages is refused at the next one, and a stream's next chunk
too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from tests.support.launcher import LIGHT_WARMUP, Launcher, alive
from tests.support.metrics import sample, settled
from tests.support.paths import ROOT
from tests.support.processes import ServerProcess
from tts_client import ServerUnavailable
from tts_front.sample_texts import PARAGRAPH, SENTENCES


def regions(prefix: str) -> set[str]:
    """The /dev/shm regions of the server whose prefix is ``prefix`` (make test runs other
    servers beside this one, whose regions come and go)."""
    assert prefix.startswith("tts_")
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def stubs_of(pid: int) -> list[str]:
    """The Python-backend stub processes whose parent is ``pid``."""
    out = subprocess.run(
        ["ps", "-ww", "-o", "pid=,ppid=,args=", "-e"], capture_output=True, text=True
    )
    return [
        line for line in out.stdout.splitlines()
        if "triton_python_backend_stub" in line and line.split()[1] == str(pid)
    ]  # fmt: skip


def phonemized(server: ServerProcess) -> float:
    """Requests the phonemizer (Triton's first stage) has completed."""
    metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
    labels = {"model": "phonemizer", "version": "1"}
    return sample(metrics, "nv_inference_request_success_total", labels) or 0


def assert_served_or_refused_clearly(results: dict) -> None:
    """Requests 0-7 (seconds of audio or an error) and two streams (chunks or an error)."""
    served = [results[k] for k in range(8)]
    # Each request is either served or refused with a retryable error (ServerOverloaded is one).
    assert all(isinstance(r, float) or isinstance(r, ServerUnavailable) for r in served), served
    # ... and a refusal says why: the server is stopping (all 8 were inside it at SIGTERM).
    refusals = [str(r) for r in served if not isinstance(r, float)]
    assert all("stopping" in r or "shutting down" in r for r in refusals), refusals
    for k in range(2):  # a stream either finished or ended with a clear, retryable error
        r = results[f"stream{k}"]
        assert isinstance(r, int) or isinstance(r, ServerUnavailable), r


def test_sigterm_ends_everything_clearly_and_leaves_nothing(exported_repository, tmp_path):
    from tts_client import TTSClient

    server = ServerProcess(
        exported_repository, tmp_path / "triton.log", cache_dir=ROOT / ".cache" / "triton"
    )
    server.start()
    pid = server.process.pid
    try:
        assert stubs_of(pid) and regions(server.shm_prefix)  # the models' stubs are running
        results: dict = {}
        streaming = threading.Barrier(3)
        first_chunks: list[int] = []  # a server refusing everything fails here, not silently

        with TTSClient(server.grpc_url, concurrency=8) as client:
            client.synthesize("Warm up.")

            def stream(k: int) -> None:
                chunks = client.stream(PARAGRAPH)
                try:
                    next(chunks)
                    first_chunks.append(k)
                    streaming.wait(60)  # SIGTERM comes while both streams are mid-way
                    results[f"stream{k}"] = sum(1 for _ in chunks) + 1
                except Exception as e:
                    results[f"stream{k}"] = e

            def request(k: int) -> None:
                try:
                    results[k] = client.synthesize(SENTENCES[k]).duration
                except Exception as e:
                    results[k] = e

            threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
            for t in threads:
                t.start()
            streaming.wait(60)
            threads += [threading.Thread(target=request, args=(k,)) for k in range(8)]
            before = phonemized(server)
            for t in threads[2:]:
                t.start()
            # SIGTERM once all 8 are inside Triton (past its first stage): a test that signalled
            # before they arrived passed on refusals of requests the server never held.
            deadline = time.monotonic() + 30
            while phonemized(server) < before + 8:
                assert time.monotonic() < deadline, "the 8 requests never reached the server"
                time.sleep(0.02)
            server.process.send_signal(signal.SIGTERM)
            for t in threads:
                t.join(120)
                assert not t.is_alive(), "a client hung after SIGTERM"
        code = server.process.wait(120)
    finally:
        server.stop()
    print(f"\n{results}")
    assert code == 0
    assert sorted(first_chunks) == [0, 1]  # both streams were served before the SIGTERM
    assert_served_or_refused_clearly(results)
    assert not stubs_of(pid)
    assert regions(server.shm_prefix) == set()


def gateway_requests(port: int) -> float:
    """Requests the gateway holds or has answered, from its /metrics."""
    import httpx2 as httpx

    total = 0.0
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
        if line.startswith(("tts_gateway_requests_in_flight ", "tts_gateway_requests_total{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


# Streamed by the gateway (over 150 characters), about 25 s of audio: two of them and 8
# requests finish well within the 40 s drain on a busy machine (two of PARAGRAPH, 100 s of
# audio each, did not).
STREAMED = " ".join(SENTENCES[6:13])


def test_sigterm_to_make_serve_drains_the_gateway(exported_repository, tmp_path):
    """The launcher (`make serve`) stops the gateway first: 8 requests and 2 streams in flight
    through it all finish, then Triton stops; exit 0, nothing left behind."""
    import json

    import httpx2 as httpx

    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    gateway = launcher.gateway
    url = f"{launcher.url}/v1/audio/speech"
    try:
        launcher.wait_ready()
        triton_pid, shm_prefix = launcher.triton_pid(), launcher.shm_prefix()
        assert regions(shm_prefix)
        results: dict = {}
        started = threading.Barrier(3)

        def stream(k: int) -> None:
            body = {"model": "tts-1", "voice": "alloy", "input": STREAMED}
            body |= {"response_format": "pcm", "stream_format": "sse"}
            with httpx.stream("POST", url, json=body, timeout=120) as response:
                lines = response.iter_lines()
                first = next(line for line in lines if line)
                started.wait(60)
                events = [first, *(line for line in lines if line)]
            results[f"stream{k}"] = json.loads(events[-1][6:])["type"]

        def request(k: int) -> None:
            body = {"model": "tts-1", "voice": "alloy", "input": SENTENCES[k]}
            results[k] = httpx.post(url, json=body, timeout=120).status_code

        threads = [threading.Thread(target=stream, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        started.wait(60)
        threads += [threading.Thread(target=request, args=(k,)) for k in range(8)]
        for t in threads[2:]:
            t.start()
        # SIGTERM once all 10 have reached the gateway (in flight or already answered).
        wait_until = time.monotonic() + 60
        while gateway_requests(gateway) < 10 and time.monotonic() < wait_until:
            time.sleep(0.05)
        launcher.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a client hung after SIGTERM"
        code = launcher.process.wait(120)
    finally:
        launcher.close()
    print(f"\n{results}")
    assert code == 0, launcher.log()[-3000:]
    assert [results[k] for k in range(8)] == [200] * 8, results
    assert results["stream0"] == results["stream1"] == "speech.audio.done", results
    assert not stubs_of(triton_pid)
    assert regions(shm_prefix) == set()
    log = launcher.log()
    # The stop says what it waits for and how long; the drain logs no traceback.
    said = (
        "SIGTERM, stopping: requests and streams in flight get up to 30 s to finish at the "
        "gateway, then 30 s at the front door, then Triton stops; 90 s in all at most"
    )
    assert said in log, log[-3000:]
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


def test_one_drain_setting_sets_every_deadline_and_cut_streams_end_with_an_error(
    exported_repository, tmp_path
):
    """The drain was written four times (front door 30 s, gateway 30 s, uvicorn 35 s, the
    launcher 40 s): a 60 s gateway drain was cut at 40 s, its SSE streams mid-event with no
    `error` event, so a client that takes EOF as the end kept cut audio as whole. Now the
    launcher's --drain-s sets them all: long streams still running when it has passed end
    with an `error` event (SSE) or a transfer left unterminated (pcm), never a clean end, and
    the launcher waits for them as long as the setting says."""
    import json

    import httpx2 as httpx

    drain_s = 12
    launcher = Launcher(
        exported_repository,
        tmp_path / "launcher.log",
        [f"--drain-s={drain_s}"],
        warmup_requests=LIGHT_WARMUP,
    )
    url = f"{launcher.url}/v1/audio/speech"
    text = (PARAGRAPH * 8)[:4000]
    results: dict = {}
    stopped_at = [0.0]
    try:
        launcher.wait_ready()
        started = threading.Barrier(5)

        def sse(k: int) -> None:
            body = {"model": "tts-1", "voice": "alloy", "input": text}
            body |= {"response_format": "pcm", "stream_format": "sse"}
            with httpx.stream("POST", url, json=body, timeout=180) as response:
                events, lines = [], response.iter_lines()
                events.append(json.loads(next(line for line in lines if line)[6:]))
                started.wait(60)
                events += [json.loads(line[6:]) for line in lines if line]
            results[f"sse{k}"] = (events[-1]["type"], time.monotonic() - stopped_at[0], events[-1])

        def pcm(k: int) -> None:
            body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
            with httpx.stream("POST", url, json=body, timeout=180) as response:
                chunks = response.iter_bytes()
                next(chunks)
                started.wait(60)
                try:
                    for _ in chunks:
                        pass
                    outcome = "whole"
                except httpx.HTTPError as e:  # the transfer left unterminated: an error
                    outcome = f"cut: {type(e).__name__}"
            results[f"pcm{k}"] = (outcome, time.monotonic() - stopped_at[0], None)

        threads = [threading.Thread(target=sse, args=(k,)) for k in range(2)]
        threads += [threading.Thread(target=pcm, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        started.wait(90)
        stopped_at[0] = time.monotonic()
        launcher.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(180)
            assert not t.is_alive(), "a client hung after SIGTERM"
        code = launcher.process.wait(180)
        took = time.monotonic() - stopped_at[0]
    finally:
        launcher.close()
    print(f"\n{results}; the launcher exited {code} {took:.1f} s after SIGTERM")
    assert code == 0, launcher.log()[-3000:]
    for name, (outcome, after, last) in results.items():
        if name.startswith("sse"):
            assert outcome in ("speech.audio.done", "error"), last
            if outcome == "error":
                assert "shutting down" in last["error"]["message"], last
        else:
            # A body that ended cleanly was all of it: only one done before the drain passed.
            assert outcome.startswith("cut") or after < drain_s, (name, outcome, after)
        # Each got the drain the setting gives (not cut sooner by another deadline).
        assert outcome in ("speech.audio.done", "whole") or after >= drain_s - 1, (name, after)
    log = launcher.log()
    assert f"get up to {drain_s} s to finish at the gateway" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def test_a_slow_reader_gets_its_whole_stream_after_everything_behind_the_edge_stopped(
    exported_repository, tmp_path
):
    """A client that reads slowly is still being sent what the gateway finished writing
    after the gateway, the front door and Triton have stopped: the edge (nginx) stops last,
    by itself, once it has sent it (a SIGTERM 2 s after Triton cut the stream: CI's client
    read more slowly than the servers stopped)."""
    import json

    import httpx2 as httpx

    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    body = {"model": "tts-1", "voice": "alloy", "input": STREAMED}
    body |= {"response_format": "pcm", "stream_format": "sse"}
    # Bytes a second: far slower than the audio is made (its events are base64), on a busy
    # machine too (there, at 128 kB/s, Triton stopped with 56 % read; at 64 kB/s: 21 %).
    rate = 64_000
    try:
        launcher.wait_ready()
        triton_pid = launcher.triton_pid()
        received, read_when_triton_stopped = bytearray(), None
        with httpx.stream(
            "POST", f"{launcher.url}/v1/audio/speech", json=body, timeout=120
        ) as response:
            paused, looked = False, 0.0
            for chunk in response.iter_bytes():
                if not received:
                    launcher.process.send_signal(signal.SIGTERM)
                received += chunk
                time.sleep(len(chunk) / rate)
                if not paused and time.monotonic() - looked > 0.25:
                    looked = time.monotonic()
                    if "launcher: stopping tritonserver" in launcher.log():
                        # The gateway and the front door have stopped. Read nothing until
                        # Triton has stopped too and the launcher has looked at the edge:
                        # Triton's stop took 3 s on a busy machine, long enough for this
                        # reader to drain the edge at 64 kB/s before the launcher looked.
                        paused = True
                        settled(lambda: alive(triton_pid), lambda up: not up, 60)
                        settled(launcher.log, lambda log: "edge is still sending" in log)
                if read_when_triton_stopped is None and not alive(triton_pid):
                    read_when_triton_stopped = len(received)
        code = launcher.process.wait(60)
    finally:
        launcher.close()
    log = launcher.log()
    # Everything behind the edge had stopped with part of the stream still to be read: what
    # the send buffers on the way hold (64 KiB each, doubled by the kernel: the read-ahead
    # bound, docs/sessions.md; with autotuned buffers most of the stream was in them).
    assert read_when_triton_stopped is not None
    unread = len(received) - read_when_triton_stopped
    print(f"\nunread when Triton stopped: {unread} of {len(received)}")
    assert unread > 100_000, (read_when_triton_stopped, len(received))
    events = [line for line in received.decode().splitlines() if line]
    assert json.loads(events[-1][6:])["type"] == "speech.audio.done", events[-1][:200]
    assert code == 0, log[-3000:]
    assert "the edge is still sending to clients" in log, log[-3000:]


def test_a_second_sigint_stops_make_serve_at_once(exported_repository, tmp_path):
    """Ctrl-C waits for the streams in flight (it says so, and for how long); Ctrl-C again
    stops everything at once and leaves nothing behind."""
    from tts_client import TTSClient

    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    streaming = threading.Event()

    def stream() -> None:
        with TTSClient(f"grpc://127.0.0.1:{launcher.grpc}", timeout=120) as client:
            try:
                for _chunk in client.stream(PARAGRAPH * 10):
                    streaming.set()
            except Exception:  # cut by the stop: what this test is about
                pass

    try:
        launcher.wait_ready()
        triton_pid, shm_prefix = launcher.triton_pid(), launcher.shm_prefix()
        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        assert streaming.wait(60), launcher.log()[-3000:]
        launcher.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while "SIGINT, stopping" not in launcher.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert launcher.process.poll() is None  # still draining the stream
        asked = time.monotonic()
        launcher.process.send_signal(signal.SIGINT)
        code = launcher.process.wait(30)
        took = time.monotonic() - asked
    finally:
        launcher.close()
    log = launcher.log()
    said = "SIGINT, stopping: requests and streams in flight get up to 30 s to finish at the"
    assert said in log, log[-3000:]
    assert "SIGINT again: stopping now" in log, log[-3000:]
    assert code == 128 + signal.SIGINT and took < 15, (code, took)
    assert not os.path.exists(f"/proc/{triton_pid}") or not stubs_of(triton_pid)
    assert regions(shm_prefix) == set()


def test_a_stream_cut_at_the_drain_limit_ends_with_an_error_event(server, tmp_path_factory):
    """An SSE stream still running when the gateway's drain time ran out got
    neither a done nor an error event. Now it ends with an error event, and the gateway exits."""
    import json

    import httpx2 as httpx

    from tests.support.gateway import gateway_on

    gateway = gateway_on(server, tmp_path_factory, "--max-input-chars=20000", "--drain-s=2")
    gateway.start()
    try:
        body = {"model": "tts-1", "voice": "alloy", "input": PARAGRAPH * 4}
        body |= {"response_format": "pcm", "stream_format": "sse"}
        url = f"{gateway.url}/v1/audio/speech"
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            events = []
            for line in response.iter_lines():
                if line:
                    events.append(json.loads(line[6:]))
                    if len(events) == 1:  # the stream is running: stop the gateway
                        gateway.process.send_signal(signal.SIGTERM)
        code = gateway.process.wait(60)
    finally:
        gateway.stop()
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error", events[-1]
    assert "shutting down" in events[-1]["error"]["message"]
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert code in (0, -signal.SIGTERM), gateway.log_tail()
    assert "Application shutdown complete" in gateway.log_tail()
