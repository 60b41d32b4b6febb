"""The client's own exceptions; tritonclient's are never raised to callers."""

from __future__ import annotations


class TTSError(Exception):
    """Base class of everything the client raises."""


class InvalidInput(TTSError):
    """The server rejected the input (INVALID_ARG); the message says what to fix."""


class ServerUnavailable(TTSError):
    """The server cannot be reached, is not ready, or the model is not loaded."""


class ServerOverloaded(ServerUnavailable):
    """The model's queue is full; retry later or add capacity."""


class LimitReached(ServerOverloaded):
    """The server refused this request at a limit of the caller's own (RESOURCE_EXHAUSTED: as
    many of its streams in progress as one client may hold, or a message too large); others
    are still served. Wait for one of its requests to end, or send less."""


class InferenceFailed(TTSError):
    """The server accepted the request but failed to synthesize it."""
