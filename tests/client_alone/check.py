"""Run by tests/integration/test_client_alone.py in a venv holding only ./client (its tts_wire
included) and the newest tritonclient: ``python check.py GRPC_URL HTTP_URL`` prints one line
per check."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import version

from tts_client import AsyncTTSClient, InvalidInput, TTSClient

LONG = "This sentence is spoken as one chunk of a stream. " * 6


def sync_checks(grpc_url: str, http_url: str) -> None:
    for url in (grpc_url, http_url):
        with TTSClient(url, priority=1) as client:
            assert client.synthesize("Hello from the client alone.").duration > 0.5
    with TTSClient(grpc_url) as client:
        chunks = list(client.stream(LONG))
        assert len(chunks) >= 2 and chunks[-1].index == len(chunks) - 1, len(chunks)
        try:
            list(client.stream("   "))
            raise AssertionError("an empty text streamed")
        except InvalidInput as e:
            assert "empty" in str(e), e
    print("sync: synthesize over gRPC and HTTP, stream, stream error: ok", flush=True)


async def async_checks(grpc_url: str, http_url: str) -> None:
    async with AsyncTTSClient(http_url, priority=1) as client:
        assert (await client.synthesize("Hello over HTTP.")).duration > 0.5
    async with AsyncTTSClient(grpc_url) as client:
        chunks = [c async for c in client.stream(LONG)]
        assert len(chunks) >= 2, len(chunks)
        long = await client.synthesize("A long text is streamed and joined. " * 60)
        assert long.duration > 20, long.duration
        try:
            [c async for c in client.stream("   ")]
            raise AssertionError("an empty text streamed")
        except InvalidInput as e:
            assert "empty" in str(e), e
    print("async: synthesize over HTTP, stream, long text, stream error: ok", flush=True)


if __name__ == "__main__":
    print(f"tritonclient {version('tritonclient')}", flush=True)
    sync_checks(sys.argv[1], sys.argv[2])
    asyncio.run(async_checks(sys.argv[1], sys.argv[2]))
