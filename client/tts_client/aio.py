"""asyncio client: ``async with AsyncTTSClient(url) as c: audio = await c.synthesize(text)``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from . import protocol
from .audio import Audio, AudioChunk, join_chunks
from .client import DEFAULT_MODEL, DEFAULT_STREAM_MODEL, Endpoint
from .errors import InvalidInput, ServerUnavailable, TTSError


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


class AsyncTTSClient:
    """The asyncio twin of :class:`TTSClient`, over tritonclient's aio clients."""

    def __init__(
        self,
        url: str = "grpc://localhost:8001",
        model: str = DEFAULT_MODEL,
        timeout: float = 120.0,
        stream_model: str = DEFAULT_STREAM_MODEL,
        retry: protocol.RetryPolicy | None = None,
        priority: int = 0,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self.model = model
        self.stream_model = stream_model
        self.timeout = timeout
        self.retry = retry or protocol.RetryPolicy()
        # Triton's dynamic-batcher priority for `tts` requests: 1 = interactive (served first),
        # 2 = bulk; 0 = the models' default level (2). Streams carry none (see README).
        self.priority = protocol.check_priority(priority)
        self._sample_rate: int | None = None
        if self.endpoint.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module
            import tritonclient.http.aio as aio
        self._module = module
        if self.endpoint.protocol == "grpc":
            self._client = aio.InferenceServerClient(self.endpoint.address)
        else:
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
        return protocol.map_exception(exc, server_alive=alive)

    async def sample_rate(self) -> int:
        if self._sample_rate is None:
            try:
                if self.endpoint.protocol == "grpc":
                    config = await self._client.get_model_config(self.model, as_json=True)
                else:
                    config = await self._client.get_model_config(self.model)
            except Exception as e:
                raise await self._error(e) from None
            self._sample_rate = protocol.sample_rate_from_config(config)
        return self._sample_rate

    async def synthesize(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> Audio:
        """Speak ``text``; over gRPC, text too long for one request is streamed and joined."""
        rate = await self.sample_rate()
        inputs = protocol.build_inputs(
            self._module, text, speed, noise_scale, noise_w, normalize, voice=voice
        )

        async def infer():
            try:
                if self.endpoint.protocol == "grpc":
                    return await self._client.infer(
                        self.model, inputs, client_timeout=self.timeout, priority=self.priority
                    )
                # (infer's `timeout` is Triton's queue timeout in microseconds, not seconds.)
                return await self._client.infer(self.model, inputs, priority=self.priority)
            except Exception as e:
                raise await self._error(e) from None

        try:
            result = await protocol.acall_with_retries(infer, self.retry)
        except TTSError as error:
            if protocol.is_text_too_long(error):
                if self.endpoint.protocol == "grpc":
                    chunks = [
                        c
                        async for c in self.stream(
                            text, speed, noise_scale, noise_w, normalize, voice
                        )
                    ]
                    return join_chunks(chunks, rate)
                raise InvalidInput(f"{error}; over HTTP, split the text yourself") from None
            raise error from None
        return protocol.audio_from_result(result, rate)

    async def stream(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> AsyncIterator[AudioChunk]:
        """Yield :class:`AudioChunk`s in order as the server makes them (gRPC).

        Leaving the ``async for`` early (or cancelling the task) cancels the server's work.
        """
        if self.endpoint.protocol != "grpc":
            raise TTSError("streaming needs a grpc:// URL (Triton streams over gRPC only)")
        rate = await self.sample_rate()
        inputs = protocol.build_inputs(
            self._module, text, speed, noise_scale, noise_w, normalize, batched=False, voice=voice
        )

        async def requests():
            # No `triton_*` parameters: tritonclient >= 2.5x refuses them in a request, and
            # tts_stream sends its final flag with the last chunk or the error anyway.
            yield {"model_name": self.stream_model, "inputs": inputs}

        responses = self._client.stream_infer(requests())
        reader = protocol.StreamReader(rate)
        try:
            while True:
                try:
                    result, error = await asyncio.wait_for(anext(responses), self.timeout)
                except StopAsyncIteration:
                    raise ServerUnavailable("the stream ended without its final response") from None
                except asyncio.TimeoutError:
                    raise ServerUnavailable(
                        f"no audio from the server in {self.timeout} s"
                    ) from None
                if error is not None:
                    failure = await self._error(error)
                    reader.finished = await _stream_ends(responses)
                    raise failure
                chunk = reader.read(result)
                if chunk is not None:
                    yield chunk
                if reader.finished:
                    return
        except TTSError:
            raise
        except Exception as e:
            raise await self._error(e) from None
        finally:
            if not reader.finished:
                responses.cancel()

    async def synthesize_many(
        self,
        texts: Sequence[str],
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        normalize: bool | None = None,
        voice: str | None = None,
    ) -> list[Audio]:
        """All texts concurrently (the server batches them); results in input order."""
        if isinstance(texts, str):
            raise InvalidInput("synthesize_many takes a list of texts; use synthesize for one")
        return list(
            await asyncio.gather(
                *(self.synthesize(t, speed, noise_scale, noise_w, normalize, voice) for t in texts)
            )
        )
