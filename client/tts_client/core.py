"""What the sync and asyncio clients share; they differ only in transport.

Where the server is (:class:`Endpoint`), which models serve plain and streamed requests, the
timeout, retries and priority, and how one call is built from a text and its
:class:`~tts_wire.SynthesisOptions`: the same inputs and the same request parameters go on the
wire from either client (tests/unit/client/test_client.py checks it with a fake transport).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal
from urllib.parse import urlsplit

from . import protocol
from .errors import InvalidInput, TTSError

DEFAULT_PORTS = {"grpc": 8001, "http": 8000}
DEFAULT_MODEL = "tts"
DEFAULT_STREAM_MODEL = "tts_stream"


@dataclass(frozen=True)
class Endpoint:
    """Where the server is and which protocol to speak, parsed from a URL."""

    protocol: Literal["grpc", "http"]
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in DEFAULT_PORTS:
            raise ValueError(
                f"URL {url!r} must start with grpc:// or http:// (e.g. grpc://localhost:8001)"
            )
        if not parts.hostname:
            raise ValueError(f"URL {url!r} has no host")
        if parts.path not in ("", "/"):
            raise ValueError(f"URL {url!r} must not have a path")
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError:
            raise ValueError(f"URL {url!r} has an invalid port") from None
        return cls(parts.scheme, parts.hostname, port)  # type: ignore[arg-type]


@dataclass(frozen=True)
class InferCall:
    """One ``tts`` request as a transport sends it: ``client.infer(model, inputs, **kwargs)``."""

    model: str
    inputs: list
    kwargs: dict[str, Any]


class ClientCore:
    """The transport-independent half of :class:`TTSClient` and :class:`AsyncTTSClient`."""

    def __init__(
        self,
        url: str,
        model: str,
        timeout: float,
        stream_model: str,
        retry: protocol.RetryPolicy | None,
        priority: int,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        # Sent with every request (gRPC metadata or HTTP headers), e.g. a proxy's credentials.
        self.headers = dict(headers) if headers else None
        self.model = model
        self.stream_model = stream_model
        self.timeout = timeout
        self.retry = retry or protocol.RetryPolicy()
        # Triton's dynamic-batcher priority for `tts` requests: 1 = interactive (served first),
        # 2 = bulk; 0 = the models' default level (2). Streams carry none (see README).
        self.priority = protocol.check_priority(priority)
        self._sample_rate: int | None = None
        # The longest text one `tts` request takes, read from its config with the sample rate.
        self._max_characters: int | None = None
        # tritonclient.grpc or .http: the InferInput class and the error types of the protocol.
        self._module: ModuleType = importlib.import_module(f"tritonclient.{self.endpoint.protocol}")

    def _infer_call(self, text: str, options: protocol.SynthesisOptions) -> InferCall:
        priority = self.priority if options.priority is None else options.priority
        kwargs: dict[str, Any] = {"priority": priority}
        headers = self.headers_for(options)
        if headers:
            kwargs["headers"] = headers
        if self.endpoint.protocol == "grpc":
            # (HTTP's `timeout` is Triton's queue timeout in microseconds, not the client's.)
            kwargs["client_timeout"] = self.timeout
        return InferCall(self.model, protocol.build_inputs(self._module, text, options), kwargs)

    def headers_for(self, options: protocol.SynthesisOptions) -> dict[str, str] | None:
        """The headers of one request: the client's, and whom a relay sends it for."""
        relayed = {
            name: value
            for name, value in (
                (protocol.CALLER_HEADER, options.caller),
                (protocol.LISTENER_HEADER, options.listener),
            )
            if value is not None
        }
        if not relayed:
            return self.headers
        return {**(self.headers or {}), **relayed}

    def _stream_inputs(self, text: str, options: protocol.SynthesisOptions) -> list:
        if self.endpoint.protocol != "grpc":
            raise TTSError("streaming needs a grpc:// URL (Triton streams over gRPC only)")
        return protocol.build_inputs(self._module, text, options, batched=False)

    def _read_config(self, config: dict) -> int:
        """Keeps what the client needs of the model's config; returns its sample rate."""
        self._max_characters = protocol.max_characters_from_config(config)
        self._sample_rate = protocol.sample_rate_from_config(config)
        return self._sample_rate

    def _streams_at_once(self, text: str) -> bool:
        """True when ``text`` is longer than the server says one request takes and can be
        streamed (gRPC): the text goes once, to the stream, not first to a refusal. (A text
        within it can still be refused for its phonemes; ``_streams_instead`` takes that.)"""
        limit = self._max_characters
        return limit is not None and len(text) > limit and self.endpoint.protocol == "grpc"

    def _streams_instead(self, error: TTSError, options: protocol.SynthesisOptions) -> bool:
        """After ``tts`` refused a text: True when it is too long and can be streamed instead
        (over gRPC); raises ``error`` (or why it cannot be streamed) otherwise."""
        if not protocol.is_text_too_long(error):
            raise error
        if self.endpoint.protocol != "grpc":
            raise InvalidInput(f"{error}; over HTTP, split the text yourself")
        return True

    @property
    def url(self) -> str:
        return f"{self.endpoint.protocol}://{self.endpoint.address}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url})"
