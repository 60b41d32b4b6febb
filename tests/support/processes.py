"""The server, the front door and the gateway as child processes of a Python program (tests,
benchmarks): free ports, start and wait for readiness, logs, stop.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tts_front.security import ADMIN_KEY_ENV, admin_headers
from tts_launcher.admin_key import KEY_FAILED, SERVER_UMASK, key_works
from tts_launcher.commands import (
    StopBudget,
    free_port,
    free_ports,
    front_command,
    gateway_command,
    log_tail,
    port_owner,
    server_command,
)
from tts_launcher.environment import server_env
from tts_launcher.restarts import stop_process
from tts_launcher.stub_healing import (
    Supervisor,
    dying_with_parent,
    is_ready,
    new_shm_prefix,
    remove_regions,
)


class Endpoints:
    """``grpc_url`` and ``http_url`` of something listening on ``grpc_port`` and ``http_port``."""

    grpc_port: int
    http_port: int

    @property
    def grpc_url(self) -> str:
        return f"grpc://localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://localhost:{self.http_port}"


class ServerProcess(Endpoints):
    """A tritonserver child process on its own ports, logging to a file.

    ``with ServerProcess(repo, log_path) as server:`` starts it, waits until it is ready (or
    raises with the log's tail) and stops it on exit. Used by the tests and the benchmarks.
    """

    def __init__(
        self,
        model_repository: Path,
        log_path: Path,
        ports: tuple[int, int, int] | None = None,
        cache_dir: Path = Path(".cache/triton"),
        extra_args: list[str] | None = None,
        key: str | None = None,
        supervise: bool = True,
        supervisor_options: dict | None = None,
    ) -> None:
        # Tests and benchmarks hold the key of their own server, as the supervisor does.
        self.supervisor_options = supervisor_options or {}
        self.admin_key = key or secrets.token_urlsafe(32)
        self.model_repository = Path(model_repository)
        self.supervise = supervise
        self.supervisor: Supervisor | None = None
        self.chosen = ports is None  # ports of our own choosing: chosen again if taken
        self.http_port, self.grpc_port, self.metrics_port = ports or tuple(free_ports(3))
        self.log_path = Path(log_path)
        self.cache_dir = cache_dir
        self.extra_args = extra_args
        self.shm_prefix = new_shm_prefix()
        self.command = self._command()
        self.process: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        return server_command(
            self.model_repository,
            self.http_port,
            self.grpc_port,
            self.metrics_port,
            self.cache_dir,
            self.extra_args,
            supervised=self.supervise,
            shm_prefix=self.shm_prefix,
        )

    def _taken(self) -> str | None:
        """Who else listens on one of this server's ports (None: nobody seen). Triton binds
        them only once its models are loaded: meanwhile another process (another test
        worker's server) took one, and its readiness answered for this one."""
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            owner = port_owner(port)
            if owner is not None and owner.pid != self.process.pid:
                return f"port {port} is held by pid {owner.pid}"
        return None

    @property
    def admin_headers(self) -> dict[str, str]:
        return admin_headers(self.admin_key)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def start(self, timeout: float = 180.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        deadline = time.monotonic() + timeout
        self._spawn()
        while time.monotonic() < deadline:
            taken = self._taken() if self.chosen else None
            if taken:  # not ours to wait for: start again on other free ports
                self.stop()
                self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
                self.command = self._command()
                self._spawn()
                continue
            if self.process.poll() is not None:
                tail = self.log_tail()
                raise RuntimeError(f"tritonserver exited ({self.process.returncode}):\n{tail}")
            if is_ready(self.http_port):
                if not key_works(self.http_port, self.admin_key):
                    self.stop()
                    raise RuntimeError(KEY_FAILED)
                if self.supervise:
                    self.supervisor = self._supervisor().start()
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"tritonserver not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def _spawn(self) -> None:
        # Append mode: the supervisor adds its lines to the same file, and O_APPEND keeps
        # tritonserver's writes from overwriting them.
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                dying_with_parent(self.command),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(key=self.admin_key, cache_dir=self.cache_dir),
                umask=SERVER_UMASK,
            )

    def _supervisor(self) -> Supervisor:
        def log(line: str) -> None:
            with open(self.log_path, "a") as f:
                f.write(line + "\n")

        return Supervisor(
            self.process.pid,
            self.http_port,
            self.model_repository,
            self.admin_headers,
            log,
            shm_prefix=self.shm_prefix,
            **self.supervisor_options,
        )

    def stop(self) -> None:
        if self.supervisor:
            self.supervisor.stop()
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        remove_regions(self.shm_prefix, set(), lambda line: None)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ChildProcess:
    """A helper process (the gateway, the front door) as a child, logging to a file (tests,
    bench). ``with ...Process(...) as p:`` starts it and waits until ``up()``, raising with
    the log's tail when it exits first or takes longer than ``start_timeout``."""

    name = "process"
    grace = 35.0  # SIGTERM, then this long to finish, then SIGKILL
    start_timeout = 60.0

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.command = command
        self.log_path = Path(log_path)
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] | None = None  # None: this process's environment

    def up(self) -> bool:
        raise NotImplementedError

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def start(self, timeout: float | None = None) -> ChildProcess:
        timeout = timeout or self.start_timeout
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.process.returncode}):\n{self.log_tail()}"
                )
            if self.up():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not up after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process:
            stop_process(self.process, self.grace)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GatewayProcess(ChildProcess):
    """``python -m tts_gateway`` on a free port; up when ``/health`` answers."""

    name = "gateway"
    grace = StopBudget().gateway_wait_s

    def __init__(
        self,
        triton_url: str,
        log_path: Path,
        port: int | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        super().__init__(gateway_command(triton_url, "127.0.0.1", self.port, extra_args), log_path)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False


class FrontProcess(ChildProcess, Endpoints):
    """``python -m tts_front`` before a ServerProcess, on free ports; up when Triton's
    readiness answers through it."""

    name = "front"
    # Its ports open after the admission warm-up (48 sentences: about 7 s on 2 idle cores).
    start_timeout = 120.0

    def __init__(
        self, server: ServerProcess, log_path: Path, extra_args: list[str] | None = None
    ) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        command = front_command(
            server.grpc_port,
            server.http_port,
            "127.0.0.1",
            self.grpc_port,
            self.http_port,
            server.shm_prefix,
            extra_args,
        )
        super().__init__(command, log_path)
        # The server's admin key opens the inner models here too, as under the launcher.
        self.env = {**os.environ, ADMIN_KEY_ENV: server.admin_key}

    def up(self) -> bool:
        return is_ready(self.http_port)


@contextlib.contextmanager
def server_and_gateway(
    repository: Path, logs: Path, cache_dir: Path = Path(".cache/triton")
) -> Iterator[tuple[ServerProcess, GatewayProcess]]:
    """tritonserver and a gateway on it (logs in ``logs``), both stopped on exit: what the
    benchmarks that go through the gateway run against."""
    server = ServerProcess(repository, logs / "triton.log", cache_dir=cache_dir)
    server.start()
    try:
        gateway = GatewayProcess(server.grpc_url, logs / "gateway.log").start()
        try:
            yield server, gateway
        finally:
            gateway.stop()
    finally:
        server.stop()


def linked_copy(repository: Path, into: Path) -> Path:
    """A copy of ``repository`` in ``into`` whose ONNX files are links, not copies: a test
    that edits files there (configs, a lexicon) leaves the shared repository, which other
    test workers' servers load at the same time, as it is."""
    import shutil

    for model in repository.iterdir():
        if model.is_dir():
            shutil.copytree(
                model, into / model.name, symlinks=True, ignore=shutil.ignore_patterns("*.onnx")
            )
            for onnx_file in (model / "1").glob("*.onnx"):
                (into / model.name / "1" / onnx_file.name).symlink_to(onnx_file)
    return into


def profile_server(repository: Path, logs: Path, profile: str | None) -> ServerProcess:
    """tritonserver serving ``configs/<profile>.pbtxt`` (None: the config.pbtxt files; logs in
    ``logs``), its canary off so that a test's batches are only its own: ``with
    profile_server(...) as server:``."""
    from tests.support.paths import ROOT

    return ServerProcess(
        repository,
        logs / "server.log",
        cache_dir=ROOT / ".cache" / "triton",
        extra_args=[f"--model-config-name={profile}"] if profile else [],
        supervisor_options={"canary_interval": 0},
    )
