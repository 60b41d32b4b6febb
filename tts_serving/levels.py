"""Two levels of work on one CPU: interactive work first, bulk work on the time it leaves.

A stage with ``scheduling: levels`` runs the requests the front door sends at the bulk level
(``tts_wire.BULK_PARAMETER``) on its own worker. Bulk work runs only while no interactive
request is anywhere in the server's stages (any stage process): an ONNX Runtime call of bulk
work is stopped as soon as one arrives (``RunOptions.terminate``: within a few milliseconds)
and run again, whole, once none has been seen for ``HOLD_S``. So an interactive request
waits for no running batch at any stage and has the cores to itself, and a flood sent at the
bulk level cannot slow it; what that costs is the stopped calls' work. Bulk work is never shut
out for good: kept out for ``MAX_BULK_WAIT_S``, a short batch of it runs to its end beside the
interactive work (one light client's closed loop of sentences had stalled every long-text
stream after its first chunk). (Threads on
``SCHED_IDLE`` were tried first: a bulk thread the kernel parked while it held the Python GIL
stalled the stage's interactive work behind it.)

The count of interactive requests is shared by the server's stage processes through a small
file in /dev/shm: one slot per process, claimed with a lock that ends with the process.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil

SLOTS = 64  # stage processes (instances) one server can have taking part
POLL_S = 0.001  # how often the gate looks at the count
CLEAR_EVERY = 500  # polls a bulk call waits between looks for ended processes' counts
# Bulk calls start only once no interactive work has been seen for this long. An interactive
# request leaves the count between its stages (and its client's next request comes a moment
# later): a bulk call started in that gap is stopped within milliseconds, its work lost, and
# it took the cores the request's next hop needed. Beside two CPU hogs a bystander beside a
# flood went from 1.4-3.2x its quiet p50 to 1.1-1.5x (docs/performance.md, 0.9.8).
HOLD_S = 0.015
# Bulk work waits at most this long for a turn: then a short batch of it (a few items) runs to
# its end beside interactive work. Without it one light client's closed loop of sentences kept
# interactive work in the server all the time, and 16 long-text streams got no audio after their
# first chunks for 120 s, until the gateway cut every one.
MAX_BULK_WAIT_S = 1.0


COUNT_PREFIX = "tts-levels-"


def count_path(server_pid: int | None = None) -> Path:
    """The count's file for the tritonserver whose stub processes we are (their parent)."""
    return Path("/dev/shm") / f"{COUNT_PREFIX}{server_pid or os.getppid()}"


def remove_stale_counts(folder: Path) -> list[Path]:
    """Remove the count files of servers that are gone (the last stage process removes its
    server's file when it closes, but a killed stub never closes). Returns what it removed."""
    removed = []
    for path in folder.glob(f"{COUNT_PREFIX}*"):
        pid = path.name.removeprefix(COUNT_PREFIX)
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass  # another stage process removed it first
    return removed


class InteractiveCount:
    """Interactive requests in the server's stages: this process's slot, everyone's total."""

    def __init__(self, path: Path) -> None:
        self.path = path
        remove_stale_counts(path.parent)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self.fd).st_size < 8 * SLOTS:
            os.ftruncate(self.fd, 8 * SLOTS)
        self.map = mmap.mmap(self.fd, 8 * SLOTS)
        self.values = np.frombuffer(self.map, dtype=np.int64)
        self.slot = self._claim()
        self.values[self.slot] = 0  # a dead process's count ended with it
        self.lock = threading.Lock()

    def _claim(self) -> int:
        for slot in range(SLOTS):
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 8 * slot)
                return slot
            except OSError:
                continue
        raise RuntimeError(f"more than {SLOTS} stage processes share {self.path}")

    def add(self, n: int) -> None:
        with self.lock:
            self.values[self.slot] += n

    def total(self) -> int:
        return int(self.values.sum())

    def clear_dead(self) -> None:
        """Zero the slots of processes that ended (a crashed stage's count would otherwise
        hold every bulk call back): a slot whose lock can be taken has no process."""
        for slot in np.flatnonzero(self.values):
            if slot == self.slot:
                continue
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8, 8 * int(slot))
            except OSError:
                continue  # held: its process lives
            self.values[slot] = 0
            fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 8 * int(slot))

    def close(self) -> None:
        """Leave the count; the last process to leave removes its file. Each lets go of its
        own slot before it tries for the whole file: holding it, two that left at once each
        found the other there, and both left the file behind."""
        self.values[self.slot] = 0
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 8, 8 * self.slot)
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 8 * SLOTS, 0)
            os.unlink(self.path)
        except OSError:
            pass  # another process still takes part
        self.values = np.zeros(0, np.int64)  # no view of the map left, so it may close
        self.map.close()
        os.close(self.fd)


