"""The edge: nginx on the public ports, in front of the front door and the gateway.

What a maintained proxy does well is left to one (docs/decisions/0003-nginx-edge.md): the
connections (how many in all and per address, how long a request head, a body or an idle
connection may take), HTTP/2's limits, the path normalized before anything routes on it,
request bodies buffered to disk rather than memory, and the forwarding headers written by
the edge alone. Each public port is an nginx of its own (its own worker and connections), so
no port's clients can use up another's connections. The front door behind it keeps what
nginx cannot do: admission by cost, per-client queues and stream caps, the model gate,
Triton's inner key.

Every limit is a front door setting (tts_front/settings.py), defined there once: the
launcher renders this file's configuration from them, and a front door without an edge
(``--no-edge``, the tests of the front door alone) enforces the same settings itself.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tts_front.settings import MIB, FrontSettings
from tts_wire import EDGE_ADDRESS_HEADER, EDGE_KEY_HEADER

from .commands import StopBudget

# The longest a request or a stream may wait between two reads from the front door or the
# gateway: the front door's own deadlines (a client's may be up to FrontSettings' 3600 s) and
# the gateway's session limits end work sooner; this only keeps a wedged upstream from holding
# a connection for ever.
UPSTREAM_READ_S = 3600
# Request bodies up to this size are held in memory; larger ones are written to a file of the
# launch's own folder and sent on from there (12 bodies of 60 MiB cost the front door 1 GB).
BODY_IN_MEMORY = "1m"


@dataclass(frozen=True)
class EdgePorts:
    """Where the edge listens (public) and where it sends each port's requests (loopback)."""

    bind: str
    http: int  # public: Triton's HTTP API
    grpc: int  # public: Triton's gRPC API
    gateway: int  # public: the OpenAI-compatible gateway (0: none)
    front_http: int  # inner: the front door's HTTP
    front_grpc: int  # inner: the front door's gRPC
    gateway_inner: int  # inner: the gateway (0: none)


