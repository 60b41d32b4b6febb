"""Hardening: each defect found, and the check that it stays fixed.

- the gateway answered 500 for a lone surrogate in `input` and accepted "1.5" and true for
  `speed`; a taken port made the launcher restart the gateway once a second for ever.
- after kill -9 of tritonserver its stubs lived on with parent 1 (test_restart.py checks they
  are gone; here the launcher's orphan handling is checked on a real child)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx2 as httpx
import pytest

from tests.support.launcher import LIGHT_WARMUP, Launcher, alive
from tests.support.paths import ROOT
from tests.support.processes import ServerProcess, free_ports
from tts_client import TTSClient, TTSError
from tts_launcher.restarts import RestartedChild, RestartPolicy
from tts_triton.probes import STUB, python_models, stubs_by_model

BODY = {"model": "tts-1", "voice": "alloy", "input": "Fine.", "response_format": "pcm"}


def post(gateway, raw: bytes) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/audio/speech",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=60,
    )


def test_a_lone_surrogate_is_a_400_naming_input(gateway):
    raw = b'{"model": "tts-1", "voice": "alloy", "input": "Hi \\ud800 there"}'
    response = post(gateway, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "input" and "lone surrogate" in error["message"]


@pytest.mark.parametrize("speed", ['"1.5"', "true", '"fast"'])
def test_speed_must_be_a_number(gateway, speed):
    raw = b'{"model": "tts-1", "voice": "alloy", "input": "Hi.", "speed": %s}' % speed.encode()
    response = post(gateway, raw)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "speed"


def test_speed_as_a_json_number_is_served_and_honoured(gateway):
    """1 and 1.5 as JSON numbers (integer and float) are served, and 1.5 speaks faster (the
    check passed before with the speed ignored)."""
    lengths = {}
    for speed in ("1", "1.5"):
        raw = (b'{"model": "tts-1", "voice": "alloy", "input": "Hello there, this is a test of '
               b'speed.", "response_format": "pcm", "speed": %s}' % speed.encode())  # fmt: skip
        response = post(gateway, raw)
        assert response.status_code == 200, response.text
        lengths[speed] = len(response.content)
    assert 0.55 < lengths["1.5"] / lengths["1"] < 0.8, lengths


def test_a_taken_port_is_one_clear_line(exported_repository):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "tts_launcher", f"--model-repository={exported_repository}",
             "--http-port=0", "--grpc-port=0", "--metrics-port=0", f"--gateway-port={port}",
             "--supervisor-metrics-port=0", "--wyoming-port=0"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
    # (Every other port on 0: a default one, Wyoming's 10200, was once taken by the compose
    # test's container beside it, and the launcher rightly named both.)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"port {port}" in line and "GATEWAY_PORT" in line, line


def test_the_gateway_on_a_taken_wyoming_port_is_one_clear_line():
    """Taken after the launcher checked it (a second launcher, wyoming-piper), the port made
    the gateway's start-up fail with a lifespan traceback, five times over."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "tts_gateway", "--triton-url=grpc://127.0.0.1:1",
             "--port=1", f"--wyoming-port={port}", "--check-voices=false"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"127.0.0.1:{port}" in line and "WYOMING_PORT" in line, line


class FakeProcess:
    """A child that has exited with ``code``."""

    pid = 1 << 22

    def __init__(self, code: int) -> None:
        self.returncode = code

    def poll(self) -> int:
        return self.returncode


def test_a_gateway_that_keeps_dying_is_restarted_with_backoff_and_never_given_up():
    """Past its budget (3 restarts here) the launcher gave up and stopped everything: six
    crashes in ten minutes were a permanent outage. Now the waits grow and it is tried again,
    with a line that says it keeps dying."""
    said, starts = [], []

    def start():
        starts.append(1)
        return FakeProcess(1)  # dies at once, as on a taken port

    keeper = RestartedChild(
        "the gateway", start, RestartPolicy(max_restarts=3, slow_s=20), said.append
    )
    clock = 0.0
    while clock < 200:
        keeper.check(clock)
        clock += 0.5
    # 1, 2 and 4 s (not every 0.5 s check), then it keeps dying: 8, 16, then every 20 s.
    assert [s.split("again in ")[1] for s in said[:6]] == [
        "1 s",
        "2 s",
        "4 s",
        "8 s",
        "16 s",
        "20 s",
    ]
    assert "it keeps dying" in said[3] and "it keeps dying" not in said[2]
    # Started at 0, 1, 3.5, 8, 16.5, 33, then every 20.5 s (a death is seen at the next check).
    assert len(starts) == 6 + 8


