"""The security review's probes of the launcher's supervision (the
front door's own are in test_attack.py): a hung front door is killed and started again while
Triton keeps serving; a process named like a stub, not a child of tritonserver, is not one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.support.launcher import LIGHT_WARMUP, Launcher, alive, served_by
from tts_triton.probes import stubs_by_model

BOUND_S = 30  # far over the time a process takes to show its new name


def test_a_process_named_like_a_stub_is_not_one(tmp_path):
    """The probe: a local user's process named like a `tts_stream` stub (argv[0] and the
    model path), exiting, ended real streams as if their stub had died."""
    script = tmp_path / "fake" / "tts_stream" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time\ntime.sleep(60)\n")
    fake = subprocess.Popen(
        ["bash", "-c", f'exec -a /opt/tritonserver/backends/python/triton_python_backend_stub '
         f'{sys.executable} {script} prefix_tts_stream_fake']
    )  # fmt: skip
    try:
        deadline = time.monotonic() + BOUND_S
        while b"triton_python_backend_stub" not in open(f"/proc/{fake.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Its parent is this test, not a tritonserver: it is nobody's stub.
        assert fake.pid not in stubs_by_model(None, ["tts_stream"])["tts_stream"]
        assert (
            fake.pid not in stubs_by_model(None, ["tts_stream"], shm_prefix="prefix")["tts_stream"]
        )
    finally:
        fake.kill()
        fake.wait()


def front_pid(launcher: Launcher) -> int:
    for pid in launcher.children():
        try:
            if b"tts_front" in open(f"/proc/{pid}/cmdline", "rb").read():
                return pid
        except OSError:
            continue
    raise AssertionError("no front door among the launcher's children")


def test_a_hung_front_door_is_restarted_and_triton_keeps_serving(exported_repository, tmp_path):
    """SIGSTOP to the front door (the probe: every client hung for as long as it lasted): the
    launcher's liveness probe kills it and starts another; tritonserver is the same process."""
    launcher = Launcher(
        exported_repository, tmp_path / "launcher.log", warmup_requests=LIGHT_WARMUP
    )
    try:
        launcher.wait_ready()
        triton, hung = launcher.triton_pid(), front_pid(launcher)
        os.kill(hung, signal.SIGSTOP)
        deadline = time.monotonic() + 120
        while alive(hung):
            assert time.monotonic() < deadline, launcher.log()[-3000:]
            time.sleep(0.5)
        assert "has not answered its liveness probe" in launcher.log()
        launcher.wait_ready()
        assert served_by(f"grpc://127.0.0.1:{launcher.grpc}") > 0.3
        assert launcher.triton_pid() == triton and front_pid(launcher) != hung
        # The new one served at once: no second warm-up (Triton's engines were warm).
        assert launcher.log().count("front: warm-up: off") == 1, launcher.log()[-3000:]
        hung_total = launcher.supervisor_metric("tts_supervisor_child_restarts_total")
        assert hung_total >= 1
        launcher.process.send_signal(signal.SIGTERM)
        assert launcher.process.wait(120) == 0, launcher.log()[-3000:]
    finally:
        launcher.close()
