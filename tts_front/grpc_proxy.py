"""The gRPC half of the front door: unary calls and ModelStreamInfer streams forwarded to
Triton, each request admitted (or refused) on its way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc
import tritonclient.grpc as grpc_types

from tts_wire import (
    AUDIO,
    EDGE_KEY_HEADER,
    FINAL_RESPONSE,
    stream_error_message,
)
from tts_wire.caps import PerClient

from .admission import (
    FREE,
    GATEWAY,
    AdmissionTicket,
    BadRequest,
    NotPublic,
    Refused,
    TooMany,
    audio_work,
)
from .gatekeeper import COSTED, Gatekeeper
from .protowire import (
    StreamInferResponse,
    infer_request,
    model_name,
    output_elements,
    stream_response,
    with_priority,
    without_stream_first,
)
from .security import GRPC_HEADER_PREFIX
from .stubs import StubWatch

SERVICE = "inference.GRPCInferenceService"
STREAM_METHOD = f"/{SERVICE}/ModelStreamInfer"
INFER_METHOD = f"/{SERVICE}/ModelInfer"


# grpcio's asyncio server logs this, with a traceback at ERROR, when writing a response fails
# because the client (nginx, a caller) already went: its check of the client's close races
# the failed write (grpc/grpc issue 31570). Nothing is wrong on our side.
_CLIENT_GONE = "ExecuteBatchError raised in core by servicer method"
GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


def client_gone_as_info(record: logging.LogRecord) -> bool:
    """A logging filter for grpcio's core logger: its line for a response written after the
    client left becomes one INFO line without the traceback; anything else passes as it is."""
    message = record.getMessage()
    if message.startswith(_CLIENT_GONE):
        method = message.removeprefix(_CLIENT_GONE).strip(" []")
        record.msg, record.args = "a client left before its response was written (%s)", (method,)
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info = record.exc_text = None
    return True


def quiet_clients_gone() -> None:
    """Install ``client_gone_as_info`` on grpcio's core logger (once)."""
    logger = logging.getLogger(GRPC_CORE_LOGGER)
    if client_gone_as_info not in logger.filters:
        logger.addFilter(client_gone_as_info)


def message_deadline(
    own_s: float | None, call_left_s: float | None, stream: bool, default_s: float
) -> float | None:
    """The deadline a request set (seconds; None: none, the default applies without the
    headroom kept off a client's own): its timeout parameter or its call's deadline, the
    sooner. A stream's call deadline is the stream's whole life: a message without a timeout
    of its own has the default unless the call ends sooner."""
    if stream and own_s is None and (call_left_s is None or call_left_s >= default_s):
        return None
    return min((d for d in (own_s, call_left_s) if d is not None), default=None)


def _metadata(
    context: grpc.aio.ServicerContext, inner: dict[str, str]
) -> list[tuple[str, str | bytes]]:
    """The client's metadata to pass on, with the inner key (``inner``) in place of any it
    sent under that name."""
    # grpc-* and pseudo headers are the transport's own; the deadline travels as timeout=.
    drop = ("user-agent", "te", "content-type", EDGE_KEY_HEADER, *inner)
    passed = [
        (k, v)
        for k, v in (context.invocation_metadata() or ())
        if not k.startswith(("grpc-", ":")) and k not in drop
    ]
    return passed + [(k, v) for k, v in inner.items() if k.startswith(GRPC_HEADER_PREFIX)]


PARSE_IN_THREAD = 256 * 1024  # a larger message is read off the event loop


