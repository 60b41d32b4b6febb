"""kill -9 of tritonserver itself under `make serve`: the launcher starts it again, the gateway
answers 502/503 meanwhile (never hangs), service is back without a manual step, the dead
server's /dev/shm regions are removed and its stubs ended, and SIGTERM still ends everything
with exit 0."""

from __future__ import annotations

import os
import shutil
import signal
import time

import httpx2 as httpx

from tests.support.launcher import LIGHT_WARMUP, Launcher, alive
from tts_launcher.liveness import LIVE_PATH
from tts_triton.probes import python_models, stubs_by_model


def probe_liveness(launcher: Launcher, triton_live: set, launcher_live: set) -> None:
    """One answer of each liveness probe, added to its set: Triton's through the front door
    (as the kubelet probed it) and the launcher's own /live (as it probes now,
    deploy/base/deployment.yaml). Status codes, or the names of the errors."""
    for url, seen in (
        (f"http://127.0.0.1:{launcher.http}/v2/health/live", triton_live),
        (f"http://127.0.0.1:{launcher.supervisor_metrics}{LIVE_PATH}", launcher_live),
    ):
        try:
            seen.add(httpx.get(url, timeout=5).status_code)
        except httpx.HTTPError as e:
            seen.add(type(e).__name__)


def probe_until_served(launcher: Launcher, since: float, *live: set) -> set:
    """The gateway's answers to a speech request, every 0.5 s until one is served (at most 120 s
    after ``since``), the liveness probes beside each (:func:`probe_liveness`)."""
    body = {"model": "tts-1", "voice": "alloy", "input": "Back again.", "response_format": "wav"}
    statuses: set = set()
    while time.monotonic() - since < 120:
        probe_liveness(launcher, *live)
        try:
            response = httpx.post(f"{launcher.url}/v1/audio/speech", json=body, timeout=30)
            statuses.add(response.status_code)
            if response.status_code == 200:
                break
        except httpx.HTTPError as e:  # (the gateway itself stays up; this would be a bug)
            statuses.add(type(e).__name__)
        time.sleep(0.5)
    return statuses


def test_a_killed_tritonserver_is_started_again(exported_repository, tmp_path):
    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    try:
        launcher.wait_ready()
        # The autoscaler's rule counts this pod's queue time from 2 minutes after this moment
        # (the front door's warm-up done): set once, and not again by a restart in place.
        since = launcher.supervisor_metric("tts_serving_since_timestamp_seconds")
        assert 0 < since <= time.time(), since
        old = launcher.triton_pid()
        regions: dict[int, str] = {}
        stubs_by_model(old, python_models(exported_repository), regions)
        assert regions
        triton_live: set = set()
        launcher_live: set = set()
        os.kill(old, signal.SIGKILL)
        killed = time.monotonic()
        # Probed from the kill on: a new tritonserver answers /v2/health/live within a second
        # of its start, before its models load, so a busy machine that probed only after the
        # launcher's "starting it again" could see Triton's liveness never fail.
        while "starting it again" not in launcher.log():
            probe_liveness(launcher, triton_live, launcher_live)
            assert time.monotonic() - killed < 60, launcher.log()[-3000:]
            time.sleep(0.1)
        # By the time the launcher restarts it, the dead server's stubs are ended, not left to
        # init (they were seen alive for minutes).
        left = [pid for pid in regions if alive(pid)]
        statuses = probe_until_served(launcher, killed, triton_live, launcher_live)
        back = time.monotonic() - killed
        new = launcher.triton_pid()
        log = launcher.log()
        print(f"\nback after {back:.1f} s; answers meanwhile: {sorted(map(str, statuses))}")
        assert 200 in statuses and new != old, log[-3000:]
        assert statuses <= {200, 502, 503}, statuses
        # Triton's liveness failed while it was restarted in place; the launcher's never did.
        assert triton_live - {200} and launcher_live == {200}, (triton_live, launcher_live)
        assert "tritonserver exited (-9); starting it again" in log
        assert launcher.supervisor_metric("tts_supervisor_server_restarts_total") == 1
        assert launcher.supervisor_metric("tts_serving_since_timestamp_seconds") == since
        for region in regions.values():
            assert not os.path.exists(f"/dev/shm/{region}"), region
        # Gone before the restart: ended by the launcher ("ended N stub(s) of the dead
        # tritonserver"), or by themselves when they saw their server die first (a busy
        # fresh-clone run had no stub left to end, so the line is not asserted).
        assert not left, (left, log[-3000:])
        launcher.process.send_signal(signal.SIGTERM)
        assert launcher.process.wait(120) == 0, launcher.log()[-3000:]
    finally:
        launcher.close()


# A model whose first load never ends (its stub's initialize sleeps), and whose next one does.
STUCK_CONFIG = """name: "stuck_once"
backend: "python"
max_batch_size: 0
input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]
output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""
STUCK_MODEL = """import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        marker = Path(__file__).with_name("loaded_once")
        if not marker.exists():
            marker.touch()
            time.sleep(3600)

    def execute(self, requests):
        raise NotImplementedError
"""


# Short, so the test is quick; an ordinary load took 10-20 s here beside other test files.
LOAD_BUDGET_S = 30


def test_a_tritonserver_whose_load_hangs_is_started_again(exported_repository, tmp_path):
    """A model load that never ends (once, on a busy machine, the vocoder's stub had finished
    its initialize and Triton never marked it loaded) leaves `make serve` not ready for good:
    the launcher kills the tritonserver that is not ready within --load-budget-s and starts it
    again, and the service comes up without a manual step."""
    repository = tmp_path / "model_repository"
    shutil.copytree(exported_repository, repository, ignore=shutil.ignore_patterns("__pycache__"))
    stuck = repository / "stuck_once"
    (stuck / "1").mkdir(parents=True)
    (stuck / "config.pbtxt").write_text(STUCK_CONFIG)
    (stuck / "1" / "model.py").write_text(STUCK_MODEL)
    launcher = Launcher(
        repository,
        tmp_path / "launcher.log",
        [f"--load-budget-s={LOAD_BUDGET_S}"],
        warmup_requests=LIGHT_WARMUP,
    )
    try:
        launcher.wait_ready()
        log = launcher.log()
        kills = log.count(f"tritonserver is not ready {LOAD_BUDGET_S} s after its start")
        assert kills >= 1, log[-3000:]
        assert "tritonserver exited (-9); starting it again" in log, log[-3000:]
        # Every kill is a restart the metric counts. The stuck load is the first; a CI machine
        # that ran two test files beside it once took longer than the budget for the second,
        # ordinary load too, and that load was killed and started again as well: the launcher
        # doing its job with a short budget, so the count follows the log.
        restarts = launcher.supervisor_metric("tts_supervisor_server_restarts_total")
        assert restarts == kills, (restarts, kills, log[-3000:])
        body = {
            "model": "tts-1",
            "voice": "alloy",
            "input": "Loaded at last.",
            "response_format": "wav",
        }
        response = httpx.post(f"{launcher.url}/v1/audio/speech", json=body, timeout=60)
        assert response.status_code == 200 and response.content[:4] == b"RIFF", response.text
        launcher.process.send_signal(signal.SIGTERM)
        assert launcher.process.wait(120) == 0, launcher.log()[-3000:]
    finally:
        launcher.close()
