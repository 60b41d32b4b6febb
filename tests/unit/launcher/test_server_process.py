"""ServerProcess (the tests' and benchmarks' tritonserver) starts a server again once when it
died of Triton's start-up abort (gRPC's epoll_wait: Bad file descriptor), and only then."""

from __future__ import annotations

import signal
import sys

import pytest

from tests.support.paths import REPOSITORY, ROOT
from tts_launcher.processes import START_RACE, ServerProcess, start_race

RACE_LINE = (
    "E1125 13:03:36.185602 16032 ev_epoll1_linux.cc:373] (event_engine) Epoll1Poller:0x5564 "
    "encountered epoll_wait error: Bad file descriptor"
)


def dies(line: str, how: str = "abort") -> list[str]:
    """A stand-in for tritonserver that writes ``line`` and dies (SIGABRT, or exit 1)."""
    end = "os.kill(os.getpid(), signal.SIGABRT)" if how == "abort" else "sys.exit(1)"
    code = f"import os, signal, sys; sys.stderr.write({line!r} + '\\n'); {end}"
    return [sys.executable, "-c", code]


class Scripted(ServerProcess):
    """Each start runs the next command of ``commands``."""

    def __init__(self, tmp_path, commands: list[list[str]]) -> None:
        super().__init__(REPOSITORY, tmp_path / "server.log", cache_dir=ROOT / ".cache" / "triton")
        self.commands = iter(commands)

    def _spawn(self) -> None:
        self.command = next(self.commands)
        super()._spawn()


def test_the_start_race_is_told_from_other_deaths():
    assert start_race(-signal.SIGABRT, f"...\n{RACE_LINE}\n")
    assert not start_race(-signal.SIGABRT, "E1125 something else aborted")
    assert not start_race(1, RACE_LINE)  # an exit, not the abort
    assert not start_race(None, RACE_LINE)


def test_a_start_race_is_started_again_once(tmp_path):
    server = Scripted(tmp_path, [dies(RACE_LINE), dies("model failed to load", "exit")])
    with pytest.raises(RuntimeError, match=r"exited \(1\)[\s\S]*model failed to load"):
        server.start(timeout=60)
    log = server.log_path.read_text()
    assert log.count(START_RACE) == 1 and log.index(RACE_LINE) < log.index("model failed")


def test_it_is_started_again_only_once_and_only_for_that(tmp_path):
    twice = Scripted(tmp_path / "a", [dies(RACE_LINE), dies(RACE_LINE), dies("never run")])
    with pytest.raises(RuntimeError, match=r"exited \(-6\)"):
        twice.start(timeout=60)
    assert twice.log_path.read_text().count(START_RACE) == 1
    other = Scripted(tmp_path / "b", [dies("E1125 a real bug", "abort"), dies("never run")])
    with pytest.raises(RuntimeError, match="a real bug"):
        other.start(timeout=60)
    assert START_RACE not in other.log_path.read_text()
