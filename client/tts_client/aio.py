"""asyncio client: ``async with AsyncTTSClient(url) as c: audio = await c.synthesize(text)``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from . import protocol
from .audio import Audio, AudioChunk, join_chunks
from .core import DEFAULT_MODEL, DEFAULT_STREAM_MODEL, ClientCore
from .errors import InvalidInput, ServerUnavailable, TTSError
from .session import BufferRule, SpeechSession

if TYPE_CHECKING:  # (annotations only: typing.Unpack is Python 3.11+, the client runs on 3.10)
    from typing_extensions import Unpack


async def _stream_ends(responses) -> bool:
    """After a stream error, wait (bounded) for the server to end the stream: cancelling it
    while Triton 2.51 completed the stream once crashed the server (segfault)."""

    async def drain() -> None:
        async for _ in responses:
            pass

    try:
        await asyncio.wait_for(drain(), protocol.END_AFTER_ERROR_S)
        return True
    except Exception:  # timed out, or the stream broke: cancel it
        return False


class AsyncTTSClient(ClientCore):
    """The asyncio twin of :class:`TTSClient`, over tritonclient's aio clients."""

    def __init__(
        self,
        url: str = "grpc://localhost:8001",
        model: str = DEFAULT_MODEL,
        timeout: float = 120.0,
        stream_model: str = DEFAULT_STREAM_MODEL,
        retry: protocol.RetryPolicy | None = None,
        priority: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(url, model, timeout, stream_model, retry, priority, headers)
        if self.endpoint.protocol == "grpc":
            import tritonclient.grpc.aio as aio

            self._client = aio.InferenceServerClient(self.endpoint.address)
        else:
            import tritonclient.http.aio as aio

            self._client = aio.InferenceServerClient(self.endpoint.address, conn_timeout=timeout)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncTTSClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def is_ready(self) -> bool:
        """True when the server and both models (``model`` and ``stream_model``) are ready."""
        try:
            return bool(
                await self._client.is_server_ready()
                and await self._client.is_model_ready(self.model)
                and await self._client.is_model_ready(self.stream_model)
            )
        except Exception:
            return False

    async def _error(self, exc: BaseException) -> TTSError:
        code = protocol.error_code(exc)
        alive = True
        if code in (protocol.UNAVAILABLE, protocol.RESOURCE_EXHAUSTED):
            try:
                alive = bool(await self._client.is_server_live())
            except Exception:
                alive = False
        return protocol.map_exception(exc, server_alive=alive, url=self.url)

    async def sample_rate(self) -> int:
        if self._sample_rate is None:
            try:
                if self.endpoint.protocol == "grpc":
                    config = await self._client.get_model_config(self.model, as_json=True)
                else:
                    config = await self._client.get_model_config(self.model)
            except Exception as e:
                raise await self._error(e) from None
            return self._read_config(config)
        return self._sample_rate

    async def synthesize(
        self,
        text: str,
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> Audio:
        """Speak ``text`` (the keywords, or ``options=SynthesisOptions(...)``); over gRPC, text
        too long for one request is streamed and joined."""
        opts = protocol.options(options, **keywords)
        return await self._synthesize(text, opts)

    async def _synthesize(self, text: str, options: protocol.SynthesisOptions) -> Audio:
        rate = await self.sample_rate()
        if self._streams_at_once(text):
            return join_chunks([c async for c in self._stream(text, options)], rate)
        call = self._infer_call(text, options)

        async def infer():
            try:
                return await self._client.infer(call.model, call.inputs, **call.kwargs)
            except Exception as e:
                raise await self._error(e) from None

        try:
            result = await protocol.acall_with_retries(infer, self.retry)
        except TTSError as error:
            if self._streams_instead(error, options):
                return join_chunks([c async for c in self._stream(text, options)], rate)
        return protocol.audio_from_result(
            result, rate, text if options.word_timestamps else None, document=text
        )

    def stream(
        self,
        text: str,
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> AsyncIterator[AudioChunk]:
        """Yield :class:`AudioChunk`s in order as the server makes them (gRPC).

        Leaving the ``async for`` early (or cancelling the task) cancels the server's work.
        """
        opts = protocol.options(options, **keywords)
        return self._stream(text, opts)

    async def _stream(
        self, text: str, options: protocol.SynthesisOptions
    ) -> AsyncIterator[AudioChunk]:
        inputs = self._stream_inputs(text, options)
        rate = await self.sample_rate()

        async def requests():
            # No `triton_*` parameters: tritonclient >= 2.5x refuses them in a request, and
            # tts_stream sends its final flag with the last chunk or the error anyway.
            yield {"model_name": self.stream_model, "inputs": inputs}

        responses = self._client.stream_infer(requests(), headers=self.headers_for(options))
        reader = protocol.StreamReader(rate, text if options.word_timestamps else None, text)
        try:
            while not reader.finished:
                result, error = await self._next_response(responses)
                if error is not None:
                    failure = await self._error(error)
                    reader.finished = await _stream_ends(responses)
                    raise failure
                if (chunk := reader.read(result)) is not None:
                    yield chunk
        except Exception as e:  # (a TTSError comes back from _error as it is)
            raise await self._error(e) from None
        finally:
            if not reader.finished:
                responses.cancel()

    async def _next_response(self, responses) -> tuple:
        try:
            return await asyncio.wait_for(anext(responses), self.timeout)
        except StopAsyncIteration:
            raise ServerUnavailable("the stream ended without its final response") from None
        except asyncio.TimeoutError:
            raise ServerUnavailable(f"no audio from the server in {self.timeout} s") from None

    async def synthesize_many(
        self,
        texts: Sequence[str],
        options: protocol.SynthesisOptions | None = None,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> list[Audio]:
        """All texts concurrently (the server batches them); results in input order."""
        if isinstance(texts, str):
            raise InvalidInput("synthesize_many takes a list of texts; use synthesize for one")
        opts = protocol.options(options, **keywords)
        return list(await asyncio.gather(*(self._synthesize(t, opts) for t in texts)))

    def session(
        self,
        options: protocol.SynthesisOptions | None = None,
        *,
        rule: BufferRule | None = None,
        ahead: int = 2,
        **keywords: Unpack[protocol.OptionKeywords],
    ) -> SpeechSession:
        """A voice-agent session: ``send`` text as it is written, iterate the audio in order
        (:class:`AudioChunk` s whose words are timed from the session's start). Each piece the
        ``rule`` releases is one ``tts`` request, batched with everyone else's; at most
        ``ahead`` are in flight or unread. Use it as ``async with client.session(...) as s``.
        """
        opts = protocol.options(options, **keywords)
        return SpeechSession(lambda text: self._synthesize(text, opts), rule, ahead)
