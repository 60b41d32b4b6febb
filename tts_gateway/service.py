"""The speech service behind the router: admission, one deadline, encoding, metrics.

``SpeechService.open`` takes an in-flight slot (or refuses with 429), waits for the first
audio within the request's deadline, and returns a :class:`Speech` whose body encodes the
rest as it arrives. The slot is released exactly once on every path: refused, failed before
the first byte, finished, cut by an error, the deadline or a drain, and a client that goes
away before the body starts, during it, or during SSE (``SpeechResponse`` closes the speech
when the response ends, whether or not its body ever ran).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from fastapi.responses import StreamingResponse

from tts_client import protocol
from tts_client.errors import InvalidInput, ServerUnavailable, TTSError
from tts_wire import FRONT_TOKEN_HEADER, PRIORITY_LEVELS, SynthesisOptions

from .bodies import captioned_lines_body, marks_json, sse_body, word_json
from .drain import CUT, Drain, DrainCut, Slots, cut_message, next_chunk
from .encoding import AudioFormat, FormatEncoder
from .errors import APIError, from_tts_error, timeout
from .metrics import Metrics
from .settings import GatewaySettings

log = logging.getLogger("tts_gateway")


class SpeechBackend(Protocol):
    """What the gateway needs of Triton; :class:`tts_client.AsyncTTSClient` is one."""

    async def sample_rate(self) -> int: ...
    async def synthesize(self, text: str, *, options: SynthesisOptions): ...
    def stream(self, text: str, *, options: SynthesisOptions) -> AsyncIterator: ...
    async def is_ready(self) -> bool: ...
    async def close(self) -> None: ...


def piece_options(options: SynthesisOptions, later: bool) -> SynthesisOptions:
    """The options of one piece of a listener's text (Wyoming, sessions): a turn's first piece
    interactive (1), the rest bulk (PRIORITY_LEVELS), so every listener's first audio is made
    before the rest of anyone's text. The front door keeps the gateway's level; a light
    listener's rest goes at the interactive level, flagged later (a batch of first pieces is
    taken before it). A text asked as bulk stays bulk."""
    if options.priority == PRIORITY_LEVELS:
        return options
    return dataclasses.replace(options, priority=PRIORITY_LEVELS if later else 1)


def default_backend(settings: GatewaySettings) -> SpeechBackend:
    from tts_client import AsyncTTSClient

    # No retries here: an overloaded Triton is answered with 503 + Retry-After at once, and the
    # caller (the openai SDK retries 429/503) decides. The client's own timeout is a backstop.
    return AsyncTTSClient(
        settings.triton_url,
        timeout=settings.request_timeout_s + 5,
        retry=protocol.NO_RETRY,
        headers={FRONT_TOKEN_HEADER: settings.front_token} if settings.front_token else None,
    )


async def check_voices(backend: SpeechBackend, voices, wait_s: float = 60.0) -> None:
    """Refuse to start on a voice Triton does not serve (one short request per Triton voice),
    rather than answer every request for it with an error. Triton not reachable for ``wait_s``
    (the front door opens its ports after its warm-up): a warning, and /ready says so."""
    loop = asyncio.get_running_loop()
    until = loop.time() + wait_s
    served = {(v.model_voice, v.speaker) for v in voices if v.model_voice or v.speaker}
    for name, speaker in sorted(served, key=lambda pair: (pair[0] or "", pair[1] or "")):
        users = ", ".join(v.id for v in voices if (v.model_voice, v.speaker) == (name, speaker))
        options = SynthesisOptions(voice=name, speaker=speaker)
        which = f"Triton voice {name or 'default'!r}" + (f" speaker {speaker!r}" if speaker else "")
        try:
            while True:
                try:
                    await backend.synthesize("Ready.", options=options)
                    break
                except ServerUnavailable:
                    if loop.time() >= until:
                        raise
                    await asyncio.sleep(0.5)
        except InvalidInput as e:
            raise SystemExit(
                f"gateway: voice(s) {users} speak with {which}, which the server does not "
                f"serve ({e}); export it (make serve VOICES=...) or fix --voices-file"
            ) from None
        except TTSError as e:
            log.warning("gateway: could not check voice %r with Triton: %s", name, e)
            return


@dataclass(frozen=True)
class SpeechJob:
    """A validated speech request: what to say, how, and in which format."""

    text: str
    options: SynthesisOptions
    format: AudioFormat
    streamed: bool  # tts_stream (long text) rather than one tts request
    client: str = ""  # the caller's address, named to the front door (its caps per caller)


class AudioPiece(Protocol):
    """A piece of audio from the backend: ``tts_client``'s Audio or AudioChunk."""

    samples: np.ndarray
    words: tuple  # tts_client.Word, timed from the request's start; () unless asked
    marks: tuple  # tts_client.Mark: an SSML document's, timed the same way


