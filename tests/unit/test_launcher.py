"""The launcher's choice of tritonserver, and the container entrypoint that calls it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tts_tools.launcher import environment

ROOT = Path(__file__).resolve().parents[2]


def fake_triton_home(tmp_path: Path) -> Path:
    home = tmp_path / "tritonserver"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "tritonserver").write_text("#!/bin/sh\n")
    (home / "backends" / "python").mkdir(parents=True)
    return home


def test_an_installed_triton_is_used_with_its_own_backends_and_libraries(tmp_path, monkeypatch):
    home = fake_triton_home(tmp_path)
    monkeypatch.setenv(environment.TRITON_HOME_ENV, str(home))
    assert environment.tritonserver_binary() == home / "bin" / "tritonserver"
    assert environment.prepare_backends(tmp_path / "cache") == home / "backends"
    assert not (tmp_path / "cache").exists()  # nothing copied from the wheel
    env = environment.server_env(base={"LD_LIBRARY_PATH": "/x"})
    assert "nvidia_pytriton.libs" not in env["LD_LIBRARY_PATH"]
    assert env["LD_LIBRARY_PATH"].endswith(os.pathsep + "/x")


def test_without_it_the_wheels_tritonserver_runs(monkeypatch):
    monkeypatch.delenv(environment.TRITON_HOME_ENV, raising=False)
    assert environment.tritonserver_binary() == environment.pytriton_dir() / "bin/tritonserver"
    assert "nvidia_pytriton.libs" in environment.server_env(base={})["LD_LIBRARY_PATH"]


def test_a_home_that_is_not_triton_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="has no bin/tritonserver: not a Triton installation"):
        environment.triton_home({environment.TRITON_HOME_ENV: str(tmp_path)})