class GrpcProxy:
    """The gRPC half of the front door: calls forwarded to Triton over one channel, every
    inference admitted by the door's :class:`~tts_front.gatekeeper.Gatekeeper` on its way,
    the streams of stubs that die ended (``watch``)."""

    def __init__(self, gatekeeper: Gatekeeper, watch: StubWatch) -> None:
        self.gatekeeper, self.watch = gatekeeper, watch
        self.settings = gatekeeper.settings
        self.channel: grpc.aio.Channel | None = None
        self._calls: dict[str, grpc.aio.UnaryUnaryMultiCallable] = {}  # one per method
        # ModelStreamInfer calls open per client.
        self._calls_open = PerClient(self.settings.max_grpc_streams_per_client)
        self.held: list = []  # upstream streams of dead stubs (_ProxiedStream.end_for_dead_stub)
        self.closing = asyncio.Event()  # set: close even the streams of dead stubs

    def open(self) -> grpc.GenericRpcHandler:
        """The channel to Triton opened; the handler for the door's gRPC server."""
        unlimited = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        self.channel = grpc.aio.insecure_channel(self.settings.triton_grpc, options=unlimited)
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails):
                method = details.method
                if method == STREAM_METHOD:
                    return grpc.stream_stream_rpc_method_handler(proxy.stream)

                async def unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    return await proxy.unary(method, request, context)

                return grpc.unary_unary_rpc_method_handler(unary)

        return Handler()

    def stuck(self) -> list:
        """Upstream streams of stubs that died, still open in tritonserver."""
        return [call for call, _ in self.held if not call.done()]

    async def close(self) -> None:
        """Close the channel, and with it the streams of dead stubs held open."""
        self.closing.set()
        if self.channel:
            await self.channel.close()

    async def admit(
        self,
        request: bytes,
        admin: bool,
        client: str,
        call_left_s: float | None,
        stream: bool = False,
        listener: str = "",
    ) -> tuple[AdmissionTicket, bytes] | tuple[None, tuple[grpc.StatusCode, str]]:
        """(ticket, the request to pass on) for a ModelInferRequest (at the default priority
        when its client holds its share above it), or (None, (code, message)). ``listener``:
        Gatekeeper.listener.

        Its deadline: :func:`message_deadline`."""
        if len(request) > PARSE_IN_THREAD:  # walking a large message takes a while
            info = await asyncio.to_thread(infer_request, request, COSTED)
        else:
            info = infer_request(request, COSTED)
        if info is None:
            return None, (
                grpc.StatusCode.INVALID_ARGUMENT,
                "unreadable ModelInferRequest: not a well-formed protobuf message",
            )
        try:
            model = self.gatekeeper.gate(info.model, admin)
        except NotPublic as e:
            return None, (grpc.StatusCode.PERMISSION_DENIED, str(e))
        cost, short = 0.0, False
        if model:
            try:
                cost = await self.gatekeeper.cost(model, info.input_bytes, info.inputs)
            except BadRequest as e:
                return None, (grpc.StatusCode.INVALID_ARGUMENT, str(e))
            short = self.gatekeeper.short_stream(model, info.inputs)
        own = info.timeout_us / 1e6 if info.timeout_us else None
        deadline_s = message_deadline(own, call_left_s, stream, self.settings.deadline_s)
        try:
            ticket = await self.gatekeeper.enter(
                model, cost, info.id, client, deadline_s, info.priority, listener, short
            )
        except TooMany as e:
            return None, (grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except Refused as e:
            return None, (grpc.StatusCode.UNAVAILABLE, str(e))
        level = self.gatekeeper.rewrite(ticket, info.priority)
        if level is not None:
            request = with_priority(request, level, ticket.later)
        if model:
            request = without_stream_first(request)
        return ticket, request

    async def unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        gatekeeper, ticket = self.gatekeeper, FREE
        if method == INFER_METHOD:
            headers = _headers(context)
            client = gatekeeper.client(headers, _peer(context))
            ticket, passed = await self.admit(
                request,
                gatekeeper.is_admin(headers),
                client,
                context.time_remaining(),
                listener=gatekeeper.listener(headers, client),
            )
            if ticket is None:
                await context.abort(*passed)
            request = passed
        outcome, samples = "error", None
        try:
            call = self._calls.get(method) or self._calls.setdefault(
                method, self.channel.unary_unary(method)
            )
            response = await call(
                request,
                metadata=_metadata(context, gatekeeper.inner),
                timeout=context.time_remaining(),
            )
            outcome = "served"
            if ticket.measured:
                samples = output_elements(response, AUDIO)
            return response
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details() or "")
        finally:
            gatekeeper.leave(ticket, outcome, samples)

    async def stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """A ModelStreamInfer call, refused at once past the client's open calls."""
        headers = _headers(context)
        client = self.gatekeeper.client(headers, _peer(context))
        if not client.startswith(GATEWAY) and self._calls_open.full(client):
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this client already has {self._calls_open.limit} ModelStreamInfer calls "
                "open; end one first, or carry more requests on each",
            )
        with self._calls_open.holding(client):
            admin = self.gatekeeper.is_admin(headers)
            async for response in self._stream_messages(requests, context, admin, client):
                yield response

    async def _stream_messages(
        self,
        requests: AsyncIterator[bytes],
        context: grpc.aio.ServicerContext,
        admin: bool,
        client: str,
    ) -> AsyncIterator[bytes]:
        """A ModelStreamInfer stream: every message is admitted as a unary request is, and
        answered on the stream with an error when refused (the stream goes on); its ticket is
        released by the response that ends it (the final flag, or an error without one)."""
        stream = _ProxiedStream(self, requests, context, admin, client)
        reader = asyncio.create_task(stream.read())
        try:
            # Triton's stream is opened by the first message admitted, not by the stream: an
            # idle stream (a client can open 1,024 per connection) then holds nothing upstream.
            while stream.first is None:
                refusal = asyncio.ensure_future(stream.refusals.get())
                admitted = asyncio.ensure_future(stream.admitted.get())
                done, _ = await asyncio.wait(
                    {refusal, admitted}, return_when=asyncio.FIRST_COMPLETED
                )
                for future in (refusal, admitted):
                    if future not in done:
                        future.cancel()
                if refusal in done:
                    yield refusal.result()
                    if admitted not in done:
                        continue
                message = admitted.result()
                if message is None:  # the client's side ended with nothing admitted
                    while not stream.refusals.empty():
                        yield stream.refusals.get_nowait()
                    return
                stream.first = message
            async for response in stream.relay():
                yield response
        finally:
            reader.cancel()
            stream.cancel_pending()
            stream.release_unanswered()  # (ended before Triton's stream was opened)


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


