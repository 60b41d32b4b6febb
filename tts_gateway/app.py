"""The gateway app: OpenAI's ``/v1/audio/speech`` over Triton, streaming, with metrics.

Every request becomes one ``tts`` inference (short text) or one ``tts_stream`` stream (long
text) over gRPC, so concurrent users are batched together inside Triton; this process only
validates, routes and encodes.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from fastapi import FastAPI, Request
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

from tts_wire import MAX_SPEED, MIN_SPEED, __version__, edge_client

from . import sessions
from .drain import CUT, cut_message
from .encoding import FORMATS, served_formats
from .errors import APIError, bad_request
from .metrics import Metrics
from .middleware import Access, BodyLimit, error_response
from .piper_api import piper_routes
from .service import SpeechBackend, SpeechJob, SpeechService, default_backend
from .settings import MODELS, GatewaySettings, Voice, known_model

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
    # Ours, not OpenAI's: each SSE speech.audio.delta also carries the words its audio holds.
    word_timestamps: bool = Field(
        False, strict=True, description="with stream_format sse: timed words in each delta"
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


class CaptionedSpeechRequest(SpeechRequest):
    """Kokoro-FastAPI's ``/dev/captioned_speech`` body: OpenAI's, plus whether to stream (one
    JSON object per line) and whether to time the words."""

    model: str = Field("tts-1", description=f"one of {', '.join(MODELS)}, or kokoro")
    stream: bool = Field(True, strict=True)
    return_timestamps: bool = Field(True, strict=True)
    # Kokoro's own knobs, accepted so its clients work unchanged; they change nothing here.
    lang_code: str | None = Field(None, description="ignored: the voice sets the language")
    return_download_link: bool = Field(False, strict=True, description="must be false")
    normalization_options: dict | None = Field(None, description="ignored")


_OPTIONAL = {"speed", "response_format", "stream_format", "instructions", "word_timestamps",
             "stream", "return_timestamps", "lang_code", "return_download_link",
             "normalization_options"}  # fmt: skip


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


def create_app(
    settings: GatewaySettings,
    backend_factory: Callable[[GatewaySettings], SpeechBackend] = default_backend,
    wyoming_socket: socket.socket | None = None,
) -> FastAPI:
    """The gateway's app; ``wyoming_socket``: Wyoming's port, already listening (bound by the
    entry point before anything starts), else bound here from the settings."""
    metrics = Metrics()
    service = SpeechService(settings, metrics, backend_factory)

    @asynccontextmanager
    async def lifespan(_app):
        await service.start()
        wyoming = None
        if settings.wyoming_port:
            from .wyoming import WyomingServer

            wyoming = WyomingServer(settings, service, wyoming_socket)
            port = await wyoming.start()
            log.info("gateway: Wyoming (Home Assistant) on %s:%d", wyoming.host, port)
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
            if wyoming is not None:
                await wyoming.close()
            await service.close()

    app = FastAPI(
        title="TTS gateway",
        description="OpenAI-compatible speech API in front of Triton Inference Server",
        version=__version__,
        lifespan=lifespan,
        # FastAPI's /docs and /redoc load their scripts from a CDN: blank offline. /docs points
        # to the schema instead.
        docs_url=None,
        redoc_url=None,
    )
    app.state.drain = service.drain  # started by tts_gateway.__main__ on SIGTERM
    app.state.speech = service

    _error_handlers(app, metrics)
    _info_routes(app, settings, service)
    _speech_route(app, settings, service)
    sessions.add_routes(app, settings, service)
    _middleware(app, settings)
    return app


def _error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Every error as OpenAI's JSON error body; no traceback reaches a client."""

    @app.exception_handler(APIError)
    async def _api_error(_request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        error = _validation_error(exc)
        metrics.requests.labels(str(error.status), "invalid").inc()
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request, exc: StarletteHTTPException):
        kind = "not_found" if exc.status_code == 404 else None
        return error_response(APIError(exc.status_code, str(exc.detail), code=kind))

    @app.exception_handler(Exception)
    async def _unexpected(_request, exc: Exception):
        if isinstance(exc, CUT):  # a stream cut as planned: Speech.body logged its one line
            return error_response(APIError(503, cut_message(exc), "server_error"))
        log.exception("unexpected error")  # the trace stays in the log, not in the answer
        return error_response(APIError(500, "internal error", "server_error", code="internal"))


def _info_routes(app: FastAPI, settings: GatewaySettings, service: SpeechService) -> None:
    """The page, health, readiness, metrics and the model and voice lists."""
    metrics = service.metrics

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
        ok = await service.backend.is_ready()
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
        return {"voices": [voice_listing(v) for v in settings.voices]}