def nginx_binary() -> str:
    """nginx's path; a clear error when it is not installed."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    if not found:
        raise FileNotFoundError(
            "nginx is not installed: `make system-deps` installs it (Debian's nginx package), "
            "or start with --no-edge to serve the front door on the public ports itself"
        )
    return found


def _listen(bind: str, port: int, http2: bool = False, sndbuf_kib: int = 0) -> str:
    host = f"[{bind}]" if ":" in bind else bind
    sndbuf = f" sndbuf={sndbuf_kib}k" if sndbuf_kib else ""
    return f"listen {host}:{port}{' http2' if http2 else ''}{sndbuf};"


def _forwarding(directive: str, key: str) -> str:
    """Headers the edge writes over whatever the client sent under the same names."""
    return "\n".join(
        f"      {directive} {name} {value};"
        for name, value in (
            (EDGE_ADDRESS_HEADER, "$remote_addr"),
            ("X-Forwarded-For", "$remote_addr"),
            (EDGE_KEY_HEADER, f'"{key}"'),
        )
    )


def _refusals(settings: FrontSettings, per_client: int) -> dict[int, str]:
    """What a client reads when the edge itself refuses (the status: the reason)."""
    return {
        429: f"this address has {per_client} requests in progress, the limit per client "
        "address; wait for one to finish",
        413: f"the request body is over {settings.max_request_bytes / MIB:g} MiB, the limit",
        502: "the server behind this port is not answering (starting or restarting); retry "
        "in a few seconds",
        504: "the server behind this port did not answer in time; retry",
    }


def _errors(kind: str, refusals: dict[int, str]) -> str:
    """The edge's own refusals in the protocol of the port: Triton's JSON error, OpenAI's, or
    a gRPC status (a client library then reads a reason, not an HTML page)."""
    lines = []
    for status, why in refusals.items():
        name = f"@{kind}_{status}"
        lines.append(f"    error_page {status} = {name};")
        if kind == "grpc":
            code = 8 if status == 429 else 14  # RESOURCE_EXHAUSTED, UNAVAILABLE
            lines.append(
                f"    location {name} {{ internal; default_type application/grpc; "
                f"add_header grpc-status {code} always; "
                f'add_header grpc-message "{why}" always; return 204; }}'
            )
            continue
        if kind == "openai":
            kind_of = {429: "rate_limit_error", 413: "invalid_request_error"}.get(
                status, "server_error"
            )
            body = f'{{"error":{{"message":"{why}","type":"{kind_of}","param":null,"code":null}}}}'
        else:
            body = f'{{"error":"{why}"}}'
        retry = "add_header Retry-After 1 always; " if status in (429, 502) else ""
        lines.append(
            f"    location {name} {{ internal; default_type application/json; {retry}"
            f"return {status} '{body}'; }}"
        )
    return "\n".join(lines)


def _upstream(name: str, port: int, keepalive_s: int) -> str:
    """A loopback upstream whose idle connections the edge closes after ``keepalive_s``
    (before the server behind closes them under a request being sent)."""
    return f"""
  upstream {name} {{
    server 127.0.0.1:{port};
    keepalive 64;
    keepalive_timeout {keepalive_s}s;
  }}"""


def _http_server(
    listen: str, zone: str, per_client: int, errors: str, upstream: str, key: str, upgrade: bool
) -> str:
    """A public HTTP port proxied to ``upstream`` (``upgrade``: WebSocket sessions too)."""
    # Other requests keep the connection to the upstream open for the next one.
    connection = "$connection_upgrade" if upgrade else '""'
    websocket = "\n      proxy_set_header Upgrade $http_upgrade;" if upgrade else ""
    return f"""
  server {{
    {listen}
    limit_conn {zone} {per_client};
{errors}
    location / {{
      proxy_pass http://{upstream}/;
      proxy_http_version 1.1;
      proxy_set_header Host $http_host;  # with its port: origins are checked by it{websocket}
      proxy_set_header Connection {connection};
{_forwarding("proxy_set_header", key)}
      proxy_buffering off;  # audio and events stream as they are made
      proxy_read_timeout {UPSTREAM_READ_S}s;
      proxy_send_timeout {UPSTREAM_READ_S}s;
    }}
  }}"""


def _main(worker_connections: int, folder: Path, drain_s: float) -> str:
    """What every port's nginx has: one worker of its own and its own files."""
    return f"""daemon off;
master_process on;
worker_processes 1;
worker_rlimit_nofile {2 * worker_connections + 256};
pid {folder}/nginx.pid;
error_log stderr warn;
# A stop lets what is in flight finish: the gateway's and the front door's drains end their
# requests cleanly first; this only bounds what is still on its way to a slow client.
worker_shutdown_timeout {int(StopBudget(drain_s).edge_s)}s;

events {{
  worker_connections {worker_connections};
}}
"""


def _http_common(s: FrontSettings, folder: Path, zone: str) -> str:
    body = f"{max(1, round(s.max_request_bytes / MIB))}m"
    return f"""  access_log off;
  server_tokens off;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi;
  uwsgi_temp_path {folder}/uwsgi;
  scgi_temp_path {folder}/scgi;

  # Requests in progress per address (gRPC: calls), over it 429 at once; a refusal is not
  # logged (one line per refusal is a lever to fill the disk).
  limit_conn_zone $binary_remote_addr zone={zone}:4m;
  limit_conn_status 429;
  limit_conn_log_level info;
  client_header_timeout {s.header_timeout_s:g}s;
  client_body_timeout {s.body_timeout_s:g}s;
  keepalive_timeout {s.idle_timeout_s:g}s;
  send_timeout {s.body_timeout_s:g}s;
  client_max_body_size {body};
  client_body_buffer_size {BODY_IN_MEMORY};
  large_client_header_buffers 4 16k;
  http2_max_concurrent_streams {s.max_streams_per_connection};
  # Paths are normalized (dot segments, duplicate slashes, percent-encoding) before any
  # location matches, and the normalized path is what goes upstream (proxy_pass with a URI).
  merge_slashes on;
"""