class Gate:
    """Lets bulk calls run only once ``count`` has been 0 for ``hold_s``, and stops the
    running ones when it rises (their callers run them again once it is 0 again)."""

    def __init__(
        self,
        count: InteractiveCount,
        poll_s: float = POLL_S,
        hold_s: float = HOLD_S,
        max_wait_s: float = MAX_BULK_WAIT_S,
    ) -> None:
        self.count = count
        self.poll_s = poll_s
        self.hold_s = hold_s
        self.max_wait_s = max_wait_s
        self.unstoppable = 0  # > 0: a starved batch runs; its calls start at once, none stopped
        self.starved_turns = 0  # turns bulk took after waiting max_wait_s
        self.running: set[ort.RunOptions] = set()
        self.lock = threading.Lock()
        self.busy = threading.Event()  # a bulk call runs: the watcher looks (else it sleeps)
        self.stopped_calls = 0  # calls stopped for interactive work (each run again)
        self.closing = threading.Event()
        self.last_seen = float("-inf")  # when interactive work was last seen in the server
        self.watcher = threading.Thread(target=self._watch, name="bulk-gate", daemon=True)
        self.watcher.start()

    def wait_turn(self) -> bool:
        """Wait until bulk work may start: no interactive work for ``hold_s`` (False), or
        ``max_wait_s`` gone by without that (True: starved; run a short batch in
        :meth:`starved_batch`)."""
        return self._wait(time.monotonic())

    def _wait(self, since: float) -> bool:
        """Wait until no interactive work has been seen for ``hold_s`` (False; False too when
        closing), or until ``max_wait_s`` has passed since ``since`` (True: starved)."""
        waited = 0
        while not self.closing.is_set():
            now = time.monotonic()
            if self.count.total() > 0:
                self.last_seen = now
            elif now - self.last_seen >= self.hold_s:
                return False
            if now - since >= self.max_wait_s:
                self.starved_turns += 1
                return True
            time.sleep(self.poll_s)
            waited += 1
            if waited % CLEAR_EVERY == 0:
                self.count.clear_dead()
        return False

    @contextmanager
    def starved_batch(self) -> Iterator[None]:
        """Within it, bulk calls start at once and are never stopped (a starved turn)."""
        with self.lock:
            self.unstoppable += 1
        try:
            yield
        finally:
            with self.lock:
                self.unstoppable -= 1

    def run(self, call: Callable[[ort.RunOptions], object]) -> object:
        """``call(run_options)``, started when no interactive work is in the server, again
        after every stop; in a starved batch, or once it has been kept out (waiting or
        stopped) for ``max_wait_s``, at once and to its end."""
        first = time.monotonic()
        while True:
            if self.unstoppable or self._wait(first):
                return call(ort.RunOptions())  # (not in ``running``: the watcher never stops it)
            options = ort.RunOptions()
            with self.lock:
                self.running.add(options)
                self.busy.set()
            try:
                return call(options)
            except Exception:
                if not options.terminate:
                    raise
                self.stopped_calls += 1
            finally:
                with self.lock:
                    self.running.discard(options)
                    if not self.running:
                        self.busy.clear()

    def _watch(self) -> None:
        while not self.closing.is_set():
            self.busy.wait()
            if self.count.total() > 0:
                self.last_seen = time.monotonic()
                with self.lock:
                    for options in self.running:
                        options.terminate = True
            time.sleep(self.poll_s)

    def close(self) -> None:
        self.closing.set()
        self.busy.set()
        self.watcher.join(1)


class GatedSession:
    """An ONNX Runtime session whose every ``run`` goes through ``gate``."""

    def __init__(self, session: ort.InferenceSession, gate: Gate) -> None:
        self.session, self.gate = session, gate

    def run(self, outputs, feeds):
        return self.gate.run(lambda options: self.session.run(outputs, feeds, options))

    def get_inputs(self):
        return self.session.get_inputs()

    def get_providers(self):
        return self.session.get_providers()
