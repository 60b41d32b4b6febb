"""How `make test` shares the work between its workers (tests/support/scheduling.py), run on a
small suite of its own with two real xdist workers: a file's tests on one worker (its module
fixture starts once), the benchmarks of every file together on one."""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

from tests.support.paths import ROOT
from tests.support.scheduling import scope_of

TEST_FILE = """
import os
import time
import pytest

@pytest.fixture(scope="module")
def started():
    with open({log!r}, "a") as f:
        f.write(f"start {{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.mark.parametrize("n", range(8))
def test_plain(started, n):
    time.sleep(0.02)
    with open({log!r}, "a") as f:
        f.write(f"plain {{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")

@pytest.mark.bench
def test_bench():
    with open({log!r}, "a") as f:
        f.write(f"bench {{__name__}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
"""


def test_a_file_runs_on_one_worker_and_the_benchmarks_together(tmp_path):
    log = tmp_path / "ran.log"
    for name in ("test_one", "test_two", "test_three"):
        (tmp_path / f"{name}.py").write_text(TEST_FILE.format(log=str(log)))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    bench: a benchmark\n")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2"]
    command += ["--dist", "loadgroup", "-p", "tests.support.scheduling"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"\b27 passed", result.stdout), result.stdout[-1000:]
    rows = [line.split() for line in log.read_text().splitlines()]
    workers = collections.defaultdict(set)
    for kind, module, worker in rows:
        workers[(kind, module)].add(worker)
    starts = [(module, worker) for kind, module, worker in rows if kind == "start"]
    assert len(starts) == 3, starts  # once per file, not once per worker that ran some of it
    for module in ("test_one", "test_two", "test_three"):
        assert len(workers[("plain", module)]) == 1, workers
    bench = set().union(*(workers[("bench", m)] for m in ("test_one", "test_two", "test_three")))
    assert len(bench) == 1, workers
    # The plain tests did not all wait on one worker: the work is shared.
    assert (
        len(set().union(*(workers[("plain", m)] for m in ("test_one", "test_two", "test_three"))))
        == 2
    )


def test_the_scope_is_the_group_or_else_the_file():
    groups = {"tests/a/test_x.py::test_y[grpc]": "bench"}
    assert scope_of("tests/a/test_x.py::test_y[grpc]", groups) == "bench"
    assert scope_of("tests/a/test_x.py::test_y[http]", groups) == "tests/a/test_x.py"
    assert scope_of("tests/a/test_x.py::Class::test_y", groups) == "tests/a/test_x.py"
