"""Errors in OpenAI's envelope, and how Triton's errors (via the client) become HTTP statuses."""

from __future__ import annotations

from dataclasses import dataclass

from tts_client.errors import (
    InvalidInput,
    LimitReached,
    ServerOverloaded,
    ServerUnavailable,
    TTSError,
)
from tts_client.protocol import MODEL_NOT_AVAILABLE


@dataclass
class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def from_tts_error(error: TTSError, retry_after: int) -> APIError:
    """Map the client's exception family (built from gRPC status codes) to HTTP."""
    message = str(error)
    if isinstance(error, InvalidInput):
        return APIError(400, message, param="input", code="invalid_input")
    if isinstance(error, LimitReached):
        # A limit of this caller's (the front door's count of its long-text requests).
        return APIError(
            429, message, type="rate_limit_error", code="rate_limit_exceeded",
            retry_after=retry_after,
        )  # fmt: skip
    if isinstance(error, ServerOverloaded):
        return APIError(
            503,
            f"the speech server is at capacity, retry later ({message})",
            type="server_error",
            code="overloaded",
            retry_after=retry_after,
        )
    if isinstance(error, ServerUnavailable) and message.startswith(MODEL_NOT_AVAILABLE):
        # Triton is up, the model is being (re)loaded: the service is briefly unavailable.
        return APIError(
            503,
            f"the speech model is loading, retry shortly ({message})",
            type="server_error",
            code="model_unavailable",
            retry_after=retry_after,
        )
    if isinstance(error, ServerUnavailable):
        return APIError(
            502,
            f"the speech server is unavailable ({message})",
            type="server_error",
            code="upstream_unavailable",
            retry_after=retry_after,
        )
    return APIError(500, f"synthesis failed: {message}", type="server_error", code="internal")


def timeout(seconds: float) -> APIError:
    return APIError(
        504, f"no audio within the gateway's {seconds:g} s deadline", "server_error", code="timeout"
    )
