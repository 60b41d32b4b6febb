"""The command lines of tritonserver, the front door and the gateway, and the ports they need."""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tts_front.security import ADMIN_HEADER, INNER_HEADER
from tts_wire import DRAIN_MARGIN_S

from .admin_key import DEFAULT_BIND, RESTRICTED
from .environment import (
    CPU_ONLY_ARGS,
    INNER_PLACEHOLDER,
    KEY_PLACEHOLDER,
    gpu_args,
    has_gpu,
    prepare_backends,
    tritonserver_binary,
)
from .stub_healing import (
    SUPERVISED_ARGS,
)

# tritonserver's exit timeout behind the front door (which drains first).
FRONTED_EXIT_TIMEOUT_S = 5
# After SIGTERM, requests and streams in flight get this long by default (--drain-s).
DRAIN_S = 30.0
# A front door still holding streams of dead stubs after Triton stopped gets this long.
STUCK_STREAMS_S = 10.0


@dataclass(frozen=True)
class StopBudget:
    """Every deadline of a stop, derived from one setting, ``drain_s``: the gateway's and
    the front door's drains (each ends what it carries by then: an SSE stream with its `error`
    event, a gRPC call with a status), uvicorn's backstop behind the gateway's (DRAIN_MARGIN_S
    later), the launcher's wait for each (DRAIN_MARGIN_S after the last of that process's own),
    the edge's and the whole stop's. Written out once each, they had drifted apart: a 60 s
    gateway drain was cut at the launcher's fixed 40 s, its SSE streams with no final event."""

    drain_s: float = DRAIN_S

    def __post_init__(self) -> None:
        if not 0 <= self.drain_s <= 3600:
            raise ValueError(f"the drain must be in [0, 3600] s, not {self.drain_s}")

    @property
    def gateway_wait_s(self) -> float:
        """How long the launcher waits for the gateway to exit (after its uvicorn backstop)."""
        return self.drain_s + 2 * DRAIN_MARGIN_S

    @property
    def front_wait_s(self) -> float:
        """How long the launcher waits for the front door to drain (after its own drain)."""
        return self.drain_s + DRAIN_MARGIN_S

    @property
    def total_s(self) -> float:
        """The longest a SIGTERM'd launcher takes (children._stop_in_order): the gateway, then
        the front door, then tritonserver (its exit timeout), then a front door still holding
        streams of dead stubs. An orchestrator's grace period must cover it."""
        return self.gateway_wait_s + self.front_wait_s + FRONTED_EXIT_TIMEOUT_S + STUCK_STREAMS_S

    @property
    def edge_s(self) -> float:
        """The edge (nginx) closes its ports first and stops last: what it still sends to a
        slow client after everything behind it has stopped gets the rest of the budget."""
        return self.total_s - 3.0


# The default's: deploy/ and docker-compose.yml give the stop this long (tested).
STOP_BUDGET_S = StopBudget().total_s


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
    inner: bool = False,
) -> list[str]:
    """The tritonserver command line; ``supervised``: with the model-control flags the
    supervisor needs; ``metrics_bind``: the metrics address when it differs from ``bind``
    (behind the front door, HTTP and gRPC stay on loopback); ``inner``: inference needs the
    launch's inner key (behind the front door: nothing reaches the models around it).

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
        *(
            (
                f"--http-restricted-api=inference:{INNER_HEADER}={INNER_PLACEHOLDER}",
                f"--grpc-restricted-protocol=inference:{INNER_HEADER}={INNER_PLACEHOLDER}",
            )
            if inner
            else ()
        ),
        *([f"--backend-config=python,shm-region-prefix-name={shm_prefix}"] if shm_prefix else []),
        "--allow-metrics=true",
        "--exit-on-error=true",
        "--strict-readiness=true",
        *(gpu_args() if has_gpu() else CPU_ONLY_ARGS),
        *(extra_args or []),
    ]


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` of a child's log file (for failures and test reports)."""
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    """One free loopback port, chosen as :func:`free_ports` chooses them."""
    return free_ports(1)[0]


