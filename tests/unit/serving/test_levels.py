"""tts_serving.levels: the interactive count shared by processes, and the gate of bulk calls."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import onnxruntime as ort
import pytest

from tts_serving.levels import Gate, InteractiveCount


def child_holding(path, n: int) -> subprocess.Popen:
    """Another process in the count, with ``n`` interactive requests, until its stdin ends."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tts_serving.levels import InteractiveCount
        count = InteractiveCount(Path({str(path)!r}))
        count.add({n})
        print(count.slot, flush=True)
        sys.stdin.read()
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    child.slot = int(child.stdout.readline())
    return child


def test_processes_share_the_total_each_in_its_own_slot(tmp_path):
    path = tmp_path / "count"
    mine = InteractiveCount(path)
    mine.add(2)
    child = child_holding(path, 3)
    try:
        assert child.slot != mine.slot
        assert mine.total() == 5
        mine.clear_dead()  # a live process's count stays
        assert mine.total() == 5
    finally:
        child.communicate("")
    assert mine.total() == 5  # until the dead one's slot is looked at
    mine.clear_dead()
    assert mine.total() == 2
    mine.add(-2)
    mine.close()
    assert not path.exists()  # the last one out removes the file


def test_the_file_stays_while_another_process_takes_part(tmp_path):
    path = tmp_path / "count"
    child = child_holding(path, 0)
    try:
        mine = InteractiveCount(path)
        mine.close()
        assert path.exists()
    finally:
        child.communicate("")


class FakeCount:
    def __init__(self) -> None:
        self.value = 0
        self.cleared = 0

    def total(self) -> int:
        return self.value

    def clear_dead(self) -> None:
        self.cleared += 1


def test_a_bulk_call_waits_for_interactive_work_to_end():
    count = FakeCount()
    count.value = 1
    gate = Gate(count, poll_s=0.001)
    started = threading.Event()
    result: list = []

    def call(options: ort.RunOptions) -> str:
        started.set()
        return "done"

    thread = threading.Thread(target=lambda: result.append(gate.run(call)))
    thread.start()
    try:
        assert not started.wait(0.2)  # held back while interactive work is in the server
        count.value = 0
        thread.join(5)
        assert result == ["done"]
    finally:
        gate.close()


def test_a_bulk_call_starts_only_once_interactive_work_was_gone_for_the_hold():
    """Between an interactive request's stages the count is 0 for a moment: a bulk call
    started then would be stopped at once, so bulk waits until none was seen for ``hold_s``."""
    count = FakeCount()
    gate = Gate(count, poll_s=0.001, hold_s=1.0, max_wait_s=30.0)
    starts: list[float] = []

    def call(options: ort.RunOptions) -> str:
        starts.append(time.monotonic())
        return "done"

    try:
        assert gate.run(call) == "done"  # none seen since the gate began: no hold
        count.value = 1
        thread = threading.Thread(target=lambda: gate.run(call))
        thread.start()
        time.sleep(0.1)
        count.value = 0  # the request moves on to its next stage
        time.sleep(0.1)
        assert len(starts) == 1  # gone for less than the hold: still held
        thread.join(5)
        assert len(starts) == 2 and starts[1] - gate.last_seen >= 1.0
    finally:
        gate.close()


def test_a_running_bulk_call_is_stopped_when_interactive_work_comes_and_run_again():
    count = FakeCount()
    gate = Gate(count, poll_s=0.001)
    runs: list[str] = []
    first_running = threading.Event()

    def call(options: ort.RunOptions) -> str:
        if not runs:  # the first run lasts until stopped, as a long ONNX Runtime call
            runs.append("stopped")
            first_running.set()
            deadline = time.monotonic() + 10
            while not options.terminate:
                assert time.monotonic() < deadline, "never stopped"
                time.sleep(0.001)
            raise RuntimeError("Exiting due to terminate flag being set to true.")
        runs.append("whole")
        return "audio"

    result: list = []
    thread = threading.Thread(target=lambda: result.append(gate.run(call)))
    thread.start()
    try:
        assert first_running.wait(5)
        count.value = 1  # an interactive request arrives somewhere in the server
        time.sleep(0.1)
        assert runs == ["stopped"]  # stopped, and not run again while it is there
        count.value = 0
        thread.join(5)
        assert result == ["audio"] and runs == ["stopped", "whole"]
        assert gate.stopped_calls == 1
    finally:
        gate.close()


def test_bulk_work_kept_out_for_its_longest_wait_runs_a_starved_batch_to_its_end():
    """One light client's closed loop kept interactive work in the server all the time, and
    long-text streams got nothing after their first chunks for 120 s: bulk work waits at most
    ``max_wait_s`` for a turn, then its calls start at once and are not stopped."""
    count = FakeCount()
    count.value = 1  # interactive work all the while
    gate = Gate(count, poll_s=0.001, max_wait_s=0.2)
    try:
        started = time.monotonic()
        assert gate.wait_turn() is True and gate.starved_turns == 1
        assert 0.2 <= time.monotonic() - started < 2
        ran: list[bool] = []

        def call(options: ort.RunOptions) -> str:
            time.sleep(0.05)  # the watcher looks meanwhile
            ran.append(bool(options.terminate))
            return "audio"

        with gate.starved_batch():
            assert gate.run(call) == "audio"
        assert ran == [False] and gate.stopped_calls == 0
        # A call the worker began in a lull, kept out (stopped or waiting) for max_wait_s
        # since: run whole too.
        assert gate.run(call) == "audio" and gate.starved_turns == 2 and ran == [False, False]
        count.value = 0  # no interactive work: a turn at once, not starved
        time.sleep(0.01)
        assert gate.wait_turn() is False and gate.starved_turns == 2
    finally:
        gate.close()


def test_an_error_that_is_no_stop_is_raised():
    gate = Gate(FakeCount())
    try:

        def call(options: ort.RunOptions):
            raise ValueError("bad input")

        with pytest.raises(ValueError, match="bad input"):
            gate.run(call)
        assert gate.stopped_calls == 0
    finally:
        gate.close()


def test_a_count_left_by_a_server_that_is_gone_is_removed(tmp_path):
    import os

    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    for name in (f"tts-levels-{gone.pid}", f"tts-levels-{os.getppid()}", "tts-levels-x"):
        (tmp_path / name).write_bytes(bytes(8))
    count = InteractiveCount(tmp_path / f"tts-levels-{os.getpid()}")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(
        [f"tts-levels-{os.getppid()}", f"tts-levels-{os.getpid()}", "tts-levels-x"]
    )
    count.close()


def _take_part_then_leave(path, barrier) -> None:
    count = InteractiveCount(path)
    barrier.wait()  # every process takes part before any leaves
    barrier.wait()
    count.close()


def test_the_last_of_processes_leaving_at_once_removes_the_count(tmp_path):
    """Stage processes that stop at the same moment (a server's shutdown): one of them removes
    the file. Each holding its own slot while it tried for the whole file, two found each other
    there and both left it behind (a full test run saw it)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for round_ in range(50):
        path = tmp_path / f"tts-levels-{round_}"
        barrier = context.Barrier(3)
        processes = [
            context.Process(target=_take_part_then_leave, args=(path, barrier)) for _ in range(3)
        ]
        for p in processes:
            p.start()
        for p in processes:
            p.join(30)
            assert p.exitcode == 0
        assert not path.exists(), f"left behind in round {round_}"
