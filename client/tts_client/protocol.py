"""The client's side of the wire contract (``tts_wire``, shared with the server and gateway).

How one request's inputs are built, what an error code means, how a stream is read and how
overload is retried. The sync and asyncio clients are thin layers over these functions; the
contract's names are re-exported here for the client's users.
"""

from __future__ import annotations

import asyncio
import html
import json
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import TypedDict, TypeVar

import numpy as np

from tts_wire import (
    AUDIO as AUDIO,
    CALLER_HEADER as CALLER_HEADER,
    CANCELLED as CANCELLED,
    CHUNK_TEXT as CHUNK_TEXT,
    DEADLINE_EXCEEDED as DEADLINE_EXCEEDED,
    FINAL_RESPONSE as FINAL_RESPONSE,
    INTERNAL as INTERNAL,
    INVALID_ARGUMENT as INVALID_ARGUMENT,
    LISTENER_HEADER as LISTENER_HEADER,
    MARKS as MARKS,
    MAX_SPEED as MAX_SPEED,
    MIN_SPEED as MIN_SPEED,
    NOISE_SCALE as NOISE_SCALE,
    NOISE_W as NOISE_W,
    NORMALIZE as NORMALIZE,
    NOT_FOUND as NOT_FOUND,
    PRIORITY_LEVELS as PRIORITY_LEVELS,
    RESOURCE_EXHAUSTED as RESOURCE_EXHAUSTED,
    SPEAKER as SPEAKER,
    SPEED as SPEED,
    TEXT as TEXT,
    TEXT_TOO_LONG as TEXT_TOO_LONG,
    UNAVAILABLE as UNAVAILABLE,
    VOICE as VOICE,
    WORD_TIMESTAMPS as WORD_TIMESTAMPS,
    WORDS as WORDS,
    SynthesisOptions as SynthesisOptions,
    parse_stream_error as parse_stream_error,
    priority_error,
    stream_error_message as stream_error_message,
)
from tts_wire.tensors import client_datatypes

from .audio import Audio, AudioChunk, Mark, Word, merge_words
from .errors import (
    InferenceFailed,
    InvalidInput,
    LimitReached,
    ServerOverloaded,
    ServerUnavailable,
    TTSError,
)

T = TypeVar("T")

_ENSEMBLE_PREFIX = re.compile(r"^(in ensemble '[^']+', )+")

_HTTP_CODES = {
    "400": INVALID_ARGUMENT,
    "404": NOT_FOUND,
    "429": UNAVAILABLE,  # over HTTP the front door's overload (gRPC: UNAVAILABLE too)
    "499": CANCELLED,
    "500": INTERNAL,
    "503": UNAVAILABLE,
    "504": DEADLINE_EXCEEDED,
}


class OptionKeywords(TypedDict, total=False):
    """The loose keywords a client method takes instead of ``options=SynthesisOptions(...)``."""

    speed: float
    noise_scale: float | None
    noise_w: float | None
    normalize: bool | None
    voice: str | None
    word_timestamps: bool
    speaker: str | None


def options(options: SynthesisOptions | None = None, **keywords: object) -> SynthesisOptions:
    """One :class:`SynthesisOptions` from a method's arguments: ``options`` itself, or one
    built from the loose keywords (checked here, once); not both."""
    if options is not None:
        if keywords:
            raise InvalidInput("pass either options= or speed/noise/normalize/voice, not both")
        if not isinstance(options, SynthesisOptions):
            raise InvalidInput(
                f"options must be SynthesisOptions, got {type(options).__name__} (speed and the "
                "other options are keywords: synthesize(text, speed=1.5))"
            )
        return options
    unknown = sorted(set(keywords) - set(OptionKeywords.__annotations__))
    if unknown:
        raise InvalidInput(
            f"unknown option(s) {', '.join(unknown)}; options: "
            f"{', '.join(OptionKeywords.__annotations__)}"
        )
    try:
        return SynthesisOptions(**keywords)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidInput(str(e)) from None


_DATATYPES = client_datatypes()  # as the models declare them (tts_wire.tensors)


