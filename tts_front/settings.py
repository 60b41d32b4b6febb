"""The front door's settings: what it enforces, and its command line."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tts_wire.settings import Setting, parse, settings_of

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
    """What the front door enforces; defaults are ``make serve``'s. Each field is a flag and a
    ``TTS_FRONT_*`` variable (tts_wire.settings); the comment above it is its help."""

    triton_grpc: str = "127.0.0.1:8001"  # tritonserver's gRPC host:port
    triton_http: str = "127.0.0.1:8000"  # tritonserver's HTTP host:port
    bind: str = "127.0.0.1"  # the address its ports listen on
    grpc_port: int = 8001  # 0: no gRPC front
    http_port: int = 8000  # 0: no HTTP front
    # The largest legitimate message, MiB: 16 vocoder latents of max_frames (192 x 4000 float32).
    max_request_mib: float = 64.0
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
    max_waiting_per_client: int = 512  # and per client
    # Before its ports open, this many normal sentences are kept in flight against Triton's
    # `tts` (3x as many in all): the engines' first-run costs are paid (0: none).
    warmup_requests: int = 16
    # The rate waiting requests are refused by is measured over the last this many seconds.
    window_s: float = 10.0
    # How often open streams are checked against the stubs that serve them.
    stream_check_s: float = 1.0
    # After SIGTERM, requests and streams in flight get this long (under the launcher its
    # --drain-s sets it: tts_launcher.commands.StopBudget).
    drain_s: float = 30.0
    # Connection hygiene (tts_front/connections.py, whose defaults these are); gRPC gets the
    # same timeouts and total.
    max_connections: int = ConnectionLimits.max_connections
    max_connections_per_client: int = ConnectionLimits.max_per_client  # per address
    # a request head (HTTP) or the HTTP/2 handshake (gRPC)
    header_timeout_s: float = ConnectionLimits.header_timeout_s
    idle_timeout_s: float = ConnectionLimits.idle_timeout_s  # between requests
    body_timeout_s: float = 60.0  # to read one HTTP body
    # Request bodies buffered at once, in all, MiB: past it a body is refused (503), not read.
    max_buffered_mib: float = 256.0
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
    # The server's shared-memory prefix (tritonserver's shm-region-prefix-name): finds its
    # stubs (a stream's model instance died).
    shm_prefix: str = ""
    # SIGUSR1 to the parent (the launcher) once drained while dead stubs' streams stay open.
    notify_parent: bool = False

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mib * MIB)

    @property
    def max_buffered_bytes(self) -> int:
        return int(self.max_buffered_mib * MIB)

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
                f"max_request_mib must be at least 1 KiB (0.001), not {self.max_request_mib:g}"
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
                "body_timeout_s must be positive and max_buffered_mib at least max_request_mib"
            )
        if not 0 <= self.warmup_requests <= 256:
            raise ValueError(f"warmup_requests must be in [0, 256], not {self.warmup_requests}")


ENV_PREFIX = "TTS_FRONT_"
DESCRIPTION = (
    "The front door: Triton's gRPC and HTTP APIs, with limits applied before Triton copies "
    "anything (tts_front/__init__.py says which)."
)


def settings() -> list[Setting]:
    """Every setting of the front door, as its flags and variables name them."""
    return settings_of(FrontSettings, ENV_PREFIX)


def parse_args(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> FrontSettings:
    """Settings from flags, then ``TTS_FRONT_*`` variables, then the defaults."""
    return parse(
        FrontSettings,
        argv,
        os.environ if environ is None else environ,
        prog="python -m tts_front",
        description=DESCRIPTION,
        env_prefix=ENV_PREFIX,
    )
