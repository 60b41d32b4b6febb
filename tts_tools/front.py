"""The front door: Triton's gRPC and HTTP APIs, with limits applied before Triton copies anything.

``python -m tts_tools.front --triton-grpc 127.0.0.1:PORT --triton-http 127.0.0.1:PORT``
(``make serve`` starts it on the public ports and tritonserver on private loopback ports).

Triton 2.51 has no input-size flag: it copied a 300 MB gRPC message (and inflated a 190 KB
gzip body to 200 MB) before refusing it, and kept the memory. Its per-stage queue caps cannot
bound the time a request spends in the whole ensemble either: 200 concurrent ``tts`` requests
waited 35 s (p50) and none was refused. Here:

- every gRPC message and HTTP body (after inflating a compressed one) is refused past
  ``max_request_bytes``, while it is read, before Triton sees it (gRPC RESOURCE_EXHAUSTED,
  HTTP 413);
- a request to a public model (``tts``, ``tts_stream``), unary, HTTP or any message of a
  gRPC stream, is served only when the wait it would see, weighed by its cost, fits
  ``deadline_s`` (Little's law on the measured throughput, :class:`Admission`), else refused at
  once (gRPC UNAVAILABLE, HTTP 429 with Retry-After; on a stream, an error response for that
  request): the same overload answer as Triton's own full queues, which clients retry with
  backoff; a client holds at most ``max_streams_per_client`` streams and, while others wait,
  ``client_share`` of the budget (RESOURCE_EXHAUSTED);
- the inner models (phonemizer, acoustic, vocoder) answer only to the admin key;
- connections are capped in all and per client, with header, idle and body timeouts
  (``tts_tools.connections``); HTTP bodies being read have a total budget;
- a stream whose model instance dies is ended with UNAVAILABLE instead of hanging for ever
  (Triton 2.51 leaves it open without an error or a final response).

Everything else passes through unchanged (headers, metadata, deadlines, the admin key header).
``GET /front/live`` is answered here: the launcher's liveness probe. docs/operations.md lists
every limit and its default.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import logging
import os
import re
import signal
import sys
import time
from collections import Counter as Tally, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import grpc
import tritonclient.grpc as grpc_types
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from tritonclient.grpc import aio as grpc_aio

from tts_client.protocol import build_inputs
from tts_tools.connections import ConnectionGuard, ConnectionLimits, GuardedSite, raise_file_limit
from tts_tools.launcher.commands import FRONT_LIVE_PATH, FRONT_TOKEN_ENV
from tts_tools.launcher.security import ADMIN_HEADER, GRPC_HEADER_PREFIX, admin_key
from tts_tools.launcher.supervisor import is_ready, stubs_by_model
from tts_tools.protowire import StreamResponse, infer_request, model_name, stream_response
from tts_tools.texts import SENTENCES
from tts_wire import FINAL_RESPONSE, FRONT_TOKEN_HEADER, stream_error_message

log = logging.getLogger("tts_front")

SERVICE = "inference.GRPCInferenceService"
STREAM_METHOD = f"/{SERVICE}/ModelStreamInfer"
INFER_METHOD = f"/{SERVICE}/ModelInfer"
MIB = 1 << 20
# Hop-by-hop headers (RFC 9110 7.6.1) and those the proxy recomputes.
_HTTP_DROP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "content-encoding",  # bodies are forwarded inflated
}
_RESPONSE_DROP = _HTTP_DROP - {"content-encoding"}
_ENCODINGS = {"identity", "gzip", "deflate", "br"}  # one of them; aiohttp inflates it
_INFER_PATH = re.compile(
    r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|generate|generate_stream)$"
)


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
    deadline_s: float = 10.0
    # Models served on the public ports ("*": all); the others answer only to the admin key
    # (an operator's perf_analyzer on one stage). Each public one is admitted by its cost.
    public_models: tuple[str, ...] = ("tts", "tts_stream")
    # Models whose completions measure the throughput admission counts on.
    measured: tuple[str, ...] = ("tts",)
    # Models whose requests are streams (decoupled): admitted at the cost of their first chunk.
    streamed: tuple[str, ...] = ("tts_stream",)
    # Concurrency always admitted, whatever was measured.
    min_in_flight: int = 8
    # Before its ports open, this many normal sentences are kept in flight against Triton's
    # `tts` (3x as many in all): the throughput admission starts from (0: none; a cold server
    # then admits min_in_flight until something is measured).
    warmup_requests: int = 16
    # The throughput admission counts on is measured over this many seconds of busy time.
    window_s: float = 30.0
    # How often open streams are checked against the stubs that serve them.
    stream_check_s: float = 1.0
    drain_s: float = 30.0
    # Connection hygiene (tts_tools/connections.py); gRPC gets the same timeouts and total.
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
    # `tts_stream` requests in progress per client address (the gateway, trusted by the
    # launcher's token, caps its own callers): 16 from one client held every stream slot.
    max_streams_per_client: int = 4
    # gRPC ModelStreamInfer calls open at once per client address, whatever they carry: 5,000
    # idle ones from one client (5 connections) cost the front door 160 MB and made gRPC
    # cancel other clients' calls (its queue of calls not yet taken overflowed).
    max_grpc_streams_per_client: int = 256
    # Of what the server serves within the deadline, the most one client's requests in flight
    # may take: the rest stays for others, whatever one client sends (the gateway, trusted by
    # the launcher's token, is not capped: it caps its own callers).
    client_share: float = 0.75
    # The server's shared-memory prefix: finds its stubs (a stream's model instance died).
    shm_prefix: str = ""
    # SIGUSR1 to the parent (the launcher) once drained while dead stubs' streams stay open.
    notify_parent: bool = False

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1024:
            raise ValueError(
                f"max_request_bytes must be at least 1024, not {self.max_request_bytes}"
            )
        if not 0 < self.deadline_s <= 3600:
            raise ValueError(f"deadline_s must be in (0, 3600], not {self.deadline_s}")
        if self.min_in_flight < 1:
            raise ValueError(f"min_in_flight must be at least 1, not {self.min_in_flight}")
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
        if not 0 < self.client_share <= 1:
            raise ValueError(f"client_share must be in (0, 1], not {self.client_share}")
        if not 0 <= self.warmup_requests <= 256:
            raise ValueError(f"warmup_requests must be in [0, 256], not {self.warmup_requests}")


class Admission:
    """Admit a request when the wait it would see fits the deadline, else refuse it at once.

    Requests are weighed by their cost in work (:func:`request_cost`: their input bytes plus a
    fixed part), not counted: a 1,000-character request waits behind, and delays, as much as
    ten 100-character ones. The wait is estimated by Little's law: (cost in flight + this
    request's) / throughput, where the throughput is cost completed per busy second (time with
    a measured request in flight) over the last ``window_s``, so idle time does not make the
    server look slow. Only measured requests (``tts``) count towards it: a stream's request is
    served for minutes at its own pace, which is not the server's rate. When admitted requests
    still overrun the deadline (batching reorders, clients share the CPU) the usable share of
    the throughput shrinks by 10 % per late request and grows back by 2 % per timely one. Up to
    ``min_in_flight`` requests are always admitted. The rate counted on is the highest the
    window has given (:meth:`capacity`): at low concurrency it measures latency, not capacity.
    Before anything was measured only ``min_in_flight`` are admitted: the front door measures
    a warm-up before it opens its ports (:meth:`Front.warm_up`).
    """

    def __init__(
        self,
        deadline_s: float,
        min_in_flight: int = 8,
        window_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_s, self.min_in_flight, self.window_s = deadline_s, min_in_flight, window_s
        self.clock = clock
        self.in_flight = 0  # requests
        self.work = 0.0  # their cost
        self._measured = 0  # of them measured: the server is busy while one is in flight
        self.admitted = self.refused = self.late = 0
        self.share = 1.0  # of the measured throughput that admission counts on
        self._since = clock()  # start of the current accounting slice
        # (end time, busy seconds, completions, cost completed) per slice, newest last.
        self._slices: deque[tuple[float, float, int, float]] = deque()
        self._peak: float | None = None  # the highest throughput the window has given

    def _account(self, completions: int = 0, cost: float = 0.0) -> None:
        now = self.clock()
        busy = (now - self._since) if self._measured else 0.0
        if busy or completions:
            self._slices.append((now, busy, completions, cost))
        self._since = now
        while self._slices and now - self._slices[0][0] > self.window_s:
            self._slices.popleft()

    def throughput(self) -> float | None:
        """Cost completed per busy second over the window; None when it holds none (idle)."""
        busy = sum(s[1] for s in self._slices)
        done = sum(s[2] for s in self._slices)
        cost = sum(s[3] for s in self._slices)
        if not (done and busy > 0):
            return None
        rate = cost / busy
        if done >= self.min_in_flight:  # enough completions to stand for the server
            self._peak = max(self._peak or 0.0, rate)
        return rate

    def seed(self, rate: float) -> None:
        """Count on ``rate`` (cost per second, measured by the warm-up) until more is
        measured."""
        self._peak = max(self._peak or 0.0, rate)

    def capacity(self) -> float | None:
        """The highest throughput measured (idling forgets nothing: a server is no slower for
        having rested); None before there is one."""
        rate = self.throughput()
        return max(self._peak or 0.0, rate or 0.0) or None

    def budget(self) -> float | None:
        """The cost the server serves within the deadline (None before anything was
        measured)."""
        rate = self.capacity()
        return rate * self.share * self.deadline_s if rate else None

    def estimated_wait(self, cost: float = 1.0) -> float | None:
        """Seconds a request of ``cost`` admitted now would take; None before anything was
        measured."""
        rate = self.capacity()
        return (self.work + cost) / (rate * self.share) if rate else None

    def enter(self, cost: float = 1.0, measured: bool = True) -> bool:
        """Admit one request (True; call ``leave`` with the same cost when it ends) or refuse
        it (False)."""
        self._account()
        wait = self.estimated_wait(cost)
        if self.in_flight >= self.min_in_flight and (wait is None or wait > self.deadline_s):
            self.refused += 1
            return False
        self.in_flight += 1
        self.work += cost
        self._measured += measured
        self.admitted += 1
        return True

    def leave(
        self, seconds: float, cost: float = 1.0, measured: bool = True, served: bool = True
    ) -> None:
        """An admitted request ended after ``seconds``: ``served``, or failed (a failure
        counts towards no throughput: requests refused at once for bad input measured a rate
        the server cannot serve, and admission then admitted everything)."""
        credited = measured and served
        self._account(completions=int(credited), cost=cost if credited else 0.0)
        self.in_flight -= 1
        self.work = max(0.0, self.work - cost)
        self._measured -= measured
        if not credited:
            return
        if seconds > self.deadline_s:
            self.late += 1
            self.share = max(0.1, self.share * 0.9)
        else:
            self.share = min(1.0, self.share * 1.02)

    def refusal(self, cost: float = 1.0) -> str:
        wait = self.estimated_wait(cost)
        why = f"about {wait:.1f} s" if wait else "not measured yet"
        return (
            f"server overloaded: {self.in_flight} requests in flight, the wait ({why}) would "
            f"exceed the {self.deadline_s:g} s deadline; retry later"
        )


# The fixed part of a request's cost, in input bytes: a sentence of about this many
# characters costs the pipeline as much again as its per-request overhead.
REQUEST_BASE_COST = 64
# Input bytes per character of speech, for the inner models when they are opened to the
# public: phoneme ids are int64 (about one per character), a latent frame is 192 float32
# (about six frames per character at 22,050 Hz).
COST_SCALE = {"acoustic": 8.0, "vocoder": 4608.0}
# A stream's request is admitted at the cost of its first chunk: it is served a chunk at a
# time, so only that much of it is ever queued ahead of other requests.
STREAM_COST = REQUEST_BASE_COST + 400
# A client refused this recently still wants its share (see Front._check_share).
OTHERS_S = 5.0
# The JSON around an HTTP request's text ({"inputs":[{"name":"text","shape":[1,1],...}]}).
JSON_OVERHEAD = 80


def request_cost(model: str, input_bytes: int) -> float:
    """The cost admission weighs a request to ``model`` by (units: bytes of text)."""
    return REQUEST_BASE_COST + input_bytes / COST_SCALE.get(model, 1.0)


def _metadata(context: grpc.aio.ServicerContext) -> list[tuple[str, str | bytes]]:
    # grpc-* and pseudo headers are the transport's own; the deadline travels as timeout=.
    return [
        (k, v)
        for k, v in (context.invocation_metadata() or ())
        if not k.startswith(("grpc-", ":")) and k not in ("user-agent", "te", "content-type")
    ]


class StubWatch:
    """The living Python-backend stubs of each model of one server (found in /proc by the
    server's shared-memory prefix): a stream whose model lost a stub it started with is dead.
    """

    def __init__(self, shm_prefix: str = "", ttl_s: float = 0.5) -> None:
        self.shm_prefix, self.ttl_s = shm_prefix, ttl_s
        self._seen: dict[str, tuple[float, set[int]]] = {}

    def stubs(self, model: str, fresh: bool = False) -> set[int]:
        """The model's living stubs; at most ``ttl_s`` old unless ``fresh`` (a stream's
        start: a stale set could hold a stub that died just before)."""
        # One /proc scan per model and half second, however many streams are silent.
        now = time.monotonic()
        seen = self._seen.get(model)
        if fresh or seen is None or now - seen[0] > self.ttl_s:
            seen = self._seen[model] = (
                now,
                stubs_by_model(None, [model], shm_prefix=self.shm_prefix)[model],
            )
        return seen[1]


@dataclass(frozen=True)
class Ticket:
    model: str | None  # None: a request no admission applies to
    start: float
    cost: float = 0.0
    measured: bool = False
    id: str = ""  # the request's id (a stream's responses are matched to it)
    client: str | None = None  # counted against this client's streams


class TooMany(Exception):
    """A client holding its limit of streams, or its share of the server."""


FREE = Ticket(None, 0.0)


class Closed(Exception):
    """A model that is not served on the public ports."""


class FrontMetrics:
    """The front door's Prometheus metrics, on its HTTP port at ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tts_front_requests", "Admitted requests by outcome", ["model", "outcome"], registry=r
        )
        self.refused = Counter(
            "tts_front_refused", "Requests refused at once for overload", ["model"], registry=r
        )
        self.in_flight = Gauge("tts_front_in_flight", "Admitted requests", ["model"], registry=r)
        self.seconds = Histogram(
            "tts_front_request_seconds",
            "Time of admitted requests through Triton",
            ["model"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60),
            registry=r,
        )
        self.share = Gauge(
            "tts_front_admission_share",
            "Share of the measured throughput admission counts on (shrinks when late)",
            registry=r,
        )
        self.share.set(1.0)
        self.refused_connections = Counter(
            "tts_front_refused_connections",
            "HTTP connections refused over the total or per-client limit",
            registry=r,
        )
        self.connections = Gauge("tts_front_connections", "Open HTTP connections", registry=r)
        self.buffered = Gauge(
            "tts_front_buffered_bytes", "Bytes of HTTP request bodies being read", registry=r
        )
        self.stuck = Gauge(
            "tts_front_stuck_streams",
            "Streams of stubs that died, still open in tritonserver (ended for their clients)",
            registry=r,
        )


