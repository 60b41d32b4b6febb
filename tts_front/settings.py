"""The front door's settings: what it enforces, and its command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .connections import ConnectionLimits

MIB = 1 << 20
# Answered by the front door itself (its event loop runs): the launcher's liveness probe.
FRONT_LIVE_PATH = "/front/live"
# Connections the door keeps beyond all the edge can open: the launcher's probes and the
# gateway's channel (FrontSettings.connection_cap).
PROBE_RESERVE = 64

PENDING_CALLS = 16384  # gRPC's queue of calls not yet taken, before it drops any


@dataclass(frozen=True)
class FrontSettings:
    """What the front door enforces; defaults are ``make serve``'s."""

    triton_grpc: str = "127.0.0.1:8001"
    triton_http: str = "127.0.0.1:8000"
    bind: str = "127.0.0.1"
    grpc_port: int = 0  # 0: no gRPC front
    http_port: int = 0  # 0: no HTTP front
    # The largest legitimate message: 16 vocoder latents of max_frames (192 x 4000 float32).
    max_request_bytes: int = 64 * MIB
    # The deadline of a request whose client set none (a gRPC deadline or Triton's "timeout"
    # parameter set one; perf_analyzer and plain tritonclient set none): what a proxy in front
    # waits for a reply by default (nginx's proxy_read_timeout, 60 s), so a request predicted
    # to come back later, which such a proxy would cut anyway, is refused at once instead.
    deadline_s: float = 60.0
    # Models served on the public ports ("*": all); the others answer only to the admin key
    # (an operator's perf_analyzer on one stage). Each public one is admitted by its cost.
    public_models: tuple[str, ...] = ("tts", "tts_stream")
    # Models whose completions measure the throughput admission counts on.
    measured: tuple[str, ...] = ("tts",)
    # Models whose requests are streams (decoupled): admitted at the cost of their first chunk.
    streamed: tuple[str, ...] = ("tts_stream",)
    # Requests passed on to Triton at once; the rest wait in the front door's queue. Two full
    # batches of the batched stages (acoustic's and vocoder's max_batch_size, 16): one being
    # computed while the next forms; the launcher sets a profile's own (front_slots).
    slots: int = 32
    # The stages run bulk work only while no interactive work is in the server (their
    # scheduling "levels"; the launcher sets it from the profile): an interactive request then
    # goes to Triton at once, beside the slots, up to as many again.
    express_interactive: bool = False
    # Requests waiting in the queue, in all and per client (the gateway's callers are one):
    # past either a request is refused at once. The gateway sends at most its
    # max_concurrent_requests (256).
    max_waiting: int = 4096
    max_waiting_per_client: int = 512
    # Before its ports open, this many normal sentences are kept in flight against Triton's
    # `tts` (3x as many in all): the engines' first-run costs are paid (0: none).
    warmup_requests: int = 16
    # The rate waiting requests are refused by is measured over the last this many seconds.
    window_s: float = 10.0
    # How often open streams are checked against the stubs that serve them.
    stream_check_s: float = 1.0
    drain_s: float = 30.0
    # Connection hygiene (tts_front/connections.py); gRPC gets the same timeouts and total.
    max_connections: int = 4096
    max_connections_per_client: int = 256
    header_timeout_s: float = 10.0  # a request head (HTTP) or the HTTP/2 handshake (gRPC)
    idle_timeout_s: float = 60.0  # between requests
    body_timeout_s: float = 60.0  # to read one HTTP body
    # Request bodies buffered at once, in all: past it a body is refused (503), not read.
    max_buffered_bytes: int = 256 * MIB
    # gRPC (HTTP/2) concurrent streams per connection: the gateway and perf_analyzer carry
    # hundreds of requests on one connection (at 128, a client's 200 concurrent calls queued
    # behind each other and its health check timed out).
    max_streams_per_connection: int = 1024
    # The edge's kernel send buffer per client connection on the gateway's port (nginx's
    # `listen ... sndbuf`, KiB): with the gateway's own (its send_buffer_bytes) it bounds the
    # audio made ahead for a session or SSE client that stops reading (autotuned, the buffers
    # on the way held 93 sentences of a reader that had stopped).
    edge_send_buffer_kib: int = 64
    # `tts_stream` requests in progress per client address (the gateway, trusted by the
    # launcher's token, caps its own callers): 16 from one client held every stream slot.
    max_streams_per_client: int = 4
    # tts_stream's max_streams (the launcher passes its config's): the last STREAMS_KEPT_SHARE
    # of them go only to clients running none, so a few addresses cannot hold every one.
    server_streams: int = 16
    # Work per client in flight at the interactive level (Triton's priority 1), in cost units
    # (admission.request_cost): the door sets every admitted request's level, within it 1,
    # past it 2 (bulk), so a light client's request goes ahead of a heavy one's queue. Priority
    # was the client's: one client's closed loop of 8 at priority 1 starved everyone else.
    # None: two of the longest sentences `tts` takes (2 * admission.BATCH_ITEM_COST).
    interactive_work_per_client: float | None = None
    # gRPC ModelStreamInfer calls open at once per client address, whatever they carry: 5,000
    # idle ones from one client (5 connections) cost the front door 160 MB and made gRPC
    # cancel other clients' calls (its queue of calls not yet taken overflowed).
    max_grpc_streams_per_client: int = 256
    # The server's shared-memory prefix: finds its stubs (a stream's model instance died).
    shm_prefix: str = ""
    # SIGUSR1 to the parent (the launcher) once drained while dead stubs' streams stay open.
    notify_parent: bool = False

    def edge_connections(self) -> int:
        """nginx's worker_connections in front of this door (tts_launcher/edge.py): each proxied
        request holds a connection upstream too, so twice the clients', and room for the files
        nginx opens itself. One worker: no more connections than this at once, both sides."""
        return 2 * self.max_connections + 64

    def connection_cap(self, behind_edge: bool) -> int:
        """The door's own total of connections per port. Behind the edge every connection is
        the edge's, which can hold as many upstream as it has in all, and the launcher's
        liveness probe must still get one: more than the edge can open, by PROBE_RESERVE."""
        return self.edge_connections() + PROBE_RESERVE if behind_edge else self.max_connections

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1024:
            raise ValueError(
                f"max_request_bytes must be at least 1024, not {self.max_request_bytes}"
            )
        if not 0 < self.deadline_s <= 3600:
            raise ValueError(f"deadline_s must be in (0, 3600], not {self.deadline_s}")
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, not {self.slots}")
        for name in (
            "max_streams_per_client",
            "server_streams",
            "max_grpc_streams_per_client",
            "edge_send_buffer_kib",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not 0 <= self.max_waiting_per_client <= self.max_waiting:
            raise ValueError(
                "max_waiting_per_client must be in [0, max_waiting], not "
                f"{self.max_waiting_per_client}"
            )
        if not 0 < self.window_s <= 3600:
            raise ValueError(f"window_s must be in (0, 3600], not {self.window_s}")
        ConnectionLimits(  # raises on a bad combination
            self.max_connections,
            self.max_connections_per_client,
            self.header_timeout_s,
            self.idle_timeout_s,
        )
        if self.body_timeout_s <= 0 or self.max_buffered_bytes < self.max_request_bytes:
            raise ValueError(
                "body_timeout_s must be positive and max_buffered_bytes at least max_request_bytes"
            )
        if not 0 <= self.warmup_requests <= 256:
            raise ValueError(f"warmup_requests must be in [0, 256], not {self.warmup_requests}")


def parser() -> argparse.ArgumentParser:
    """The command line, every default the settings' own."""
    d = FrontSettings()
    p = argparse.ArgumentParser(
        prog="python -m tts_front",
        description="The front door: Triton's gRPC and HTTP APIs, with limits applied before "
        "Triton copies anything (tts_front/__init__.py says which).",
    )
    p.add_argument("--triton-grpc", default=d.triton_grpc, help="tritonserver's gRPC host:port")
    p.add_argument("--triton-http", default=d.triton_http, help="tritonserver's HTTP host:port")
    p.add_argument("--shm-prefix", default="", help="tritonserver's shm-region-prefix-name")
    p.add_argument("--notify-parent", action="store_true", help="SIGUSR1 the launcher (drained)")
    p.add_argument("--bind", default=d.bind)
    p.add_argument("--grpc-port", type=int, default=8001, help="0: no gRPC front")
    p.add_argument("--http-port", type=int, default=8000, help="0: no HTTP front")
    p.add_argument("--max-request-mib", type=float, default=d.max_request_bytes / MIB)
    p.add_argument(
        "--deadline-s",
        type=float,
        default=d.deadline_s,
        help="the deadline of requests whose client set none",
    )
    p.add_argument(
        "--public-models",
        default=",".join(d.public_models),
        help="models served on the public ports ('*': all); the others need the admin key",
    )
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    p.add_argument("--max-connections-per-client", type=int, default=d.max_connections_per_client)
    p.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s)
    p.add_argument("--idle-timeout-s", type=float, default=d.idle_timeout_s)
    p.add_argument("--body-timeout-s", type=float, default=d.body_timeout_s)
    p.add_argument("--max-streams-per-client", type=int, default=d.max_streams_per_client)
    p.add_argument(
        "--server-streams",
        type=int,
        default=d.server_streams,
        help="tts_stream's max_streams (the launcher passes its config's)",
    )
    p.add_argument(
        "--interactive-work-per-client",
        type=float,
        default=d.interactive_work_per_client,
        help="cost per client in flight at priority 1 (the rest goes at 2, bulk)",
    )
    p.add_argument("--max-grpc-streams-per-client", type=int, default=d.max_grpc_streams_per_client)
    p.add_argument("--max-streams-per-connection", type=int, default=d.max_streams_per_connection)
    p.add_argument("--edge-send-buffer-kib", type=int, default=d.edge_send_buffer_kib)
    p.add_argument("--max-buffered-mib", type=float, default=d.max_buffered_bytes / MIB)
    p.add_argument(
        "--slots", type=int, default=d.slots, help="requests passed on to Triton at once"
    )
    p.add_argument(
        "--express-interactive",
        action="store_true",
        help="interactive requests go to Triton at once, beside the slots (stages that run "
        "bulk work only on time interactive work leaves: scheduling levels)",
    )
    p.add_argument("--max-waiting", type=int, default=d.max_waiting)
    p.add_argument("--max-waiting-per-client", type=int, default=d.max_waiting_per_client)
    p.add_argument(
        "--warmup-requests",
        type=int,
        default=d.warmup_requests,
        help="sentences sent to tts at start to measure the throughput (0: none)",
    )
    p.add_argument("--drain-s", type=float, default=d.drain_s)
    p.add_argument(
        "--window-s",
        type=float,
        default=d.window_s,
        help="seconds over which admission measures the rate it refuses by",
    )
    return p