def voice_listing(voice: Voice) -> dict:
    """One voice as ``GET /v1/audio/voices`` lists it (the page's list too)."""
    return {
        "id": voice.id,
        "name": voice.id,  # Open WebUI reads id and name
        "description": voice.description,
        "aliases": list(voice.aliases),
        "speed": voice.speed,
        "language": voice.language or None,
        "speaker": voice.speaker,
    }


def speech_job(
    request: SpeechRequest,
    word_timestamps: bool,
    client: str,
    settings: GatewaySettings,
    voice_names: dict,
    formats: dict,
) -> SpeechJob:
    """The speech service's job for a request, or the APIError that refuses it."""
    if not known_model(request.model):
        raise APIError(
            404,
            f"unknown model {request.model!r}; models: {', '.join(MODELS)}",
            param="model",
            code="model_not_found",
        )
    voice = voice_names.get(request.voice)
    if voice is None:
        raise APIError(  # 400 with param "voice", as OpenAI answers an invalid voice
            400,
            f"unknown voice {request.voice!r}; voices: {', '.join(voice_names)}",
            param="voice",
            code="voice_not_found",
        )
    text = request.input
    if not text.strip():
        raise bad_request("input is empty; send the text to speak", param="input")
    if len(text) > settings.max_input_chars:
        raise bad_request(
            f"input is {len(text)} characters, over this server's limit of "
            f"{settings.max_input_chars}; split it, or raise the limit with "
            "--max-input-chars (TTS_GATEWAY_MAX_INPUT_CHARS; up to tts_stream's max_characters)",
            param="input",
            code="string_above_max_length",
        )
    try:
        # (sent for the caller: the front door queues it as the caller's own)
        options = voice.options(
            request.speed, word_timestamps=word_timestamps, caller=client or None
        )
    except ValueError as e:
        raise bad_request(str(e), param="speed") from None
    # A long text streams; so does a short one played as it arrives, where its first audio
    # comes from tts_stream's windows (speech_early_audio).
    played_as_it_comes = request.response_format == "pcm" or request.stream_format == "sse"
    windows = settings.speech_early_audio == "windows" and played_as_it_comes
    streamed = len(text) > settings.direct_max_chars or windows
    return SpeechJob(text, options, formats[request.response_format], streamed, client)


def _speech_route(app: FastAPI, settings: GatewaySettings, service: SpeechService) -> None:
    """``POST /v1/audio/speech`` and ``/dev/captioned_speech``: validate, then hand the
    request to the speech service."""
    formats = served_formats(settings.pcm_sample_rate)
    voice_names = settings.voice_names()

    def caller(http: Request) -> str:
        return edge_client(http.headers, http.client.host if http.client else "", settings.edge_key)

    def job_for(request: SpeechRequest, word_timestamps: bool, client: str = "") -> SpeechJob:
        try:
            return speech_job(request, word_timestamps, client, settings, voice_names, formats)
        except APIError as e:
            raise service.refused(e, formats[request.response_format].name) from None

    piper_routes(app, settings, service, formats, caller)

    @app.post(
        "/v1/audio/speech",
        response_class=StreamingResponse,
        responses={200: {"content": {f.media_type: {} for f in FORMATS.values()}}},
    )
    async def speech(request: SpeechRequest, http: Request):
        sse = request.stream_format == "sse"
        if request.word_timestamps and not sse:
            raise service.refused(
                bad_request(
                    "word_timestamps needs stream_format 'sse' (audio bytes have no room for "
                    "them), or POST /dev/captioned_speech",
                    param="word_timestamps",
                ),
                request.response_format,
            )
        job = job_for(request, request.word_timestamps, caller(http))
        return service.response(await service.open(job), sse=sse)

    @app.post("/dev/captioned_speech", response_model=None)
    async def captioned_speech(request: CaptionedSpeechRequest, http: Request):
        """Kokoro-FastAPI's captioned speech: base64 audio with ``timestamps`` of
        ``{word, start_time, end_time}`` (and where each word is in the input); with
        ``stream`` (its default) one such JSON object per line as the audio comes."""
        if request.return_download_link:
            raise service.refused(
                bad_request(
                    "return_download_link is not supported: the audio is in the response",
                    param="return_download_link",
                ),
                request.response_format,
            )
        speech = await service.open(job_for(request, request.return_timestamps, caller(http)))
        if request.stream:
            return service.captioned_lines(speech)
        return JSONResponse(await service.captioned(speech), headers=speech.headers)


def _middleware(app: FastAPI, settings: GatewaySettings) -> None:
    # Outermost last: CORS (a preflight needs no key), then the key and the content type,
    # then the body limit.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    origins = [o.strip() for o in settings.cors_origins.split(",") if o.strip()]
    app.add_middleware(Access, api_key=settings.api_key, origins=tuple(origins))
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
            expose_headers=["X-Sample-Rate", "X-Audio-Streaming", "Retry-After"],
        )
