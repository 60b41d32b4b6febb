"""A stand-in for the gateway's Triton client: the real app in front of tones, no server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import astuple

import numpy as np
import uvicorn
from starlette.testclient import TestClient

from tts_client.audio import Audio, AudioChunk
from tts_gateway.app import create_app
from tts_gateway.settings import GatewaySettings

RATE = 22050


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


class FakeBackend:
    """Speaks a tone of 0.1 s per character; ``fail`` raises before or after the first chunk."""

    def __init__(self, fail: Exception | None = None, fail_after: int | None = None, delay=0.0):
        self.fail = fail
        self.fail_after = fail_after
        self.delay = delay
        self.calls: list[tuple] = []
        self.options: list = []  # each call's SynthesisOptions, in order

    async def sample_rate(self) -> int:
        return RATE

    async def synthesize(self, text, *, options) -> Audio:
        speed = options.speed
        self.calls.append(("synthesize", text, *astuple(options)[:3], options.voice))
        self.options.append(options)
        await asyncio.sleep(self.delay)
        if self.fail and self.fail_after is None:
            raise self.fail
        return Audio(tone(0.1 * len(text) / speed), RATE)

    async def stream(self, text, *, options):
        speed = options.speed
        self.calls.append(("stream", text, *astuple(options)[:3], options.voice))
        self.options.append(options)
        for index, part in enumerate(text.split(". ")):
            await asyncio.sleep(self.delay)
            if self.fail and index == (self.fail_after or 0):
                raise self.fail
            yield AudioChunk(tone(0.1 * len(part) / speed), RATE, part, index)

    async def is_ready(self) -> bool:
        return True

    async def close(self) -> None:
        pass


def client_for(backend: FakeBackend, **settings) -> TestClient:
    app = create_app(GatewaySettings(**settings), lambda _settings: backend)
    return TestClient(app)


def speech(client: TestClient, **body):
    full = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", **body}
    return client.post("/v1/audio/speech", json=full)


@contextlib.contextmanager
def served(app, config: uvicorn.Config | None = None) -> Iterator[str]:
    """``app`` under a real uvicorn (``config``'s settings) on a free loopback port: its base
    URL. (Starlette's
    TestClient hands messages over in-process and hides races of the socket and what uvicorn
    does with an answer cut mid-body.)"""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    if config is None:
        config = uvicorn.Config(app, host="127.0.0.1", log_level="warning")
    config.host, config.port = "127.0.0.1", port
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
