"""First contact, as a newcomer meets `make serve` with tools no one here wrote: perf_analyzer
over gRPC and HTTP from a cold start and after idling, curl without Accept-Encoding, raw
tritonclient bursts (no retries), the CLI pointed at the wrong port, the start-up banner, and a
restart right after a stop. One launcher (``python -m tts_launcher``, as `make serve` runs
it) for the module, started on half the cores and then given all; its admission window is
shortened so that "after idling" (longer than the window, which forgot everything before)
takes seconds, not a minute."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2 as httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.busy import half_of, halved, pin, process_tree, thread_affinities
from tests.support.launcher import LIGHT_WARMUP, Launcher
from tests.support.metrics import sample
from tests.support.paths import ROOT
from tts_front.sample_texts import SENTENCES

WINDOW_S = 3.0  # the front door's admission window in this module (default 30 s)


@pytest.fixture(scope="module")
def served(exported_repository, tmp_path_factory):
    """The launcher started on half the cores, so its warm-up measures a slower machine than
    the one that then serves (busy before it started: nothing measured then may refuse the
    load that follows), and given all of them once ready."""
    log = tmp_path_factory.mktemp("first-contact") / "launcher.log"
    launcher = Launcher(exported_repository, log, env={"TTS_FRONT_WINDOW_S": str(WINDOW_S)})
    cores = os.sched_getaffinity(0)
    half = half_of(cores)
    pin([launcher.process.pid], half)  # its children inherit it
    try:
        launcher.wait_ready()
        tree = process_tree(launcher.process.pid)
        assert all(os.sched_getaffinity(pid) == half for pid in tree), "not started on half"
        pin(tree, cores)
        yield launcher
    finally:
        launcher.close()


def perf_analyzer(protocol: str, port: int, concurrency: int) -> subprocess.CompletedProcess:
    """The README's perf_analyzer command (no retries, as it always runs), with count windows
    so a busy machine gives slow figures rather than no stable window. A window counts as many
    requests as are in flight: three of them, 48 requests (96 took 20 CPU-seconds more a run)."""
    command = [
        sys.executable, "-m", "perf_analyzer_configs.pa", "-m", "tts",
        "-u", f"localhost:{port}", "-i", protocol,
        "--input-data", "perf_analyzer_configs/tts_mixed.json",
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-mode", "count_windows", "--measurement-request-count", str(concurrency),
        "--stability-percentage", "1000000", "--max-trials", "3",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


def assert_clean(result: subprocess.CompletedProcess) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Throughput:" in result.stdout
    assert "error" not in output.lower().replace("error_count", ""), output[-3000:]


def burst(port: int, n: int) -> list[str]:
    """``n`` concurrent raw tritonclient `tts` requests of medium sentences; their errors."""

    def one(i: int) -> str | None:
        client = grpcclient.InferenceServerClient(f"localhost:{port}")
        text = grpcclient.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[SENTENCES[3 + i % 12].encode()]], dtype=object))
        try:
            client.infer("tts", [text])
            return None
        except grpcclient.InferenceServerException as e:
            return str(e)
        finally:
            client.close()

    with ThreadPoolExecutor(n) as pool:
        return [e for e in pool.map(one, range(n)) if e]


def test_perf_analyzer_over_grpc_from_a_cold_start_has_no_errors(served):
    # The first load this server sees, on twice the cores its warm-up had. It refused the 9th
    # concurrent request before (8 in flight and nothing measured): perf_analyzer rc 99.
    assert_clean(perf_analyzer("grpc", served.grpc, 16))


def test_perf_analyzer_over_http_after_idling_has_no_errors(served):
    # Idle past the admission window (it forgot its measurement before), then perf_analyzer
    # over HTTP, which failed on gzip replies it never asked for.
    time.sleep(WINDOW_S + 1)
    assert_clean(perf_analyzer("http", served.http, 16))


def test_a_burst_after_idling_is_all_served(served):
    # 32 medium sentences take 4-5 s here. Before, a server idle past its window admitted 8 and
    # refused the rest; then one that counted on a rate measured on a busier machine refused
    # 16 (CI). Now nothing is refused without a live rate that says it must be.
    time.sleep(WINDOW_S + 1)
    errors = burst(served.grpc, 32)
    assert errors == [], f"{len(errors)} of 32 refused: {errors[0]}"


def test_on_half_the_cores_after_the_warm_up_normal_load_is_still_served(served):
    """The suite failed on a machine busier than the warm-up had seen: a rate measured once
    refused perf_analyzer at c=16 and bursts (16 of 32 refused: "the wait (about 40.4 s) would
    exceed the 10 s deadline"). Here the server (tritonserver and its stubs) loses half its
    cores after the warm-up; perf_analyzer and 48 concurrent raw requests are all served."""
    with halved(served.triton_pid()) as cores:
        threads = thread_affinities(served.triton_pid())
        assert threads and all(affinity == cores for affinity in threads)
        assert_clean(perf_analyzer("grpc", served.grpc, 16))
        errors = burst(served.grpc, 48)
        assert errors == [], f"{len(errors)} of 48 refused: {errors[0]}"


def test_on_half_the_cores_overload_is_refused_and_what_is_served_makes_its_deadline(served):
    """Open-loop arrivals at three times what half the cores serve (measured first, by a
    closed loop of 16: 8 a second were once far past it, and on a faster CPU they were all
    served in 6 s, so nothing was overloaded), each with a 30 s deadline of its own, raw
    tritonclient without retries: every request is served in time or refused with
    UNAVAILABLE; none runs into its deadline. Before, 32 in flight took 10 s on 2 busy cores,
    and requests that took the last free slots, or a slot at the start of a busy spell, missed
    their deadlines (DEADLINE_EXCEEDED: computed for nothing, and the client waited all of
    it): the unit tests of admission hold those causes. Here 30 s, not 10: a full batch is
    never refused, and on one core beside the rest of the suite one batch took over 10 s (at
    20 s and 30 s the old code passed too)."""
    deadline_s = 30.0

    def one(i: int) -> tuple[str, float]:
        client = grpcclient.InferenceServerClient(f"localhost:{served.grpc}")
        text = grpcclient.InferInput("text", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[SENTENCES[3 + i % 12].encode()]], dtype=object))
        start = time.monotonic()
        try:
            client.infer("tts", [text], client_timeout=deadline_s)
            return "served", time.monotonic() - start
        except grpcclient.InferenceServerException as e:
            return str(e.status()), time.monotonic() - start
        finally:
            client.close()

    time.sleep(WINDOW_S + 1)
    with halved(served.triton_pid()):
        with ThreadPoolExecutor(16) as pool:  # what half the cores serve, in sentences a second
            until = time.monotonic() + 6
            counts = pool.map(lambda k: _closed_loop(one, k, until), range(16))
            capacity = sum(counts) / 6
        time.sleep(WINDOW_S + 1)  # (that rate is not the one the open loop is refused by)
        rate = max(8.0, 3 * capacity)
        sent = min(240, int(rate * 12))
        with ThreadPoolExecutor(sent) as pool:
            start, futures = time.monotonic(), []
            for i in range(sent):
                time.sleep(max(0.0, start + i / rate - time.monotonic()))
                futures.append(pool.submit(one, i))
            results = [f.result() for f in futures]
    print(f"\nhalf the cores served {capacity:.1f} sentences/s; sent {sent} at {rate:.1f}/s")
    outcomes = [o for o, _ in results]
    refused = sorted(s for o, s in results if o == "StatusCode.UNAVAILABLE")
    assert set(outcomes) <= {"served", "StatusCode.UNAVAILABLE"}, outcomes
    assert outcomes.count("served") >= 8 and refused, outcomes
    assert refused[len(refused) // 2] < deadline_s / 2, refused  # refused well before


def _closed_loop(one, k: int, until: float) -> int:
    """Requests ``one`` served one after another until ``until``."""
    served = 0
    while time.monotonic() < until:
        served += one(k + served)[0] == "served"
    return served


def test_tritons_own_ports_refuse_inference_around_the_front_door(served):
    """Triton's ports (on its command line, which every local user reads) served inference to
    any local process around admission: three vocoder clients there starved every client of
    the front door. Now they refuse it without the launch's inner key, which only the front
    door and the supervisor hold (the command line shows a placeholder)."""
    arguments = Path(f"/proc/{served.triton_pid()}/cmdline").read_bytes().split(b"\0")
    ports = dict(a.decode().split("=", 1) for a in arguments if a.startswith(b"--"))
    assert b"--grpc-restricted-protocol=inference:tts-inner-key=tts-inner-key-hidden" in arguments
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"Around the door."]], dtype=object))
    inner = grpcclient.InferenceServerClient(f"localhost:{ports['--grpc-port']}")
    latent = grpcclient.InferInput("latent", [1, 192, 4], "FP32")
    latent.set_data_from_numpy(np.zeros((1, 192, 4), np.float32))
    with pytest.raises(grpcclient.InferenceServerException, match="tts-inner-key"):
        inner.infer("vocoder", [latent])
    with pytest.raises(grpcclient.InferenceServerException, match="tts-inner-key"):
        inner.infer("tts", [text])
    url = f"http://127.0.0.1:{ports['--http-port']}"
    body = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["Hi."]}]}
    refused = httpx.post(f"{url}/v2/models/tts/infer", json=body, timeout=30)
    assert refused.status_code == 403 and "tts-inner-key" in refused.text
    assert httpx.get(f"{url}/v2/health/ready", timeout=30).status_code == 200  # probes stay open
    front = grpcclient.InferenceServerClient(f"localhost:{served.grpc}")
    assert front.infer("tts", [text]).as_numpy("audio").size > 10_000  # the door passes it on


def test_a_reply_without_accept_encoding_is_plain_json(served, tmp_path):
    url = f"http://127.0.0.1:{served.http}/v2/models/tts/infer"
    request = {
        "inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["Hello."]}],
        "outputs": [{"name": "audio", "parameters": {"binary_data": False}}],
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    # curl sends no Accept-Encoding unless --compressed: the reply must be plain JSON (the
    # front door's own upstream client asked Triton for gzip and passed that on).
    command = ["curl", "-si", url, "-H", "content-type: application/json"]
    result = subprocess.run([*command, "--data-binary", "@request.json"], capture_output=True,
                            timeout=60, cwd=tmp_path)  # fmt: skip
    head, _, body = result.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"content-encoding" not in head.lower(), head
    assert len(json.loads(body)["outputs"][0]["data"]) > 10_000  # samples, as JSON numbers
    # A client that asks for gzip gets it (Triton's choice for infer replies, passed on).
    asked = httpx.post(url, json=request, headers={"Accept-Encoding": "gzip"}, timeout=60)
    assert asked.headers.get("content-encoding") == "gzip"
    assert len(asked.json()["outputs"][0]["data"]) > 10_000  # httpx inflates it


def test_the_cli_pointed_at_the_gateway_says_what_it_answered(served):
    command = [sys.executable, "-m", "tts_client", "Hello", "--url", served.url, "-o", "/dev/null"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert served.url in result.stderr  # what was reached, named
    assert "not Triton's inference API" in result.stderr
    assert "8080 is the OpenAI-compatible gateway" in result.stderr


def _tts_served(launcher: Launcher) -> float:
    url = f"http://127.0.0.1:{launcher.http}/metrics"
    labels = {"model": "tts", "outcome": "served"}
    return sample(url, "tts_front_requests_total", labels) or 0.0


def test_a_session_that_stops_reading_stops_its_requests(served):
    """Audio nobody reads is not made far ahead: a session given 96 sentences whose client
    reads nothing gets a few pieces made (what the send buffers on the way hold, two ahead),
    then none until it reads again; then it gets every piece. With the kernel's autotuned
    buffers 93 of 128 sentences were made for a client that had stopped reading."""
    import websocket

    text = " ".join(SENTENCES * 8)
    url = served.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    ws = websocket.create_connection(url, timeout=60)
    try:
        ws.send(json.dumps({"type": "session.config", "response_format": "pcm"}))
        before = _tts_served(served)
        ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        counts = [_tts_served(served) - before]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until it holds still for 3 s
            time.sleep(3)
            counts.append(_tts_served(served) - before)
            if counts[-1] == counts[-2] > 0:
                break
        assert counts[-1] == counts[-2], f"still making audio nobody reads: {counts}"
        assert counts[-1] <= 20, f"made for a stopped reader, every 3 s: {counts}"
        pieces = 0
        while True:
            message = ws.recv()
            if isinstance(message, str):
                kind = json.loads(message)["type"]
                pieces += kind == "audio.done"
                if kind == "session.done":
                    break
        # Read again, it got every piece, each made once.
        assert pieces > 96 and _tts_served(served) - before == pieces
    finally:
        ws.close()


def test_the_banner_says_once_where_everything_is(served):
    log = served.log()
    assert log.count("\nready:\n") == 1, log[-3000:]
    banner = log.split("\nready:\n", 1)[1]
    for line in (
        f"http://127.0.0.1:{served.gateway}/\n",
        f"http://127.0.0.1:{served.gateway}/v1\n",
        f"127.0.0.1:{served.grpc} ",
        f"http://127.0.0.1:{served.http} ",
        "warm-up: 48 sentences, 16 at a time",
    ):
        assert line in log, line
    assert ("harmless" in banner) == (not Path("/dev/nvidia0").exists())


# The restarted launcher's --load-budget-s: a load measured at 15-60 s here, beside hogs too.
RESTART_LOAD_BUDGET_S = 90


def test_a_restart_right_after_a_stop_comes_up_on_the_same_ports(served, tmp_path):
    """Last in the module: it stops the module's launcher. Keep-alive connections open at the
    stop leave the ports in TIME_WAIT, which made the next start exit 2 for about a minute."""
    keep_alive = [httpx.Client() for _ in range(3)]
    for client in keep_alive:
        assert client.get(f"http://127.0.0.1:{served.http}/v2/health/ready").status_code == 200
        assert client.get(f"{served.url}/health").status_code == 200
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(60) == 0, served.log()[-3000:]
    # (The warm-up at its lighter setting: the start on the same ports is what is tested. A
    # load that hangs, which Triton 2.51 once did beside two CPU hogs here, is the launcher's
    # to restart (tests/reliability/test_restart.py): within a budget this test waits out.)
    again = Launcher(
        served.repository,
        tmp_path / "again.log",
        [f"--load-budget-s={RESTART_LOAD_BUDGET_S}"],
        ports=served.ports,
        warmup_requests=LIGHT_WARMUP,
    )
    try:
        again.wait_ready(timeout=RESTART_LOAD_BUDGET_S + 120)
        assert "not free" not in again.log()
        assert burst(again.grpc, 4) == []
    finally:
        again.close()
        for client in keep_alive:
            client.close()
