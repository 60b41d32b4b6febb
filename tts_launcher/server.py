"""Start the real ``tritonserver`` shipped in the nvidia-pytriton wheel on a model repository.

``python -m tts_launcher --model-repository model_repository`` (``make serve`` calls it).
The wheel carries Triton 2.51 with the Python backend; what it needs to run outside PyTriton:
a backend directory holding the stub for this interpreter, libpython's directory first on
LD_LIBRARY_PATH, and this environment's ``bin/`` first on PATH.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from export.serving import servers, serving
from tts_front.security import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    ADMIN_KEY_FILE_ENV,
    EDGE_KEY_ENV,
    FRONT_TOKEN_ENV,
    FRONT_TOKEN_FILE_ENV,
    GATEWAY_EDGE_KEY_ENV,
    GATEWAY_FRONT_TOKEN_ENV,
    INNER_KEY_ENV,
    admin_headers,
    admin_key,
    inner_headers,
    secret_setting,
)
from tts_front.settings import (
    ENV_PREFIX as FRONT_PREFIX,
    FRONT_LIVE_PATH,
    parse_args as front_settings,
)
from tts_triton.probes import answers_ok

from .children import supervise
from .commands import (
    FRONTED_EXIT_TIMEOUT_S,
    free_ports,
    front_command,
    gateway_command,
    server_command,
    taken_ports,
)
from .edge import EdgePorts, edge_command, write_config
from .environment import has_gpu, quiet_grpc, server_env
from .liveness import LIVE_PATH, Heartbeat, serve as serve_metrics
from .repository import gateway_voices
from .served import front_slots, front_streams, levels_scheduled, null_engine, profiles
from .settings import LauncherSettings, parse_args
from .stub_healing import (
    SupervisorMetrics,
    new_shm_prefix,
)


def profile_name(extra: list[str]) -> str | None:
    """The profile among tritonserver's flags (``--model-config-name``), if one is asked for."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--model-config-name")
    return flags.parse_known_args(extra)[0].model_config_name


def profile_problem(profile: str | None, repository: Path) -> str | None:
    """Why ``profile`` cannot be served from ``repository`` (None: it can). Triton itself
    would load config.pbtxt in silence for a profile no model has."""
    if profile is None:
        return None
    have = profiles(repository)
    if profile not in have:
        return (
            f"no model in {repository} has the profile {profile!r} (configs/{profile}.pbtxt); "
            f"it serves {', '.join(have) or 'none'} (a benchmark's baseline is served from the "
            "repository python -m bench.baselines makes)"
        )
    if null_engine(profile, repository):
        return (
            f"profile {profile} runs the null engine, which serves silence; it is for "
            "python -m perf_analyzer_configs.host_ceiling only"
        )
    return None


def local_host(bind: str) -> str:
    """The address this machine reaches a server bound to ``bind`` at."""
    return "127.0.0.1" if bind in ("0.0.0.0", "::") else bind


def port_open(bind: str, port: int) -> bool:
    """Something accepts connections on the port (``bind``: the address it listens on)."""
    try:
        with socket.create_connection((local_host(bind), port), timeout=1):
            return True
    except OSError:
        return False


def front_live(bind: str, port: int) -> bool:
    """The front door's own liveness answer (its event loop runs), not Triton's."""
    return answers_ok(f"http://{local_host(bind)}:{port}{FRONT_LIVE_PATH}")


def banner(args: LauncherSettings, gpu: bool) -> str:
    """What ``make serve`` prints once the service answers: where to reach each interface."""
    host = local_host(args.bind)
    lines = ["", "=" * 72, "ready:"]
    if args.gateway_port:
        lines += [
            f"  page             http://{host}:{args.gateway_port}/",
            f"  OpenAI base URL  http://{host}:{args.gateway_port}/v1",
        ]
    if args.gateway_port and args.wyoming_port:
        lines.append(f"  Wyoming          tcp://{host}:{args.wyoming_port}   (Home Assistant)")
    lines += [
        f"  Triton gRPC      {host}:{args.grpc_port}   (tritonclient, perf_analyzer -i grpc)",
        f"  Triton HTTP      http://{host}:{args.http_port}   (curl, perf_analyzer -i http)",
    ]
    if not gpu:
        lines.append(
            "  (no GPU here: tritonserver's 'CudaDriverHelper has not been initialized' and "
            "'unable to create stream ... CUDA driver version is insufficient' above are "
            "harmless; the models run on the CPU)"
        )
    lines += [
        "Ctrl-C stops (requests in flight finish first); Ctrl-C again stops at once.",
        "=" * 72,
    ]
    return "\n".join(lines)


