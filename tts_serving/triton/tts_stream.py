"""The tts_stream model: long text -> ordered audio chunks over a decoupled (streaming) response.

The text is planned into chunks lazily (normalized and phonemized here, once); each chunk's
ids go to ``acoustic`` and its latent to ``vocoder`` with async BLS calls, so the dynamic
batchers batch them with every other user's requests. The stream's first chunk is decoded in
windows (``tts_serving.stream.windows``): its first audio leaves after a short window, the
sentence whole. ``tts_serving.stream.scheduler`` keeps the order, the in-flight window,
cancellation and errors; this module wires it to pb_utils.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import (
    AUDIO,
    BULK_PARAMETER,
    CANCELLED,
    CHUNK_TEXT,
    INTERNAL,
    INVALID_ARGUMENT,
    LATENT,
    LATENT_CHECK,
    LATER_PARAMETER,
    MARK_SPANS,
    MARKS,
    PHONEME_IDS,
    SPEAKER,
    SPEED,
    STREAM_FIRST_PARAMETER,
    TEXT,
    UNAVAILABLE,
    VOICE,
    WORD_SPANS,
    WORDS,
    SynthesisOptions,
    is_short_text,
    stream_error_message,
)
from tts_wire.tensors import ACOUSTIC, MODEL_IO, VOCODER, options_of

from ..errors import InvalidInputError, ModelConfigError
from ..inputs import CleanText, sent_rows, validate_rate
from ..settings import StreamSettings
from ..stream.plan import PlannedChunk, finish_chunk, plan_chunks, plan_document
from ..stream.scheduler import InFlight, Parts, StageError, StreamResponse, run_stream
from ..stream.windows import REACH_FILE, REACH_MARGIN, kept, read_reach, rows_in, windows
from ..text.front_end import TextFrontEnd
from .adapter import ModelContext, flags, latent_check, one_value, request_options

SHUTTING_DOWN = "Server not ready"  # Triton's answer to a request during shutdown


def stage_error(model: str, error) -> Exception:
    """The exception for a BLS call's error response: bad input, a full queue, or a failure."""
    message = error.message()
    if error.code() == pb_utils.TritonError.INVALID_ARG:
        return InvalidInputError(message)
    if error.code() == pb_utils.TritonError.UNAVAILABLE:
        return StageError(UNAVAILABLE, f"{model}: {message}")
    if SHUTTING_DOWN in message:
        # After SIGTERM Triton 2.51 refuses new requests, a stream's own BLS calls included;
        # the stream cannot finish here: say so with a code a client retries elsewhere.
        return StageError(UNAVAILABLE, "the server is shutting down; retry on another instance")
    return RuntimeError(f"{model} failed: {message}")


FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# A stage call's rank (tts_serving/triton/adapter.py: rank): ahead of everyone's first
# pieces; interactive, behind them (as a text's later pieces); bulk.
AHEAD, LATER, BULK = "ahead", "later", "bulk"
RANK_PARAMETERS = {
    AHEAD: {STREAM_FIRST_PARAMETER: True},
    LATER: {LATER_PARAMETER: True},
    BULK: {BULK_PARAMETER: True},
}
FINALIZE_WAIT_S = 20.0  # inside Triton's default 30 s exit timeout, so unloading ends


@dataclass(frozen=True)
class ChunkAudio:
    """What one chunk's stage calls gave: its samples and (asked for; else None) its words' rows
    (start s, end s, first char, end char), timed from the chunk's own start."""

    samples: np.ndarray
    words: np.ndarray | None
    marks: np.ndarray | None = None  # SSML <mark>s reached: rows (time s, character)


@dataclass(frozen=True)
class ChunkWindows:
    """What each window of a chunk's latent is decoded with (TtsStream.window)."""

    latent: np.ndarray  # [1, 192, frames]
    vocoder: list  # the option tensors of the chunk's vocoder calls
    voice: str
    words: np.ndarray | None  # the chunk's rows, timed from its start (asked for; else None)
    marks: np.ndarray | None


