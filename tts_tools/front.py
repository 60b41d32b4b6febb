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
- a request to an admitted model (``tts``) is served only when the wait it would see fits
  ``deadline_s`` (Little's law on the measured throughput, :class:`Admission`), else refused at
  once (gRPC UNAVAILABLE, HTTP 429 with Retry-After): the same overload answer as Triton's own
  full queues, which clients retry with backoff;
- a stream whose model instance dies is ended with UNAVAILABLE instead of hanging for ever
  (Triton 2.51 leaves it open without an error or a final response).

Everything else passes through unchanged (headers, metadata, deadlines, the admin key header).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import grpc
import tritonclient.grpc as grpc_types
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from tritonclient.grpc import aio as grpc_aio

from tts_client.protocol import build_inputs
from tts_tools.launcher.supervisor import is_ready, stubs_by_model
from tts_tools.texts import SENTENCES

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
_INFER_PATH = re.compile(
    r"^/v2/models/([^/]+)(?:/versions/[^/]+)?/(?:infer|generate|generate_stream)$"
)


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
    admitted: tuple[str, ...] = ("tts",)
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
        if not 0 <= self.warmup_requests <= 256:
            raise ValueError(f"warmup_requests must be in [0, 256], not {self.warmup_requests}")


class Admission:
    """Admit a request when the wait it would see fits the deadline, else refuse it at once.

    The wait is estimated by Little's law: (requests in flight + 1) / throughput, where the
    throughput is completions per busy second (time with something in flight) over the last
    ``window_s``, so idle time does not make the server look slow. The estimate assumes the
    pipeline serves in order at that rate; when admitted requests still overrun the deadline
    (batching reorders, clients share the CPU) the usable share of the throughput shrinks by
    10 % per late request and grows back by 2 % per timely one. Up to ``min_in_flight``
    requests are always admitted. The rate counted on is the highest the window has given
    (:meth:`capacity`): completions per busy second at low concurrency measure latency, not
    capacity (one request alone: 1 / its latency), so a burst that followed a lone request, or a
    quiet minute, was refused below what the server serves. Late requests still shrink the
    share. Before anything was measured only ``min_in_flight`` are admitted: the front door
    measures a warm-up before it opens its ports (:meth:`Front.warm_up`).
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
        self.in_flight = 0
        self.admitted = self.refused = self.late = 0
        self.share = 1.0  # of the measured throughput that admission counts on
        self._since = clock()  # start of the current accounting slice
        # (end time, busy seconds, completions) per slice, newest last.
        self._slices: deque[tuple[float, float, int]] = deque()
        self._peak: float | None = None  # the highest throughput the window has given

    def _account(self, completions: int = 0) -> None:
        now = self.clock()
        busy = (now - self._since) if self.in_flight else 0.0
        if busy or completions:
            self._slices.append((now, busy, completions))
        self._since = now
        while self._slices and now - self._slices[0][0] > self.window_s:
            self._slices.popleft()

    def throughput(self) -> float | None:
        """Completions per busy second over the window; None when it holds none (idle)."""
        busy = sum(s[1] for s in self._slices)
        done = sum(s[2] for s in self._slices)
        if not (done and busy > 0):
            return None
        rate = done / busy
        if done >= self.min_in_flight:  # enough completions to stand for the server
            self._peak = max(self._peak or 0.0, rate)
        return rate

    def seed(self, rate: float) -> None:
        """Count on ``rate`` requests per second (measured by the warm-up) until more is
        measured."""
        self._peak = max(self._peak or 0.0, rate)

    def capacity(self) -> float | None:
        """The highest throughput measured (idling forgets nothing: a server is no slower for
        having rested); None before there is one."""
        rate = self.throughput()
        return max(self._peak or 0.0, rate or 0.0) or None

    def estimated_wait(self) -> float | None:
        """Seconds a request admitted now would take; None before anything was measured."""
        rate = self.capacity()
        return (self.in_flight + 1) / (rate * self.share) if rate else None

    def enter(self) -> bool:
        """Admit one request (True; call ``leave`` when it ends) or refuse it (False)."""
        self._account()
        wait = self.estimated_wait()
        if self.in_flight >= self.min_in_flight and (wait is None or wait > self.deadline_s):
            self.refused += 1
            return False
        self.in_flight += 1
        self.admitted += 1
        return True

    def leave(self, seconds: float) -> None:
        """An admitted request ended after ``seconds`` (served or failed)."""
        self._account(completions=1)
        self.in_flight -= 1
        if seconds > self.deadline_s:
            self.late += 1
            self.share = max(0.1, self.share * 0.9)
        else:
            self.share = min(1.0, self.share * 1.02)

    def refusal(self) -> str:
        wait = self.estimated_wait()
        why = f"about {wait:.1f} s" if wait else "not measured yet"
        return (
            f"server overloaded: {self.in_flight} requests in flight, the wait ({why}) would "
            f"exceed the {self.deadline_s:g} s deadline; retry later"
        )


def model_name(message: bytes) -> str | None:
    """Field 1 (``model_name``) of a serialized ModelInferRequest, read from the protobuf wire
    format without parsing (and copying) the tensors; None when absent or malformed.

    The last occurrence, as protobuf (and so Triton) reads a repeated singular field: reading
    the first let a request prefixed with another model_name pass admission as that model."""
    view, i, n = memoryview(message), 0, len(message)

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while i < n and shift < 64:
            byte = view[i]
            i += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise ValueError("truncated varint")

    name = None
    try:
        while i < n:
            key = varint()
            number, kind = key >> 3, key & 7
            if kind == 0:
                varint()
            elif kind == 1:
                i += 8
            elif kind == 5:
                i += 4
            elif kind == 2:
                length = varint()
                if i + length > n:
                    return None
                if number == 1:
                    name = bytes(view[i : i + length]).decode("utf-8")
                i += length
            else:
                return None
    except (ValueError, UnicodeDecodeError):
        return None
    return name


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

    # ----- admission shared by both protocols -----

    def enter(self, model: str | None) -> Ticket | None:
        """A ticket for a request to ``model`` (None: refused for overload)."""
        if model is None or model not in self.settings.admitted:
            return Ticket(None, 0.0)
        if not self.admission.enter():
            self.metrics.refused.labels(model).inc()
            return None
        self.metrics.in_flight.labels(model).inc()
        return Ticket(model, time.monotonic())

    def leave(self, ticket: Ticket, outcome: str) -> None:
        if ticket.model is None:
            return
        seconds = time.monotonic() - ticket.start
        self.admission.leave(seconds)
        self.metrics.in_flight.labels(ticket.model).dec()
        self.metrics.requests.labels(ticket.model, outcome).inc()
        self.metrics.seconds.labels(ticket.model).observe(seconds)
        self.metrics.share.set(self.admission.share)

    async def warm_up(self, timeout_s: float = 120.0) -> str:
        """Measure the throughput admission starts from, before the ports open (a cold server
        that counted on ``min_in_flight`` alone refused the 9th request of the first burst).

        A closed loop of ``warmup_requests`` medium sentences in flight, three times that many
        in all, counted from the first completion to the last: one round sent at once measured
        about half the steady rate (its stages ran one after another, where a steady load keeps
        each busy). Also pays the engines' first-run costs before a user does. Returns one line
        for the log; a failure leaves admission unmeasured."""
        n = self.settings.warmup_requests
        if not n or "tts" not in self.settings.admitted:
            return "admission warm-up: off"
        total = 3 * n
        client = grpc_aio.InferenceServerClient(self.settings.triton_grpc)
        done: list[float] = []
        queue = list(range(total))

        async def worker() -> None:
            while queue:
                inputs = build_inputs(grpc_types, SENTENCES[3 + queue.pop() % 12])
                await client.infer("tts", inputs, client_timeout=timeout_s)
                done.append(time.monotonic())

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
        rate = (len(done) - 1) / max(done[-1] - done[0], 1e-3)
        self.admission.seed(rate)
        return (
            f"admission warm-up: {total} sentences, {n} at a time, in "
            f"{time.monotonic() - start:.1f} s: {rate:.1f} requests/s; up to about "
            f"{rate * self.settings.deadline_s:.0f} in flight fit the "
            f"{self.settings.deadline_s:g} s deadline"
        )

    # ----- gRPC -----

    async def _unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        ticket = self.enter(model_name(request) if method == INFER_METHOD else None)
        if ticket is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.admission.refusal())
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
        stubs: dict[str, set[int]] = {}  # model -> its stubs when this stream first used it
        hold = asyncio.Event()  # set: a stub of this stream died, keep it open upstream

        async def forward() -> AsyncIterator[bytes]:
            try:
                async for request in requests:
                    model = model_name(request)
                    if model and model not in stubs:
                        stubs[model] = self.watch.stubs(model, fresh=True)
                    yield request
            except Exception:  # the client's side ended (this handler returned or aborted)
                pass
            if hold.is_set():
                # An error here, or the end of requests, would close the stream upstream.
                await self._closing.wait()

        call = self._channel.stream_stream(STREAM_METHOD)(
            forward(), metadata=_metadata(context), timeout=context.time_remaining()
        )
        responses = call.__aiter__()
        next_response = None
        try:
            while True:
                if next_response is None:
                    next_response = asyncio.ensure_future(responses.__anext__())
                finished, _ = await asyncio.wait(
                    {next_response}, timeout=self.settings.stream_check_s
                )
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
                    return
                next_response = None
                yield response
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            if next_response is not None:
                next_response.cancel()
            if call is not None:
                call.cancel()  # the client left or the stream ended: Triton stops its work

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
        limit = self.settings.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            return _http_error(
                413,
                f"request body of {request.content_length} bytes is over the {limit}-byte limit",
            )
        body = bytearray()
        try:
            # Inflated as it is read (aiohttp decompresses gzip/deflate/br bodies): a small
            # compressed body that inflates past the limit is stopped at the limit.
            async for chunk in request.content.iter_chunked(256 * 1024):
                body += chunk
                if len(body) > limit:
                    return _http_error(
                        413, f"request body is over the {limit}-byte limit (after decompression)"
                    )
        except aiohttp.ClientPayloadError as e:
            return _http_error(400, f"unreadable request body: {e}")
        match = _INFER_PATH.match(request.path)
        if request.path == "/metrics" and request.method == "GET":
            self.metrics.stuck.set(len(self.stuck()))
            return web.Response(
                body=generate_latest(self.metrics.registry), content_type="text/plain"
            )
        ticket = self.enter(match.group(1) if match and request.method == "POST" else None)
        if ticket is None:
            return _http_error(429, self.admission.refusal(), {"Retry-After": "1"})
        outcome = "error"
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HTTP_DROP}
            url = f"http://{self.settings.triton_http}{request.rel_url}"
            async with self._session.request(
                request.method, url, data=bytes(body), headers=headers
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

    # ----- life cycle -----

    async def start(self) -> None:
        s = self.settings
        unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        if s.grpc_port:
            self._channel = grpc.aio.insecure_channel(s.triton_grpc, options=unlimited)
            self._grpc = grpc.aio.server(
                options=[
                    ("grpc.max_receive_message_length", s.max_request_bytes),
                    ("grpc.max_send_message_length", -1),
                    ("grpc.so_reuseport", 0),
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
            site = web.TCPSite(self._runner, s.bind, s.http_port)
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
    p.add_argument("--admit", default=",".join(d.admitted), help="models under admission control")
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
            admitted=tuple(m for m in a.admit.split(",") if m),
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
        f"{', '.join(settings.admitted) or 'no model'} admitted within a "
        f"{settings.deadline_s:g} s deadline)",
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