def _match(tickets: list[AdmissionTicket], response: StreamInferResponse) -> AdmissionTicket | None:
    """The admitted request a stream's final response ends: by model and id, else the
    oldest of its model (clients need not set ids); never another model's (Triton names the
    model in its errors; a message naming none, reusing an in-flight `tts` id, freed that
    request's ticket, and Triton queued 70 requests while the door counted 32)."""
    same = [t for t in tickets if t.model == response.model]
    for ticket in same:
        if response.id and ticket.id == response.id:
            return ticket
    return same[0] if same else None


class _ProxiedStream:
    """One ModelStreamInfer call through the front door: the messages admitted and forwarded,
    the refusals answered here, Triton's responses relayed, the stubs watched."""

    def __init__(self, proxy: GrpcProxy, requests, context, admin: bool, client: str) -> None:
        self.proxy, self.context, self.admin, self.client = proxy, context, admin, client
        self.stubs: dict[str, set[int]] = {}  # model -> its stubs when this stream first used it
        self.hold = asyncio.Event()  # set: a stub of this stream died, keep it open upstream
        self.tickets: list[AdmissionTicket] = []  # admitted, not yet ended, oldest first
        self.audio: dict[int, int] = {}  # samples so far of each short text's stream, by id()
        self.refusals: asyncio.Queue[bytes] = asyncio.Queue()  # answered here, not by Triton
        # Messages admitted, in the order admitted, to pass on; None: no more will come.
        self.admitted: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.pending: set[asyncio.Task] = set()  # messages waiting in the admission queue
        self.incoming = requests.__aiter__()
        self.first: bytes | None = None
        self.call = self.next_response = self.next_refusal = None

    async def read(self) -> None:
        """Read the client's messages as they come, each admitted on its own (it may wait in
        the queue while later ones are read): a stream of many requests is many requests."""
        try:
            async for request in self.incoming:
                task = asyncio.create_task(self.admit(request))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
        except Exception:  # the client's side ended (this handler returned or aborted)
            pass
        while self.pending:
            await asyncio.wait(set(self.pending))
        self.admitted.put_nowait(None)

    async def admit(self, request: bytes) -> None:
        """Admit one message: passed on when admitted; its error queued when refused."""
        ticket, passed = await self.proxy.admit(
            request, self.admin, self.client, self.context.time_remaining(), stream=True
        )
        if ticket is None:
            self.refusals.put_nowait(_stream_error(request, *passed))
            return
        request = passed
        if ticket.model:
            self.tickets.append(ticket)
        model = ticket.model or model_name(request)
        if model and model not in self.stubs:
            self.stubs[model] = self.proxy.watch.stubs(model, fresh=True)
        self.admitted.put_nowait(request)

    def cancel_pending(self) -> None:
        """Stop admitting: the messages still waiting in the queue leave it."""
        for task in list(self.pending):
            task.cancel()

    def release_unanswered(self) -> None:
        """Release the admitted messages the stream ended before Triton answered (or before
        they were passed on at all)."""
        tickets, self.tickets = self.tickets, []
        self.audio.clear()
        for ticket in tickets:
            self.proxy.gatekeeper.leave(ticket, "error")

    async def forward(self) -> AsyncIterator[bytes]:
        yield self.first
        while (request := await self.admitted.get()) is not None:
            yield request
        if self.hold.is_set():
            # An error here, or the end of requests, would close the stream upstream.
            await self.proxy.closing.wait()

    def ended(self, response: bytes) -> None:
        r = stream_response(response)
        if r is None:
            return
        ticket = _match(self.tickets, r)
        if r.samples and r.model in self.proxy.settings.streamed:
            if ticket is not None and ticket.queued:
                # A short text's stream took a slot: its audio, summed, is the work it did,
                # measured when it ends as a `tts` request's is.
                self.audio[id(ticket)] = self.audio.get(id(ticket), 0) + r.samples
            else:
                # A long text's stream takes no slot; each chunk's audio is charged to its
                # client.
                self.proxy.gatekeeper.admission.charge(self.client, audio_work(r.samples))
        if not (r.final or (r.error and r.final is None)):
            return  # more responses follow for its request
        if ticket is not None:
            self.tickets.remove(ticket)
            samples = self.audio.pop(id(ticket), None)
            self.proxy.gatekeeper.leave(ticket, "error" if r.error else "served", samples)

    def dead_models(self) -> list[str]:
        watch = self.proxy.watch
        return [m for m, pids in self.stubs.items() if pids and not pids <= watch.stubs(m)]

    async def end_for_dead_stub(self, model: str) -> None:
        # Not cancelled upstream: Triton 2.51's Python backend aborted (boost lock_exception)
        # on cancelling a request of a dead stub. The call is kept referenced (garbage
        # collection would cancel it) until this process ends.
        self.hold.set()
        self.proxy.held.append((self.call, self.next_response))
        self.call = self.next_response = None
        await self.context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"the instance of model '{model}' serving this stream died; the stream was ended, "
            "retry it",
        )

    async def relay(self) -> AsyncIterator[bytes]:
        """Triton's responses and the refusals, as they come; the stream ended with an error
        when a stub it uses dies."""
        self.call = self.proxy.channel.stream_stream(STREAM_METHOD)(
            self.forward(),
            metadata=_metadata(self.context, self.proxy.gatekeeper.inner),
            timeout=self.context.time_remaining(),
        )
        responses = self.call.__aiter__()
        try:
            while True:
                if self.next_response is None:
                    self.next_response = asyncio.ensure_future(responses.__anext__())
                if self.next_refusal is None:
                    self.next_refusal = asyncio.ensure_future(self.refusals.get())
                finished, _ = await asyncio.wait(
                    {self.next_response, self.next_refusal},
                    timeout=self.proxy.settings.stream_check_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if self.next_refusal in finished:
                    yield self.next_refusal.result()
                    self.next_refusal = None
                    continue
                if not finished:
                    dead = self.dead_models()
                    if dead:
                        await self.end_for_dead_stub(dead[0])
                    continue
                try:
                    response = self.next_response.result()
                except StopAsyncIteration:
                    while not self.refusals.empty():  # refused after the last response
                        yield self.refusals.get_nowait()
                    return
                self.next_response = None
                self.ended(response)
                yield response
        except grpc.aio.AioRpcError as e:
            await self.context.abort(e.code(), e.details() or "")
        finally:
            for future in (self.next_response, self.next_refusal):
                if future is not None:
                    future.cancel()
            if self.call is not None:
                self.call.cancel()  # the client left or the stream ended: Triton stops its work
            self.release_unanswered()
