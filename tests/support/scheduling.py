"""Which worker runs what (a pytest plugin, loaded by tests/conftest.py).

With ``--dist loadgroup`` (``make test``): the tests of one file run on one worker, one after
another (a file's module fixtures, its servers, start once), and the benchmarks run as tests
(marked ``bench``) form one group, so no two of them measure at the same time.

xdist's own loadgroup tells its scheduler a test's group by appending it to the test's id,
which pytest 9.2's structured ids ignore (pytest-xdist issue 1386: every group is silently
ignored), and it schedules a test without a group alone. So the workers write the groups to a
file the controller names, and the scheduler reads it: a test's group, else its file
(docs/decisions/0005-test-groups-beside-xdist.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

BENCH_GROUP = "bench"
GROUPS_DIR_ENV = "TTS_TEST_GROUPS_DIR"
_FOLDER = pytest.StashKey[str]()


def scope_of(nodeid: str, groups: dict[str, str]) -> str:
    """The unit of scheduling of a test: its group, else its file."""
    return groups.get(nodeid) or nodeid.split("::", 1)[0]


def read_groups(folder: Path) -> dict[str, str]:
    """The groups every worker wrote (they collect the same tests)."""
    groups: dict[str, str] = {}
    for path in sorted(folder.glob("*.json")):
        groups.update(json.loads(path.read_text()))
    return groups


def pytest_configure(config):
    if config.getoption("dist", "no") == "loadgroup":  # the controller, before workers start
        folder = tempfile.mkdtemp(prefix="test-groups-")
        os.environ[GROUPS_DIR_ENV] = config.stash[_FOLDER] = folder


def pytest_unconfigure(config):
    if _FOLDER in config.stash:
        shutil.rmtree(config.stash[_FOLDER], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """On a worker: write the group of every test that has one."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    folder = os.environ.get(GROUPS_DIR_ENV)
    if worker is None or folder is None:
        return
    groups = {item.nodeid: BENCH_GROUP for item in items if item.get_closest_marker("bench")}
    partial = Path(folder) / f"{worker}.part"
    partial.write_text(json.dumps(groups))
    partial.rename(partial.with_suffix(".json"))  # whole, before the controller can read it


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: absent under -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    """A scheduler that reads the groups once every worker has collected."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = Path(config.stash[_FOLDER])

    class ByGroupOrFile(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first called once all workers reported their collection
                self.groups = read_groups(folder)
            return scope_of(nodeid, self.groups)

    return ByGroupOrFile(config, log)
