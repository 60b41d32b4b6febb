"""Synchronous client: ``TTSClient("grpc://localhost:8001").synthesize("Hello")``."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from . import protocol
from .audio import Audio, AudioChunk, join_chunks
from .core import DEFAULT_MODEL, DEFAULT_STREAM_MODEL, ClientCore, Endpoint
from .errors import InvalidInput, ServerUnavailable, TTSError

if TYPE_CHECKING:  # (annotations only: typing.Unpack is Python 3.11+, the client runs on 3.10)
    from typing_extensions import Unpack


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


class TTSClient(ClientCore):
    """Text to speech over Triton; the URL scheme picks gRPC or HTTP.

    Thread-safe; use as a context manager to close connections.
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
        headers: dict[str, str] | None = None,
    ) -> None:
        """``retry``: how ``synthesize`` retries a request refused for overload (default 3
        retries with jittered exponential backoff; ``protocol.NO_RETRY`` never retries).
        ``concurrency``: requests in flight at once from one thread over HTTP (its connection
        pool) and the threads ``synthesize_many`` uses over gRPC."""
        super().__init__(url, model, timeout, stream_model, retry, priority, headers)
        self.concurrency = concurrency
        self._shared = None
        self._local = threading.local()
        self._opened: weakref.WeakSet = weakref.WeakSet()
        self._opened_lock = threading.Lock()
        if self.endpoint.protocol == "grpc":
            self._shared = self._connect()
        else:
            self._client  # noqa: B018 (connect now, so that a bad address fails here)

    def _connect(self):
        try:
            if self.endpoint.protocol == "grpc":
                return self._module.InferenceServerClient(self.endpoint.address)
            return self._module.InferenceServerClient(
                self.endpoint.address,
                concurrency=self.concurrency,
                connection_timeout=self.timeout,
                network_timeout=self.timeout,
            )
        except Exception as e:
            raise protocol.map_exception(e, server_alive=False, url=self.url) from None

    @property
    def _client(self):
        """The transport for the calling thread. tritonclient's gRPC client is thread-safe and
        shared; its HTTP client is not (one object, one thread: shared, threads deadlock on its
        gevent connection pool), so each thread gets its own."""
        if self._shared is not None:
            return self._shared
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._connect()
            with self._opened_lock:
                self._opened.add(client)
        return client

    @_client.setter
    def _client(self, transport) -> None:
        """One transport for every thread (the unit tests' fakes)."""
        self._shared = transport

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
        with self._opened_lock:
            opened = list(self._opened)
        for client in opened:
            client.close()

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
        return protocol.map_exception(exc, server_alive=alive, url=self.url)

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
            return self._read_config(config)
        return self._sample_rate

    # -- synthesis -------------------------------------------------------------------------
    def synthesize(
        self,
        text: str,
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> Audio:
        """Speak ``text``; ``speed`` 2.0 is twice as fast. Noise 0 makes output repeatable.

        ``normalize``: write out numbers, dates... first (None: the server's default). The
        keywords or one ``options=SynthesisOptions(...)`` (which can also set the priority).
        Over gRPC, text the server says is too long for one request is streamed and joined.
        """
        opts = protocol.options(options, **keywords)
        return self._synthesize(text, opts)

    def _synthesize(self, text: str, options: protocol.SynthesisOptions) -> Audio:
        rate = self.sample_rate
        if self._streams_at_once(text):
            return join_chunks(list(self._stream(text, options)), rate)
        call = self._infer_call(text, options)

        def infer():
            try:
                return self._client.infer(call.model, call.inputs, **call.kwargs)
            except Exception as e:
                raise self._error(e) from None

        try:
            result = protocol.call_with_retries(infer, self.retry)
        except TTSError as error:
            if self._streams_instead(error, options):
                return join_chunks(list(self._stream(text, options)), rate)
        return protocol.audio_from_result(
            result, rate, text if options.word_timestamps else None, document=text
        )

    def stream(
        self,
        text: str,
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> Iterator[AudioChunk]:
        """Yield the audio of ``text`` chunk by chunk, in order, as the server makes it (gRPC).

        Each :class:`AudioChunk` holds its samples and the text it speaks. Stopping the
        iteration early cancels the request on the server.
        """
        opts = protocol.options(options, **keywords)
        return self._stream(text, opts)

    def _stream(self, text: str, options: protocol.SynthesisOptions) -> Iterator[AudioChunk]:
        inputs = self._stream_inputs(text, options)
        rate = self.sample_rate
        results: queue.Queue = queue.Queue()
        client = self._module.InferenceServerClient(self.endpoint.address)  # one stream each
        reader = protocol.StreamReader(rate, text if options.word_timestamps else None, text)
        try:
            client.start_stream(
                callback=lambda result, error: results.put((result, error)),
                headers=self.headers_for(options),
            )
            client.async_stream_infer(self.stream_model, inputs, enable_empty_final_response=True)
            while not reader.finished:
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
                    follows = protocol.final_follows(error)
                    reader.finished = _final_arrives(results) if follows else True
                    raise failure
                if (chunk := reader.read(result)) is not None:
                    yield chunk
        except Exception as e:  # (a TTSError comes back from _error as it is)
            raise self._error(e) from None
        finally:
            try:
                client.stop_stream(cancel_requests=not reader.finished)
            finally:
                client.close()

    def synthesize_many(
        self,
        texts: Sequence[str],
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> list[Audio]:
        """Send all texts at once so the server batches them; results in input order.

        Raises the first error (in input order) if any text fails.
        """
        if isinstance(texts, str):
            raise InvalidInput("synthesize_many takes a list of texts; use synthesize for one")
        opts = protocol.options(options, **keywords)
        rate = self.sample_rate
        if self.endpoint.protocol == "http":
            try:
                calls = [self._infer_call(t, opts) for t in texts]
                pending = [self._client.async_infer(c.model, c.inputs, **c.kwargs) for c in calls]
            except TTSError:
                raise
            except Exception as e:
                raise self._error(e) from None
            results: list[Audio] = []
            for t, p in zip(texts, pending):
                try:
                    said = t if opts.word_timestamps else None
                    results.append(
                        protocol.audio_from_result(p.get_result(), rate, said, document=t)
                    )
                except Exception as e:
                    raise self._error(e) from None
            return results
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(texts)))) as pool:
            futures = [pool.submit(self._synthesize, t, opts) for t in texts]
            return [f.result() for f in futures]


__all__ = ["Endpoint", "TTSClient"]
