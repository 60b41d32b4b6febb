"""The front door: one event loop with a gRPC and an HTTP server in front of Triton; admission,
shares per client, warm-up and the life cycle (the proxies are grpc_proxy and http_proxy)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections import Counter

import aiohttp
import grpc
import tritonclient.grpc as grpc_types
from aiohttp import web
from tritonclient.grpc import aio as grpc_aio

from tts_client.protocol import build_inputs
from tts_triton.probes import is_ready
from tts_wire import CALLER_HEADER, FRONT_TOKEN_HEADER, edge_client

from .admission import (
    FREE,
    GATEWAY,
    Admission,
    AdmissionTicket,
    NotPublic,
    Refused,
    TooMany,
    request_cost,
    work_done,
)
from .connections import ConnectionGuard, ConnectionLimits, GuardedSite, raise_file_limit
from .grpc_proxy import GrpcProxy
from .http_proxy import HttpProxy
from .metrics import FrontMetrics
from .protowire import infer_request
from .sample_texts import SENTENCES
from .security import (
    ADMIN_HEADER,
    EDGE_KEY_ENV,
    FRONT_TOKEN_ENV,
    GRPC_HEADER_PREFIX,
    INNER_KEY_ENV,
    admin_key,
    inner_headers,
)
from .settings import PENDING_CALLS, FrontSettings
from .stubs import StubWatch

log = logging.getLogger("tts_front")


class Front(GrpcProxy, HttpProxy):
    """The gRPC and HTTP servers of the front door, in one event loop."""

    def __init__(self, settings: FrontSettings, watch: StubWatch | None = None) -> None:
        self.settings = settings
        self.admission = Admission(
            settings.slots,
            settings.deadline_s,
            settings.window_s,
            settings.max_waiting,
            settings.max_waiting_per_client,
        )
        self.metrics = FrontMetrics()
        self.metrics.waiting.set_function(self.admission.waiting)
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
        # The launch's inner key: Triton's ports refuse inference without it (every request
        # passed on carries it; what a client sent under its name is dropped).
        self.inner = inner_headers(os.environ.get(INNER_KEY_ENV, ""))
        # The edge's key (the launcher's nginx, launcher/edge.py): with it a request names the
        # address that connected to the edge. Behind the edge every connection is the edge's,
        # so the per-address connection cap is the edge's to keep (it counts the real ones).
        self._edge_key = os.environ.get(EDGE_KEY_ENV, "")
        self._streams: Counter[str] = Counter()  # streams in progress per client
        self._grpc_streams: Counter[str] = Counter()  # ModelStreamInfer calls per client
        cap = settings.connection_cap(behind_edge=bool(self._edge_key))
        self._guard = ConnectionGuard(
            ConnectionLimits(
                cap,
                cap if self._edge_key else settings.max_connections_per_client,
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

    async def enter(
        self,
        model: str | None,
        cost: float,
        rid: str = "",
        client: str = "",
        deadline_s: float | None = None,
    ) -> AdmissionTicket:
        """A ticket for a request to ``model`` of ``cost`` from ``client``, once it may go on
        (it may wait in the queue first). Raises Refused for overload, TooMany when the client
        holds its limit of streams."""
        if model is None:
            return FREE
        if model in self.settings.streamed:
            # A stream runs for minutes at its own pace: it takes no slot (the `tts` requests
            # the rate is measured on would wait behind it); tts_stream's max_streams and this
            # cap per client bound them. The gateway caps its own callers' streams.
            limit = self.settings.max_streams_per_client
            if not client.startswith(GATEWAY) and self._streams[client] >= limit:
                self.metrics.refused.labels(model).inc()
                raise TooMany(
                    f"this client already has {limit} {model} requests in progress (the limit "
                    "per client); wait for one to end"
                )
            self._streams[client] += 1
            self.metrics.in_flight.labels(model).inc()
            return AdmissionTicket(model, time.monotonic(), cost, False, rid, client)
        measured = model in self.settings.measured
        try:
            await self.admission.acquire(cost, client, deadline_s, measured)
        except Refused:
            self.metrics.refused.labels(model).inc()
            raise
        self.metrics.in_flight.labels(model).inc()
        return AdmissionTicket(model, time.monotonic(), cost, measured, rid, client, queued=True)

    def leave(self, ticket: AdmissionTicket, outcome: str, samples: int | None = None) -> None:
        """A request ended; ``samples``: the audio it produced, when read (its real work)."""
        if ticket.model is None:
            return
        seconds = time.monotonic() - ticket.start
        if ticket.queued:
            work = work_done(samples) if samples is not None and ticket.measured else None
            self.admission.release(
                ticket.cost, outcome == "served", ticket.measured, work, ticket.client, seconds
            )
        else:
            self._streams[ticket.client] -= 1
            if self._streams[ticket.client] <= 0:
                del self._streams[ticket.client]
        self.metrics.in_flight.labels(ticket.model).dec()
        self.metrics.requests.labels(ticket.model, outcome).inc()
        self.metrics.seconds.labels(ticket.model).observe(seconds)

    def gate(self, model: str | None, admin: bool) -> str | None:
        """The model admission applies to (None: none does: the admin key, or not an
        inference); raises NotPublic for a model not served on the public ports."""
        if model is None or admin:
            return None
        public = self.settings.public_models
        if "*" not in public and model not in public:
            raise NotPublic(
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
        """Pay the engines' first-run costs before the ports open, so no user does: a closed
        loop of ``warmup_requests`` medium sentences in flight against Triton's `tts`, three
        times that many in all. Admission does not start from it (it measures the rate as it
        serves); the rate it saw is logged, counted from the first completion to the last.
        Returns one line for the log."""
        n = self.settings.warmup_requests
        if not n:
            return "warm-up: off"
        total = 3 * n
        client = grpc_aio.InferenceServerClient(self.settings.triton_grpc)
        done: list[float] = []  # completion times
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                text = SENTENCES[3 + queue.pop() % 12]
                inputs = build_inputs(grpc_types, text)
                await client.infer("tts", inputs, client_timeout=timeout_s, headers=self.inner)
                done.append(time.monotonic())

        start = time.monotonic()
        try:
            await asyncio.gather(*(worker() for _ in range(n)))
        except Exception as e:
            return f"warm-up failed ({type(e).__name__}: {e}); the first requests pay it"
        finally:
            await client.close()
        rate = (len(done) - 1) / max(max(done) - min(done), 1e-3)
        return (
            f"warm-up: {total} sentences, {n} at a time, in {time.monotonic() - start:.1f} s "
            f"({rate:.1f} requests/s now; admission measures the rate as it serves)"
        )

    # ----- gRPC -----

    async def _admit_message(
        self,
        request: bytes,
        admin: bool,
        client: str,
        call_left_s: float | None,
        stream: bool = False,
    ) -> tuple[AdmissionTicket, None] | tuple[None, tuple[grpc.StatusCode, str]]:
        """(ticket, None) for a ModelInferRequest to pass on, or (None, (code, message)).

        Its deadline: Triton's "timeout" parameter or the call's gRPC deadline, the sooner;
        neither: the default. A stream's call deadline is the stream's whole life, so each of
        its messages has its own timeout or the default, within what is left of the call."""
        info = infer_request(request)
        if info is None:
            return None, (
                grpc.StatusCode.INVALID_ARGUMENT,
                "unreadable ModelInferRequest: not a well-formed protobuf message",
            )
        try:
            model = self.gate(info.model, admin)
        except NotPublic as e:
            return None, (grpc.StatusCode.PERMISSION_DENIED, str(e))
        cost = request_cost(model, info.input_bytes) if model else 0.0
        own = info.timeout_us / 1e6 if info.timeout_us else None
        if stream:
            own = own or self.settings.deadline_s
        deadline_s = min((d for d in (own, call_left_s) if d is not None), default=None)
        try:
            return await self.enter(model, cost, info.id, client, deadline_s), None
        except TooMany as e:
            return None, (grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Refused as e:
            return None, (grpc.StatusCode.UNAVAILABLE, str(e))

    def client(self, headers: dict[str, str], peer: str) -> str:
        """The queue a request waits in: its address (as the edge saw it, behind one); for the
        gateway's (they carry the launcher's token), the caller the gateway names, each a
        client like any other."""
        token = headers.get(FRONT_TOKEN_HEADER, "")
        if token and self._token and hmac.compare_digest(token.encode(), self._token.encode()):
            return f"{GATEWAY}{headers.get(CALLER_HEADER, '')[:256]}"
        return edge_client(headers, peer, self._edge_key)

    # ----- life cycle -----

    async def start(self) -> None:
        s = self.settings
        # Both ports' connections, Triton's and the log's fit under it with room to spare.
        cap = self._guard.limits.max_connections
        files = raise_file_limit(2 * cap + 1024)
        if files < cap + 256:
            log.warning(
                "open-file limit %d is low for %d connections: raise it (ulimit -n)", files, cap
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
                    ("grpc.max_allowed_incoming_connections", cap),
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
