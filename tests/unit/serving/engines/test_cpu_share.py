"""Others' CPU: the machine's busy time less this service's process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import psutil
import pytest

from tts_serving.engines import cpu_share
from tts_serving.engines.cpu_share import STALE_WINDOWS, CpuShare, tree_seconds


class Readings:
    """A ``sample`` for CpuShare: the (machine, service) CPU seconds a test sets."""

    def __init__(self) -> None:
        self.machine = 0.0
        self.service = 0.0

    def __call__(self) -> tuple[float, float]:
        return self.machine, self.service


def test_the_tree_counts_a_child_that_burned_cpu_and_nothing_once_gone():
    burn = "import time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\n"
    child = subprocess.Popen(
        [sys.executable, "-c", burn + "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "done"
        own = psutil.Process().cpu_times()
        # /proc counts in ticks of 0.01 s, the child's clock finer: a tick's slack.
        assert tree_seconds(os.getpid()) - (own.user + own.system) >= 0.28
        assert tree_seconds(child.pid) >= 0.28
    finally:
        child.communicate("")
    assert tree_seconds(child.pid) == 0.0


def test_others_busy_when_the_machine_ran_more_than_this_service():
    now = [0.0]
    readings = Readings()
    heard: list[tuple[bool, float]] = []
    share = CpuShare(
        root=1, threshold=0.5, window_s=1.0, clock=lambda: now[0], sample=readings, background=False
    )
    share.listen(lambda busy, cores: heard.append((busy, cores)))
    # Two seconds: the machine ran 3 CPU seconds, this service 2.5 of them: others 0.25 cores.
    readings.machine, readings.service = 3.0, 2.5
    now[0] = 2.0
    assert not share.others_busy() and share.others_cores == 0.25
    # The next second: 1.9 s, this service 0.4 of them: others 1.5 cores.
    readings.machine, readings.service = 4.9, 2.9
    now[0] = 2.5
    assert not share.others_busy()  # within the window: not read again
    now[0] = 3.0
    assert share.others_busy() and share.others_cores == pytest.approx(1.5)
    # Others at 0.3 cores: still busy (quiet again under half the threshold), then 0.
    readings.machine, readings.service = 5.9, 3.6
    now[0] = 4.0
    assert share.others_busy() and share.others_cores == pytest.approx(0.3)
    now[0] = 5.0
    assert not share.others_busy()
    assert [busy for busy, _ in heard] == [True, False] and heard[0][1] == pytest.approx(1.5)


def test_a_stale_window_says_nothing_of_now():
    now = [0.0]
    readings = Readings()
    share = CpuShare(root=1, window_s=1.0, clock=lambda: now[0], sample=readings, background=False)
    # Ten idle seconds in which another server took 1.5 cores: not read as now.
    readings.machine = 15.0
    now[0] = 10.0
    assert STALE_WINDOWS < 10 and not share.others_busy()
    # The next second, only this service ran: still quiet.
    readings.machine, readings.service = 16.5, 1.5
    now[0] = 11.0
    assert not share.others_busy() and share.others_cores == 0.0


def test_a_due_window_is_read_on_its_own_thread_while_the_caller_goes_on():
    now = [0.0]
    readings = Readings()
    release, reading = threading.Event(), threading.Event()

    def slow() -> tuple[float, float]:
        if now[0] > 0:
            reading.set()
            assert release.wait(10)
        return readings()

    share = CpuShare(root=1, window_s=1.0, clock=lambda: now[0], sample=slow)
    readings.machine, now[0] = 2.0, 1.0  # others took 2 cores
    assert not share.others_busy()  # the state it had: the read is under way
    assert reading.wait(10)
    assert not share.others_busy()  # not a second read while one runs
    release.set()
    for _ in range(1000):
        if share.busy:
            break
        threading.Event().wait(0.01)
    assert share.others_busy() and share.others_cores == 2.0


def test_the_service_is_the_launchers_tree_when_it_says_so(monkeypatch):
    monkeypatch.setenv(cpu_share.SERVICE_PID_ENV, str(os.getppid()))
    assert cpu_share.service_root() == os.getppid()
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    monkeypatch.setenv(cpu_share.SERVICE_PID_ENV, str(gone.pid))  # gone: not this service
    assert cpu_share.service_root() == os.getpid()  # pytest's parent is no tritonserver


def test_a_failed_reading_is_told_once_per_run_of_failures_and_the_state_stays():
    """The reading runs on a thread of its own: an exception there would vanish unheard."""
    now = [0.0]
    readings = Readings()
    broken = [False]

    def sample() -> tuple[float, float]:
        if broken[0]:
            raise PermissionError("/proc/stat: permission denied")
        return readings()

    share = CpuShare(root=1, window_s=1.0, clock=lambda: now[0], sample=sample, background=False)
    told: list[str] = []
    share.listen(lambda busy, cores: None, failed=told.append)
    readings.machine, now[0] = 2.0, 1.0  # others took 2 cores
    assert share.others_busy()
    broken[0] = True
    for t in (2.0, 3.0, 4.0):
        now[0] = t
        assert share.others_busy()  # as it was
    assert told == [
        "reading the machine's CPU share failed (PermissionError: /proc/stat: permission "
        "denied); batches keep the lanes they have"
    ]
    broken[0], now[0] = False, 5.0  # works again; the window since 1.0 is stale
    assert share.others_busy()
    now[0] = 6.0  # others took nothing this second
    assert not share.others_busy()
    broken[0], now[0] = True, 7.0
    share.others_busy()
    assert len(told) == 2  # a new run of failures is told again