def first_rank(request) -> str:
    """The rank of a stream's first audio: the level the front door sent it at (BULK, or
    LATER: a short text's stream admitted as `tts` is), else AHEAD."""
    bulk, later = flags(request, BULK_PARAMETER, LATER_PARAMETER)
    return BULK if bulk else LATER if later else AHEAD


# The stages each chunk goes through here (tts_stream phonemizes itself).
STAGES = (ACOUSTIC, VOCODER)


def forwarded(request, stage: str) -> dict[str, np.ndarray]:
    """The options of ``request`` that ``stage`` takes (tts_wire.tensors), as sent, [1, 1]."""
    values = {}
    for option in options_of(stage):
        tensor = pb_utils.get_input_tensor_by_name(request, option.name)
        if tensor is not None:
            # A copy: the request's own memory is the backend's, the stream outlives reads.
            values[option.name] = tensor.as_numpy().reshape(1, 1).copy()
    return values


@dataclass(frozen=True)
class StreamRequest:
    """One stream's plan and what every chunk's stage calls carry besides its ids."""

    plan: Iterator[PlannedChunk]
    options: SynthesisOptions  # read and checked once (adapter.request_options)
    voice: str  # the stream's voice (the default one when none was asked)
    forwarded: dict[str, dict[str, np.ndarray]]  # by stage: the options it takes, as sent
    clean: CleanText  # maps word spans back to the text as sent
    # The rank of its first audio (the first chunk's acoustic call and first window): AHEAD,
    # or the level the front door sent it at (a short text's stream is admitted as `tts` is:
    # a heavy client's at BULK, a text's later sentence as LATER).
    first: str = AHEAD
    _made: dict[tuple[str, str, float, int], list] = field(default_factory=dict)

    def inputs(self, chunk: PlannedChunk, stage: str) -> list:
        """The option tensors of ``chunk``'s call to ``stage``: the ones sent, the voice its
        own (an SSML segment's, else the stream's; the speaker only for the stream's voice) and
        the speed times its segment's rate, its segment's speaker; made once per stage, voice,
        rate and speaker."""
        key = (stage, chunk.voice or self.voice, chunk.rate, chunk.speaker)
        if key not in self._made:
            values = dict(self.forwarded[stage])
            takes = {o.name for o in options_of(stage)}
            if VOICE in takes:
                values[VOICE] = np.array([[key[1].encode()]], dtype=np.object_)
            if key[1] != self.voice:  # another voice's span (SSML <voice>): its first speaker
                values.pop(SPEAKER, None)
            if SPEAKER in takes and chunk.speaker >= 0:  # <voice name="voice:speaker">
                values[SPEAKER] = np.array([[str(chunk.speaker).encode()]], dtype=np.object_)
            if SPEED in takes and chunk.rate != 1.0:
                values[SPEED] = np.array([[self.options.speed * chunk.rate]], np.float32)
            self._made[key] = [pb_utils.Tensor(k, v) for k, v in values.items()]
        return self._made[key]