class Speech:
    """One admitted request with its first audio in hand; ``body()`` encodes the rest."""

    def __init__(
        self,
        service: SpeechService,
        job: SpeechJob,
        release: Callable[[], None],
        chunks: AsyncIterator[AudioPiece],
        first: AudioPiece,
        rate: int,
        started: float,
    ) -> None:
        self.service = service
        self.job = job
        self._release = release
        self._chunks = chunks
        self._first = first
        self.rate = rate
        self.started = started
        # One `tts` request: the whole audio comes at once, so WAV and FLAC get real lengths.
        # A streamed FLAC is sent whole too: its header's sample count is written last, and
        # without it readers fail (libsndfile via soundfile: "array is too big").
        whole = not job.streamed or job.format.name == "flac"
        self.encoder = FormatEncoder(job.format, rate, whole=whole)
        self.samples = 0
        self.status = "cancelled"  # until the body says otherwise
        self._closed = False
        self._words: list = []  # timed words whose audio the body has encoded, not yet taken
        self._marks: list = []  # SSML marks the same way

    def take_words(self) -> list:
        """The words of the audio encoded since the last call (word timestamps asked for)."""
        words, self._words = self._words, []
        return words

    def take_marks(self) -> list:
        """The SSML marks the audio encoded since the last call reached."""
        marks, self._marks = self._marks, []
        return marks

    @property
    def headers(self) -> dict[str, str]:
        return {
            "X-Audio-Streaming": "true" if self.job.streamed else "false",
            "X-Sample-Rate": str(self.encoder.output_rate),  # what the bytes hold (Opus: 48 kHz)
        }

    @property
    def audio_seconds(self) -> float:
        return self.samples / self.rate

    async def body(self) -> AsyncIterator[bytes]:
        """Encoded bytes as audio arrives; an error after the first byte cuts the stream."""
        metrics = self.service.metrics
        first_sent = False
        try:
            pending: AudioPiece | None = self._first
            while pending is not None:
                self.samples += pending.samples.size
                data = await asyncio.to_thread(self.encoder.encode, pending.samples)
                self._words += pending.words
                self._marks += pending.marks
                if data:
                    if not first_sent:
                        first_sent = True
                        metrics.first_byte.observe(time.perf_counter() - self.started)
                    yield data
                # The request timeout is per piece of progress after the first audio (which
                # open() waited for): a long text is never cut for its length.
                limit = asyncio.get_running_loop().time() + self.service.settings.request_timeout_s
                try:
                    pending = await next_chunk(self._chunks, limit, self.service.drain)
                except StopAsyncIteration:
                    pending = None
            rest = await asyncio.to_thread(self.encoder.finish)
            if not first_sent:  # a whole response comes out of finish() only
                metrics.first_byte.observe(time.perf_counter() - self.started)
            self.status = "200"
            yield rest
        except BaseException as exc:
            self.status = "cancelled" if isinstance(exc, asyncio.CancelledError) else "stream_error"
            if isinstance(exc, CUT):
                log.warning(
                    "stream cut after %.2f s of audio: %s", self.audio_seconds, cut_message(exc)
                )
            raise
        finally:
            await self.close()

    async def close(self) -> None:
        """Give the slot back and count the request: once, whichever path ends it."""
        if self._closed:
            return
        self._closed = True
        self._release()
        self.encoder.close()
        await self._chunks.aclose()
        metrics = self.service.metrics
        metrics.requests.labels(self.status, self.job.format.name).inc()
        if self.status == "200":
            elapsed = time.perf_counter() - self.started
            metrics.audio_seconds.inc(self.audio_seconds)
            metrics.latency.observe(elapsed)
            if self.audio_seconds > 0:
                metrics.real_time_factor.observe(elapsed / self.audio_seconds)