def announce_when_ready(args: LauncherSettings, gpu: bool, timeout_s: float = 600.0) -> None:
    """Print the banner once, when the gateway (or, without one, the front door) answers
    ready; from a thread, so the launcher's own start is not held up."""
    host = local_host(args.bind)
    if args.gateway_port:
        url = f"http://{host}:{args.gateway_port}/ready"
    else:
        url = f"http://{host}:{args.http_port}/v2/health/ready"

    def wait() -> None:
        until = time.monotonic() + timeout_s
        while time.monotonic() < until:
            if answers_ok(url):
                print(banner(args, gpu), flush=True)
                return
            time.sleep(0.5)

    threading.Thread(target=wait, name="banner", daemon=True).start()


def refuse_to_start(args: LauncherSettings, extra: list[str]) -> None:
    """Exit 2 with the reason for a profile it cannot serve or a port already taken."""
    problem = profile_problem(profile_name(extra), args.model_repository)
    if problem:
        print(f"launcher: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    taken = taken_ports(
        args.bind,
        [
            (args.http_port, "--http-port / HTTP_PORT"),
            (args.grpc_port, "--grpc-port / GRPC_PORT"),
            (args.metrics_port, "--metrics-port / METRICS_PORT"),
            (args.gateway_port, "--gateway-port / GATEWAY_PORT"),
            (args.wyoming_port if args.gateway_port else 0, "--wyoming-port / WYOMING_PORT"),
            (args.supervisor_metrics_port, "--supervisor-metrics-port / SUPERVISOR_METRICS_PORT"),
        ],
        [pid for pid in servers() if pid != os.getpid()],
    )
    for line in taken:  # every one at once: fixing them one start at a time is slow
        print(f"launcher: {line}", file=sys.stderr, flush=True)
    if taken:
        sys.exit(2)


def front_listens(args: LauncherSettings, edge: EdgePorts | None) -> tuple[str, int, int]:
    """Where the front door listens, (host, gRPC port, HTTP port): behind the edge its
    loopback ports, else the public ones."""
    if edge:
        return "127.0.0.1", edge.front_grpc, edge.front_http
    return args.bind, args.grpc_port, args.http_port


def front_door(
    args: LauncherSettings,
    triton_grpc: int,
    triton_http: int,
    shm_prefix: str,
    edge: EdgePorts | None,
    profile: str | None = None,
) -> list[str]:
    """The front door's command line (and the token the gateway shows it, in the environment):
    its slots and streams the profile's, unless $TTS_FRONT_SLOTS or $TTS_FRONT_SERVER_STREAMS
    sets them; its other settings it reads from the environment it inherits."""
    # The gateway shows the front door this token (the children inherit it; a process's
    # environment is readable by its own user only): its callers are capped per address
    # by the gateway, not lumped together as one client of the front door. A token given
    # ($TTS_FRONT_TOKEN or $TTS_FRONT_TOKEN_FILE) is kept: a gateway in pods of its own
    # (deploy/overlays/gpu) holds the same one, from a Secret.
    given = secret_setting(FRONT_TOKEN_ENV, FRONT_TOKEN_FILE_ENV, "the front door's token")
    token = given or secrets.token_urlsafe(32)
    os.environ[FRONT_TOKEN_ENV] = os.environ[GATEWAY_FRONT_TOKEN_ENV] = token
    repository = args.model_repository
    derived = {
        "slots": front_slots(profile, repository),
        "server_streams": front_streams(profile, repository),
        "express_interactive": str(levels_scheduled(profile, repository)).lower(),
    }
    flags = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in derived.items()
        if FRONT_PREFIX + name.upper() not in os.environ
    ]
    return front_command(
        triton_grpc,
        triton_http,
        *front_listens(args, edge),
        shm_prefix,
        [
            "--notify-parent",
            *flags,
            f"--drain-s={args.stop_budget.drain_s:g}",
        ],
    )


