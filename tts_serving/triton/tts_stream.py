"""The tts_stream model: long text -> ordered audio chunks over a decoupled (streaming) response.

The text is planned into chunks lazily (normalized and phonemized here, once); each chunk's
ids go to ``acoustic`` and its latent to ``vocoder`` with async BLS calls, so the dynamic
batchers batch them with every other user's requests. ``tts_serving.stream.scheduler`` keeps
the order, the in-flight window, cancellation and errors; this module wires it to pb_utils.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tts_wire import (
    AUDIO,
    CANCELLED,
    CHUNK_TEXT,
    INTERNAL,
    INVALID_ARGUMENT,
    LATENT,
    MAX_SPEED,
    MIN_SPEED,
    NOISE_SCALE,
    NOISE_W,
    NORMALIZE,
    PHONEME_IDS,
    SPEED,
    TEXT,
    UNAVAILABLE,
    VOICE,
    WORD_SPANS,
    WORD_TIMESTAMPS,
    WORDS,
    SynthesisOptions,
    stream_error_message,
)
from tts_wire.tensors import MODEL_IO

from ..errors import InvalidInputError, ModelConfigError
from ..inputs import (
    CleanText,
    check_encoded_size,
    decode_clean,
    decode_utf8,
    sent_rows,
    validate_rate,
)
from ..settings import StreamSettings
from ..stream.plan import PlannedChunk, finish_chunk, plan_chunks, plan_document
from ..stream.scheduler import InFlight, StageError, StreamResponse, run_stream
from ..text import ssml
from ..text.espeak_pool import voice_phonemizers
from ..text.lexicon import lexicon_file
from ..text.ssml import is_ssml
from ..voices import decode_voice
from .adapter import ModelContext, normalizes
from .phonemizer import voice_infos


def stream_option(request, name: str, default: Any) -> Any:
    """One value of a non-batched input (``tts_stream``: shape [1]), or ``default``.

    Bytes stay bytes (text), BOOL becomes bool, numbers become float.
    """
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    array = tensor.as_numpy().reshape(-1)
    if array.size != 1:
        raise InvalidInputError(f"input {name!r} must hold one value, got {array.size}")
    value = array[0]
    if isinstance(value, bytes | str):
        return value
    if array.dtype == np.bool_:
        return bool(value)
    return float(value)


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
# What each chunk's acoustic request carries of a stream's options (the voice goes apart).
ACOUSTIC_OPTIONS = (SPEED, NOISE_SCALE, NOISE_W)
FINALIZE_WAIT_S = 20.0  # inside Triton's default 30 s exit timeout, so unloading ends


@dataclass(frozen=True)
class ChunkAudio:
    """What one chunk's stage calls gave: its samples and (asked for; else None) its words' rows
    (start s, end s, first char, end char), timed from the chunk's own start."""

    samples: np.ndarray
    words: np.ndarray | None


@dataclass(frozen=True)
class StreamRequest:
    """One stream's plan and what every chunk's stage calls carry besides its ids."""

    plan: Iterator[PlannedChunk]
    voice: str  # both stages take it (acoustic: network, defaults; vocoder: gain)
    options: dict[str, float]  # speed and the noise scales a client set
    clean: CleanText  # maps word spans back to the text as sent

    def inputs(self, chunk: PlannedChunk) -> list:
        """The voice and option tensors of ``chunk``'s stage calls: the stream's own, made
        once; an SSML chunk's segment its voice and the speed times its rate."""
        if chunk.voice in (None, self.voice) and chunk.rate == 1.0:
            return self.stream_inputs
        options = dict(self.options)
        options[SPEED] = options.get(SPEED, 1.0) * chunk.rate
        return _tensors(chunk.voice or self.voice, options)

    @cached_property
    def stream_inputs(self) -> list:
        return _tensors(self.voice, self.options)


