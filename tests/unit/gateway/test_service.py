"""The speech service's time limits over a real uvicorn (tts_gateway/service.py): a long
stream is never cut for its length, and a stream that stops making progress is cut with one
clear log line (the planned cut, not a traceback)."""

from __future__ import annotations

import asyncio
import logging

import httpx2 as httpx
import pytest

from tests.support.fake_backend import RATE, FakeBackend, served, tone
from tts_client.audio import AudioChunk
from tts_gateway.__main__ import PlannedCuts
from tts_gateway.app import create_app
from tts_gateway.settings import GatewaySettings

SENTENCES = ". ".join(f"Sentence number {k} of a long text" for k in range(12)) + "."


class Stalls(FakeBackend):
    """Streams two chunks at once, then makes no more progress."""

    async def stream(self, text, *, options):
        for index, part in enumerate(text.split(". ")[:2]):
            yield AudioChunk(tone(0.1 * len(part)), RATE, part, index)
        await asyncio.sleep(3600)


def post(base: str, text: str, **body) -> httpx.Response:
    request = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    return httpx.post(f"{base}/v1/audio/speech", json={**request, **body}, timeout=60)


def test_a_stream_longer_than_the_request_timeout_arrives_whole():
    """Twelve chunks of 0.15 s each: 1.8 s of work against a 0.5 s request timeout, which
    holds for each piece of progress, not for the whole answer."""
    settings = GatewaySettings(request_timeout_s=0.5, direct_max_chars=20, check_voices=False)
    app = PlannedCuts(create_app(settings, lambda _s: FakeBackend(delay=0.15)))
    with served(app) as base:
        answer = post(base, SENTENCES)
    assert answer.status_code == 200
    pieces = SENTENCES.split(". ")
    expected = sum(int(0.1 * len(p) * RATE) for p in pieces)  # each piece's tone, at 22.05 kHz
    assert len(answer.content) // 2 == pytest.approx(expected * 24000 / RATE, rel=0.01)


def test_a_stream_that_stops_is_cut_with_one_line_and_no_traceback(caplog):
    settings = GatewaySettings(request_timeout_s=0.5, direct_max_chars=20, check_voices=False)
    app = PlannedCuts(create_app(settings, lambda _s: Stalls()))
    logging.getLogger("uvicorn.error").addFilter(PlannedCuts.quiet)
    try:
        with caplog.at_level(logging.INFO), served(app) as base:
            with pytest.raises(httpx.RemoteProtocolError):  # cut: never ended as if complete
                post(base, SENTENCES)
            sse = post(base, SENTENCES, stream_format="sse")
    finally:
        logging.getLogger("uvicorn.error").removeFilter(PlannedCuts.quiet)
    assert (
        sse.status_code == 200
        and '"type": "error"' in sse.text
        and "--request-timeout-s" in sse.text
    )
    cuts = [r for r in caplog.records if "stream cut" in r.getMessage()]
    assert len(cuts) == 2 and all(r.levelno == logging.WARNING for r in cuts)
    assert "--request-timeout-s" in cuts[0].getMessage()
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]