def grpc_calls_per_client(settings: FrontSettings) -> int:
    """gRPC calls in progress per address at the edge: on the gRPC port a connection carries
    many calls and limit_conn counts calls, so as many as admission would queue and serve for
    one client, no fewer."""
    s = settings
    return max(s.max_connections_per_client, s.max_waiting_per_client + s.slots)


def render(settings: FrontSettings, ports: EdgePorts, key: str, folder: Path) -> dict[str, str]:
    """nginx's configuration for one launch, one per public port ("http", "grpc", "gateway"):
    each port is its own nginx with its own connections, so connections held on one port
    (21,000 half-sent heads on the gateway's) cannot take another's. ``folder``: each port's
    pid file and body buffers go in a folder of that port's name there."""
    s = settings
    worker_connections = s.edge_connections()
    grpc_per_client = grpc_calls_per_client(s)
    per_client = s.max_connections_per_client
    refusals = _refusals(s, per_client)
    front_keepalive = max(1, int(s.idle_timeout_s / 2))
    http = _http_server(
        _listen(ports.bind, ports.http), "http", per_client,
        _errors("triton", refusals), "front_http", key, upgrade=False,
    )  # fmt: skip
    grpc_refusals = {k: v for k, v in _refusals(s, grpc_per_client).items() if k != 413}
    grpc = f"""
  server {{
    {_listen(ports.bind, ports.grpc, http2=True)}
    limit_conn grpc {grpc_per_client};
    # A stream's client may send nothing for minutes while its audio is made: the wait
    # between two of its messages is bounded by the front door (deadlines, stream caps),
    # not by a body timeout.
    client_body_timeout {UPSTREAM_READ_S}s;
    client_max_body_size 0;  # a stream's messages add up; the front door caps each one
{_errors("grpc", grpc_refusals)}
    location / {{
      grpc_pass grpc://front_grpc;
{_forwarding("grpc_set_header", key)}
      grpc_read_timeout {UPSTREAM_READ_S}s;
      grpc_send_timeout {UPSTREAM_READ_S}s;
    }}
  }}"""
    servers = {
        "http": _upstream("front_http", ports.front_http, front_keepalive) + http,
        "grpc": _upstream("front_grpc", ports.front_grpc, front_keepalive) + grpc,
    }
    if ports.gateway:  # uvicorn closes idle connections after 5 s
        servers["gateway"] = _upstream("gateway", ports.gateway_inner, 4) + _http_server(
            _listen(ports.bind, ports.gateway, sndbuf_kib=s.edge_send_buffer_kib), "gateway",
            per_client,
            _errors("openai", refusals), "gateway", key, upgrade=True,
        )  # fmt: skip
    upgrade = """
  map $http_upgrade $connection_upgrade {
    default upgrade;
    '' '';
  }"""
    return {
        name: f"""# Rendered by tts_launcher/edge.py for one launch: the edge on the {name} port.
# Edit the front door's settings (FRONT_ARGS), not this file.
{_main(worker_connections, folder / name, settings.drain_s)}
http {{
{_http_common(s, folder / name, name)}{upgrade if name == "gateway" else ""}
{server}
}}
"""
        for name, server in servers.items()
    }


def edge_command(config: Path) -> list[str]:
    """nginx in the foreground on ``config`` (its prefix: the config's folder)."""
    return [nginx_binary(), "-p", str(config.parent), "-e", "stderr", "-c", str(config)]


def write_config(
    settings: FrontSettings, ports: EdgePorts, key: str, folder: Path
) -> dict[str, Path]:
    """Each public port's configuration file in a folder of its own under ``folder``
    (readable by its owner only: it holds the key), by the port's name."""
    # Traversable by nginx's workers (nobody, under a root master), for their body buffers:
    # set even when it exists (a mkdtemp folder is 0700, and root's workers got 500s).
    written = {}
    for name, text in render(settings, ports, key, folder).items():
        for path in (folder, folder / name):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o711)
        config = folder / name / "nginx.conf"
        config.touch(mode=0o600)
        config.write_text(text)
        written[name] = config
    return written