def _tensors(voice: str, options: dict[str, float]) -> list:
    """[1, 1] tensors of a voice and options (the voice first)."""
    return [
        pb_utils.Tensor(VOICE, np.array([[voice.encode()]], dtype=np.object_)),
        *(pb_utils.Tensor(k, np.array([[v]], np.float32)) for k, v in options.items()),
    ]


class TtsStream:
    """``TritonPythonModel`` of ``model_repository/tts_stream`` (its model.py subclasses it)."""

    def initialize(self, args):
        self.ctx = ModelContext.from_args(args, StreamSettings)
        self.ctx.require_io(MODEL_IO["tts_stream"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.ctx.config):
            raise ModelConfigError("tts_stream needs model_transaction_policy { decoupled: true }")
        self.settings = self.ctx.settings
        self.logger = pb_utils.Logger
        # The stream plans its own chunks within max_phoneme_ids: no limit on one text here.
        self.voices, self.pool = voice_phonemizers(
            self.ctx.voices(),
            1 << 30,
            self.settings.espeak_workers,
            self.settings.espeak_timeout_s,
            self.logger.log_warn,
        )
        self.lexicon = lexicon_file(
            self.ctx.version_dir, self.voices, self.logger.log_info, self.logger.log_error
        )
        self.voice_infos = voice_infos(self.voices)
        rates = {p.config.sample_rate for _, p in self.voices}
        if len(rates) != 1:
            raise ModelConfigError(f"every voice must share one sample rate, got {sorted(rates)}")
        self.sample_rate = rates.pop()
        self.in_flight = InFlight()
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

    def parse(self, request) -> StreamRequest:
        raw = stream_option(request, TEXT, None)
        if raw is None:
            raise InvalidInputError("input 'text' is missing")
        as_sent = decode_utf8(check_encoded_size(raw, self.settings.max_characters))
        clean = decode_clean(as_sent)
        text = clean.text
        voice, phonemizer = self.voices.pick(decode_voice(stream_option(request, VOICE, None)))
        document = (
            ssml.parse(as_sent, voice, self.voice_infos, ssml.STREAM_LIMITS)
            if is_ssml(text)
            else None
        )
        try:
            # The same options object as the client's and the gateway's, checked once here
            # against the wire contract's ranges; absent noise: acoustic uses the voice's.
            options = SynthesisOptions(
                speed=stream_option(request, SPEED, 1.0),
                noise_scale=stream_option(request, NOISE_SCALE, None),
                noise_w=stream_option(request, NOISE_W, None),
                normalize=stream_option(request, NORMALIZE, None),
                word_timestamps=bool(stream_option(request, WORD_TIMESTAMPS, False)),
            )
        except ValueError as e:
            raise InvalidInputError(str(e)) from None
        scalars = {k: v for k, v in options.inputs().items() if k in ACOUSTIC_OPTIONS}
        if document is None:
            plan = plan_chunks(
                text,
                self.settings,
                phonemizer,
                normalizes(phonemizer, options.normalize, self.settings.normalize_text),
                options.word_timestamps,
                lexicon=lambda block: self.lexicon.apply(voice, block),
            )
        else:
            for segment in document.segments:  # before the first chunk, not in the middle
                validate_rate(options.speed, segment.rate)
            plan = plan_document(
                document,
                self.settings,
                lambda name: self.voices.pick(name)[1],
                lambda reader: normalizes(reader, options.normalize, self.settings.normalize_text),
                options.word_timestamps,
                self.lexicon.apply,
            )
        return StreamRequest(plan, voice, scalars, clean)

    async def bls(self, model, inputs, outputs: list[str]) -> list:
        request = pb_utils.InferenceRequest(
            model_name=model, requested_output_names=outputs, inputs=inputs
        )
        response = await request.async_exec()
        if response.has_error():
            raise stage_error(model, response.error())
        return [pb_utils.get_output_tensor_by_name(response, name) for name in outputs]

    async def synthesize(self, chunk: PlannedChunk, stream: StreamRequest) -> ChunkAudio:
        inputs = [pb_utils.Tensor(PHONEME_IDS, np.array([chunk.ids], dtype=np.int64))]
        outputs = [LATENT]
        if chunk.words is not None:  # asked for: acoustic times them from its frames
            inputs.append(pb_utils.Tensor(WORD_SPANS, chunk.words[None]))
            outputs.append(WORDS)
        voice, *options = stream.inputs(chunk)
        found = await self.bls("acoustic", [*inputs, voice, *options], outputs)
        (audio,) = await self.bls("vocoder", [found[0], voice], [AUDIO])
        times = found[1].as_numpy().reshape(-1, 4) if len(found) > 1 else None
        if times is not None and len(times):
            # (times, times, characters of the clean text) -> characters of the text as sent
            spans = sent_rows(times.tolist(), chunk.source or stream.clean)
            times = np.asarray(spans, dtype=times.dtype).reshape(-1, 4)
        return ChunkAudio(audio.as_numpy().reshape(-1), times)

    def sender(self, request):
        response_sender = request.get_response_sender()
        rate = self.sample_rate
        closed = False
        sent_samples = 0  # words are timed from the stream's start
        speed = float(stream_option(request, SPEED, 1.0))  # checked by parse(): in range
        speed = speed if MIN_SPEED <= speed <= MAX_SPEED else 1.0

        def is_closed() -> bool:
            return closed

        def send(response: StreamResponse):
            # The final flag travels with the last chunk, so a client sees the end without
            # asking for an empty final response (a reserved `triton_*` parameter newer
            # tritonclients refuse to send). An error is followed by a flag-only final: an
            # error response sent with the final flag crashed Triton 2.51 (segfault in
            # TRITONBACKEND_ResponseFactoryIsCancelled); a client sees the stream end instead.
            nonlocal closed, sent_samples
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
                pause = chunk.sentence_end and not response.last
                audio = finish_chunk(
                    response.audio.samples, rate, self.settings, pause, speed, chunk
                )
                caption = np.array([chunk.text.encode()], dtype=np.object_)
                outputs = [pb_utils.Tensor(AUDIO, audio), pb_utils.Tensor(CHUNK_TEXT, caption)]
                if response.audio.words is not None:
                    # Only when asked: a plain stream's responses stay as they were (each
                    # tensor more is more time in the stub's shared-memory locks, and a stub
                    # killed inside one aborts Triton 2.51: tests/reliability/test_front.py).
                    words = response.audio.words.copy()
                    words[:, :2] += sent_samples / rate + chunk.pause_before_s
                    outputs.append(pb_utils.Tensor(WORDS, words))
                sent_samples += audio.size
                response_sender.send(
                    pb_utils.InferenceResponse(output_tensors=outputs),
                    flags=FINAL if response.last else 0,
                )
                closed = response.last

        return send, is_closed

    async def stream(self, request):
        send, closed = self.sender(request)
        if self.in_flight.count >= self.settings.max_streams:
            # Shed load at once rather than queue a stream behind minutes of others.
            message = f"{self.settings.max_streams} streams are running; retry later"
            send(StreamResponse(error_code=UNAVAILABLE, error_message=message))
            send(StreamResponse(final=True))
            return
        with self.in_flight:
            try:
                parsed = self.parse(request)
            except InvalidInputError as e:
                send(StreamResponse(error_code=INVALID_ARGUMENT, error_message=str(e)))
                send(StreamResponse(final=True))
                return
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
            if outcome.error_code == CANCELLED:
                self.logger.log_info(f"tts_stream: cancelled after {outcome.sent} chunks")

    def finalize(self):
        # Let streams still running finish (as python_backend's decoupled examples do).
        if not self.in_flight.wait_idle(FINALIZE_WAIT_S):
            self.logger.log_warn(
                f"tts_stream: {self.in_flight.count} streams still running at unload"
            )
        if self.pool is not None:
            self.pool.close()
