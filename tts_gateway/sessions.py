"""``/v1/audio/speech/stream``: voice-agent sessions over a WebSocket, in vLLM-Omni's protocol.

A client (an agent feeding an LLM's tokens) sends ``session.config``, then ``input.text``
pieces as they are written, then ``input.done``; the gateway answers each spoken piece with
``audio.start``, its audio as binary frames, ``audio.done``, and ends with ``session.done``
(the connection may then start another session). Ours on top: ``input.flush`` (speak what is
buffered now), ``input.cancel`` (barge-in: drop the buffered text and the queued pieces,
cancel their Triton requests, answered by ``input.cancelled``), ``session.close``, word
timestamps in ``audio.start``, a priority, and the buffering rule's numbers. Each piece is one
``tts`` request through :meth:`tts_client.AsyncTTSClient.session`, so every session is
batched with everyone else's in Triton. docs/sessions.md has the protocol and the limits.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Literal

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.websockets import WebSocketState

from tts_client.errors import ServerOverloaded, ServerUnavailable, TTSError
from tts_client.session import BufferRule, SpeechSession
from tts_wire import MAX_SPEED, MIN_SPEED, SynthesisOptions

from .bodies import word_json
from .encoding import encode_all, served_formats
from .service import SpeechService
from .settings import MODELS, GatewaySettings, known_model

log = logging.getLogger("tts_gateway")

PATH = "/v1/audio/speech/stream"
# Close codes (RFC 6455): normal, going away (drain), policy (a bad message or a limit), too
# big, internal error, try again later (capacity).
NORMAL, GOING_AWAY, POLICY, TOO_BIG, INTERNAL, TRY_LATER = 1000, 1001, 1008, 1009, 1011, 1013
CONFIG_TIMEOUT_S = 10.0  # for the first session.config of a connection
PCM_FRAME_S = 0.2  # stream_audio: one binary frame per this much audio
# vLLM-Omni's session.config fields for its own models (Qwen3-TTS and others): accepted so
# their clients run unchanged, and ignored; a Piper voice has no such knobs.
IGNORED = (
    "task_type",
    "language",
    "instructions",
    "max_new_tokens",
    "initial_codec_chunk_frames",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "speaker_embedding",
    "streaming_mode",
)


class SessionConfig(BaseModel):
    """``session.config``: vLLM-Omni's fields, and ours (``word_timestamps``, ``priority``,
    the buffering rule)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["session.config"]
    model: str | None = None
    voice: str | None = Field(None, description="a voice id or alias; default: the first")
    response_format: Literal["wav", "pcm", "mp3", "opus", "flac", "aac"] = "wav"
    speed: float = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    stream_audio: bool = Field(False, description="pcm in frames of 0.2 s, not one per piece")
    word_timestamps: bool = False
    priority: Literal[1, 2] | None = Field(None, description="1 interactive, 2 bulk")
    first_words: int = Field(BufferRule.first_words, ge=1, le=100)
    clause_words: int = Field(BufferRule.clause_words, ge=1, le=500)
    max_chars: int = Field(BufferRule.max_chars, ge=20, le=2000)

    @model_validator(mode="before")
    @classmethod
    def _drop_ignored(cls, data):
        return {k: v for k, v in data.items() if k not in IGNORED}


