"""The launcher's choice of tritonserver, and the container entrypoint that calls it."""

from __future__ import annotations

import os
import subprocess
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


def test_the_container_entrypoint_exports_then_runs_the_launcher(tmp_path):
    """docker/entrypoint.sh with pip and python3 replaced by recorders: what it would run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    for tool in ("pip", "python3", "cc"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {log}\n')
        (bin_dir / tool).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "TTS_WORKSPACE": str(ROOT),
        "TTS_INSTALLED_MARKER": str(tmp_path / "installed"),
        "TTS_PROFILE": "gpu",
    }
    subprocess.run(
        ["bash", str(ROOT / "docker/entrypoint.sh"), "--log-verbose=1"], env=env, check=True
    )
    calls = log.read_text().splitlines()
    assert calls[0].startswith("pip install -q -r docker/requirements-gpu.txt")
    assert calls[-2] == "python3 -m export --repository model_repository"
    assert calls[-1] == (
        "python3 -m tts_tools.server --model-repository=model_repository --bind=0.0.0.0 "
        "--http-port=8000 --grpc-port=8001 --metrics-port=8002 --supervisor-metrics-port=8003 "
        "--gateway-port=0 --cache-dir=/tmp/tts-cache --model-config-name=gpu --log-verbose=1"
    )
    # Installed once: a second start goes straight to the export and the launcher.
    log.unlink()
    subprocess.run(["bash", str(ROOT / "docker/entrypoint.sh")], env=env, check=True)
    assert [c.split()[2] for c in log.read_text().splitlines()] == ["export", "tts_tools.server"]