def test_stubs_left_by_a_dead_server_are_ended():
    # A child that stands for tritonserver starts a process named like a stub and dies; as
    # subreaper, this process inherits the orphan, and end_orphans kills and reaps it.
    # The stub's pid is printed once `exec -a` has run (its cmdline then starts with the
    # stub's name): before that, under a loaded machine, the scan could read bash mid-exec.
    # Its output goes nowhere, so a stub left alive cannot hold the test's pipe open.
    code = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen(['bash', '-c', 'exec -a {STUB} sleep 600'],\n"
        "                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "deadline = time.monotonic() + 30\n"
        f"while not open(f'/proc/{{p.pid}}/cmdline', 'rb').read().startswith(b'{STUB}'):\n"
        "    assert time.monotonic() < deadline\n"
        "    time.sleep(0.01)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    script = (
        "import subprocess, sys, os\n"
        "from tts_launcher.stub_healing import become_subreaper, end_orphans\n"
        "assert become_subreaper()\n"
        f"server = subprocess.Popen([sys.executable, '-c', {code!r}], stdout=subprocess.PIPE)\n"
        "stub = int(server.stdout.readline())\n"
        "server.wait()\n"
        "stat = open(f'/proc/{stub}/stat').read()\n"
        "assert int(stat.rsplit(')', 1)[1].split()[1]) == os.getpid(), stat\n"
        "seen = open(f'/proc/{stub}/stat').read(), open(f'/proc/{stub}/cmdline', 'rb').read()\n"
        "killed = end_orphans(keep=set())\n"
        "print('ended', killed == [stub], os.path.exists(f'/proc/{stub}'))\n"
        "print(stub, killed, seen, file=sys.stderr)  # what the scan saw, when this fails\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.stdout.strip() == "ended True False", result.stdout + result.stderr


def test_a_killed_launcher_takes_its_children_with_it(exported_repository, tmp_path):
    # A launcher that dies without its cleanup (kill -9, OOM) left tritonserver serving under
    # init, and the front door and the gateway holding the public ports (a new `make serve`
    # then found them taken); now each gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG).
    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    try:
        launcher.wait_ready()
        triton = launcher.triton_pid()
        children = launcher.children()
        # + the front door, the gateway and the edge (an nginx per public port), whose
        # workers must go too
        assert triton in children and len(children) == 6, children
        for child in list(children):
            found = subprocess.run(["pgrep", "-P", str(child), "nginx"], capture_output=True)
            children += [int(pid) for pid in found.stdout.split()]
        assert len(children) >= 9, children
        launcher.process.kill()
        launcher.process.wait()
        deadline = time.monotonic() + 90  # Triton's own exit takes up to its 30 s timeout
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [pid for pid in children if alive(pid)] == []
    finally:
        launcher.close()


def test_a_crash_loop_leaves_no_shared_memory_behind(exported_repository, tmp_path):
    # A stub that died again before the supervisor's 1 s scan saw it was
    # never recorded, and its region stayed (10 of 12 deaths leaked), even past SIGTERM.
    server = ServerProcess(
        exported_repository, tmp_path / "triton.log", cache_dir=ROOT / ".cache" / "triton",
        supervisor_options={"canary_interval": 0},
    ).start()  # fmt: skip
    try:
        pid = server.process.pid
        (stub,) = stubs_by_model(pid, ["vocoder"])["vocoder"]
        ready = f"http://127.0.0.1:{server.http_port}/v2/models/vocoder/ready"
        for _ in range(4):  # each new stub dies as soon as it serves, well inside the 1 s scan
            os.kill(stub, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                fresh = stubs_by_model(pid, ["vocoder"])["vocoder"] - {stub}
                if fresh and httpx.get(ready, timeout=5).status_code == 200:
                    stub = fresh.pop()
                    break
                time.sleep(0.02)
            else:
                raise AssertionError(f"vocoder did not come back:\n{server.log_tail()}")
        with TTSClient(server.grpc_url, timeout=30) as client:  # healed in the end
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                try:
                    assert client.synthesize("Back.").duration > 0.2
                    break
                except TTSError:
                    time.sleep(0.5)
        living: dict[int, str] = {}
        stubs_by_model(pid, python_models(exported_repository), living)
        assert all(r.startswith(server.shm_prefix) for r in living.values())  # ours alone
        deadline = time.monotonic() + 30  # the supervisor cleans up after its last reload
        while time.monotonic() < deadline:
            left = regions_of(server) - set(living.values())
            if not left:
                break
            time.sleep(0.5)
        assert not left, (left, server.log_tail())
    finally:
        server.stop()
    assert regions_of(server) == set()


def regions_of(server: ServerProcess) -> set[str]:
    """This server's /dev/shm regions (its own name prefix; other servers may be running)."""
    return {name for name in os.listdir("/dev/shm") if name.startswith(server.shm_prefix)}


def test_a_front_door_that_keeps_dying_is_retried_every_30_s_never_given_up():
    """Six crashes of the proxy in 35 s made the launcher stop a healthy
    tritonserver and exit 1."""
    said, starts = [], []

    def start():
        starts.append(1)
        return FakeProcess(1)

    keeper = RestartedChild(
        "the front door", start, RestartPolicy(max_restarts=3, slow_s=30), said.append
    )
    clock = 0.0
    while clock < 100:
        keeper.check(clock)  # the launcher goes on
        clock += 0.5
    assert "it keeps dying" in said[3]
    assert len(starts) == 8  # at 0, 1, 3.5, 8, 16.5, 33, then every 30.5 s (63.5, 94)


def test_a_server_whose_port_is_taken_while_it_loads_starts_on_others(
    exported_repository, tmp_path
):
    """Triton binds its ports once its models are loaded: another test worker's server took
    one meanwhile, its readiness answered for this one, and the admin key check failed: 158
    tests errored in one busy run. A port held by someone else means other free ports."""
    server = ServerProcess(
        exported_repository, tmp_path / "triton.log", cache_dir=ROOT / ".cache" / "triton",
        supervisor_options={"canary_interval": 0},
    )  # fmt: skip
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(20):  # another worker's server may take the chosen port first
            try:
                thief.bind(("0.0.0.0", server.http_port))
                break
            except OSError:
                server.http_port, server.grpc_port, server.metrics_port = free_ports(3)
        chosen = server.http_port
        thief.listen()
        with server:
            assert server.http_port != chosen
            with TTSClient(server.http_url, timeout=60) as client:
                assert client.synthesize("On other ports.").duration > 0.3
