"""The gateway app: OpenAI's ``/v1/audio/speech`` over Triton, streaming, with metrics.

Every request becomes one ``tts`` inference (short text) or one ``tts_stream`` stream (long
text) over gRPC, so concurrent users are batched together inside Triton; this process only
validates, routes and encodes.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from tts_client import protocol
from tts_client.errors import InvalidInput, TTSError
from tts_wire import MAX_SPEED, MIN_SPEED

from .encoding import FORMATS, Encoder
from .errors import APIError, bad_request, from_tts_error, timeout
from .metrics import Metrics
from .settings import MODELS, GatewaySettings, known_model

log = logging.getLogger("tts_gateway")

STATIC = Path(__file__).parent / "static"
FormatName = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class SpeechRequest(BaseModel):
    """OpenAI's ``audio.speech.create`` body."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description=f"one of {', '.join(MODELS)} (all the same engine)")
    input: str = Field(description="the text to speak")
    voice: str = Field(description="a voice id or alias (GET /v1/audio/voices)")
    # strict: a number, as OpenAI's API takes it ("1.5" and true are refused, not coerced).
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False, strict=True)
    response_format: FormatName = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = Field(
        None, description="accepted for compatibility and ignored: Piper voices take no prompt"
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data):
        # OpenAI's SDKs and many clients send null for an option they leave unset.
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in _OPTIONAL}
        return data

    @field_validator("input")
    @classmethod
    def _valid_unicode(cls, text: str) -> str:
        # JSON may escape a lone surrogate ("\\ud800"): no UTF-8 encodes it, so refuse it here
        # with its place instead of failing later as a 500.
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"holds a lone surrogate ({text[e.start]!r} at character {e.start}); "
                "send valid Unicode"
            ) from None
        return text


_OPTIONAL = {"speed", "response_format", "stream_format", "instructions"}


class SpeechBackend(Protocol):
    """What the gateway needs of Triton; :class:`tts_client.AsyncTTSClient` is one."""

    async def sample_rate(self) -> int: ...
    async def synthesize(self, text: str, speed: float, noise_scale, noise_w, *, voice): ...
    def stream(self, text: str, speed: float, noise_scale, noise_w, *, voice) -> AsyncIterator: ...
    async def is_ready(self) -> bool: ...
    async def close(self) -> None: ...


def default_backend(settings: GatewaySettings) -> SpeechBackend:
    from tts_client import AsyncTTSClient

    # No retries here: an overloaded Triton is answered with 503 + Retry-After at once, and the
    # caller (the openai SDK retries 429/503) decides. The client's own timeout is a backstop.
    return AsyncTTSClient(
        settings.triton_url, timeout=settings.request_timeout_s + 5, retry=protocol.NO_RETRY
    )


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first problem, naming the field, in words a user can act on."""
    error = exc.errors()[0]
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    kind = error.get("type", "")
    if kind == "json_invalid":
        return bad_request(
            f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
        )
    param = ".".join(loc) or None
    message = error.get("msg", "invalid value")
    if kind == "extra_forbidden":
        message = f"unknown field {param!r}; fields: {', '.join(SpeechRequest.model_fields)}"
    elif kind == "missing" and param is None:
        message = "a JSON body is required"
    elif param:
        message = f"{param}: {message}"
    return bad_request(message, param=param, code=kind or None)


class DrainCut(Exception):
    """The gateway is stopping and its drain time ran out with this stream still running."""


class Drain:
    """When the gateway began to stop (SIGTERM), so streams can end cleanly at its limit."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cut_at: float | None = None  # on the event loop's clock
        self.started = asyncio.Event()

    def begin(self, loop: asyncio.AbstractEventLoop) -> None:
        """Called from the signal handler (tts_gateway.__main__); thread-safe."""
        if self.cut_at is None:
            self.cut_at = loop.time() + self.seconds
            loop.call_soon_threadsafe(self.started.set)