class TtsStream:
    """``TritonPythonModel`` of ``model_repository/tts_stream`` (its model.py subclasses it)."""

    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, StreamSettings)
        self.ctx.require_io(MODEL_IO["tts_stream"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.ctx.config):
            raise ModelConfigError("tts_stream needs model_transaction_policy { decoupled: true }")
        self.settings = self.ctx.settings
        self.logger = pb_utils.Logger
        self.text = TextFrontEnd(
            self.ctx.voices(), self.ctx.version_dir, self.settings, self.logger
        )
        self.voices = self.text.voices
        rates = {p.config.sample_rate for _, p in self.voices}
        if len(rates) != 1:
            raise ModelConfigError(f"every voice must share one sample rate, got {sorted(rates)}")
        self.sample_rate = rates.pop()
        # Each voice's vocoder: samples per latent frame, and the context its windows need.
        self.hop_length = {name: p.config.hop_length for name, p in self.voices}
        self.context = {}
        for voice in self.ctx.voices():
            reach = read_reach(voice.file(REACH_FILE))
            self.context[voice.name] = reach + REACH_MARGIN
        self.in_flight = InFlight()
        self.long_streams = 0  # of them, long texts' (max_streams bounds these)
        # pb_utils.TritonError exists only once the stub is up, not at import.
        self.codes = {
            INVALID_ARGUMENT: pb_utils.TritonError.INVALID_ARG,
            UNAVAILABLE: pb_utils.TritonError.UNAVAILABLE,
            CANCELLED: pb_utils.TritonError.CANCELLED,
            INTERNAL: pb_utils.TritonError.INTERNAL,
        }
        self.logger.log_info(
            f"tts_stream ready: voices {', '.join(self.voices.names)}; {self.settings}"
        )

    async def execute(self, requests):
        # Decoupled + async: each stream runs concurrently with the others on the stub's loop.
        await asyncio.gather(*(self.stream(r) for r in requests))
        return None

    def parse(self, request, raw: bytes | None = None) -> StreamRequest:
        """``request`` read and checked; ``raw``: its text when already read."""
        if raw is None:
            raw = one_value(request, TEXT, batched=False)
        if raw is None:
            raise InvalidInputError("input 'text' is missing")
        received = self.text.received(raw)
        # The same options object as the client's and the gateway's, checked once here
        # against the wire contract's ranges; absent noise: acoustic uses the voice's.
        options = request_options(request, "tts_stream")
        voice, phonemizer = self.voices.pick(options.voice)
        self.voices.speaker(voice, options.speaker)  # refused before the first chunk
        if not received.is_ssml:
            phonemizer.check_script(received.clean.text)  # no chunk of it is skipped for it
            reader = self.text.reader(voice, options.normalize)
            plan = plan_chunks(received.clean.text, self.settings, reader, options.word_timestamps)
        else:
            document = self.text.document(received, voice)
            for segment in document.segments:  # before the first chunk, not in the middle
                validate_rate(options.speed, segment.rate)
                self.voices.pick(segment.voice)[1].check_script(segment.text)
            plan = plan_document(
                document,
                self.settings,
                lambda name: self.text.reader(name, options.normalize),
                options.word_timestamps,
            )
        by_stage = {stage: forwarded(request, stage) for stage in STAGES}
        return StreamRequest(
            plan, options, voice, by_stage, received.clean, first=first_rank(request)
        )

    async def bls(self, model, inputs, outputs: list[str], rank: str = AHEAD) -> list:
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=outputs,
            inputs=inputs,
            # A stream's later chunks are bulk work for stages that run levels; its first
            # audio (the first chunk's acoustic call and first window) is taken ahead of other
            # interactive work, the first chunk's later windows as a text's later pieces are
            # (due a window's length of audio later). The stages in batch mode ignore them.
            parameters=RANK_PARAMETERS[rank],
        )
        response = await request.async_exec()
        if response.has_error():
            raise stage_error(model, response.error())
        return [pb_utils.get_output_tensor_by_name(response, name) for name in outputs]

    async def synthesize(self, chunk: PlannedChunk, stream: StreamRequest) -> ChunkAudio:
        inputs = [pb_utils.Tensor(PHONEME_IDS, np.array([chunk.ids], dtype=np.int64))]
        outputs = [LATENT, LATENT_CHECK]
        if chunk.words is not None:  # asked for (or marks): acoustic times them from its frames
            inputs.append(pb_utils.Tensor(WORD_SPANS, chunk.words[None]))
            outputs.append(WORDS)
        if chunk.marks is not None:
            inputs.append(pb_utils.Tensor(MARK_SPANS, chunk.marks[None]))
            outputs.append(MARKS)
        rank = BULK if chunk.index > 0 else stream.first
        found = await self.bls(ACOUSTIC, [*inputs, *stream.inputs(chunk, ACOUSTIC)], outputs, rank)
        latent = [found.pop(0), found.pop(0)]  # the latent and its check, as tts sends them
        marks = found.pop().as_numpy().reshape(-1, 2).copy() if chunk.marks is not None else None
        times = found[0].as_numpy().reshape(-1, 4) if found else None
        if not stream.options.word_timestamps:
            times = None  # found for the marks only
        if times is not None and len(times):
            # (times, times, characters of the clean text) -> characters of the text as sent
            spans = sent_rows(times.tolist(), chunk.source or stream.clean)
            times = np.asarray(spans, dtype=times.dtype).reshape(-1, 4)
        vocoder = stream.inputs(chunk, VOCODER)
        voice = chunk.voice or stream.voice
        first = self.settings.first_window_frames if chunk.index == 0 else 0
        if first and latent[0].is_cpu():  # (a latent on a GPU goes whole, as it came)
            frames = latent[0].as_numpy()
            parts = windows(frames.shape[-1], first, self.context[voice])
            if len(parts) > 1:
                chunk_windows = ChunkWindows(frames, vocoder, voice, times, marks)
                tasks: list[asyncio.Future] = []
                for k, part in enumerate(parts):
                    last = k == len(parts) - 1
                    later = rank if k == 0 or rank == BULK else LATER
                    after = tasks[-1] if tasks else None
                    window = self.window(chunk_windows, part, last, later, after)
                    tasks.append(asyncio.ensure_future(window))
                return Parts(tasks)
        (audio,) = await self.bls(VOCODER, [*latent, *vocoder], [AUDIO], rank)
        return ChunkAudio(audio.as_numpy().reshape(-1), times, marks)

    async def window(
        self, chunk: ChunkWindows, part, last: bool, rank: str, after: asyncio.Future | None
    ) -> ChunkAudio:
        """The audio of one window of a chunk's latent (``part``, a FrameSpan: its own frames
        and the context it is computed with), and the chunk's word and mark rows that start
        in it (the last window: all from its start on), timed from the chunk's start. Sent
        once the window before it (``after``) is done: a chunk holds one request in the
        vocoder's queue, as when it went whole (a queue's limit counts requests)."""
        if after is not None:
            await asyncio.wait({after})  # (not ``await``: cancelling this must not cancel it)
            if after.cancelled() or after.exception() is not None:
                raise asyncio.CancelledError  # the stream ends with the earlier one's error
        piece = np.ascontiguousarray(chunk.latent[..., part.lo : part.hi])
        tensors = [
            pb_utils.Tensor(LATENT, piece),
            pb_utils.Tensor(LATENT_CHECK, latent_check(piece)[None]),
        ]
        (audio,) = await self.bls(VOCODER, [*tensors, *chunk.vocoder], [AUDIO], rank)
        hop = self.hop_length[chunk.voice]
        samples = kept(audio.as_numpy().reshape(-1), part, hop)
        seconds = hop / self.sample_rate
        return ChunkAudio(
            samples,
            rows_in(chunk.words, part, last, seconds, span_columns=slice(2, 4)),
            rows_in(chunk.marks, part, last, seconds),
        )

    def sender(self, request, speed: float):
        """(send, is_closed) of ``request``'s stream; ``speed`` scales the pauses it adds."""
        response_sender = request.get_response_sender()
        rate = self.sample_rate
        closed = False
        sent_samples = 0  # words are timed from the stream's start
        chunk_start = 0.0  # seconds: where the chunk being sent (in parts, maybe) began

        def is_closed() -> bool:
            return closed

        def send(response: StreamResponse):
            # The final flag travels with the last chunk, so a client sees the end without
            # asking for an empty final response (a reserved `triton_*` parameter newer
            # tritonclients refuse to send). An error is followed by a flag-only final: an
            # error response sent with the final flag crashed Triton 2.51 (segfault in
            # TRITONBACKEND_ResponseFactoryIsCancelled); a client sees the stream end instead.
            nonlocal closed, sent_samples, chunk_start
            if closed:
                return
            if response.final:
                response_sender.send(flags=FINAL)
                closed = True
            elif response.error_code is not None:
                message = stream_error_message(response.error_code, response.error_message)
                error = pb_utils.TritonError(message, self.codes[response.error_code])
                response_sender.send(pb_utils.InferenceResponse(error=error))
            else:
                chunk = response.chunk
                head, tail = response.part == 0, response.part == response.parts - 1
                pause = chunk.sentence_end and not response.last
                audio = finish_chunk(
                    response.audio.samples, rate, self.settings, pause, speed, chunk, head, tail
                )
                if head:
                    chunk_start = sent_samples / rate + chunk.pause_before_s
                # The caption with the chunk's first part; its later parts add audio only.
                caption = np.array([(chunk.text if head else "").encode()], dtype=np.object_)
                outputs = [pb_utils.Tensor(AUDIO, audio), pb_utils.Tensor(CHUNK_TEXT, caption)]
                if response.audio.words is not None:
                    # Only when asked: a plain stream's responses stay as they were (each
                    # tensor more is more time in the stub's shared-memory locks, and a stub
                    # killed inside one aborts Triton 2.51: tests/reliability/test_front.py).
                    words = response.audio.words.copy()
                    words[:, :2] += chunk_start
                    outputs.append(pb_utils.Tensor(WORDS, words))
                if response.audio.marks is not None:
                    marks = response.audio.marks.copy()
                    marks[:, 0] += chunk_start
                    outputs.append(pb_utils.Tensor(MARKS, marks))
                sent_samples += audio.size
                response_sender.send(
                    pb_utils.InferenceResponse(output_tensors=outputs),
                    flags=FINAL if response.last else 0,
                )
                closed = response.last

        return send, is_closed

    async def stream(self, request):
        parsed, refusal = None, None
        try:
            raw = one_value(request, TEXT, batched=False)
        except InvalidInputError as e:
            raw, refusal = None, StreamResponse(error_code=INVALID_ARGUMENT, error_message=str(e))
        # A short text's stream is admitted by the front door as `tts` is (its slots bound
        # them); max_streams bounds the long texts, which run for minutes.
        long = not (isinstance(raw, bytes | str) and is_short_text(raw))
        if refusal is None and long and self.long_streams >= self.settings.max_streams:
            # Shed load at once rather than queue a stream behind minutes of others.
            message = f"{self.settings.max_streams} long-text streams are running; retry later"
            refusal = StreamResponse(error_code=UNAVAILABLE, error_message=message)
        elif refusal is None:
            try:
                parsed = self.parse(request, raw)  # no await: counted once it runs
            except InvalidInputError as e:
                refusal = StreamResponse(error_code=INVALID_ARGUMENT, error_message=str(e))
            except Exception as e:  # answered, never left waiting (the trace in the log only)
                self.logger.log_error(f"tts_stream: reading the request failed: {e!r}")
                refusal = StreamResponse(error_code=INTERNAL, error_message="internal error")
        send, closed = self.sender(request, parsed.options.speed if parsed else 1.0)
        if parsed is None:
            send(refusal)
            send(StreamResponse(final=True))
            return
        self.long_streams += long
        try:
            with self.in_flight:
                outcome = await run_stream(
                    parsed.plan,
                    lambda chunk: self.synthesize(chunk, parsed),
                    send,
                    # Never asked once the final flag went out: the response factory is gone
                    # then, and asking crashed Triton 2.51 (segfault in
                    # TRITONBACKEND_ResponseFactoryIsCancelled).
                    lambda: not closed() and request.is_cancelled(),
                    self.settings.max_in_flight,
                    lambda message: self.logger.log_error(f"tts_stream: {message}"),
                )
        finally:
            self.long_streams -= long
        if outcome.error_code == CANCELLED:
            self.logger.log_info(f"tts_stream: cancelled after {outcome.sent} chunks")

    def finalize(self):
        # Let streams still running finish (as python_backend's decoupled examples do).
        if not self.in_flight.wait_idle(FINALIZE_WAIT_S):
            self.logger.log_warn(
                f"tts_stream: {self.in_flight.count} streams still running at unload"
            )
        self.text.close()