class Front:
    """The gRPC and HTTP servers of the front door, in one event loop."""

    def __init__(self, settings: FrontSettings, watch: StubWatch | None = None) -> None:
        self.settings = settings
        self.admission = Admission(settings.deadline_s, settings.min_in_flight, settings.window_s)
        self.metrics = FrontMetrics()
        self.watch = watch or StubWatch(settings.shm_prefix)
        self._grpc: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.ports: dict[str, int] = {}
        self._stuck: list = []  # upstream streams of dead stubs (see _stream)
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}  # one per method
        self._closing = asyncio.Event()  # set: close even the streams of dead stubs
        # The admin key opens the inner models (a random one nobody has when none is set).
        self._admin_key = admin_key()[0]
        # The launcher's token, which the gateway sends (it caps streams per caller itself).
        self._token = os.environ.get(FRONT_TOKEN_ENV, "")
        self._streams: Tally[str] = Tally()  # streams in progress per client
        self._grpc_streams: Tally[str | None] = Tally()  # ModelStreamInfer calls per client
        self._work: Tally[str] = Tally()  # cost in flight per client
        self._refused_at: dict[str, float] = {}  # when each client was last refused
        self._guard = ConnectionGuard(
            ConnectionLimits(
                settings.max_connections,
                settings.max_connections_per_client,
                settings.header_timeout_s,
                settings.idle_timeout_s,
            ),
            self._refused_connection,
        )
        self._buffered = 0  # bytes of HTTP bodies being read
        self._refusal_logged = 0.0

    def _refused_connection(self, peer: str) -> None:
        self.metrics.refused_connections.inc()
        now = time.monotonic()
        if now - self._refusal_logged > 10:  # one line per 10 s, not one per attempt
            self._refusal_logged = now
            log.warning(
                "refusing connections over the limits (%d open; this one from %s); "
                "tts_front_refused_connections_total counts them",
                len(self._guard.open),
                peer,
            )

    # ----- admission shared by both protocols -----

    def enter(
        self, model: str | None, cost: float, rid: str = "", client: str | None = None
    ) -> Ticket | None:
        """A ticket for a request to ``model`` of ``cost`` from ``client`` (None: the trusted
        gateway, which caps its own callers); None when refused for overload. Raises
        TooMany when the client holds its limit of streams."""
        if model is None:
            return FREE
        streamed = model in self.settings.streamed
        if streamed:
            cost = min(cost, STREAM_COST)
            limit = self.settings.max_streams_per_client
            if client is not None and self._streams[client] >= limit:
                self.metrics.refused.labels(model).inc()
                raise TooMany(
                    f"this client already has {limit} {model} requests in progress (the limit "
                    "per client); wait for one to end"
                )
        elif client is not None and self._work[client] > 0:
            try:
                self._check_share(client, cost)
            except TooMany:
                self.metrics.refused.labels(model).inc()
                self._refused_at[client] = time.monotonic()
                raise
        measured = model in self.settings.measured
        if not self.admission.enter(cost, measured):
            self.metrics.refused.labels(model).inc()
            if client is not None:
                self._refused_at[client] = time.monotonic()
            return None
        self.metrics.in_flight.labels(model).inc()
        if client is not None:
            self._work[client] += cost
            self._streams[client] += streamed
        return Ticket(model, time.monotonic(), cost, measured, rid, client)

    def leave(self, ticket: Ticket, outcome: str) -> None:
        if ticket.model is None:
            return
        if ticket.client is not None:
            c = ticket.client
            self._work[c] -= ticket.cost
            self._streams[c] -= ticket.model in self.settings.streamed
            if self._work[c] <= 1e-6:
                del self._work[c]
                self._streams.pop(c, None)
        seconds = time.monotonic() - ticket.start
        self.admission.leave(seconds, ticket.cost, ticket.measured, outcome == "served")
        self.metrics.in_flight.labels(ticket.model).dec()
        self.metrics.requests.labels(ticket.model, outcome).inc()
        self.metrics.seconds.labels(ticket.model).observe(seconds)
        self.metrics.share.set(self.admission.share)

    def _check_share(self, client: str, cost: float) -> None:
        """Raise TooMany when ``client``'s work in flight would pass its share of what the
        server serves within the deadline while another client wants some (has work in
        flight, or was refused in the last ``OTHERS_S``): the rest of the budget is theirs,
        whatever one client sends (one client's flood had everyone else refused). A client
        alone has it all: a burst that fits the deadline is served."""
        now = time.monotonic()
        if len(self._refused_at) > 4096:  # forget old refusals (bounded, whatever the peers)
            self._refused_at = {c: t for c, t in self._refused_at.items() if now - t < OTHERS_S}
        others = any(c != client for c in self._work) or any(
            c != client and now - t < OTHERS_S for c, t in self._refused_at.items()
        )
        budget = self.admission.budget()
        share = self.settings.client_share
        mine = self._work[client] + cost
        # (Not after min_in_flight: a flooding client refilled those always-admitted places
        # the moment one freed, and another client never got one.)
        if others and budget:
            if mine > share * budget:
                raise TooMany(
                    f"this client's requests in flight would take {mine / budget:.0%} of what "
                    f"the server serves within the {self.settings.deadline_s:g} s deadline, "
                    f"while others wait (the limit per client is then {share:.0%}); wait for "
                    "some of them to finish"
                )

    def gate(self, model: str | None, admin: bool) -> str | None:
        """The model admission applies to (None: none does: the admin key, or not an
        inference); raises Closed for a model not served on the public ports."""
        if model is None or admin:
            return None
        public = self.settings.public_models
        if "*" not in public and model not in public:
            raise Closed(
                f"model '{model}' is not served on the public ports (public: "
                f"{', '.join(public)}); an operator reaches it with the admin key header "
                f"'{ADMIN_HEADER}', or opens it with the front door's --public-models"
            )
        return model

    def is_admin(self, headers: dict[str, str]) -> bool:
        """Whether ``headers`` (lower-case names) carry the admin key."""
        key = headers.get(ADMIN_HEADER) or headers.get(f"{GRPC_HEADER_PREFIX}{ADMIN_HEADER}")
        return bool(key) and hmac.compare_digest(key.encode(), self._admin_key.encode())

    async def warm_up(self, timeout_s: float = 120.0) -> str:
        """Measure the throughput admission starts from, before the ports open (a cold server
        that counted on ``min_in_flight`` alone refused the 9th request of the first burst).

        A closed loop of ``warmup_requests`` medium sentences in flight, three times that many
        in all, counted from the first completion to the last: one round sent at once measured
        about half the steady rate (its stages ran one after another, where a steady load keeps
        each busy). Also pays the engines' first-run costs before a user does. Returns one line
        for the log; a failure leaves admission unmeasured."""
        n = self.settings.warmup_requests
        if not n or "tts" not in self.settings.measured:
            return "admission warm-up: off"
        total = 3 * n
        client = grpc_aio.InferenceServerClient(self.settings.triton_grpc)
        done: list[tuple[float, float]] = []  # (time, cost) per completion
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                text = SENTENCES[3 + queue.pop() % 12]
                inputs = build_inputs(grpc_types, text)
                await client.infer("tts", inputs, client_timeout=timeout_s)
                # The cost the front door gives it: a BYTES tensor is 4 bytes of length + text.
                done.append((time.monotonic(), request_cost("tts", 4 + len(text.encode()))))

        start = time.monotonic()
        try:
            await asyncio.gather(*(worker() for _ in range(n)))
        except Exception as e:
            return (
                f"admission warm-up failed ({type(e).__name__}: {e}); until requests are "
                f"measured, {self.settings.min_in_flight} at a time are admitted"
            )
        finally:
            await client.close()
        done.sort()
        seconds = max(done[-1][0] - done[0][0], 1e-3)
        requests, rate = (len(done) - 1) / seconds, sum(c for _, c in done[1:]) / seconds
        self.admission.seed(rate)
        return (
            f"admission warm-up: {total} sentences, {n} at a time, in "
            f"{time.monotonic() - start:.1f} s: {requests:.1f} requests/s ({rate:.0f} cost/s); "
            f"up to about {requests * self.settings.deadline_s:.0f} such in flight fit the "
            f"{self.settings.deadline_s:g} s deadline"
        )

    # ----- gRPC -----

    def _admit_message(
        self, request: bytes, admin: bool, client: str | None
    ) -> tuple[Ticket, None] | tuple[None, tuple[grpc.StatusCode, str]]:
        """(ticket, None) for a ModelInferRequest to pass on, or (None, (code, message))."""
        info = infer_request(request)
        if info is None:
            return None, (
                grpc.StatusCode.INVALID_ARGUMENT,
                "unreadable ModelInferRequest: not a well-formed protobuf message",
            )
        try:
            model = self.gate(info.model, admin)
        except Closed as e:
            return None, (grpc.StatusCode.PERMISSION_DENIED, str(e))
        cost = request_cost(model, info.input_bytes) if model else 0.0
        try:
            ticket = self.enter(model, cost, info.id, client)
        except TooMany as e:
            return None, (grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        if ticket is None:
            return None, (grpc.StatusCode.UNAVAILABLE, self.admission.refusal(cost))
        return ticket, None

    def client(self, headers: dict[str, str], peer: str) -> str | None:
        """Who a request counts against: its address, or None for the gateway (it carries
        the launcher's token, and caps streams per caller itself)."""
        token = headers.get(FRONT_TOKEN_HEADER, "")
        if token and self._token and hmac.compare_digest(token.encode(), self._token.encode()):
            return None
        return peer

    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        ticket = FREE
        if method == INFER_METHOD:
            headers = _headers(context)
            ticket, refused = self._admit_message(
                request, self.is_admin(headers), self.client(headers, _peer(context))
            )
            if refused:
                await context.abort(*refused)
        outcome = "error"
        try:
            call = self._calls.get(method) or self._calls.setdefault(
                method, self._channel.unary_unary(method)
            )
            response = await call(
                request, metadata=_metadata(context), timeout=context.time_remaining()
            )
            outcome = "served"
            return response
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            self.leave(ticket, outcome)

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """A ModelStreamInfer call, refused at once past the client's open calls."""
        headers = _headers(context)
        client = self.client(headers, _peer(context))
        limit = self.settings.max_grpc_streams_per_client
        if client is not None and self._grpc_streams[client] >= limit:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this client already has {limit} ModelStreamInfer calls open; "
                "end one first, or carry more requests on each",
            )
        self._grpc_streams[client] += 1
        try:
            admin = self.is_admin(headers)
            async for response in self._stream_messages(requests, context, admin, client):
                yield response
        finally:
            self._grpc_streams[client] -= 1
            if not self._grpc_streams[client]:
                del self._grpc_streams[client]

    async def _stream_messages(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        admin: bool,
        client: str | None,
    ) -> AsyncIterator[bytes]:
        """A ModelStreamInfer stream: every message is admitted as a unary request is, and
        answered on the stream with an error when refused (the stream goes on); its ticket is
        released by the response that ends it (the final flag, or an error without one)."""
        stubs: dict[str, set[int]] = {}  # model -> its stubs when this stream first used it
        hold = asyncio.Event()  # set: a stub of this stream died, keep it open upstream
        tickets: list[Ticket] = []  # admitted, not yet ended, oldest first
        refusals: asyncio.Queue[bytes] = asyncio.Queue()  # answered here, not by Triton

        incoming = requests.__aiter__()

        def admitted(request: bytes) -> bool:
            """Admit one message: True to pass it on; False when refused (its error queued)."""
            ticket, refused = self._admit_message(request, admin, client)
            if refused:
                refusals.put_nowait(_stream_error(request, *refused))
                return False
            if ticket.model:
                tickets.append(ticket)
            model = ticket.model or model_name(request)
            if model and model not in stubs:
                stubs[model] = self.watch.stubs(model, fresh=True)
            return True

        # Triton's stream is opened by the first message admitted, not by the stream: an idle
        # stream (a client can open 1,024 per connection) then holds nothing upstream.
        first = None
        try:
            async for request in incoming:
                if admitted(request):
                    first = request
                    break
                yield refusals.get_nowait()
        except Exception:  # the client's side ended
            return
        if first is None:
            return

        async def forward() -> AsyncIterator[bytes]:
            yield first
            try:
                async for request in incoming:
                    if admitted(request):
                        yield request
            except Exception:  # the client's side ended (this handler returned or aborted)
                pass
            if hold.is_set():
                # An error here, or the end of requests, would close the stream upstream.
                await self._closing.wait()

        def ended(response: bytes) -> None:
            r = stream_response(response)
            if r is None or not (r.final or (r.error and r.final is None)):
                return  # more responses follow for its request
            ticket = _match(tickets, r)
            if ticket is not None:
                tickets.remove(ticket)
                self.leave(ticket, "error" if r.error else "served")

        call = self._channel.stream_stream(STREAM_METHOD)(
            forward(), metadata=_metadata(context), timeout=context.time_remaining()
        )
        responses = call.__aiter__()
        next_response = next_refusal = None
        try:
            while True:
                if next_response is None:
                    next_response = asyncio.ensure_future(responses.__anext__())
                if next_refusal is None:
                    next_refusal = asyncio.ensure_future(refusals.get())
                finished, _ = await asyncio.wait(
                    {next_response, next_refusal},
                    timeout=self.settings.stream_check_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if next_refusal in finished:
                    yield next_refusal.result()
                    next_refusal = None
                    continue
                if not finished:
                    dead = [
                        m for m, pids in stubs.items() if pids and not pids <= self.watch.stubs(m)
                    ]
                    if dead:
                        # Not cancelled upstream: Triton 2.51's Python backend aborted
                        # (boost lock_exception) on cancelling a request of a dead stub. The
                        # call is kept referenced (garbage collection would cancel it) until
                        # this process ends.
                        hold.set()
                        self._stuck.append((call, next_response))
                        call = next_response = None
                        await context.abort(
                            grpc.StatusCode.UNAVAILABLE,
                            f"the instance of model '{dead[0]}' serving this stream died; "
                            "the stream was ended, retry it",
                        )
                    continue
                try:
                    response = next_response.result()
                except StopAsyncIteration:
                    while not refusals.empty():  # refused after the last response
                        yield refusals.get_nowait()
                    return
                next_response = None
                ended(response)
                yield response
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            for future in (next_response, next_refusal):
                if future is not None:
                    future.cancel()
            if call is not None:
                call.cancel()  # the client left or the stream ended: Triton stops its work
            for ticket in tickets:  # never answered: the stream ended first
                self.leave(ticket, "error")

    def _grpc_handler(self) -> grpc.GenericRpcHandler:
        front = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails):
                method = details.method
                if method == STREAM_METHOD:
                    return grpc.stream_stream_rpc_method_handler(front._stream)

                async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    return await front._unary(method, request, context)

                return grpc.unary_unary_rpc_method_handler(unary)

        return Handler()

    # ----- HTTP -----

    async def _http(self, request: web.Request) -> web.StreamResponse:
        self._guard.request_started(request)
        try:
            return await self._http_request(request)
        finally:
            self._guard.request_ended(request)

    async def _http_request(self, request: web.Request) -> web.StreamResponse:
        if request.path == FRONT_LIVE_PATH:  # answered here: the launcher's liveness probe
            return web.json_response({"live": True})
        if request.path == "/metrics" and request.method == "GET":
            self.metrics.stuck.set(len(self.stuck()))
            self.metrics.connections.set(len(self._guard.open))
            self.metrics.buffered.set(self._buffered)
            return web.Response(
                body=generate_latest(self.metrics.registry), content_type="text/plain"
            )
        match = _INFER_PATH.match(request.path)
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:  # before the body is read: a closed model's body is never buffered
            model = self.gate(
                match.group(1) if match and request.method == "POST" else None,
                self.is_admin(headers),
            )
        except Closed as e:
            return _http_error(403, str(e))
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in _ENCODINGS:
            return _http_error(
                415, f"Content-Encoding '{encoding}' is not supported; send one of "
                f"{', '.join(sorted(_ENCODINGS))}"
            )  # fmt: skip
        body, refused = await self._read_body(request)
        if refused is not None:
            return refused
        cost = request_cost(model, _http_input_bytes(headers, len(body))) if model else 0.0
        try:
            ticket = self.enter(model, cost, client=self.client(headers, request.remote or ""))
        except TooMany as e:
            return _http_error(429, str(e), {"Retry-After": "1"})
        if ticket is None:
            return _http_error(429, self.admission.refusal(cost), {"Retry-After": "1"})
        outcome = "error"
        try:
            forwarded = {k: v for k, v in request.headers.items() if k.lower() not in _HTTP_DROP}
            url = f"http://{self.settings.triton_http}{request.rel_url}"
            async with self._session.request(
                request.method, url, data=bytes(body), headers=forwarded
            ) as upstream:
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={
                        k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROP
                    },
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                outcome = "served" if upstream.status < 400 else "error"
                return response
        except aiohttp.ClientError as e:
            return _http_error(503, f"cannot reach tritonserver: {e}")
        finally:
            self.leave(ticket, outcome)

    async def _read_body(self, request: web.Request) -> tuple[bytearray, web.Response | None]:
        """The body, inflated, within the size, time and total-buffer limits; or a refusal."""
        s, body = self.settings, bytearray()
        limit = s.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return body, _http_error(
                413,
                f"request body of {request.content_length} bytes is over the {limit}-byte limit",
            )
        try:
            async with asyncio.timeout(s.body_timeout_s):
                # Inflated as it is read (aiohttp decompresses gzip/deflate/br bodies): a small
                # compressed body that inflates past the limit is stopped at the limit.
                async for chunk in request.content.iter_chunked(256 * 1024):
                    if self._buffered + len(chunk) > s.max_buffered_bytes:
                        return body, _http_error(
                            503,
                            f"the front door holds its limit of {s.max_buffered_bytes // MIB} "
                            "MiB of request bodies being read; retry later",
                            {"Retry-After": "1"},
                        )
                    body += chunk
                    self._buffered += len(chunk)
                    if len(body) > limit:
                        return body, _http_error(
                            413, f"request body is over the {limit}-byte limit (after "
                            "decompression)"
                        )  # fmt: skip
        except TimeoutError:
            return body, _http_error(
                408, f"the request body took over {s.body_timeout_s:g} s to arrive"
            )
        except aiohttp.ClientPayloadError as e:
            return body, _http_error(400, f"unreadable request body: {e}")
        finally:
            self._buffered -= len(body)  # forwarded as one bytes copy below, then freed
        return body, None

    # ----- life cycle -----

    async def start(self) -> None:
        s = self.settings
        # Both ports' connections, Triton's and the log's fit under it with room to spare.
        files = raise_file_limit(2 * s.max_connections + 1024)
        if files < s.max_connections + 256:
            log.warning(
                "open-file limit %d is low for %d connections: raise it (ulimit -n)",
                files,
                s.max_connections,
            )
        unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        if s.grpc_port:
            self._channel = grpc.aio.insecure_channel(s.triton_grpc, options=unlimited)
            self._grpc = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", s.max_request_bytes),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.so_reuseport", 0),
                    ("grpc.max_concurrent_streams", s.max_streams_per_connection),
                    ("grpc.max_allowed_incoming_connections", s.max_connections),
                    ("grpc.server_handshake_timeout_ms", int(s.header_timeout_s * 1000)),
                    ("grpc.max_connection_idle_ms", int(s.idle_timeout_s * 1000)),
                    # Calls not yet taken by this process: past 1,000 gRPC cancelled calls at
                    # random, other clients' too, while one client opened 5,000 streams at
                    # once. Each is taken (and refused, if over a limit) in microseconds.
                    ("grpc.server.max_pending_requests", PENDING_CALLS),
                    ("grpc.server.max_pending_requests_hard_limit", 2 * PENDING_CALLS),
                ]
            )
            self._grpc.add_generic_rpc_handlers((self._grpc_handler(),))
            self.ports["grpc"] = self._grpc.add_insecure_port(f"{s.bind}:{s.grpc_port}")
            await self._grpc.start()
        if s.http_port:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,  # responses pass through as Triton encoded them
                # aiohttp would ask Triton for gzip on every request, and the gzip reply would
                # reach clients that never asked for it (curl, perf_analyzer): only the
                # client's own Accept-Encoding goes upstream.
                skip_auto_headers=("Accept-Encoding",),
                timeout=aiohttp.ClientTimeout(total=None),
                connector=aiohttp.TCPConnector(limit=0),
            )
            app = web.Application(client_max_size=s.max_request_bytes)
            app.router.add_route("*", "/{tail:.*}", self._http)
            self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=s.drain_s)
            await self._runner.setup()
            site = GuardedSite(self._runner, s.bind, s.http_port, self._guard)
            await site.start()
            self.ports["http"] = site._server.sockets[0].getsockname()[1]

    def stuck(self) -> list:
        """Upstream streams of stubs that died, still open in tritonserver."""
        return [call for call, _ in self._stuck if not call.done()]

    async def drain(self) -> None:
        """Stop accepting and let what is in flight finish (up to ``drain_s``)."""
        if self._grpc:
            await self._grpc.stop(self.settings.drain_s)
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    async def close(self, stuck_wait_s: float = 60.0) -> None:
        """Close the channel to tritonserver.

        Streams of dead stubs are closed only once tritonserver is stopping (not ready; its
        launcher stops it after we drained), up to ``stuck_wait_s``: closing one while it
        served aborted it (Triton 2.51's Python backend, boost lock_exception), and holding it
        open blocks its exit.
        """
        stuck = self.stuck()
        if stuck:
            log.warning(
                "%d stream(s) of stubs that died are still open in tritonserver; closing them "
                "once it is stopping (closing them while it serves aborts Triton 2.51)",
                len(stuck),
            )
            deadline = time.monotonic() + stuck_wait_s
            while time.monotonic() < deadline and await self._triton_ready():
                await asyncio.sleep(0.2)
        self._closing.set()
        if self._channel:
            await self._channel.close()

    async def _triton_ready(self) -> bool:
        port = int(self.settings.triton_http.rsplit(":", 1)[1])
        return await asyncio.to_thread(is_ready, port)

    async def stop(self) -> None:
        await self.drain()
        await self.close()


