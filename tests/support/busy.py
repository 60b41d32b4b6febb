"""A server given less CPU than it measured at start: its processes (tritonserver and its
stubs, every thread) pinned to fewer cores, and given them back. Busy loops beside a server
barely slow it (its stages run many threads: six single-threaded spinners cost it about 15 %
here); pinning takes away a known share, and shows that it did."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _on_threads(pids: list[int], call: Callable[[int], T]) -> list[T]:
    """``call(tid)`` for every thread of ``pids``; a thread that ends meanwhile is left out
    (a server's threads come and go under load)."""
    found = []
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                found.append(call(int(task.name)))
            except (ProcessLookupError, FileNotFoundError):
                pass
    return found


def pin(pids: list[int], cores: set[int]) -> None:
    """Every thread of ``pids`` onto ``cores`` (threads made later inherit it)."""
    _on_threads(pids, lambda tid: os.sched_setaffinity(tid, cores))


def half_of(cores: set[int]) -> set[int]:
    """The first half of ``cores`` (at least one)."""
    return set(sorted(cores)[: max(1, len(cores) // 2)])


@contextmanager
def halved(root: int) -> Iterator[set[int]]:
    """The process tree of ``root`` on half this process's cores (at least one) inside the
    block, on all of them again after it; yields the cores it had."""
    cores = os.sched_getaffinity(0)
    half = half_of(cores)
    pin(process_tree(root), half)
    try:
        yield half
    finally:
        pin(process_tree(root), cores)


def thread_affinities(root: int) -> list[set[int]]:
    """The cores each live thread of ``root``'s process tree may run on."""
    return _on_threads(process_tree(root), os.sched_getaffinity)