def _tensor(module: ModuleType, name: str, value, shape: list[int]):
    datatype = _DATATYPES[name]
    if datatype == "BYTES":
        array = np.array([value.encode("utf-8")], dtype=np.object_)
    elif datatype == "BOOL":
        array = np.array([bool(value)])
    else:
        array = np.array([value], dtype=np.float32)
    tensor = module.InferInput(name, shape, datatype)
    tensor.set_data_from_numpy(array.reshape(shape))
    return tensor


def build_inputs(
    module: ModuleType, text: str, options: SynthesisOptions | None = None, batched: bool = True
) -> list:
    """InferInput list for one request (``module``: tritonclient.grpc or .http).

    ``batched``: the model has a batch dimension (``tts``: shape [1, 1]); ``tts_stream`` has
    none (shape [1]). Options left at None are not sent: the server's defaults apply.
    """
    if not isinstance(text, str):
        raise InvalidInput(f"text must be a str, got {type(text).__name__}")
    shape = [1, 1] if batched else [1]
    inputs = (options or SynthesisOptions()).inputs()
    return [_tensor(module, TEXT, text, shape)] + [
        _tensor(module, name, value, shape) for name, value in inputs.items()
    ]


def check_priority(priority: int) -> int:
    """0 (the models' default level) or 1..PRIORITY_LEVELS."""
    problem = priority_error(priority)
    if problem:
        raise InvalidInput(problem)
    return priority


def sample_rate_from_config(config: dict) -> int:
    """The ``sample_rate`` parameter of a model config (dict from HTTP or gRPC as_json)."""
    config = config.get("config", config)
    try:
        return int(config["parameters"]["sample_rate"]["string_value"])
    except (KeyError, TypeError, ValueError):
        raise TTSError(
            f"model {config.get('name')!r} has no sample_rate parameter in its config"
        ) from None


def max_characters_from_config(config: dict) -> int | None:
    """The ``max_characters`` parameter of a model config: the longest text one request takes
    (None where the server does not publish it; its "text is too long" error then says so)."""
    config = config.get("config", config)
    try:
        return int(config["parameters"]["max_characters"]["string_value"])
    except (KeyError, TypeError, ValueError):
        return None


def audio_from_result(
    result, sample_rate: int, text: str | None = None, *, document: str = ""
) -> Audio:
    """The response's audio; with ``text`` (word timestamps were asked for), its words; the
    marks of ``document`` (the text sent) it reached."""
    samples = result.as_numpy(AUDIO)
    if samples is None:
        raise InferenceFailed("the server's response has no 'audio' output")
    audio = np.ascontiguousarray(samples.reshape(-1), dtype=np.float32)
    marks = result_marks(result, document)
    return Audio(audio, sample_rate, result_words(result, text), marks)


_MARK = re.compile(r"""<mark\s+name\s*=\s*(["'])(.*?)\1""", re.S)


def result_marks(result, document: str) -> tuple[Mark, ...]:
    """The response's SSML marks (rows of time, character where the ``<mark`` starts in
    ``document``), each named as the document names it."""
    rows = result.as_numpy(MARKS)
    if rows is None or not rows.size:
        return ()
    marks = []
    for time_s, char in rows.reshape(-1, 2).tolist():
        found = _MARK.match(document, int(char))
        name = html.unescape(found.group(2)) if found else ""
        marks.append(Mark(name, float(time_s), int(char)))
    return tuple(marks)


def result_words(result, sent: str | None) -> tuple[Word, ...]:
    """The words of one response (tts, or a tts_stream chunk) as spans of ``sent``; none when
    ``sent`` is None (word timestamps were not asked for)."""
    if sent is None:
        return ()
    rows = result.as_numpy(WORDS)
    if rows is None:
        raise InferenceFailed("word timestamps were asked for; the response has no 'words'")
    return words_from_rows(rows.reshape(-1, 4), sent)


