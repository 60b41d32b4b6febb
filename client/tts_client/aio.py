"""asyncio client: ``async with AsyncTTSClient(url) as c: audio = await c.synthesize(text)``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .audio import Audio
from .client import (
    DEFAULT_MODEL,
    Endpoint,
    audio_from_result,
    build_inputs,
    sample_rate_from_config,
)
from .errors import map_exception


class AsyncTTSClient:
    """The asyncio twin of :class:`TTSClient`, over tritonclient's aio clients."""

    def __init__(
        self, url: str = "grpc://localhost:8001", model: str = DEFAULT_MODEL, timeout: float = 120.0
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self.model = model
        self.timeout = timeout
        self._sample_rate: int | None = None
        if self.endpoint.protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio
        else:
            import tritonclient.http as module
            import tritonclient.http.aio as aio
        self._module = module
        self._client = aio.InferenceServerClient(self.endpoint.address)

    async def close(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> AsyncTTSClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def sample_rate(self) -> int:
        if self._sample_rate is None:
            try:
                if self.endpoint.protocol == "grpc":
                    config = await self._client.get_model_config(self.model, as_json=True)
                else:
                    config = await self._client.get_model_config(self.model)
            except Exception as e:
                raise map_exception(e) from None
            self._sample_rate = sample_rate_from_config(config)
        return self._sample_rate

    async def synthesize(
        self,
        text: str,
        speed: float = 1.0,
        noise_scale: float | None = None,
        noise_w: float | None = None,
    ) -> Audio:
        rate = await self.sample_rate()
        inputs = build_inputs(self._module, text, speed, noise_scale, noise_w)
        try:
            if self.endpoint.protocol == "grpc":
                result = await self._client.infer(self.model, inputs, client_timeout=self.timeout)
            else:
                result = await self._client.infer(self.model, inputs, timeout=int(self.timeout))
        except Exception as e:
            raise map_exception(e) from None
        return audio_from_result(result, rate)

    async def synthesize_many(self, texts: Sequence[str], speed: float = 1.0) -> list[Audio]:
        """All texts concurrently (the server batches them); results in input order."""
        return list(await asyncio.gather(*(self.synthesize(t, speed) for t in texts)))