class SpeechResponse(StreamingResponse):
    """A streaming response that closes its speech when it ends, even if its body never ran
    (a client gone before the first byte): the slot cannot leak."""

    def __init__(self, speech: Speech, content: AsyncIterator[bytes], media_type: str) -> None:
        super().__init__(content, media_type=media_type, headers=speech.headers)
        self.speech = speech

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.speech.close()


class SpeechService:
    """Owns the backend (Triton), the in-flight slots, deadlines, drain and metrics."""

    def __init__(
        self,
        settings: GatewaySettings,
        metrics: Metrics,
        backend_factory: Callable[[GatewaySettings], SpeechBackend] = default_backend,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.slots = Slots(settings.max_concurrent_requests, metrics)
        self.drain = Drain(settings.drain_s)
        self._factory = backend_factory
        self._backend: SpeechBackend | None = None

    @property
    def backend(self) -> SpeechBackend:
        if self._backend is None:
            raise RuntimeError("the speech service is not started (the app's lifespan starts it)")
        return self._backend

    async def start(self) -> None:
        self._backend = self._factory(self.settings)

    async def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            await backend.close()

    def refused(self, error: APIError, label: str) -> APIError:
        """Count a request refused before any audio, and return its error to raise."""
        self.metrics.requests.labels(str(error.status), label).inc()
        return error

    def _admit(self, job: SpeechJob) -> None:
        """Refuse ``job`` (429) when this gateway has no room for it. (Its caller's long-text
        requests are counted by the front door, with its gRPC streams: one count per caller.)"""
        settings = self.settings
        if self.slots.used >= self.slots.limit:
            raise self.refused(
                APIError(
                    429,
                    f"this gateway is answering {self.slots.limit} requests already; retry later",
                    type="rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after=settings.retry_after_s,
                ),
                job.format.name,
            )

    async def open(self, job: SpeechJob) -> Speech:
        """Admit ``job`` and wait for its first audio (within the request's deadline)."""
        started = time.perf_counter()
        settings = self.settings
        self._admit(job)
        release = self.slots.take()
        backend = self.backend
        # The first audio within the request timeout (on the loop's clock); then each next
        # piece within it of the one before (Speech.body).
        deadline = asyncio.get_running_loop().time() + settings.request_timeout_s

        async def audio() -> AsyncIterator[AudioPiece]:
            if job.streamed:
                async for chunk in backend.stream(job.text, options=job.options):
                    yield chunk
            else:  # (the client streams by itself if the text is too long for one request)
                yield await backend.synthesize(job.text, options=job.options)

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
            label = job.format.name
            if isinstance(exc, TTSError):
                raise self.refused(
                    from_tts_error(exc, settings.retry_after_s), job.format.name
                ) from None
            if isinstance(exc, asyncio.TimeoutError):
                raise self.refused(timeout(settings.request_timeout_s), label) from None
            if isinstance(exc, StopAsyncIteration):
                error = APIError(500, "no audio came back", "server_error")
                raise self.refused(error, label) from None
            raise
        self.metrics.characters.inc(len(job.text))
        return Speech(self, job, release, chunks, first, rate, started)

    def response(self, speech: Speech, sse: bool) -> SpeechResponse:
        """The HTTP response for ``speech``: raw audio bytes, or OpenAI's SSE events."""
        if sse:
            return SpeechResponse(speech, sse_body(speech), "text/event-stream")
        return SpeechResponse(speech, speech.body(), speech.job.format.media_type)

    def captioned_lines(self, speech: Speech) -> SpeechResponse:
        """Kokoro-FastAPI's streamed captioned speech: one JSON object per line, each with a
        piece of the encoded audio (base64) and the words whose audio it holds."""
        return SpeechResponse(speech, captioned_lines_body(speech), "application/x-ndjson")

    async def captioned(self, speech: Speech) -> dict:
        """Kokoro-FastAPI's captioned speech as one JSON body: the whole audio (base64) and
        every word's times. Nothing is sent before the end, so a failure is an error status."""
        parts = []
        try:
            async for data in speech.body():
                parts.append(data)
        except CUT as exc:
            if isinstance(exc, TTSError):
                raise from_tts_error(exc, self.settings.retry_after_s) from None
            raise APIError(503 if isinstance(exc, DrainCut) else 504, cut_message(exc)) from None
        finally:
            await speech.close()
        return {
            "audio": base64.b64encode(b"".join(parts)).decode(),
            "audio_format": speech.job.format.name,
            "timestamps": [word_json(w) for w in speech.take_words()],
            **marks_json(speech.take_marks()),
        }