# Where the kernel takes the local ports of outgoing connections (Linux's default when its
# setting cannot be read).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
# The lowest port chosen for an inner hop: above the public ones the launcher listens on by
# default (8000-8003, 8080, 10200) and the well-known services.
LOWEST_CHOSEN_PORT = 20000


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (and for a bind to port 0)."""
    try:
        low, high = (int(v) for v in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def port_pool(ephemeral: tuple[int, int]) -> range:
    """The ports free_ports chooses from: the larger stretch outside ``ephemeral`` (from
    LOWEST_CHOSEN_PORT up), or the whole range above it where neither stretch is left."""
    low, high = ephemeral
    below, above = range(LOWEST_CHOSEN_PORT, low), range(high + 1, 65536)
    pool = max(below, above, key=len)
    return pool if len(pool) >= 1000 else range(LOWEST_CHOSEN_PORT, 65536)


def free_ports(n: int, avoid: Iterable[int] = (), rng: random.Random | None = None) -> list[int]:
    """``n`` distinct free loopback ports, none of ``avoid``, outside the kernel's range for
    outgoing connections: a port chosen is bound only seconds later (the front door's, once
    Triton is ready), and one from that range was taken meanwhile as an outgoing connection's
    local port on a busy machine (the front door then failed to start: address in use). Held
    open together while they are chosen (one at a time the same port came out twice)."""
    avoid, held, ports = set(avoid), [], []
    pool = port_pool(ephemeral_range())
    rng = rng or random.SystemRandom()
    try:
        for port in rng.sample(pool, min(len(pool), 50 * n + 100)):
            if len(ports) == n:
                break
            if port in avoid:
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
            ports.append(port)
        while len(ports) < n:  # the pool is taken: what the kernel gives
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
            if (port := s.getsockname()[1]) not in avoid:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def taken_ports(
    bind: str, ports: list[tuple[int, str]], launchers: Iterable[int] = ()
) -> list[str]:
    """A line for each port (0: none) that cannot be bound on ``bind``: who holds it where
    that can be seen (another launcher among ``launchers``, by its process tree, or any other
    process), and the option or make variable that moves it."""
    lines = []
    for port, option in ports:
        if not port:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # As the servers themselves bind: the last run's closed connections (TIME_WAIT)
            # do not hold the port, a socket listening on it still does.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((bind, port))
                s.listen()
                continue
            except OSError as e:
                why = e.strerror
        holder = _holder(port, why, set(launchers))
        lines.append(f"port {port} on {bind} is not free{holder}, or choose another with {option}")
    return lines


def _holder(port: int, why: str, launchers: set[int]) -> str:
    """Who listens on ``port``, as the rest of a sentence."""
    owner = port_owner(port)
    if owner is None:  # another user's, unseen: only the kernel's word
        return f" ({why}); stop what uses it"
    try:
        tree = [owner.pid, *(p.pid for p in owner.parents())]
        name = owner.name()
    except psutil.Error:
        return f" ({why}); stop what uses it"
    launcher = next((pid for pid in tree if pid in launchers), None)
    if launcher is not None:
        its = "" if launcher == owner.pid else f" ({name}, pid {owner.pid}, is its child)"
        return (
            f": another launcher (`make serve`, pid {launcher}) is running and holds it{its}; "
            "stop it (Ctrl-C)"
        )
    return f": {name} (pid {owner.pid}) listens on it; stop it"


def port_owner(port: int) -> psutil.Process | None:
    """The process listening on ``port``, where this user may see it (root sees all)."""
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                return psutil.Process(conn.pid)
    except psutil.Error:
        pass
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


def front_command(
    triton_grpc_port: int,
    triton_http_port: int,
    bind: str,
    grpc_port: int,
    http_port: int,
    shm_prefix: str = "",
    extra_args: list[str] | None = None,
) -> list[str]:
    """The front door (``tts_front``) on the public ports, tritonserver on loopback ones."""
    return [
        sys.executable,
        "-m",
        "tts_front",
        f"--triton-grpc=127.0.0.1:{triton_grpc_port}",
        f"--triton-http=127.0.0.1:{triton_http_port}",
        f"--bind={bind}",
        f"--grpc-port={grpc_port}",
        f"--http-port={http_port}",
        f"--shm-prefix={shm_prefix}",
        *(extra_args or []),
    ]