def words_from_rows(rows: np.ndarray, text: str) -> tuple[Word, ...]:
    """The server's rows (start, end, first char, end char), one per spoken word, as words of
    ``text``: spoken words that share a span (a token the server rewrote) make one word."""
    words = [
        Word(text[int(first) : int(last)], start, end, int(first), int(last))
        for start, end, first, last in rows.tolist()
    ]
    return merge_words(words)


def error_code(exc: BaseException) -> str | None:
    """The gRPC status name of a tritonclient error (HTTP statuses translated), or None."""
    status_fn = getattr(exc, "status", None)
    status = str((status_fn() if callable(status_fn) else None) or "")
    if status.startswith("StatusCode."):
        return status[len("StatusCode.") :]
    return _HTTP_CODES.get(status)


def error_message(exc: BaseException) -> str:
    message_fn = getattr(exc, "message", None)
    message = (message_fn() if callable(message_fn) else None) or str(exc)
    if not isinstance(message, str):  # a JSON error body that is not Triton's ({"error": "..."})
        message = json.dumps(message)[:300]
    return _ENSEMBLE_PREFIX.sub("", message.strip())


# What tritonclient's HTTP client says when a reply is not Triton's JSON.
_UNDECODED = "an exception occurred in the client while decoding the response"


def not_triton(exc: BaseException, url: str) -> TTSError | None:
    """The error for an HTTP reply that is not Triton's API (another server on that port, e.g.
    the OpenAI gateway), naming what was reached; None for Triton's own errors."""
    message_fn = getattr(exc, "message", None)
    message = message_fn() if callable(message_fn) else None
    if message is None or (isinstance(message, str) and not message.startswith(_UNDECODED)):
        return None
    status_fn = getattr(exc, "status", None)
    status = status_fn() if callable(status_fn) else None
    details_fn = getattr(exc, "debug_details", None)
    body = (details_fn() if callable(details_fn) else None) or error_message(exc)
    return ServerUnavailable(
        f"{url} answered HTTP {status} with {str(body)[:200]!r}, which is not Triton's "
        "inference API: is the URL the right server and port? (make serve: Triton's HTTP on "
        "8000, gRPC on 8001; 8080 is the OpenAI-compatible gateway, for OpenAI clients)"
    )


MODEL_NOT_AVAILABLE = "model not available"


def map_error(code: str | None, message: str, server_alive: bool = True) -> TTSError:
    """The client's exception for a status code: decided by the code, never by the text.

    ``server_alive``: UNAVAILABLE from a server that answers is a full queue (overload);
    from one that does not, the server is down or unreachable.
    """
    if code == INVALID_ARGUMENT:
        return InvalidInput(message)
    if code == RESOURCE_EXHAUSTED and server_alive:
        return LimitReached(message)
    if code in (UNAVAILABLE, RESOURCE_EXHAUSTED):
        if server_alive:
            return ServerOverloaded(message)
        return ServerUnavailable(f"cannot reach the server: {message}")
    if code == NOT_FOUND:
        return ServerUnavailable(f"{MODEL_NOT_AVAILABLE}: {message}")
    if code == DEADLINE_EXCEEDED:
        return ServerUnavailable(f"request timed out: {message}")
    return InferenceFailed(message)


def map_exception(exc: BaseException, server_alive: bool = True, url: str = "") -> TTSError:
    """Translate a tritonclient / transport exception into the client's family; ``url``: the
    server asked (named when its answer is not Triton's)."""
    if isinstance(exc, TTSError):
        return exc
    foreign = not_triton(exc, url or "the server")
    if foreign is not None:
        return foreign
    if isinstance(exc, (ConnectionError, OSError, TimeoutError)):
        return ServerUnavailable(f"cannot reach the server: {exc}")
    message = error_message(exc)
    code, message = _code_and_message(exc, message)
    return map_error(code, message, server_alive)


# Triton's core refusing a request on a stream (which carries no status code) because the
# model is not loaded: the same refusal is NOT_FOUND on a unary call.
_MODEL_NOT_LOADED = re.compile(r"^Request for unknown model: ")


