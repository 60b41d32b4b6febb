"""Whether other processes keep this machine's CPU busy, read from ``/proc``.

Linux shares a busy CPU among runnable threads, not processes: beside other work, a server
that runs one thread per core gets a smaller share than one with a thread per request
(Piper's HTTP server) though it needs fewer cycles per second of audio. A stage that knows
others are busy can run a batch on more single-thread sessions and keep its share; on a quiet
machine those extra threads would only wait on each other (docs/performance.md, "A busy
machine").

Others' CPU is the machine's busy time (``/proc/stat``) less this service's (its processes'
``utime + stime``), over the last second or more. This service is the process tree under
``$TTS_SERVICE_PID`` (the launcher sets it to itself: Triton, its stubs, the front door, the
gateway), else under tritonserver when it is this process's parent (Triton's stub), else this
process alone.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

SERVICE_PID_ENV = "TTS_SERVICE_PID"
# Over this many cores taken by other processes, they count as busy (a benchmark's or a
# proxy's client side stays well under it); under half of it, quiet again (no flapping).
OTHERS_BUSY_CORES = 0.5
# The shortest window others' CPU is averaged over: one scheduler tick is 1/100 s.
WINDOW_S = 1.0
# A window this many times longer is stale: no batch read it, so this service was idle.
STALE_WINDOWS = 3
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_ticks(proc: Path = Path("/proc")) -> int:
    """Ticks every core spent running anything since boot: user, nice, system, irq and
    softirq (not idle, I/O wait or time a hypervisor stole, which no thread count wins)."""
    fields = (proc / "stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
    return user + nice + system + irq + softirq


def _stat(pid: int, proc: Path) -> tuple[int, int] | None:
    """(parent pid, utime + stime ticks) of a process, None once it is gone."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The name in parentheses may hold spaces and parentheses; the fields follow the last one.
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def tree_ticks(root: int, proc: Path = Path("/proc")) -> int:
    """CPU ticks (utime + stime, all threads) of ``root`` and every process below it."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name), proc)
            if stat is not None:
                parents.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    own = _stat(root, proc)
    total, todo = (0 if own is None else own[1]), [root]
    while todo:
        for pid, ticks in parents.get(todo.pop(), ()):
            total += ticks
            todo.append(pid)
    return total


def service_root(proc: Path = Path("/proc")) -> int:
    """The pid whose process tree is this service (the module docstring says which)."""
    given = os.environ.get(SERVICE_PID_ENV, "")
    if given.isdigit() and (proc / given).exists():
        return int(given)
    try:
        if (proc / str(os.getppid()) / "comm").read_text().strip() == "tritonserver":
            return os.getppid()
    except OSError:
        pass
    return os.getpid()


class CpuShare:
    """``others_busy()``: whether processes outside this service took more than
    ``threshold`` cores over the last window of ``window_s`` to ``STALE_WINDOWS`` times that
    (and, once they did, until they take under half of it); re-read at most once per window,
    from the caller's thread (a scan of ``/proc``, about two milliseconds); after a longer
    gap the state stays until a new window ends. ``on_change(busy, others_cores)`` hears each
    turn."""

    def __init__(
        self,
        root: int | None = None,
        threshold: float = OTHERS_BUSY_CORES,
        window_s: float = WINDOW_S,
        proc: Path = Path("/proc"),
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool, float], None] | None = None,
    ) -> None:
        self.root = service_root(proc) if root is None else root
        self.threshold = threshold
        self.window_s = window_s
        self.proc = proc
        self.clock = clock
        self.on_change = on_change
        self.others_cores = 0.0
        self.busy = False
        self._lock = threading.Lock()
        self._last = self._sample()

    def _sample(self) -> tuple[float, int, int]:
        return self.clock(), machine_busy_ticks(self.proc), tree_ticks(self.root, self.proc)

    def others_busy(self) -> bool:
        with self._lock:
            then, busy, ours = self._last
            if self.clock() - then >= STALE_WINDOWS * self.window_s:
                # An idle stretch (another server's turn, say) says nothing of now: start a
                # new window, keep the state.
                self._last = self._sample()
            elif self.clock() - then >= self.window_s:
                self._last = now = self._sample()
                others = (now[1] - busy) - (now[2] - ours)
                self.others_cores = max(0.0, others / _TICK / (now[0] - then))
                was = self.busy
                limit = self.threshold / 2 if was else self.threshold
                self.busy = self.others_cores > limit
                if self.busy != was and self.on_change is not None:
                    self.on_change(self.busy, self.others_cores)
            return self.busy


_PROCESS_SHARE: CpuShare | None = None


def process_share(on_change: Callable[[bool, float], None] | None = None) -> CpuShare:
    """The one CpuShare of this process (each model copy asks; /proc is read once a second,
    a turn heard once); ``on_change`` of the first caller that gives one."""
    global _PROCESS_SHARE
    if _PROCESS_SHARE is None:
        _PROCESS_SHARE = CpuShare()
    if _PROCESS_SHARE.on_change is None:
        _PROCESS_SHARE.on_change = on_change
    return _PROCESS_SHARE
