"""The client's own exceptions; tritonclient's are never raised to callers."""

from __future__ import annotations

import re


class TTSError(Exception):
    """Base class of everything the client raises."""


class InvalidInput(TTSError):
    """The server rejected the input (INVALID_ARG); the message says what to fix."""


class ServerUnavailable(TTSError):
    """The server cannot be reached, is not ready, or the model is not loaded."""


class ServerOverloaded(ServerUnavailable):
    """The model's queue is full; retry later or add capacity."""


class InferenceFailed(TTSError):
    """The server accepted the request but failed to synthesize it."""


_ENSEMBLE_PREFIX = re.compile(r"^(in ensemble '[^']+', )+")
# Errors inside a gRPC stream arrive without a status code; tts_stream prefixes bad input.
STREAM_INVALID_PREFIX = "invalid input: "


def map_exception(exc: BaseException) -> TTSError:
    """Translate a tritonclient / transport exception into the client's family."""
    if isinstance(exc, TTSError):
        return exc
    if isinstance(exc, (ConnectionError, OSError, TimeoutError)):
        return ServerUnavailable(f"cannot reach the server: {exc}")
    message_fn = getattr(exc, "message", None)
    message = (message_fn() if callable(message_fn) else None) or str(exc)
    message = _ENSEMBLE_PREFIX.sub("", message.strip())
    status_fn = getattr(exc, "status", None)
    status = str(status_fn() if callable(status_fn) else "") or ""
    if message.startswith(STREAM_INVALID_PREFIX):
        return InvalidInput(_ENSEMBLE_PREFIX.sub("", message[len(STREAM_INVALID_PREFIX) :]))
    if "queue size" in message.lower():
        return ServerOverloaded(message)
    if status in ("StatusCode.INVALID_ARGUMENT", "400"):
        return InvalidInput(message)
    if status in ("StatusCode.UNAVAILABLE", "503", "StatusCode.NOT_FOUND", "404") or (
        "connect" in message.lower() or "not ready" in message.lower()
    ):
        return ServerUnavailable(message)
    if status in ("StatusCode.DEADLINE_EXCEEDED",) or "deadline" in message.lower():
        return ServerUnavailable(f"request timed out: {message}")
    return InferenceFailed(message)