class SessionEnd(Exception):
    """Ends the connection: an ``error`` frame (when ``message``) and a close code."""

    def __init__(self, code: int, message: str = "", kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.code, self.message, self.kind = code, message, kind


def _tts_end(error: TTSError) -> SessionEnd:
    if isinstance(error, ServerOverloaded):
        return SessionEnd(TRY_LATER, f"the speech server is at capacity ({error})", "overloaded")
    if isinstance(error, ServerUnavailable):
        return SessionEnd(TRY_LATER, f"the speech server is unavailable ({error})", "unavailable")
    return SessionEnd(INTERNAL, f"synthesis failed: {error}", "synthesis_failed")


class Sessions:
    """Every WebSocket session of this gateway: the limits, and one :class:`Connection` each."""

    def __init__(self, settings: GatewaySettings, service: SpeechService) -> None:
        self.settings = settings
        self.service = service
        self.open = 0
        self.voices = settings.voice_names()
        self.formats = served_formats(settings.pcm_sample_rate)

    def refusal(self) -> SessionEnd | None:
        """Why a new connection is refused at once, if it is."""
        if self.service.drain.cut_at is not None:
            return SessionEnd(TRY_LATER, "the gateway is shutting down; reconnect", "draining")
        if self.open >= self.settings.max_sessions:
            return SessionEnd(
                TRY_LATER,
                f"this gateway holds {self.settings.max_sessions} sessions already; retry later",
                "rate_limit_exceeded",
            )
        return None

    async def serve(self, websocket: WebSocket) -> None:
        await websocket.accept()
        refused = self.refusal()
        connection = Connection(self, websocket)
        if refused is not None:
            return await connection.end(refused)
        self.open += 1
        self.service.metrics.sessions.inc()
        try:
            await connection.run()
        finally:
            self.open -= 1
            self.service.metrics.sessions.dec()

    def options(self, config: SessionConfig) -> tuple[SynthesisOptions, BufferRule]:
        """The synthesis options and buffering rule of ``config``; SessionEnd if invalid."""
        if config.model is not None and not known_model(config.model):
            raise SessionEnd(POLICY, f"unknown model {config.model!r}; models: {', '.join(MODELS)}")
        name = config.voice or self.settings.voices[0].id
        voice = self.voices.get(name)
        if voice is None:
            raise SessionEnd(POLICY, f"unknown voice {name!r}; voices: {', '.join(self.voices)}")
        if config.stream_audio and config.response_format != "pcm":
            raise SessionEnd(POLICY, "stream_audio needs response_format 'pcm'")
        try:
            options = voice.options(
                config.speed, priority=config.priority, word_timestamps=config.word_timestamps
            )
        except ValueError as e:
            raise SessionEnd(POLICY, f"session.config: {e}") from None
        rule = BufferRule(config.first_words, config.clause_words, config.max_chars)
        return options, rule


class Connection:
    """One WebSocket: sessions one after another, each a reader and a writer task."""

    def __init__(self, sessions: Sessions, websocket: WebSocket) -> None:
        self.sessions = sessions
        self.settings = sessions.settings
        self.ws = websocket
        self.lock = asyncio.Lock()  # one frame at a time, and cancel's frames in order
        self.open_piece: list[int] | None = None  # [index, bytes] between start and done
        self.sending = False  # the writer has a piece in hand (a slow reader may hold it)
        self.started = time.monotonic()

    async def run(self) -> None:
        first = True
        try:
            while True:
                config = await self._config(first)
                if config is None:
                    return await self.end(SessionEnd(NORMAL))
                first = False
                options, rule = self.sessions.options(config)
                backend = self.sessions.service.backend
                async with backend.session(options, rule=rule) as session:
                    if not await self._session(session, config):
                        return await self.end(SessionEnd(NORMAL))
        except SessionEnd as end:
            await self.end(end)
        except WebSocketDisconnect:
            pass  # the client went away: the session's close cancelled its requests
        except Exception:
            log.exception("session failed")  # the trace stays in the log, not in the frame
            await self.end(SessionEnd(INTERNAL, "internal error", "internal"))

    async def end(self, end: SessionEnd) -> None:
        if self.ws.client_state != WebSocketState.CONNECTED:
            return
        try:
            if end.message:
                await self._json({"type": "error", "message": end.message, "code": end.kind})
            # (a close reason holds at most 123 bytes of UTF-8; the error frame has it all)
            await self.ws.close(end.code, end.message.encode()[:120].decode(errors="ignore"))
        except (WebSocketDisconnect, RuntimeError):
            pass  # gone meanwhile

    async def _json(self, payload: dict) -> None:
        await self.ws.send_text(json.dumps(payload))

    async def _message(self, timeout: float | None) -> dict | None:
        """The next client message as a dict; None at ``session.close``; SessionEnd on a bad
        one or after ``timeout`` without one."""
        try:
            message = await asyncio.wait_for(self.ws.receive(), timeout)
        except asyncio.TimeoutError:
            raise SessionEnd(
                POLICY, f"no message for {timeout:g} s; the session is closed", "idle_timeout"
            ) from None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        raw = message.get("text")
        if raw is None:
            raise SessionEnd(POLICY, "send JSON text messages; binary messages are not taken")
        if len(raw) > self.settings.session_max_message_chars:
            raise SessionEnd(
                TOO_BIG,
                f"a message is over {self.settings.session_max_message_chars} characters; "
                "send text in smaller pieces",
                "message_too_large",
            )
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise SessionEnd(POLICY, f"a message is not valid JSON ({e.msg})") from None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            raise SessionEnd(POLICY, "each message must be a JSON object with a 'type'")
        return None if data["type"] == "session.close" else data

    async def _config(self, first: bool) -> SessionConfig | None:
        timeout = CONFIG_TIMEOUT_S if first else self.settings.session_idle_s
        data = await self._message(timeout)
        if data is None:
            return None
        if data["type"] != "session.config":
            raise SessionEnd(POLICY, f"expected session.config first, got {data['type']!r}")
        try:
            return SessionConfig(**data)
        except ValidationError as e:
            problem = e.errors()[0]
            where = ".".join(str(p) for p in problem.get("loc", ())) or "session.config"
            raise SessionEnd(POLICY, f"session.config: {where}: {problem['msg']}") from None

    async def _session(self, session: SpeechSession, config: SessionConfig) -> bool:
        """One session to its end; False when the connection closes with it."""
        writer = asyncio.ensure_future(self._write(session, config))
        reader = asyncio.ensure_future(self._read(session))
        try:
            done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done and reader.exception() is None:
                return False  # session.close (the reader ends otherwise only by an error)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()
            await writer
            return True
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    def _limit_left(self) -> float:
        return self.started + self.settings.session_max_s - time.monotonic()

    async def _read(self, session: SpeechSession) -> None:
        """Client messages until session.close (returns) or an error (raises); otherwise the
        writer ends the session."""
        received = 0
        done = False
        while True:
            left = self._limit_left()
            if left <= 0:
                raise SessionEnd(
                    POLICY,
                    f"the session reached its limit of {self.settings.session_max_s:g} s",
                    "session_too_long",
                )
            wait = min(left, self.settings.session_idle_s)
            try:
                data = await self._message(wait)
            except SessionEnd as end:
                if end.kind != "idle_timeout":
                    raise
                if left <= wait or done or session.busy or self.sending:
                    continue  # the length limit (above), or audio still being made or sent
                raise
            if data is None:
                return
            kind = data["type"]
            if kind == "input.text":
                text = data.get("text")
                if not isinstance(text, str):
                    raise SessionEnd(POLICY, "input.text needs a 'text' string")
                if done:
                    raise SessionEnd(POLICY, "input.text after input.done; start a new session")
                received += len(text)
                if received > self.settings.session_max_chars:
                    raise SessionEnd(
                        POLICY,
                        f"the session's text is over {self.settings.session_max_chars} "
                        "characters; start a new session",
                        "session_too_long",
                    )
                await session.send(text)
            elif kind == "input.flush" and not done:
                await session.flush()
            elif kind == "input.done" and not done:
                done = True
                await session.done()
            elif kind == "input.cancel":
                await self._cancel(session)
            else:
                raise SessionEnd(
                    POLICY,
                    f"unexpected message {kind!r}"
                    + (" after input.done" if done else "")
                    + "; expected input.text, input.flush, input.done, input.cancel or "
                    "session.close",
                )

    async def _cancel(self, session: SpeechSession) -> None:
        """Barge-in: no audio of what was said before is sent after ``input.cancelled``."""
        async with self.lock:
            dropped = await session.cancel()
            if self.open_piece is not None:  # cut the piece being sent
                index, sent = self.open_piece
                self.open_piece = None
                await self._json(
                    {"type": "audio.done", "sentence_index": index, "total_bytes": sent,
                     "error": False, "cancelled": True}
                )  # fmt: skip
            await self._json({"type": "input.cancelled", "dropped_sentences": dropped})

    async def _write(self, session: SpeechSession, config: SessionConfig) -> None:
        fmt = self.sessions.formats[config.response_format]
        pieces = 0
        while True:
            self.sending = False
            try:
                chunk = await anext(session)
            except StopAsyncIteration:
                break
            except TTSError as e:
                raise _tts_end(e) from None
            turn = session.turn  # (no await since anext: the turn the chunk belongs to)
            self.sending = True
            data = await asyncio.to_thread(encode_all, chunk.samples, fmt, chunk.sample_rate, True)
            rate = fmt.sample_rate or chunk.sample_rate
            step = int(rate * PCM_FRAME_S) * 2 if config.stream_audio else len(data) or 1
            frames = [data[k : k + step] for k in range(0, len(data), step)]
            start = {
                "type": "audio.start",
                "sentence_index": chunk.index,
                "sentence_text": chunk.text,
                "format": fmt.name,
                "sample_rate": rate,
            }
            if config.word_timestamps:
                start["words"] = [word_json(w) for w in chunk.words]
            async with self.lock:
                if session.turn != turn:
                    continue
                await self._json(start)
                self.open_piece = [chunk.index, 0]
            for frame in frames:
                async with self.lock:
                    if session.turn != turn:
                        break
                    await self.ws.send_bytes(frame)
                    self.open_piece[1] += len(frame)
            async with self.lock:
                if session.turn == turn and self.open_piece is not None:
                    await self._json(
                        {"type": "audio.done", "sentence_index": chunk.index,
                         "total_bytes": self.open_piece[1], "error": False}
                    )  # fmt: skip
                    self.open_piece = None
                    pieces += 1
        async with self.lock:
            await self._json({"type": "session.done", "total_sentences": pieces})


def add_routes(app: FastAPI, settings: GatewaySettings, service: SpeechService) -> None:
    sessions = Sessions(settings, service)

    @app.websocket(PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        """Voice-agent sessions: docs/sessions.md."""
        await sessions.serve(websocket)
