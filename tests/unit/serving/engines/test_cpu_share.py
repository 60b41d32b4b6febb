"""Others' CPU from a fake /proc: the machine's busy ticks less this service's tree."""

from __future__ import annotations

from pathlib import Path

from tts_serving.engines import cpu_share
from tts_serving.engines.cpu_share import CpuShare, tree_ticks


class FakeProc:
    """A /proc with ``stat`` and processes ``pid -> (parent, utime, stime)``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[int, tuple[int, int, int]] = {}

    def write(self, busy: int) -> None:
        # user nice system idle iowait irq softirq steal: busy = user+nice+system+irq+softirq
        (self.root / "stat").write_text(f"cpu  {busy} 0 0 500 7 0 0 900 0 0\ncpu0 1 2 3\n")
        for pid, (parent, utime, stime) in self.processes.items():
            folder = self.root / str(pid)
            folder.mkdir(exist_ok=True)
            fields = ["S", str(parent)] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 5
            (folder / "stat").write_text(f"{pid} (a (b) c) {' '.join(fields)}\n")


def test_the_tree_counts_the_root_and_everything_below_it_only(tmp_path):
    proc = FakeProc(tmp_path)
    proc.processes = {10: (1, 5, 1), 11: (10, 7, 0), 12: (11, 2, 2), 20: (1, 100, 100)}
    proc.write(0)
    assert tree_ticks(10, tmp_path) == 5 + 1 + 7 + 2 + 2
    assert tree_ticks(11, tmp_path) == 11
    assert tree_ticks(99, tmp_path) == 0  # gone: nothing


def test_others_busy_when_the_machine_ran_more_than_this_service(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_share, "_TICK", 100)
    now = [0.0]
    proc = FakeProc(tmp_path)
    proc.processes = {10: (1, 0, 0), 11: (10, 0, 0)}
    proc.write(0)
    heard: list[tuple[bool, float]] = []
    share = CpuShare(
        root=10,
        threshold=0.5,
        window_s=1.0,
        proc=tmp_path,
        clock=lambda: now[0],
        on_change=lambda busy, cores: heard.append((busy, cores)),
    )
    # Two seconds: the machine ran 300 ticks, this service 250 of them: others 0.25 cores.
    proc.processes = {10: (1, 100, 50), 11: (10, 100, 0)}
    proc.write(300)
    now[0] = 2.0
    assert not share.others_busy() and share.others_cores == 0.25
    # The next second: 190 ticks, this service 40 of them: others 1.5 cores.
    proc.processes = {10: (1, 120, 50), 11: (10, 120, 0)}
    proc.write(490)
    now[0] = 2.5
    assert not share.others_busy()  # within the window: not read again
    now[0] = 3.0
    assert share.others_busy() and share.others_cores == 1.5
    # Others at 0.3 cores: still busy (quiet again under half the threshold), then 0.
    proc.processes = {10: (1, 155, 50), 11: (10, 155, 0)}
    proc.write(490 + 100)
    now[0] = 4.0
    assert share.others_busy() and abs(share.others_cores - 0.3) < 1e-9
    proc.write(590 + 0)
    now[0] = 5.0
    assert not share.others_busy()
    assert [busy for busy, _ in heard] == [True, False] and heard[0][1] == 1.5


def test_the_service_is_the_launchers_tree_when_it_says_so(tmp_path, monkeypatch):
    import os

    (tmp_path / "4242").mkdir()
    monkeypatch.setenv(cpu_share.SERVICE_PID_ENV, "4242")
    assert cpu_share.service_root(tmp_path) == 4242
    monkeypatch.setenv(cpu_share.SERVICE_PID_ENV, "4243")  # gone: not this service
    assert cpu_share.service_root(tmp_path) == os.getpid()


def test_a_stale_window_says_nothing_of_now(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_share, "_TICK", 100)
    now = [0.0]
    proc = FakeProc(tmp_path)
    proc.processes = {10: (1, 0, 0)}
    proc.write(0)
    share = CpuShare(root=10, window_s=1.0, proc=tmp_path, clock=lambda: now[0])
    # Ten idle seconds in which another server took 1.5 cores: not read as now.
    proc.write(1500)
    now[0] = 10.0
    assert not share.others_busy()
    # The next second, only this service ran: still quiet.
    proc.processes = {10: (1, 150, 0)}
    proc.write(1650)
    now[0] = 11.0
    assert not share.others_busy() and share.others_cores == 0.0
