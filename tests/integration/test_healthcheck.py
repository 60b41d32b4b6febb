"""The container's health check (tts_launcher.healthcheck) against the real server: ready when
every model is, and not ready, naming it, when one is missing."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.support.paths import REPOSITORY


def healthcheck(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tts_launcher.healthcheck", *args], capture_output=True, text=True
    )


def test_every_model_ready(server):
    result = healthcheck("--url", server.http_url, "--repository", str(REPOSITORY))
    assert result.returncode == 0, result.stderr


def test_a_model_that_is_not_served_is_named(server, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "tts", repo / "tts", ignore=shutil.ignore_patterns("1"))
    (repo / "missing_stage").mkdir()
    (repo / "missing_stage" / "config.pbtxt").write_text('name: "missing_stage"\n')
    result = healthcheck("--url", server.http_url, "--repository", str(repo))
    assert result.returncode == 1
    assert "not ready: missing_stage" in result.stderr and "tts:" not in result.stderr
    down = healthcheck("--url", "http://127.0.0.1:9", "--repository", str(repo))
    assert down.returncode == 1 and "tts:" in down.stderr
