"""Start the real ``tritonserver`` shipped in the nvidia-pytriton wheel on a model repository.

``python -m tts_tools.server --model-repository model_repository`` (``make serve`` calls it).
The wheel carries Triton 2.51 with the Python backend; what it needs to run outside PyTriton:
a backend directory holding the stub for this interpreter, libpython's directory first on
LD_LIBRARY_PATH, and this environment's ``bin/`` first on PATH.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import start_http_server

from .supervisor import (
    SUPERVISED_ARGS,
    Supervisor,
    SupervisorMetrics,
    become_subreaper,
    die_with_parent,
    end_orphans,
    is_ready,
    new_shm_prefix,
    remove_regions,
)

# How long a stopping gateway may take to finish its requests (uvicorn's graceful shutdown).
GATEWAY_DRAIN_S = 40.0
# tritonserver's exit timeout behind the front door (which drains first).
FRONTED_EXIT_TIMEOUT_S = 5
PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"


def pytriton_dir() -> Path:
    # Found without importing pytriton: its __init__ pulls in its Python API's dependencies,
    # which a server-only environment (the GPU bundle) does not install.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvidia-pytriton is not installed (it ships tritonserver)")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def tritonserver_binary() -> Path:
    return pytriton_dir() / "bin" / "tritonserver"


def prepare_backends(cache_dir: Path) -> Path:
    """A backend directory whose python backend uses this interpreter's stub (idempotent)."""
    src = pytriton_dir()
    stub = src / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"nvidia-pytriton has no Python backend stub for Python {PY_VERSION}")
    backends = cache_dir / f"backends-py{PY_VERSION}"
    python_backend = backends / "python"
    marker = python_backend / "triton_python_backend_stub"
    if not marker.exists() or marker.stat().st_size != stub.stat().st_size:
        shutil.rmtree(backends, ignore_errors=True)
        shutil.copytree(src / "backends" / "python", python_backend)
        shutil.copy2(stub, marker)
    return backends


SHIM_SOURCE = Path(__file__).with_name("server_shim.c")
KEY_PLACEHOLDER = "tts-admin-key-hidden"  # what /proc/PID/cmdline shows; see server_shim.c
KEY_ENV = "TTS_TRITON_ADMIN_KEY"


def server_shim(cache_dir: Path) -> Path:
    """``server_shim.c`` built into ``cache_dir`` (rebuilt when the source changes)."""
    source = SHIM_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    library = Path(cache_dir) / f"libtts_server_shim-{digest}.so"
    if not library.exists():
        compiler = shutil.which(os.environ.get("CC", "cc"))
        if compiler is None:
            raise SystemExit(
                "no C compiler (cc) to build tts_tools/server_shim.c, which keeps the admin key "
                "out of tritonserver's command line: run `make system-deps` (installs gcc)"
            )
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        flags = ["-shared", "-fPIC", "-O2", "-Wall"]
        subprocess.run([compiler, *flags, "-o", str(partial), str(SHIM_SOURCE), "-ldl"], check=True)
        partial.replace(library)
    return library


def server_env(
    base: dict[str, str] | None = None, key: str | None = None, cache_dir: Path | None = None
) -> dict[str, str]:
    """tritonserver's environment; with ``key``, the shim that hands it the key (server_shim.c)."""
    env = dict(os.environ if base is None else base)
    if key is not None:
        env[KEY_ENV] = key
        env["LD_PRELOAD"] = str(server_shim(cache_dir or Path(".cache/triton")).resolve())
    libs = Path(pytriton_dir()).parent.parent / "nvidia_pytriton.libs"
    ld = [sysconfig.get_config_var("LIBDIR"), str(libs)]
    if env.get("LD_LIBRARY_PATH"):
        ld.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    # The stub finds this environment's packages through the python on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # PYTHONPATH pointing at site-packages instead of the PATH route gave empty outputs once.
    env.pop("PYTHONPATH", None)
    return env


def has_gpu() -> bool:
    """An NVIDIA driver is present (its device node), so CUDA may be used."""
    return Path("/dev/nvidiactl").exists()


# On a machine without a GPU, Triton still probes NVML and DCGM for GPU metrics and logs both
# failures; this flag stops that probe. The CUDA lines that remain are harmless (README).
CPU_ONLY_ARGS = ("--allow-gpu-metrics=false",)