def gateway_child(args: LauncherSettings, edge: EdgePorts | None) -> list[str]:
    """The gateway's command line (behind the edge: on a loopback port, straight to the
    front door's; its Wyoming port is still its own, on --bind)."""
    host, grpc_port, _ = front_listens(args, edge)
    # The repository's voices (voices.json), each under its own name: a voice added with
    # `make serve VOICES=...` reaches the page and /v1/audio/voices. A voices file or
    # $TTS_GATEWAY_VOICES_FILE (the gateway's own settings: README, Settings) wins.
    command = gateway_command(
        f"grpc://{local_host(host)}:{grpc_port}",
        "127.0.0.1" if edge else args.bind,
        edge.gateway_inner if edge else args.gateway_port,
        [
            f"--triton-voices={gateway_voices(args.model_repository)}",
            f"--voice-configs={(args.model_repository / 'phonemizer' / '1').resolve()}",
            f"--wyoming-port={args.wyoming_port}",
            f"--wyoming-host={args.bind}",
            f"--drain-s={args.stop_budget.drain_s:g}",
        ],
    )
    print(
        f"gateway: OpenAI-compatible API on http://{args.bind}:{args.gateway_port}/v1",
        flush=True,
    )
    return command


def inner_ports(args: LauncherSettings) -> list[int]:
    """The loopback ports behind the public ones, distinct from each other and from every
    port the command line names: tritonserver's HTTP and gRPC, then the front door's and the
    gateway's behind the edge."""
    public = (args.http_port, args.grpc_port, args.metrics_port, args.gateway_port,
              args.wyoming_port, args.supervisor_metrics_port)  # fmt: skip
    return free_ports(5, avoid=public)


def edge_ports(args: LauncherSettings, inner: list[int]) -> EdgePorts | None:
    """Where the edge listens and where it sends each port (None: no edge)."""
    if args.no_front or args.no_edge:
        return None
    return EdgePorts(
        bind=args.bind,
        http=args.http_port,
        grpc=args.grpc_port,
        gateway=args.gateway_port,
        front_http=inner[2],
        front_grpc=inner[3],
        gateway_inner=inner[4] if args.gateway_port else 0,
    )


def edge_children(args: LauncherSettings, ports: EdgePorts, folder: Path) -> dict[str, list[str]]:
    """nginx's command lines, one per public port by its name, on this launch's
    configuration rendered from the front door's settings ($TTS_FRONT_*); the key it shows
    the front door and the gateway, in the environment the children inherit."""
    key = secrets.token_urlsafe(32)
    os.environ[EDGE_KEY_ENV] = os.environ[GATEWAY_EDGE_KEY_ENV] = key
    settings = front_settings([f"--drain-s={args.drain_s:g}"])
    configs = write_config(settings, ports, key, folder)
    print(
        f"edge: nginx on {args.bind}:{ports.http} (HTTP), :{ports.grpc} (gRPC)"
        + (f", :{ports.gateway} (gateway)" if ports.gateway else "")
        + f"; {settings.max_connections} connections per port, "
        f"{settings.max_connections_per_client} per address, "
        f"{settings.header_timeout_s:g} s for a request head ($TTS_FRONT_* sets them)",
        flush=True,
    )
    return {name: edge_command(config) for name, config in configs.items()}


def supervisor_metrics(args: LauncherSettings) -> tuple[SupervisorMetrics, Heartbeat]:
    """The launcher's outage metrics and liveness, served when a port is given."""
    metrics = SupervisorMetrics()
    heartbeat = Heartbeat()
    if args.supervisor_metrics_port:
        serve_metrics(args.supervisor_metrics_port, args.bind, metrics.registry, heartbeat)
        print(
            f"supervisor: outage metrics on {args.bind}:{args.supervisor_metrics_port}/metrics, "
            f"the launcher's liveness on {LIVE_PATH}",
            flush=True,
        )
    return metrics, heartbeat


