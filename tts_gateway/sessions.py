"""``/v1/audio/speech/stream``: voice-agent sessions over a WebSocket, in vLLM-Omni's protocol.

A client (an agent feeding an LLM's tokens) sends ``session.config``, then ``input.text``
pieces as they are written, then ``input.done``; the gateway answers each spoken piece with
``audio.start``, its audio as binary frames, ``audio.done``, and ends the utterance with
``session.done``. The connection stays open: the config is kept for the next utterance
(more ``input.text``), and another ``session.config`` between utterances replaces it. Ours on
top: ``input.flush`` (speak what is buffered now), ``input.cancel`` (barge-in: drop the
buffered text and the queued pieces, cancel their Triton requests, answered by
``input.cancelled``), ``session.close``, word timestamps in ``audio.start``, a priority, and
the buffering rule's numbers. Each piece is one ``tts`` request through
:meth:`tts_client.AsyncTTSClient.session`, so every session is batched with everyone else's
in Triton. docs/sessions.md has the protocol and the limits.

One task reads the socket for the whole connection and every message it reads is handled, in
order: a message for the next utterance waits until the current one has sent its
``session.done`` (a reader per utterance, cancelled at its end, could take the next message
off the socket and lose it).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import time
from asyncio import FIRST_COMPLETED
from dataclasses import dataclass
from typing import Literal

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.websockets import WebSocketState

from tts_client.errors import LimitReached, ServerOverloaded, ServerUnavailable, TTSError
from tts_client.session import BufferRule, SpeechSession
from tts_wire import MAX_SPEED, MIN_SPEED, SynthesisOptions, edge_client
from tts_wire.caps import PerClient

from .bodies import word_json
from .encoding import encode_all, served_formats
from .service import SpeechService, piece_options
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
    "non_streaming_mode",
    "seed",
)
# vLLM-Omni's split_granularity as a buffering rule: "none" speaks only at input.done (or a
# flush), "sentence" at sentence ends, "clause" at every clause boundary too. Without it, our
# rule (an early first clause, then sentences).
NEVER = 10**9
# A session's first piece of a turn ends after this many words where no clause ends sooner
# (BufferRule.first_piece_words): 6 got every agent's first audio before the same sentence
# POSTed whole, with no more gaps than those POSTs at 16 agents starting together; 4 (what
# Wyoming uses) came sooner still but left twice as many agents with a gap
# (docs/sessions.md, "Measured").
SESSION_FIRST_PIECE_WORDS = 6
GRANULARITY = {
    "none": {"cut": False},
    "sentence": {"first_words": NEVER, "clause_words": NEVER},
    "clause": {"first_words": 1, "clause_words": 1},
}


class SessionConfig(BaseModel):
    """``session.config``: vLLM-Omni's fields, and ours (``word_timestamps``, ``priority``,
    the buffering rule)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["session.config"]
    model: str | None = None
    voice: str | None = Field(None, description="a voice id or alias (or `speaker`)")
    response_format: Literal["wav", "pcm", "mp3", "opus", "flac", "aac"] = "wav"
    speed: float | None = Field(1.0, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    split_granularity: Literal["none", "sentence", "clause"] | None = None
    stream_audio: bool = Field(False, description="pcm in frames of 0.2 s, not one per piece")
    word_timestamps: bool = False
    priority: Literal[1, 2] | None = Field(None, description="1 interactive, 2 bulk")
    first_words: int = Field(BufferRule.first_words, ge=1, le=100)
    clause_words: int = Field(BufferRule.clause_words, ge=1, le=500)
    max_chars: int = Field(BufferRule.max_chars, ge=20, le=2000)
    first_piece_words: int = Field(SESSION_FIRST_PIECE_WORDS, ge=0, le=100)

    @model_validator(mode="before")
    @classmethod
    def _drop_ignored(cls, data):
        data = {k: v for k, v in data.items() if k not in IGNORED}
        if "speaker" in data:  # vLLM-Omni's newer clients name the voice so
            speaker = data.pop("speaker")
            if data.setdefault("voice", speaker) != speaker:
                raise ValueError("voice and speaker name different voices; give one")
        return data

    def rule(self) -> BufferRule:
        """When this session's buffered text is spoken."""
        if self.split_granularity is None:
            return BufferRule(
                self.first_words,
                self.clause_words,
                self.max_chars,
                first_piece_words=self.first_piece_words,
            )
        ours = {"first_words", "clause_words", "first_piece_words"} & self.model_fields_set
        if ours:
            raise ValueError(f"give split_granularity or {' and '.join(sorted(ours))}, not both")
        return BufferRule(max_chars=self.max_chars, **GRANULARITY[self.split_granularity])


class SessionEnd(Exception):
    """Ends the connection: an ``error`` frame (when ``message``) and a close code."""

    def __init__(self, code: int, message: str = "", kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.code, self.message, self.kind = code, message, kind


def _tts_end(error: TTSError) -> SessionEnd:
    if isinstance(error, LimitReached):
        return SessionEnd(TRY_LATER, str(error), "rate_limit_exceeded")
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
        # Connections with sessions per address.
        self.by_client = PerClient(settings.max_sessions_per_client)
        self.voices = settings.voice_names()
        self.formats = served_formats(settings.pcm_sample_rate)

    def refusal(self, client: str) -> SessionEnd | None:
        """Why a new connection from ``client`` is refused at once, if it is."""
        if self.service.drain.cut_at is not None:
            return SessionEnd(TRY_LATER, "the gateway is shutting down; reconnect", "draining")
        if self.open >= self.settings.max_sessions:
            return SessionEnd(
                TRY_LATER,
                f"this gateway holds {self.settings.max_sessions} sessions already; retry later",
                "rate_limit_exceeded",
            )
        if self.by_client.full(client):
            return SessionEnd(
                TRY_LATER,
                f"your address holds {self.settings.max_sessions_per_client} sessions already "
                "(--max-sessions-per-client); close one or retry later",
                "rate_limit_exceeded",
            )
        return None

    async def serve(self, websocket: WebSocket) -> None:
        await websocket.accept()
        peer = websocket.client.host if websocket.client else ""
        client = edge_client(websocket.headers, peer, self.settings.edge_key)
        refused = self.refusal(client)
        connection = Connection(self, websocket, client)
        if refused is not None:
            return await connection.end(refused)
        self.open += 1
        self.service.metrics.sessions.inc()
        try:
            with self.by_client.holding(client):
                await connection.run()
        finally:
            self.open -= 1
            self.service.metrics.sessions.dec()

    def options(
        self, config: SessionConfig, client: str = "", listener: str | None = None
    ) -> tuple[SynthesisOptions, BufferRule]:
        """The synthesis options (sent for ``client``'s ``listener``) and buffering rule of
        ``config``; SessionEnd if invalid."""
        if config.model is not None and not known_model(config.model):
            raise SessionEnd(POLICY, f"unknown model {config.model!r}; models: {', '.join(MODELS)}")
        name = config.voice or self.settings.voices[0].id
        voice = self.voices.get(name)
        if voice is None:
            raise SessionEnd(POLICY, f"unknown voice {name!r}; voices: {', '.join(self.voices)}")
        if config.stream_audio and config.response_format != "pcm":
            raise SessionEnd(POLICY, "stream_audio needs response_format 'pcm'")
        speed = 1.0 if config.speed is None else config.speed
        try:
            options = voice.options(
                speed,
                priority=config.priority,
                word_timestamps=config.word_timestamps,
                caller=client or None,
                listener=listener,
            )
            rule = config.rule()
        except ValueError as e:
            raise SessionEnd(POLICY, f"session.config: {e}") from None
        return options, rule


@dataclass
class Utterance:
    """The text between one ``session.config`` (or ``session.done``) and the next
    ``session.done``: a session of the client library and the task that sends its audio."""

    index: int
    session: SpeechSession
    writer: asyncio.Task
    received: int = 0  # characters of input.text
    done: bool = False  # input.done was read


_CONNECTIONS = itertools.count(1)


class Connection:
    """One WebSocket: utterances one after another, read by one reader, each with a writer."""

    def __init__(self, sessions: Sessions, websocket: WebSocket, client: str = "") -> None:
        self.sessions = sessions
        self.client = client  # its address: the front door queues its requests as its own
        self.listener = f"session-{next(_CONNECTIONS)}"  # each WebSocket is one listener
        self.settings = sessions.settings
        self.ws = websocket
        self.lock = asyncio.Lock()  # one frame at a time, and cancel's frames in order
        self.open_piece: list[int] | None = None  # [index, bytes] between start and done
        self.sending = False  # the writer has a piece in hand (a slow reader may hold it)
        self.started = time.monotonic()
        self.receiving: asyncio.Task | None = None  # the one receive() of the socket
        self.config: SessionConfig | None = None  # kept across utterances
        self.made: tuple[SynthesisOptions, BufferRule] | None = None  # the config's, checked
        self.utterance: Utterance | None = None
        self.utterances = 0

    async def run(self) -> None:
        try:
            await self._serve()
        except SessionEnd as end:
            await self.end(end)
        except WebSocketDisconnect:
            pass  # the client went away: the session's close cancelled its requests
        except Exception:
            log.exception("session failed")  # the trace stays in the log, not in the frame
            await self.end(SessionEnd(INTERNAL, "internal error", "internal"))
        finally:
            await self._drop_utterance()
            if self.receiving is not None:
                self.receiving.cancel()
                await asyncio.gather(self.receiving, return_exceptions=True)

    async def _serve(self) -> None:
        while True:
            data = await self._next_message()
            if data is None:  # session.close
                return await self.end(SessionEnd(NORMAL))
            kind = data["type"]
            if self.utterance is not None and self.utterance.done and kind != "input.cancel":
                await self._finish()  # this message is the next utterance's
            if kind == "session.config":
                if self.utterance is not None:
                    raise SessionEnd(
                        POLICY,
                        "session.config while an utterance is in progress; send input.done first",
                    )
                self.config = self._parse_config(data)
                # A bad voice: now.
                self.made = self.sessions.options(self.config, self.client, self.listener)
                continue
            if self.config is None:
                raise SessionEnd(POLICY, f"expected session.config first, got {kind!r}")
            if self.utterance is None:
                self._begin()
            await self._handle(self.utterance, data)

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

    def _limit_left(self) -> float:
        return self.started + self.settings.session_max_s - time.monotonic()

    async def _next_message(self) -> dict | None:
        """The next client message; None at ``session.close``. Meanwhile the utterance's
        writer may end it (its error raises). SessionEnd on a bad message, at the connection's
        time limit, or when silent past the idle limit with nothing being said."""
        while True:
            left = self._limit_left()
            if left <= 0:
                raise SessionEnd(
                    POLICY,
                    f"the session reached its limit of {self.settings.session_max_s:g} s",
                    "session_too_long",
                )
            idle = CONFIG_TIMEOUT_S if self.config is None else self.settings.session_idle_s
            wait = min(left, idle)
            if self.receiving is None:
                self.receiving = asyncio.ensure_future(self.ws.receive())
            waiting = {self.receiving}
            writer = self.utterance.writer if self.utterance is not None else None
            if writer is not None:
                waiting.add(writer)
            done, _ = await asyncio.wait(waiting, timeout=wait, return_when=FIRST_COMPLETED)
            if self.receiving in done:
                message, self.receiving = self.receiving.result(), None
                return self._parse(message)
            if writer is not None and writer in done:
                await self._finish()
                continue
            busy = self.utterance is not None and (
                self.utterance.done or self.utterance.session.busy or self.sending
            )
            if left <= wait or busy:
                continue  # the length limit (above), or audio still being made or sent
            raise SessionEnd(
                POLICY, f"no message for {wait:g} s; the session is closed", "idle_timeout"
            )

    def _parse(self, message: dict) -> dict | None:
        """A received message as a dict; None for ``session.close``; SessionEnd if bad."""
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

    def _parse_config(self, data: dict) -> SessionConfig:
        try:
            config = SessionConfig(**data)
        except ValidationError as e:
            problem = e.errors()[0]
            where = ".".join(str(p) for p in problem.get("loc", ())) or "session.config"
            raise SessionEnd(POLICY, f"session.config: {where}: {problem['msg']}") from None
        return config

    def _begin(self) -> None:
        assert self.config is not None and self.made is not None
        options, rule = self.made
        service = self.sessions.service

        synthesize = service.backend.synthesize
        # A turn's first piece interactive, its later ones asked at bulk, as Wyoming's.
        session = SpeechSession(
            functools.partial(synthesize, options=piece_options(options, later=False)),
            rule,
            later=functools.partial(synthesize, options=piece_options(options, later=True)),
        )
        writer = asyncio.ensure_future(self._write(session, self.config, self.utterances))
        self.utterance = Utterance(self.utterances, session, writer)
        self.utterances += 1

    async def _finish(self) -> None:
        """The utterance's writer to its end (its session.done sent, or its error raised)."""
        utterance = self.utterance
        assert utterance is not None
        try:
            await utterance.writer
        finally:
            await self._drop_utterance()

    async def _drop_utterance(self) -> None:
        utterance, self.utterance = self.utterance, None
        if utterance is not None:
            utterance.writer.cancel()
            await asyncio.gather(utterance.writer, return_exceptions=True)
            await utterance.session.close()

    async def _handle(self, utterance: Utterance, data: dict) -> None:
        session, kind = utterance.session, data["type"]
        if kind == "input.text":
            text = data.get("text")
            if not isinstance(text, str):
                raise SessionEnd(POLICY, "input.text needs a 'text' string")
            utterance.received += len(text)
            if utterance.received > self.settings.session_max_chars:
                raise SessionEnd(
                    POLICY,
                    f"the session's text is over {self.settings.session_max_chars} "
                    "characters; start a new session",
                    "session_too_long",
                )
            await session.send(text)
        elif kind == "input.flush":
            await session.flush()
        elif kind == "input.done":
            utterance.done = True
            await session.done()
        elif kind == "input.cancel":
            await self._cancel(utterance)
        else:
            raise SessionEnd(
                POLICY,
                f"unexpected message {kind!r}; expected session.config, input.text, "
                "input.flush, input.done, input.cancel or session.close",
            )

    async def _cancel(self, utterance: Utterance) -> None:
        """Barge-in: no audio of what was said before is sent after ``input.cancelled``."""
        async with self.lock:
            dropped = await utterance.session.cancel()
            if self.open_piece is not None:  # cut the piece being sent
                index, sent = self.open_piece
                self.open_piece = None
                await self._json(
                    {"type": "audio.done", "utterance_index": utterance.index,
                     "sentence_index": index, "total_bytes": sent, "error": False,
                     "cancelled": True}
                )  # fmt: skip
            await self._json({"type": "input.cancelled", "dropped_sentences": dropped})

    async def _write(self, session: SpeechSession, config: SessionConfig, utterance: int) -> None:
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
                "utterance_index": utterance,
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
                        {"type": "audio.done", "utterance_index": utterance,
                         "sentence_index": chunk.index, "total_bytes": self.open_piece[1],
                         "error": False}
                    )  # fmt: skip
                    self.open_piece = None
                    pieces += 1
        self.sending = False
        async with self.lock:
            await self._json(
                {"type": "session.done", "utterance_index": utterance, "total_sentences": pieces}
            )


def add_routes(app: FastAPI, settings: GatewaySettings, service: SpeechService) -> None:
    sessions = Sessions(settings, service)

    @app.websocket(PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        """Voice-agent sessions: docs/sessions.md."""
        await sessions.serve(websocket)