def _code_and_message(exc: BaseException, message: str) -> tuple[str | None, str]:
    stream_code, stream_message = parse_stream_error(message)
    if stream_code is not None:
        return stream_code, _ENSEMBLE_PREFIX.sub("", stream_message)
    code = error_code(exc)
    if code is None and _MODEL_NOT_LOADED.match(message):
        return NOT_FOUND, message  # a stream's model reloading: unavailable, not failed
    return code, message


def final_follows(exc: BaseException) -> bool:
    """A stream error that tts_stream wrote (``[CODE] message``): its final flag comes next.
    Any other (the front door ended the stream, Triton's core refused the request) has none
    to wait for."""
    return parse_stream_error(error_message(exc))[0] is not None


def is_text_too_long(error: TTSError) -> bool:
    """The server refused the text for its length (so it can be streamed instead)."""
    return isinstance(error, InvalidInput) and str(error).startswith(TEXT_TOO_LONG)


def chunk_from_result(
    result, index: int, sample_rate: int, sent: str | None = None, document: str = ""
) -> AudioChunk | None:
    """The AudioChunk in one tts_stream response, or None for the empty final response.
    ``sent``: the stream's text, when word timestamps were asked for (the chunk's words);
    ``document``: the stream's text (its marks)."""
    samples = result.as_numpy(AUDIO)
    if samples is None:
        return None
    text = result.as_numpy(CHUNK_TEXT)
    caption = text.reshape(-1)[0].decode("utf-8") if text is not None else ""
    audio = np.ascontiguousarray(samples.reshape(-1), dtype=np.float32)
    marks = result_marks(result, document)
    return AudioChunk(audio, sample_rate, caption, index, result_words(result, sent), marks)


def is_final(result) -> bool:
    """True for the response that carries the stream's final flag."""
    final = result.get_response().parameters.get(FINAL_RESPONSE)
    return final is not None and final.bool_param


# How long a client waits, after a stream error, for the stream to end before closing it.
END_AFTER_ERROR_S = 5.0


class StreamReader:
    """Turns one stream's responses into numbered AudioChunks and notices the final flag."""

    def __init__(self, sample_rate: int, sent: str | None = None, document: str = "") -> None:
        self.sample_rate = sample_rate
        self.sent = sent  # the text, when its words were asked for
        self.document = document  # the text (the names of its marks)
        self.index = 0
        self.finished = False

    def read(self, result) -> AudioChunk | None:
        chunk = chunk_from_result(result, self.index, self.sample_rate, self.sent, self.document)
        if chunk is not None:
            self.index += 1
        self.finished = is_final(result)
        return chunk


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries a request the server refused for overload (ServerOverloaded).

    Every request of this client is idempotent (synthesis has no side effects), so a retry is
    safe. Delays grow exponentially with full jitter (uniform in [0, min(max_delay,
    base_delay * 2**k)]), so many clients refused together do not come back together.
    """

    retries: int = 3  # after the first attempt; 0 = never retry
    base_delay: float = 0.1
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if self.retries < 0 or self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("retries and delays must be >= 0")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        rng = rng or random.Random()
        for k in range(self.retries):
            yield rng.uniform(0, min(self.max_delay, self.base_delay * 2**k))


NO_RETRY = RetryPolicy(retries=0)


def _exhausted(error: ServerOverloaded, policy: RetryPolicy) -> ServerOverloaded:
    if not policy.retries:
        return error
    return ServerOverloaded(f"{error} (refused {policy.retries + 1} times)")


def call_with_retries(
    call: Callable[[], T], policy: RetryPolicy, sleep: Callable[[float], None] = time.sleep
) -> T:
    """``call()``, retried on ServerOverloaded as ``policy`` says; other errors at once."""
    delays = policy.delays()
    while True:
        try:
            return call()
        except ServerOverloaded as e:
            delay = next(delays, None)
            if delay is None:
                raise _exhausted(e, policy) from None
            sleep(delay)


async def acall_with_retries(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """The asyncio twin of :func:`call_with_retries`."""
    delays = policy.delays()
    while True:
        try:
            return await call()
        except ServerOverloaded as e:
            delay = next(delays, None)
            if delay is None:
                raise _exhausted(e, policy) from None
            await sleep(delay)