def parse_args(argv: list[str] | None = None) -> FrontSettings:
    p = parser()
    a = p.parse_args(argv)
    try:
        settings = FrontSettings(
            triton_grpc=a.triton_grpc,
            triton_http=a.triton_http,
            bind=a.bind,
            grpc_port=a.grpc_port,
            http_port=a.http_port,
            max_request_bytes=int(a.max_request_mib * MIB),
            deadline_s=a.deadline_s,
            public_models=tuple(m for m in a.public_models.split(",") if m),
            max_connections=a.max_connections,
            max_connections_per_client=a.max_connections_per_client,
            header_timeout_s=a.header_timeout_s,
            idle_timeout_s=a.idle_timeout_s,
            body_timeout_s=a.body_timeout_s,
            max_buffered_bytes=int(a.max_buffered_mib * MIB),
            max_streams_per_connection=a.max_streams_per_connection,
            edge_send_buffer_kib=a.edge_send_buffer_kib,
            max_streams_per_client=a.max_streams_per_client,
            server_streams=a.server_streams,
            interactive_work_per_client=a.interactive_work_per_client,
            max_grpc_streams_per_client=a.max_grpc_streams_per_client,
            slots=a.slots,
            express_interactive=a.express_interactive,
            max_waiting=a.max_waiting,
            max_waiting_per_client=a.max_waiting_per_client,
            warmup_requests=a.warmup_requests,
            window_s=a.window_s,
            drain_s=a.drain_s,
            shm_prefix=a.shm_prefix,
            notify_parent=a.notify_parent,
        )
    except ValueError as e:
        p.error(str(e))
    return settings