# Closed by default: what changes the server or reaches into its memory needs the admin key,
# sent as this header; inference, health and model metadata stay open. Two read-only APIs stay
# open by default too: model configuration (clients read the sample rate from the tts config)
# and statistics (perf_analyzer reads them and cannot send a header over gRPC); an operator
# who does not need them closes them with --restricted-apis (README, security).
ADMIN_HEADER = "tts-admin-key"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # what Triton 2.51 checks over gRPC
RESTRICTED = "model-repository,logging,trace,shared-memory"
ADMIN_KEY_ENV = "TTS_ADMIN_KEY"
ADMIN_KEY_FILE_ENV = "TTS_ADMIN_KEY_FILE"
DEFAULT_BIND = "127.0.0.1"


def admin_key(environ: dict[str, str] | None = None) -> tuple[str, bool]:
    """(key, configured): from $TTS_ADMIN_KEY or the file named by $TTS_ADMIN_KEY_FILE.

    With neither, a random key nobody is told: the admin APIs are then refused to everyone.
    """
    env = os.environ if environ is None else environ
    if env.get(ADMIN_KEY_ENV):
        return env[ADMIN_KEY_ENV], True
    if env.get(ADMIN_KEY_FILE_ENV):
        key = Path(env[ADMIN_KEY_FILE_ENV]).read_text().strip()
        if not key:
            raise SystemExit(f"{env[ADMIN_KEY_FILE_ENV]} is empty: put the admin key in it")
        return key, True
    return secrets.token_urlsafe(32), False


def admin_headers(key: str) -> dict[str, str]:
    """Headers carrying the admin key, for HTTP and gRPC alike (gRPC expects Triton's prefix)."""
    return {ADMIN_HEADER: key, f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER}": key}


# Shared-memory regions and files tritonserver creates are its user's alone (request text and
# audio pass through /dev/shm).
SERVER_UMASK = 0o077
KEY_FAILED = (
    "the admin key did not reach tritonserver (tts_tools/server_shim.c was not loaded), so its "
    "key would be the placeholder any local user can read in /proc; stopped"
)

# A request per restricted API that needs the key and changes nothing.
KEY_PROBES = {
    "model-repository": ("POST", "/v2/repository/index"),
    "logging": ("GET", "/v2/logging"),
    "trace": ("GET", "/v2/trace/setting"),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status"),
    "statistics": ("GET", "/v2/models/stats"),
}


