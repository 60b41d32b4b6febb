"""Synchronous client: ``TTSClient("grpc://localhost:8001").synthesize("Hello")``."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from . import protocol
from .audio import Audio, AudioChunk, join_chunks
from .errors import InvalidInput, ServerUnavailable, TTSError

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


def _final_arrives(results: queue.Queue) -> bool:
    """After a stream error, wait (bounded) for the final flag the server sends next."""
    deadline = time.monotonic() + protocol.END_AFTER_ERROR_S
    while (left := deadline - time.monotonic()) > 0:
        try:
            result, _ = results.get(timeout=left)
        except queue.Empty:
            return False
        if result is not None and protocol.is_final(result):
            return True
    return False


class TTSClient:
    """Text to speech over Triton; the URL scheme picks gRPC or HTTP.

    Thread-safe for ``synthesize``; use as a context manager to close connections.
    """

    def __init__(
        self,
        url: str = "grpc://localhost:8001",
        model: str = DEFAULT_MODEL,
        timeout: float = 120.0,
        concurrency: int = 16,
        stream_model: str = DEFAULT_STREAM_MODEL,
        retry: protocol.RetryPolicy | None = None,
        priority: int = 0,
    ) -> None:
        """``retry``: how ``synthesize`` retries a request refused for overload (default 3
        retries with jittered exponential backoff; ``protocol.NO_RETRY`` never retries)."""
        self.endpoint = Endpoint.parse(url)
        self.model = model
        self.stream_model = stream_model
        self.timeout = timeout
        self.concurrency = concurrency
        self.retry = retry or protocol.RetryPolicy()
        # Triton's dynamic-batcher priority for `tts` requests: 1 = interactive (served first),
        # 2 = bulk; 0 = the models' default level (2). Streams carry none (see README).
        self.priority = protocol.check_priority(priority)
        self._sample_rate: int | None = None
        try:
            if self.endpoint.protocol == "grpc":
                import tritonclient.grpc as module

                self._client = module.InferenceServerClient(self.endpoint.address)
            else:
                import tritonclient.http as module

                self._client = module.InferenceServerClient(
                    self.endpoint.address,
                    concurrency=concurrency,
                    connection_timeout=timeout,
                    network_timeout=timeout,
                )
        except Exception as e:
            raise protocol.map_exception(e, server_alive=False) from None
        self._module = module

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TTSClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def is_ready(self) -> bool:
        """True when the server and the model are ready to serve."""
        try:
            return bool(self._client.is_server_ready() and self._client.is_model_ready(self.model))
        except Exception:
            return False

    def _is_live(self) -> bool:
        try:
            return bool(self._client.is_server_live())
        except Exception:
            return False

    def _error(self, exc: BaseException) -> TTSError:
        """The client's exception for ``exc``; UNAVAILABLE is told apart by asking the server."""
        code = protocol.error_code(exc)
        alive = code not in (protocol.UNAVAILABLE, protocol.RESOURCE_EXHAUSTED) or self._is_live()
        return protocol.map_exception(exc, server_alive=alive)

    @property
    def sample_rate(self) -> int:
        """Read once from the model's config, so no client hard-codes it."""
        if self._sample_rate is None:
            try:
                if self.endpoint.protocol == "grpc":
                    config = self._client.get_model_config(self.model, as_json=True)
                else:
                    config = self._client.get_model_config(self.model)
            except Exception as e:
                raise self._error(e) from None
            self._sample_rate = protocol.sample_rate_from_config(config)
        return self._sample_rate

    # -- synthesis -------------------------------------------------------------------------
    def synthesize(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> Audio:
        """Speak ``text``; ``speed`` 2.0 is twice as fast. Noise 0 makes output repeatable.

        ``normalize``: write out numbers, dates... first (None: the server's default). Over
        gRPC, text the server says is too long for one request is streamed and joined.
        """
        rate = self.sample_rate
        inputs = protocol.build_inputs(
            self._module, text, speed, noise_scale, noise_w, normalize, voice=voice
        )

        def infer():
            try:
                if self.endpoint.protocol == "grpc":
                    return self._client.infer(
                        self.model, inputs, client_timeout=self.timeout, priority=self.priority
                    )
                return self._client.infer(self.model, inputs, priority=self.priority)
            except Exception as e:
                raise self._error(e) from None

        try:
            result = protocol.call_with_retries(infer, self.retry)
        except TTSError as error:
            if protocol.is_text_too_long(error):
                if self.endpoint.protocol == "grpc":
                    chunks = list(self.stream(text, speed, noise_scale, noise_w, normalize, voice))
                    return join_chunks(chunks, rate)
                raise InvalidInput(f"{error}; over HTTP, split the text yourself") from None
            raise error from None
        return protocol.audio_from_result(result, rate)

    def stream(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> Iterator[AudioChunk]:
        """Yield the audio of ``text`` chunk by chunk, in order, as the server makes it (gRPC).

        Each :class:`AudioChunk` holds its samples and the text it speaks. Stopping the
        iteration early cancels the request on the server.
        """
        if self.endpoint.protocol != "grpc":
            raise TTSError("streaming needs a grpc:// URL (Triton streams over gRPC only)")
        import tritonclient.grpc as grpcclient

        rate = self.sample_rate
        inputs = protocol.build_inputs(
            grpcclient, text, speed, noise_scale, noise_w, normalize, batched=False, voice=voice
        )
        results: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(self.endpoint.address)  # one stream each
        reader = protocol.StreamReader(rate)
        try:
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            client.async_stream_infer(self.stream_model, inputs, enable_empty_final_response=True)
            while True:
                try:
                    result, error = results.get(timeout=self.timeout)
                except queue.Empty:
                    raise ServerUnavailable(
                        f"no audio from the server in {self.timeout} s"
                    ) from None
                if error is not None:
                    # The final comes after the error (the stream was asked for empty finals):
                    # let the stream end, since cancelling while Triton 2.51 completed it once
                    # crashed the server (segfault).
                    failure = self._error(error)
                    reader.finished = (
                        _final_arrives(results) if protocol.final_follows(error) else True
                    )
                    raise failure
                chunk = reader.read(result)
                if chunk is not None:
                    yield chunk
                if reader.finished:
                    return
        except TTSError:
            raise
        except Exception as e:
            raise self._error(e) from None
        finally:
            try:
                client.stop_stream(cancel_requests=not reader.finished)
            finally:
                client.close()

    def synthesize_many(
        self,
        texts: Sequence[str],
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> list[Audio]:
        """Send all texts at once so the server batches them; results in input order.

        Raises the first error (in input order) if any text fails.
        """
        if isinstance(texts, str):
            raise InvalidInput("synthesize_many takes a list of texts; use synthesize for one")
        rate = self.sample_rate
        if self.endpoint.protocol == "http":
            try:
                pending = [
                    self._client.async_infer(
                        self.model,
                        protocol.build_inputs(
                            self._module, t, speed, noise_scale, noise_w, normalize, voice=voice
                        ),
                        priority=self.priority,
                    )
                    for t in texts
                ]
            except TTSError:
                raise
            except Exception as e:
                raise self._error(e) from None
            results: list[Audio] = []
            for p in pending:
                try:
                    results.append(protocol.audio_from_result(p.get_result(), rate))
                except Exception as e:
                    raise self._error(e) from None
            return results
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(texts)))) as pool:
            futures = [
                pool.submit(self.synthesize, t, speed, noise_scale, noise_w, normalize, voice)
                for t in texts
            ]
            return [f.result() for f in futures]

    def __repr__(self) -> str:
        return (
            f"TTSClient({self.endpoint.protocol}://{self.endpoint.address}, model={self.model!r})"
        )


__all__ = ["Endpoint", "TTSClient"]
