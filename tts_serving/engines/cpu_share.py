"""Whether other processes keep this machine's CPU busy (read through ``psutil``).

Linux shares a busy CPU among runnable threads, not processes: beside other work, a server
that runs one thread per core gets a smaller share than one with a thread per request
(Piper's HTTP server) though it needs fewer cycles per second of audio. A stage that knows
others are busy can run a batch on more single-thread sessions and keep its share; on a quiet
machine those extra threads would only wait on each other (docs/history (notebook), "A busy
machine").

Others' CPU is the machine's busy time less this service's (its processes' user + system
time), over the last second or more. This service is the process tree under
``$TTS_SERVICE_PID`` (the launcher sets it to itself: Triton, its stubs, the front door, the
gateway), else under tritonserver when it is this process's parent (Triton's stub), else this
process alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psutil

SERVICE_PID_ENV = "TTS_SERVICE_PID"
# Over this many cores taken by other processes, they count as busy (a benchmark's or a
# proxy's client side stays well under it); under half of it, quiet again (no flapping).
OTHERS_BUSY_CORES = 0.5
# The shortest window others' CPU is averaged over: one scheduler tick is 1/100 s.
WINDOW_S = 1.0
# A window this many times longer is stale: no batch asked during it, so this service was idle.
STALE_WINDOWS = 3

# (the machine's busy CPU seconds, this service's CPU seconds), both since some fixed time.
Sample = Callable[[], tuple[float, float]]


def machine_busy_seconds() -> float:
    """CPU seconds every core spent running anything since boot: user, nice, system, irq and
    softirq (not idle, I/O wait or time a hypervisor stole, which no thread count wins)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def tree_seconds(root: int) -> float:
    """CPU seconds (user + system, all threads) of ``root`` and every process below it;
    0 once ``root`` is gone."""
    try:
        top = psutil.Process(root)
        processes = [top, *top.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended between the listing and now
            continue
        total += times.user + times.system
    return total


def service_root() -> int:
    """The pid whose process tree is this service (the module docstring says which)."""
    given = os.environ.get(SERVICE_PID_ENV, "")
    if given.isdigit() and psutil.pid_exists(int(given)):
        return int(given)
    try:
        if psutil.Process(os.getppid()).name() == "tritonserver":
            return os.getppid()
    except psutil.Error:
        pass
    return os.getpid()


class CpuShare:
    """``others_busy()``: whether processes outside this service took more than
    ``threshold`` cores over the last window of ``window_s`` to ``STALE_WINDOWS`` times that
    (and, once they did, until they take under half of it); after a longer gap the state
    stays until a new window ends. Each listener (``listen``) hears each turn as
    ``(busy, others_cores)``; each ``failed`` listener hears the first of a run of failed
    readings (the state then stays as it was, so batches keep their lanes).

    A due window is read on a thread of its own (``background``; listing the tree takes a
    few milliseconds) and the caller goes on with the state it had: a batch never waits for
    it. ``sample`` replaces the reading (tests)."""

    def __init__(
        self,
        root: int | None = None,
        threshold: float = OTHERS_BUSY_CORES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        sample: Sample | None = None,
        background: bool = True,
    ) -> None:
        self.root = service_root() if root is None else root
        self.threshold = threshold
        self.window_s = window_s
        self.clock = clock
        self.listeners: list[Callable[[bool, float], None]] = []
        self.failure_listeners: list[Callable[[str], None]] = []
        self.failing = False
        self.sample = sample or (lambda: (machine_busy_seconds(), tree_seconds(self.root)))
        self.others_cores = 0.0
        self.busy = False
        self._lock = threading.Lock()
        self._reader = ThreadPoolExecutor(1, "cpu-share") if background else None
        self._reading = False
        self._last = (clock(), *self.sample())

    def listen(
        self,
        listener: Callable[[bool, float], None],
        failed: Callable[[str], None] | None = None,
    ) -> None:
        """``listener(busy, others_cores)`` hears each turn from now on; ``failed(message)``
        the first failure of each run of failed readings."""
        self.listeners.append(listener)
        if failed is not None:
            self.failure_listeners.append(failed)

    def others_busy(self) -> bool:
        """The state now; starts reading a new window when one is due."""
        with self._lock:
            due = self.clock() - self._last[0] >= self.window_s and not self._reading
            self._reading = self._reading or due
        if due:
            if self._reader is None:
                self._read()
            else:
                self._reader.submit(self._read)
        return self.busy

    def _read(self) -> None:
        try:
            self._read_window()
            self.failing = False
        except Exception as exc:  # on the reader's thread nobody else would ever see it
            if not self.failing:
                self.failing = True
                message = (
                    f"reading the machine's CPU share failed ({type(exc).__name__}: {exc}); "
                    "batches keep the lanes they have"
                )
                for failed in self.failure_listeners:
                    failed(message)
        finally:
            with self._lock:
                self._reading = False

    def _read_window(self) -> None:
        now, machine, ours = self.clock(), *self.sample()
        then, machine_then, ours_then = self._last
        self._last = (now, machine, ours)
        if now - then >= STALE_WINDOWS * self.window_s:
            # An idle stretch (another server's turn, say) says nothing of now: the window
            # starts again here and the state stays.
            return
        others = (machine - machine_then) - (ours - ours_then)
        self.others_cores = max(0.0, others / (now - then))
        was = self.busy
        self.busy = self.others_cores > (self.threshold / 2 if was else self.threshold)
        if self.busy != was:
            for listener in self.listeners:
                listener(self.busy, self.others_cores)


_PROCESS_SHARE: CpuShare | None = None


def process_share() -> CpuShare:
    """The one CpuShare of this process: each model copy in it asks the same one, so the
    tree is read once a window however many ask."""
    global _PROCESS_SHARE
    if _PROCESS_SHARE is None:
        _PROCESS_SHARE = CpuShare()
    return _PROCESS_SHARE