def triton_command(
    args: LauncherSettings, extra: list[str], shm_prefix: str, inner: list[int]
) -> tuple[list[str], int, int]:
    """tritonserver's command line and its HTTP and gRPC ports (behind the front door: the
    first two of ``inner``)."""
    # Behind the front door tritonserver listens on private loopback ports; only the front
    # (and the launcher's own probes) reach it.
    triton_http, triton_grpc = (args.http_port, args.grpc_port) if args.no_front else inner[:2]
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
        inner=not args.no_front,
    )
    return cmd, triton_http, triton_grpc


def main(argv: list[str] | None = None) -> None:
    args, extra = parse_args(argv)
    quiet_grpc(os.environ)  # the children inherit it
    # Known from the start (before any port is bound): a second launcher started at the same
    # moment then finds this one when a port it needs is taken.
    with serving(args.model_repository):
        sys.exit(run(args, extra))


def run(args: LauncherSettings, extra: list[str]) -> int:
    refuse_to_start(args, extra)
    shm_prefix = new_shm_prefix()
    key, configured = admin_key()
    inner_port = inner_ports(args)
    cmd, triton_http, triton_grpc = triton_command(args, extra, shm_prefix, inner_port)
    admin = (
        f"need the {ADMIN_HEADER} header (key from ${ADMIN_KEY_ENV} / ${ADMIN_KEY_FILE_ENV})"
        if configured
        else f"are refused (set ${ADMIN_KEY_ENV} or ${ADMIN_KEY_FILE_ENV} to use them)"
    )
    edge = edge_ports(args, inner_port)
    folder = Path(tempfile.mkdtemp(prefix="tts-edge-")) if edge else None
    try:
        edge_cmds = edge_children(args, edge, folder) if edge and folder else {}
    except FileNotFoundError as e:  # no nginx: say how to get it
        print(f"launcher: {e}", file=sys.stderr, flush=True)
        return 2
    front = (
        None
        if args.no_front
        else front_door(args, triton_grpc, triton_http, shm_prefix, edge, profile_name(extra))
    )
    print(
        f"tritonserver: HTTP on {args.bind}:{args.http_port}, gRPC on {args.bind}:{args.grpc_port}"
        f"{'' if args.no_front else ' (through the front door)'}, metrics on "
        f"{args.bind}:{args.metrics_port}/metrics; model repository {args.model_repository}; "
        f"admin APIs ({args.restricted_apis}) {admin}",
        flush=True,
    )
    gateway = gateway_child(args, edge) if args.gateway_port else None
    # Behind the front door Triton's ports refuse inference without this launch's inner key,
    # which only the front door (from its environment) and the supervisor's canaries hold.
    inner = "" if args.no_front else secrets.token_urlsafe(32)
    if inner:
        os.environ[INNER_KEY_ENV] = inner
    headers = {**admin_headers(key), **inner_headers(inner)}
    metrics, heartbeat = supervisor_metrics(args)
    env = server_env(key=key, cache_dir=args.cache_dir, inner_key=inner)
    announce_when_ready(args, gpu=has_gpu())
    # The front door's probes go to its own ports (behind the edge: the inner ones, so the
    # launcher's liveness probe never queues behind the public connections).
    host, grpc_port, http_port = front_listens(args, edge)
    front_ready = (lambda: port_open(host, grpc_port)) if grpc_port else None
    live = (lambda: front_live(host, http_port)) if http_port else None
    try:
        return supervise(
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
            front_ready=front_ready,
            front_live=live,
            heartbeat=heartbeat,
            edge_cmds=edge_cmds,
            load_budget_s=args.load_budget_s,
            budget=args.stop_budget,
            gateway_ready=(lambda: port_open("127.0.0.1", edge.gateway_inner))
            if edge and edge.gateway_inner
            else None,
        )
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