def _peer(context: grpc.aio.ServicerContext) -> str:
    """The client's address without its port ("ipv4:127.0.0.1:5555" -> "127.0.0.1")."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _stream_error(request: bytes, code: grpc.StatusCode, message: str) -> bytes:
    """A stream response refusing one request: its model and id, the message prefixed with
    its code as tts_stream writes its errors (``[UNAVAILABLE] ...``, which clients map as they
    map a status code), and the final flag: nothing more comes for that request."""
    info = infer_request(request)
    response = grpc_types.service_pb2.ModelStreamInferResponse(
        error_message=stream_error_message(code.name, message)
    )
    if info is not None:
        response.infer_response.model_name = info.model or ""
        response.infer_response.id = info.id
    response.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    return response.SerializeToString()


def _match(tickets: list[Ticket], response: StreamResponse) -> Ticket | None:
    """The admitted request a stream's final response ends: by model and id, else the
    oldest of its model (clients need not set ids), else (no model named) none."""
    same = [t for t in tickets if t.model == response.model]
    for ticket in same or tickets:
        if response.id and ticket.id == response.id:
            return ticket
    return same[0] if same else None


def _http_input_bytes(headers: dict[str, str], body: int) -> int:
    """A body's input bytes: its binary part (the binary tensor extension), else the JSON
    less what surrounds a text."""
    header = headers.get("inference-header-content-length")
    if header and header.isdigit():
        return max(0, body - int(header))
    return max(0, body - JSON_OVERHEAD)


def _http_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    # Triton's own HTTP error body, so tritonclient shows the message.
    return web.json_response({"error": message}, status=status, headers=headers)


def parse_args(argv: list[str] | None = None) -> FrontSettings:
    d = FrontSettings()
    p = argparse.ArgumentParser(
        prog="python -m tts_tools.front", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--triton-grpc", default=d.triton_grpc, help="tritonserver's gRPC host:port")
    p.add_argument("--triton-http", default=d.triton_http, help="tritonserver's HTTP host:port")
    p.add_argument("--shm-prefix", default="", help="tritonserver's shm-region-prefix-name")
    p.add_argument("--notify-parent", action="store_true", help="SIGUSR1 the launcher (drained)")
    p.add_argument("--bind", default=d.bind)
    p.add_argument("--grpc-port", type=int, default=8001, help="0: no gRPC front")
    p.add_argument("--http-port", type=int, default=8000, help="0: no HTTP front")
    p.add_argument("--max-request-mib", type=float, default=d.max_request_bytes / MIB)
    p.add_argument("--deadline-s", type=float, default=d.deadline_s)
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
    p.add_argument("--client-share", type=float, default=d.client_share)
    p.add_argument("--max-streams-per-client", type=int, default=d.max_streams_per_client)
    p.add_argument("--max-grpc-streams-per-client", type=int, default=d.max_grpc_streams_per_client)
    p.add_argument("--max-streams-per-connection", type=int, default=d.max_streams_per_connection)
    p.add_argument("--max-buffered-mib", type=float, default=d.max_buffered_bytes / MIB)
    p.add_argument("--min-in-flight", type=int, default=d.min_in_flight)
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
        help="seconds over which admission measures the throughput",
    )
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
            max_streams_per_client=a.max_streams_per_client,
            max_grpc_streams_per_client=a.max_grpc_streams_per_client,
            client_share=a.client_share,
            min_in_flight=a.min_in_flight,
            warmup_requests=a.warmup_requests,
            window_s=a.window_s,
            drain_s=a.drain_s,
            shm_prefix=a.shm_prefix,
            notify_parent=a.notify_parent,
        )
    except ValueError as e:
        p.error(str(e))
    return settings


async def serve(settings: FrontSettings) -> None:
    front = Front(settings)
    print(f"front: {await front.warm_up()}", flush=True)
    await front.start()
    print(
        f"front: {', '.join(f'{k} on {settings.bind}:{v}' for k, v in front.ports.items())} -> "
        f"tritonserver (requests over {settings.max_request_bytes / MIB:g} MiB refused; "
        f"public models {', '.join(settings.public_models)}, admitted by cost within a "
        f"{settings.deadline_s:g} s deadline; {settings.max_connections} connections, "
        f"{settings.max_connections_per_client} per client)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await front.drain()
    if front.stuck() and settings.notify_parent:
        # The launcher waits for our exit or this signal before it stops tritonserver.
        os.kill(os.getppid(), signal.SIGUSR1)
    await front.close()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = parse_args(argv)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main(sys.argv[1:])