async def next_chunk(chunks: AsyncIterator, deadline: float, drain: Drain):
    """The next chunk, or TimeoutError at ``deadline``, or DrainCut when the drain runs out;
    StopAsyncIteration at the end."""
    loop = asyncio.get_running_loop()
    step = asyncio.ensure_future(anext(chunks))
    try:
        while True:
            cut = drain.cut_at
            limit = deadline if cut is None else min(deadline, cut)
            waits: set[asyncio.Future] = {step}
            if cut is None:  # wake up when a drain begins, to honour its limit
                waits.add(asyncio.ensure_future(drain.started.wait()))
            done, pending = await asyncio.wait(
                waits, timeout=max(0.0, limit - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            for future in pending - {step}:
                future.cancel()
            if step in done:
                return step.result()
            if loop.time() >= limit:
                raise DrainCut() if cut is not None and limit == cut else asyncio.TimeoutError()
    finally:
        if not step.done():
            step.cancel()
            await asyncio.gather(step, return_exceptions=True)


class _Slots:
    """Admission control: at most ``limit`` speech requests in this process."""

    def __init__(self, limit: int, metrics: Metrics) -> None:
        self.limit = limit
        self.used = 0
        self.metrics = metrics

    def take(self) -> Callable[[], None]:
        self.used += 1
        self.metrics.in_flight.inc()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.used -= 1
                self.metrics.in_flight.dec()

        return release


class BodyLimit:
    """ASGI middleware: read at most ``limit`` bytes of body before the app sees anything.

    Compressed bodies are refused (415) rather than inflated; bigger bodies get 413 without
    being read to the end.
    """

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        encoding = headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding not in (b"", b"identity"):
            error = APIError(
                415, "compressed request bodies are not accepted; send plain JSON", code="encoding"
            )
            return await _error_response(error)(scope, receive, send)
        declared = headers.get(b"content-length", b"0")
        too_large = APIError(
            413, f"the request body is over {self.limit} bytes", code="request_too_large"
        )
        if not declared.isdigit() or int(declared) > self.limit:
            return await _error_response(too_large)(scope, receive, send)
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            size += len(message.get("body", b""))
            if size > self.limit:
                return await _error_response(too_large)(scope, receive, send)
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(parts), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def check_voices(backend: SpeechBackend, voices) -> None:
    """Refuse to start on a voice Triton does not serve (one short request per Triton voice),
    rather than answer every request for it with an error. Triton not reachable yet: a warning,
    and /ready says so."""
    for name in sorted({v.model_voice for v in voices if v.model_voice}):
        users = ", ".join(v.id for v in voices if v.model_voice == name)
        try:
            await backend.synthesize("Ready.", 1.0, None, None, voice=name)
        except InvalidInput as e:
            raise SystemExit(
                f"gateway: voice(s) {users} speak with Triton voice {name!r}, which the server "
                f"does not serve ({e}); export it (make serve VOICES=...) or fix --voices-file"
            ) from None
        except TTSError as e:
            log.warning("gateway: could not check voice %r with Triton: %s", name, e)
            return


class Access:
    """On /v1/: the API key when one is configured (``Authorization: Bearer``, compared in
    constant time; 401), and JSON for a POST body (415 naming the header, instead of a
    validation error about a missing dict)."""

    def __init__(self, app, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or ())
        if self.key:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                error = APIError(
                    401,
                    "a valid API key is needed: send 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                )
                return await _error_response(error)(scope, receive, send)
        content_type = headers.get(b"content-type")
        if scope["method"] == "POST" and content_type is not None:
            media = content_type.split(b";")[0].strip().lower()
            if media != b"application/json" and not media.endswith(b"+json"):
                error = APIError(
                    415,
                    f"the body must be JSON: send it with 'Content-Type: application/json' "
                    f"(got {media.decode(errors='replace')!r})",
                    code="unsupported_media_type",
                )
                return await _error_response(error)(scope, receive, send)
        return await self.app(scope, receive, send)


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def create_app(
    settings: GatewaySettings,
    backend_factory: Callable[[GatewaySettings], SpeechBackend] = default_backend,
) -> FastAPI:
    metrics = Metrics()
    slots = _Slots(settings.max_concurrent_requests, metrics)
    pcm = dataclasses.replace(FORMATS["pcm"], sample_rate=settings.pcm_sample_rate or None)
    formats = {**FORMATS, "pcm": pcm}
    voice_names = settings.voice_names()
    state: dict[str, SpeechBackend] = {}
    drain = Drain(settings.drain_s)

    @asynccontextmanager
    async def lifespan(_app):
        state["backend"] = backend_factory(settings)
        log.info(
            "gateway: Triton at %s; voices %s; up to %d characters, %d requests in flight",
            settings.triton_url,
            ", ".join(v.id for v in settings.voices),
            settings.max_input_chars,
            settings.max_concurrent_requests,
        )
        try:
            yield
        finally:
            await state.pop("backend").close()

    app = FastAPI(
        title="TTS gateway",
        description="OpenAI-compatible speech API in front of Triton Inference Server",
        version="0.2.0",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc load their scripts from a CDN: blank offline. /docs points
        # to the schema instead.
        docs_url=None,
        redoc_url=None,
    )
    app.state.drain = drain

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        error = _validation_error(exc)
        metrics.requests.labels(str(error.status), "invalid").inc()
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        kind = "not_found" if exc.status_code == 404 else None
        return _error_response(APIError(exc.status_code, str(exc.detail), code=kind))

    @app.exception_handler(Exception)
    async def _unexpected(_request, exc: Exception):
        log.exception("unexpected error")  # the trace stays in the log, not in the answer
        return _error_response(APIError(500, "internal error", "server_error", code="internal"))

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return HTMLResponse(
            "<!doctype html><title>TTS gateway API</title><p>The OpenAPI schema is at "
            '<a href="/openapi.json">/openapi.json</a> (open it in any OpenAPI viewer); the '
            'API is OpenAI\'s <code>audio.speech</code>; <a href="/">the speech page</a>.'
        )

    @app.get("/health")
    async def health() -> dict:
        """Live: this process answers."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        """Ready: Triton's ``tts`` and ``tts_stream`` are ready."""
        ok = await state["backend"].is_ready()
        return JSONResponse(
            {"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503
        )

    @app.get("/metrics", include_in_schema=False)
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "tts-serving"} for m in MODELS
        ]
        return {"object": "list", "data": data}

    @app.get("/v1/audio/models")
    async def audio_models() -> dict:
        """The speech models, as Open WebUI and Kokoro-FastAPI list them."""
        return {"models": [{"id": m, "name": m} for m in MODELS]}

    @app.get("/v1/audio/voices")
    async def voices() -> dict:
        return {
            "voices": [
                {
                    "id": v.id,
                    "name": v.id,  # Open WebUI reads id and name
                    "description": v.description,
                    "aliases": list(v.aliases),
                    "speed": v.speed,
                }
                for v in settings.voices
            ]
        }

    @app.post(
        "/v1/audio/speech",
        response_class=StreamingResponse,
        responses={200: {"content": {f.media_type: {} for f in FORMATS.values()}}},
    )
    async def speech(request: SpeechRequest):
        started = time.perf_counter()
        fmt = formats[request.response_format]
        label = request.response_format

        def refuse(error: APIError) -> APIError:
            metrics.requests.labels(str(error.status), label).inc()
            return error

        if not known_model(request.model):
            raise refuse(
                APIError(
                    404,
                    f"unknown model {request.model!r}; models: {', '.join(MODELS)}",
                    param="model",
                    code="model_not_found",
                )
            )
        voice = voice_names.get(request.voice)
        if voice is None:
            raise refuse(
                APIError(  # 400 with param "voice", as OpenAI answers an invalid voice
                    400,
                    f"unknown voice {request.voice!r}; voices: {', '.join(voice_names)}",
                    param="voice",
                    code="voice_not_found",
                )
            )
        text = request.input
        if not text.strip():
            raise refuse(bad_request("input is empty; send the text to speak", param="input"))
        if len(text) > settings.max_input_chars:
            raise refuse(
                bad_request(
                    f"input is {len(text)} characters, over this server's limit of "
                    f"{settings.max_input_chars}; split it",
                    param="input",
                    code="string_above_max_length",
                )
            )
        if slots.used >= slots.limit:
            raise refuse(
                APIError(
                    429,
                    f"this gateway is answering {slots.limit} requests already; retry later",
                    type="rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after=settings.retry_after_s,
                )
            )
        release = slots.take()
        backend = state["backend"]
        # One deadline for the whole request, on the loop's clock (asyncio.timeout_at).
        deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
        streamed = len(text) > settings.direct_max_chars
        # The voice's speed scales the request's; the server checks the product's range.
        options = (request.speed * voice.speed, voice.noise_scale, voice.noise_w)
        model_voice = voice.model_voice

        async def audio() -> AsyncIterator[np.ndarray]:
            if streamed:
                async for chunk in backend.stream(text, *options, voice=model_voice):
                    yield chunk.samples
            else:  # (the client streams by itself if the text is too long for one request)
                yield (await backend.synthesize(text, *options, voice=model_voice)).samples

        chunks = audio()
        try:
            # (timeout_at, not wait_for: no inner task, so a cancelled wait leaves no generator
            # running behind it.)
            async with asyncio.timeout_at(deadline):
                rate = await backend.sample_rate()
                first = await anext(chunks)
        except BaseException as exc:
            release()
            await chunks.aclose()
            if isinstance(exc, TTSError):
                raise refuse(from_tts_error(exc, settings.retry_after_s)) from None
            if isinstance(exc, asyncio.TimeoutError):
                raise refuse(timeout(settings.request_timeout_s)) from None
            if isinstance(exc, StopAsyncIteration):
                raise refuse(APIError(500, "no audio came back", "server_error")) from None
            raise
        metrics.characters.inc(len(text))
        # One `tts` request: the whole audio comes at once, so WAV and FLAC get real lengths.
        encoder = Encoder(fmt, rate, whole=not streamed)
        progress = {"samples": 0}

        async def encoded() -> AsyncIterator[bytes]:
            """Encoded bytes as audio arrives; an error after the first byte cuts the stream."""
            status = "200"
            first_sent = False
            try:
                pending: np.ndarray | None = first
                while pending is not None:
                    progress["samples"] += pending.size
                    data = await asyncio.to_thread(encoder.encode, pending)
                    if data:
                        if not first_sent:
                            first_sent = True
                            metrics.first_byte.observe(time.perf_counter() - started)
                        yield data
                    try:
                        pending = await next_chunk(chunks, deadline, drain)
                    except StopAsyncIteration:
                        pending = None
                rest = await asyncio.to_thread(encoder.finish)
                if not first_sent:  # a whole response comes out of finish() only
                    metrics.first_byte.observe(time.perf_counter() - started)
                yield rest
            except BaseException as exc:
                status = "cancelled" if isinstance(exc, asyncio.CancelledError) else "stream_error"
                if isinstance(exc, TTSError | asyncio.TimeoutError | DrainCut):
                    log.warning(
                        "stream cut after %.2f s of audio: %s", progress["samples"] / rate, exc
                    )
                raise
            finally:
                release()
                encoder.close()
                await chunks.aclose()
                metrics.requests.labels(status, label).inc()
                if status == "200":
                    seconds = progress["samples"] / rate
                    elapsed = time.perf_counter() - started
                    metrics.audio_seconds.inc(seconds)
                    metrics.latency.observe(elapsed)
                    if seconds > 0:
                        metrics.real_time_factor.observe(elapsed / seconds)

        headers = {
            "X-Audio-Streaming": "true" if streamed else "false",
            "X-Sample-Rate": str(encoder.output_rate),  # what the bytes hold (Opus: 48 kHz)
        }
        if request.stream_format == "sse":
            return StreamingResponse(
                _sse(encoded(), len(text), lambda: progress["samples"] / rate),
                media_type="text/event-stream",
                headers=headers,
            )
        return StreamingResponse(encoded(), media_type=fmt.media_type, headers=headers)

    # Outermost last: CORS (a preflight needs no key), then the key and the content type,
    # then the body limit.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(Access, api_key=settings.api_key)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["X-Sample-Rate", "X-Audio-Streaming", "Retry-After"],
        )
    return app


async def _sse(
    encoded: AsyncIterator[bytes], characters: int, audio_seconds: Callable[[], float]
) -> AsyncIterator[bytes]:
    """OpenAI's ``speech.audio.delta`` / ``speech.audio.done`` events (``data:`` lines)."""

    def event(payload: dict) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    try:
        async for data in encoded:
            if data:
                yield event(
                    {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                )
    except (asyncio.TimeoutError, TTSError, DrainCut) as exc:
        if isinstance(exc, DrainCut):
            message = "the gateway is shutting down and its drain time ran out; retry"
        elif isinstance(exc, TTSError):
            message = str(exc)
        else:
            message = "the gateway's deadline passed"
        yield event({"type": "error", "error": {"message": message, "type": "server_error"}})
        return
    yield event(
        {
            "type": "speech.audio.done",
            "usage": {"input_characters": characters, "audio_seconds": round(audio_seconds(), 3)},
        }
    )