def key_works(http_port: int, key: str, restricted: str = RESTRICTED) -> bool:
    """Whether ``key`` opens a restricted API. False means the shim did not hand tritonserver
    the key, so its key is the placeholder anyone can read: the caller must not go on."""
    for api in restricted.split(","):
        if api in KEY_PROBES:
            method, path = KEY_PROBES[api]
            request = urllib.request.Request(
                f"http://127.0.0.1:{http_port}{path}",
                data=b"{}" if method == "POST" else None,
                method=method,
                headers=admin_headers(key),
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status == 200
            except OSError:
                return False
    return True  # nothing restricted that a probe knows: nothing to check


def server_command(
    model_repository: Path,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    cache_dir: Path = Path(".cache/triton"),
    extra_args: list[str] | None = None,
    bind: str = DEFAULT_BIND,
    restricted: str = RESTRICTED,
    supervised: bool = True,
    shm_prefix: str | None = None,
    metrics_bind: str | None = None,
) -> list[str]:
    """The tritonserver command line; ``supervised``: with the model-control flags the
    supervisor needs; ``metrics_bind``: the metrics address when it differs from ``bind``
    (behind the front door, HTTP and gRPC stay on loopback).

    The admin key flags hold a placeholder: Triton 2.51 takes the key only as a flag, and
    /proc/PID/cmdline is readable by every local user, so the key itself reaches tritonserver
    through ``server_env(key=...)`` and server_shim.c.
    """
    backends = prepare_backends(cache_dir)
    return [
        str(tritonserver_binary()),
        f"--model-repository={Path(model_repository).resolve()}",
        f"--backend-directory={backends.resolve()}",
        f"--http-address={bind}",
        f"--grpc-address={bind}",
        f"--metrics-address={metrics_bind or bind}",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        *(SUPERVISED_ARGS if supervised else ()),
        f"--http-restricted-api={restricted}:{ADMIN_HEADER}={KEY_PLACEHOLDER}",
        f"--grpc-restricted-protocol={restricted}:{ADMIN_HEADER}={KEY_PLACEHOLDER}",
        *([f"--backend-config=python,shm-region-prefix-name={shm_prefix}"] if shm_prefix else []),
        "--allow-metrics=true",
        "--exit-on-error=true",
        "--strict-readiness=true",
        *([] if has_gpu() else CPU_ONLY_ARGS),
        *(extra_args or []),
    ]


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` of a child's log file (for failures and test reports)."""
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        self.http_port, self.grpc_port, self.metrics_port = ports or (
            free_port(),
            free_port(),
            free_port(),
        )
        self.log_path = Path(log_path)
        self.cache_dir = cache_dir
        self.shm_prefix = new_shm_prefix()
        self.command = server_command(
            model_repository,
            self.http_port,
            self.grpc_port,
            self.metrics_port,
            cache_dir,
            extra_args,
            supervised=supervise,
            shm_prefix=self.shm_prefix,
        )
        self.process: subprocess.Popen | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        return admin_headers(self.admin_key)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def start(self, timeout: float = 180.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("")
        # Append mode: the supervisor adds its lines to the same file, and O_APPEND keeps
        # tritonserver's writes from overwriting them.
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=server_env(key=self.admin_key, cache_dir=self.cache_dir),
                umask=SERVER_UMASK,
                preexec_fn=die_with_parent,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited ({self.process.returncode}):\n{self.log_tail()}"
                )
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tts_tools.server", description=__doc__)
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    parser.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002))
    )
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/triton"))
    parser.add_argument(
        "--bind",
        default=os.environ.get("BIND", DEFAULT_BIND),
        help="address for HTTP, gRPC and metrics (default 127.0.0.1; 0.0.0.0 opens them)",
    )
    parser.add_argument(
        "--gateway-port",
        type=int,
        default=int(os.environ.get("GATEWAY_PORT", 8080)),
        help="port of the OpenAI-compatible gateway, on --bind (0: no gateway)",
    )
    parser.add_argument(
        "--supervisor-metrics-port",
        type=int,
        default=int(os.environ.get("SUPERVISOR_METRICS_PORT", 8003)),
        help="Prometheus metrics of the supervisor (outages, restarts) on --bind (0: none)",
    )
    parser.add_argument(
        "--restricted-apis",
        default=RESTRICTED,
        help=f"APIs that need the admin key (default {RESTRICTED}; add statistics, "
        "model-config to close those too)",
    )
    parser.add_argument(
        "--no-front",
        action="store_true",
        help="serve tritonserver's HTTP and gRPC on the public ports directly, without the "
        "front door's size limits, admission and stream watch (tts_tools/front.py)",
    )
    parser.add_argument(
        "--front-args",
        default=os.environ.get("FRONT_ARGS", ""),
        help="extra flags of the front door, e.g. '--deadline-s 5 --max-request-mib 16'",
    )
    args, extra = parser.parse_known_args(argv)
    shm_prefix = new_shm_prefix()
    taken = taken_port(
        args.bind,
        [
            (args.http_port, "--http-port / HTTP_PORT"),
            (args.grpc_port, "--grpc-port / GRPC_PORT"),
            (args.metrics_port, "--metrics-port / METRICS_PORT"),
            (args.gateway_port, "--gateway-port / GATEWAY_PORT"),
            (args.supervisor_metrics_port, "--supervisor-metrics-port / SUPERVISOR_METRICS_PORT"),
        ],
    )
    if taken:
        print(f"launcher: {taken}", file=sys.stderr, flush=True)
        sys.exit(2)
    key, configured = admin_key()
    # Behind the front door tritonserver listens on private loopback ports; only the front
    # (and the launcher's own probes) reach it.
    triton_http, triton_grpc = (
        (args.http_port, args.grpc_port) if args.no_front else (free_port(), free_port())
    )
    if not args.no_front:
        # Nothing is in flight once the front door has drained, but a stream of a stub that
        # died stays in flight in Triton 2.51 for ever: do not wait 30 s for it at exit.
        extra = [f"--exit-timeout-secs={FRONTED_EXIT_TIMEOUT_S}", *extra]
    cmd = server_command(
        args.model_repository,
        triton_http,
        triton_grpc,
        args.metrics_port,
        args.cache_dir,
        extra,
        bind=args.bind if args.no_front else "127.0.0.1",
        restricted=args.restricted_apis,
        shm_prefix=shm_prefix,
        metrics_bind=args.bind,
    )
    admin = (
        f"need the {ADMIN_HEADER} header (key from ${ADMIN_KEY_ENV} / ${ADMIN_KEY_FILE_ENV})"
        if configured
        else f"are refused (set ${ADMIN_KEY_ENV} or ${ADMIN_KEY_FILE_ENV} to use them)"
    )
    front = None
    if not args.no_front:
        front = front_command(
            triton_grpc,
            triton_http,
            args.bind,
            args.grpc_port,
            args.http_port,
            shm_prefix,
            ["--notify-parent", *shlex.split(args.front_args)],
        )
    print(
        f"tritonserver: HTTP on {args.bind}:{args.http_port}, gRPC on {args.bind}:{args.grpc_port}"
        f"{'' if args.no_front else ' (through the front door)'}, metrics on "
        f"{args.bind}:{args.metrics_port}/metrics; model repository {args.model_repository}; "
        f"admin APIs ({args.restricted_apis}) {admin}",
        flush=True,
    )
    gateway = None
    if args.gateway_port:
        local = "127.0.0.1" if args.bind in ("0.0.0.0", "::") else args.bind
        gateway = gateway_command(f"grpc://{local}:{args.grpc_port}", args.bind, args.gateway_port)
        print(
            f"gateway: OpenAI-compatible API on http://{args.bind}:{args.gateway_port}/v1",
            flush=True,
        )
    headers = admin_headers(key)
    metrics = SupervisorMetrics()
    if args.supervisor_metrics_port:
        start_http_server(args.supervisor_metrics_port, args.bind, registry=metrics.registry)
        print(
            f"supervisor: outage metrics on {args.bind}:{args.supervisor_metrics_port}/metrics",
            flush=True,
        )
    env = server_env(key=key, cache_dir=args.cache_dir)
    sys.exit(
        supervise(
            cmd,
            triton_http,
            args.model_repository,
            headers,
            gateway,
            metrics=metrics,
            env=env,
            restricted=args.restricted_apis,
            shm_prefix=shm_prefix,
            front_cmd=front,
        )
    )


def taken_port(bind: str, ports: list[tuple[int, str]]) -> str | None:
    """One line naming the first port (0: none) that cannot be bound on ``bind``, and the
    option or make variable that moves it; None when all are free."""
    for port, option in ports:
        if not port:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((bind, port))
            except OSError as e:
                return (
                    f"port {port} on {bind} is not free ({e.strerror}); stop what uses it or "
                    f"choose another with {option}"
                )
    return None


def gateway_command(
    triton_url: str, bind: str, port: int, extra_args: list[str] | None = None
) -> list[str]:
    """The OpenAI-compatible gateway (``tts_gateway``) in front of a tritonserver."""
    return [
        sys.executable,
        "-m",
        "tts_gateway",
        f"--triton-url={triton_url}",
        f"--host={bind}",
        f"--port={port}",
        *(extra_args or []),
    ]


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

    def up(self) -> bool:
        raise NotImplementedError

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def start(self, timeout: float | None = None) -> ChildProcess:
        timeout = timeout or self.start_timeout
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
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
            _stop(self.process, self.grace)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class GatewayProcess(ChildProcess):
    """``python -m tts_gateway`` on a free port; up when ``/health`` answers."""

    name = "gateway"
    grace = GATEWAY_DRAIN_S

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


def front_command(
    triton_grpc_port: int,
    triton_http_port: int,
    bind: str,
    grpc_port: int,
    http_port: int,
    shm_prefix: str = "",
    extra_args: list[str] | None = None,
) -> list[str]:
    """The front door (``tts_tools.front``) on the public ports, tritonserver on loopback ones."""
    return [
        sys.executable,
        "-m",
        "tts_tools.front",
        f"--triton-grpc=127.0.0.1:{triton_grpc_port}",
        f"--triton-http=127.0.0.1:{triton_http_port}",
        f"--bind={bind}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--shm-prefix={shm_prefix}",
        *(extra_args or []),
    ]


class FrontProcess(ChildProcess, Endpoints):
    """``python -m tts_tools.front`` before a ServerProcess, on free ports; up when Triton's
    readiness answers through it."""

    name = "front"
    start_timeout = 30.0

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

    def up(self) -> bool:
        return is_ready(self.http_port)


def _stop(process: subprocess.Popen, grace: float, kill: bool = True) -> None:
    """SIGTERM, wait up to ``grace``, then SIGKILL (``kill``) or leave it running."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            if kill:
                process.kill()
                process.wait()


def supervise(
    cmd: list[str],
    http_port: int,
    repository: Path,
    headers: dict[str, str],
    gateway_cmd: list[str] | None = None,
    drain_s: float = GATEWAY_DRAIN_S,
    restarts: RestartPolicy | None = None,
    metrics: SupervisorMetrics | None = None,
    gateway_restarts: RestartPolicy | None = None,
    env: dict[str, str] | None = None,
    restricted: str = RESTRICTED,
    shm_prefix: str = "",
    front_cmd: list[str] | None = None,
) -> int:
    """Run tritonserver (and the front door and the gateway) as children with the supervisor
    beside them.

    SIGTERM/SIGINT stop the gateway first, which stops accepting and lets its requests finish
    (up to ``drain_s``) while Triton still serves them; then the front door the same way (its
    connections to Triton closed, so none holds Triton's exit); then tritonserver. A gateway
    or front door that dies is started again; so is a tritonserver that dies on its own (a
    crash, an OOM kill), with backoff, until ``restarts`` says it keeps dying; then the
    launcher exits with its code.
    """
    restarts = restarts or RestartPolicy()
    metrics = metrics or SupervisorMetrics()
    stopping = threading.Event()
    say = functools.partial(print, flush=True)

    def on_signal(signum, _frame) -> None:
        if not stopping.is_set():
            say(f"launcher: {signal.Signals(signum).name}, stopping")
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    drained = threading.Event()  # the front door has drained, but waits for Triton to go
    signal.signal(signal.SIGUSR1, lambda *_: drained.set())
    # Stubs of a tritonserver that died are reparented here (not to init) and ended below.
    become_subreaper()
    gateway: Keeper | None = None
    front: Keeper | None = None
    while True:
        # Their own sessions: a terminal's Ctrl-C reaches only us, and we forward it once.
        process = subprocess.Popen(
            cmd,
            env=env or server_env(),
            start_new_session=True,
            umask=SERVER_UMASK,
            preexec_fn=die_with_parent,
        )
        while process.poll() is None and not stopping.is_set() and not is_ready(http_port):
            stopping.wait(0.5)
        key = headers.get(ADMIN_HEADER, "")
        if (
            process.poll() is None
            and not stopping.is_set()
            and not key_works(http_port, key, restricted)
        ):
            say(f"launcher: {KEY_FAILED}")
            process.kill()
            process.wait()
            return 1
        supervisor: Supervisor | None = None
        if process.poll() is None and not stopping.is_set():
            supervisor = Supervisor(
                process.pid,
                http_port,
                repository,
                headers,
                say,
                metrics=metrics,
                shm_prefix=shm_prefix,
            ).start()
            if front_cmd and front is None:
                front = Keeper(
                    "the front door",
                    lambda: subprocess.Popen(front_cmd, start_new_session=True),
                    RestartPolicy(),
                    say,
                )
            if gateway_cmd and gateway is None:
                gateway = Keeper(
                    "the gateway",
                    lambda: subprocess.Popen(gateway_cmd, start_new_session=True),
                    gateway_restarts or RestartPolicy(),
                    say,
                )
        keepers = [k for k in (front, gateway) if k]
        while process.poll() is None and not stopping.is_set():
            if not all(k.check(time.monotonic()) for k in keepers):
                stopping.set()
                break
            end_orphans(keep={process.pid, *(p for k in keepers for p in k.pids())})
            stopping.wait(0.5)
        if stopping.is_set():
            break
        # tritonserver died on its own. Its stubs would live on (they were seen for minutes,
        # mapping the dead server's regions): end them, then remove the regions.
        code = process.wait()
        if supervisor:
            supervisor.stop()
        orphans = end_orphans(keep={p for k in keepers for p in k.pids()})
        if orphans:
            say(f"launcher: ended {len(orphans)} stub(s) of the dead tritonserver")
        remove_regions(shm_prefix, set(), say)
        delay = restarts.next_delay(time.monotonic())
        if delay is None:
            say(f"launcher: tritonserver exited ({code}) {restarts.describe()}; giving up")
            for keeper in keepers:
                keeper.stop(drain_s)
            return code or 1
        say(f"launcher: tritonserver exited ({code}); starting it again in {delay:.0f} s")
        metrics.server_restarts.inc()
        if stopping.wait(delay):
            for keeper in keepers:
                keeper.stop(drain_s)
            return 0  # stopped on request while the server was down: nothing left to stop
    # The gateway drains into the front door, the front door into Triton: in that order. A
    # front door that holds streams of dead stubs exits only once Triton has (see front.py).
    if gateway:
        gateway.stop(drain_s)
    if front and front.process and front.process.poll() is None:
        front.process.send_signal(signal.SIGTERM)
        until = time.monotonic() + drain_s
        while front.process.poll() is None and not drained.is_set() and time.monotonic() < until:
            time.sleep(0.05)
    if supervisor:  # stubs stop on purpose now: nothing to heal
        supervisor.stop(wait=False)
    if process.poll() is None:
        say("launcher: stopping tritonserver")
        process.send_signal(signal.SIGTERM)
    code = process.wait()
    if code != 0 and drained.is_set():
        # The front door held streams of stubs that died (their clients already got an error):
        # Triton 2.51 keeps them in flight for ever, so its exit timeout passes (exit 1), or
        # closing them aborts it; everything else had finished.
        say(
            f"launcher: tritonserver exited {code} on streams of stubs that died earlier "
            "(Triton 2.51 never ends them); everything else had finished"
        )
        code = 0
    orphans = end_orphans(keep={p for k in (front, gateway) if k for p in k.pids()})
    if orphans:
        say(f"launcher: ended {len(orphans)} stub(s) tritonserver left behind")
    if front:
        front.stop(10.0)
    if supervisor:
        supervisor.stop()
    remove_regions(shm_prefix, set(), say)  # what stubs that died along the way left behind
    return 1 if any(k and k.gave_up for k in (gateway, front)) else code


class Keeper:
    """A child the launcher keeps running (the gateway): started again after it exits, after
    the policy's backoff, until the policy gives up (a taken port made it restart once a
    second for ever before)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], subprocess.Popen],
        policy: RestartPolicy,
        say: Callable[[str], None],
    ) -> None:
        self.name, self.start, self.policy, self.say = name, start, policy, say
        self.process: subprocess.Popen | None = start()
        self.due: float | None = None  # when it is started again
        self.gave_up = False

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process else []

    def check(self, now: float) -> bool:
        """Start it again when due; False once it has died too often (the launcher stops)."""
        if self.process and self.process.poll() is not None and self.due is None:
            code = self.process.returncode
            delay = self.policy.next_delay(now)
            if delay is None:
                self.say(
                    f"launcher: {self.name} exited ({code}) {self.policy.describe()}; "
                    "giving up (its error is above)"
                )
                self.gave_up = True
                return False
            self.say(f"launcher: {self.name} exited ({code}); starting it again in {delay:.0f} s")
            self.due = now + delay
        if self.due is not None and now >= self.due:
            self.process, self.due = self.start(), None
        return True

    def stop(self, grace: float, kill: bool = True) -> None:
        if self.process:
            _stop(self.process, grace, kill)


@dataclass
class RestartPolicy:
    """Restart a dead tritonserver after 1, 2, 4 ... (at most 30) s, but not more than
    ``max_restarts`` times within ``window_s``: a server that keeps dying needs a person."""

    max_restarts: int = 5
    window_s: float = 600.0
    times: list[float] = field(default_factory=list)

    def next_delay(self, now: float) -> float | None:
        self.times = [t for t in self.times if now - t < self.window_s]
        if len(self.times) >= self.max_restarts:
            return None
        self.times.append(now)
        return float(min(30, 2 ** (len(self.times) - 1)))

    def describe(self) -> str:
        return f"{len(self.times)} times within {self.window_s:.0f} s"


if __name__ == "__main__":
    main()
