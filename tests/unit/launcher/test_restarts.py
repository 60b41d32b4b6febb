"""tts_launcher.restarts: the backoff that never gives up, a kept child started again after
it exits or stops answering, and a stop that escalates to SIGKILL only after its grace."""

from __future__ import annotations

import subprocess
import sys
import time

from tts_launcher.restarts import RestartedChild, RestartPolicy, stop_process


def test_the_backoff_doubles_to_30_s_then_keeps_going_slower_never_giving_up():
    policy = RestartPolicy(max_restarts=5, window_s=600, slow_s=300)
    delays = [policy.next_delay(now) for now in range(0, 80, 10)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 128]  # from the 6th death in 600 s: slower
    assert policy.keeps_dying
    assert "keeps dying" in policy.again(64) and "again in 64 s" in policy.again(64)
    assert [policy.next_delay(100), policy.next_delay(110)] == [256, 300]  # up to slow_s
    patient = RestartPolicy(max_restarts=10)
    assert [patient.next_delay(t) for t in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_deaths_older_than_the_window_are_forgotten():
    policy = RestartPolicy(max_restarts=2, window_s=60)
    assert [policy.next_delay(t) for t in (0, 1, 2)] == [1, 2, 4]
    assert policy.keeps_dying
    assert policy.next_delay(1000) == 1 and not policy.keeps_dying
    assert policy.again(1) == "; starting it again in 1 s"


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_child_that_exits_is_started_again_after_its_backoff():
    started, said = [], []

    def start() -> subprocess.Popen:
        started.append(python("import sys; sys.exit(3)"))
        return started[-1]

    child = RestartedChild("gateway", start, RestartPolicy(), said.append)
    started[0].wait()
    now = time.monotonic()
    child.check(now)
    assert said == ["launcher: gateway exited (3); starting it again in 1 s"]
    child.check(now + 0.5)
    assert len(started) == 1  # not due yet
    child.check(now + 1.0)
    assert len(started) == 2 and child.process is started[1]
    child.stop(5)


def test_a_child_that_stops_answering_is_killed_once_it_had_answered():
    answers = iter([True, False, False])
    said: list[str] = []
    child = RestartedChild(
        "front door",
        lambda: python("import time; time.sleep(60)"),
        RestartPolicy(),
        said.append,
        live=lambda: next(answers),
        hang_s=10,
    )
    first = child.process
    now = time.monotonic()
    child.check(now + 2.5)  # answers
    child.check(now + 5.0)  # silent for 2.5 s: within hang_s
    assert first.poll() is None and said == []
    child.check(now + 20.0)  # silent for 17.5 s since its last answer
    assert first.poll() is not None
    assert said == [  # killed, and its exit seen in the same check: the backoff begins
        "launcher: front door has not answered its liveness probe for 18 s; killing it to "
        "start it again",
        "launcher: front door exited (-9); starting it again in 1 s",
    ]
    child.check(now + 21.0)
    assert child.process is not first and child.process.poll() is None
    child.stop(5)


def test_stop_waits_its_grace_for_a_child_that_ignores_sigterm_then_kills_it():
    stubborn = python(
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('ready', flush=True); time.sleep(60)"
    )
    time.sleep(0.5)
    start = time.monotonic()
    stop_process(stubborn, grace=1.0, kill=False)
    assert stubborn.poll() is None and time.monotonic() - start >= 1.0  # left running
    stop_process(stubborn, grace=0.5)
    assert stubborn.returncode == -9
    polite = python("import time; time.sleep(60)")
    time.sleep(0.3)
    stop_process(polite, grace=5)
    assert polite.returncode == -15
