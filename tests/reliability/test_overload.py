"""Overload is shed at once with a clear error (full queue, queue timeout, too many streams),
and the server keeps serving."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.paths import ROOT
from tests.support.processes import ServerProcess, linked_copy
from tts_client import ServerOverloaded, TTSClient
from tts_client.protocol import NO_RETRY
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_wire import SHORT_TEXT_CHARS


def edited_server(exported_repository, tmp_path_factory, edits: dict[str, list[tuple]]):
    """The same models (ONNX files linked, not copied) with config edits: model -> [(re, new)]."""
    repo = linked_copy(exported_repository, tmp_path_factory.mktemp("repo"))
    for model, changes in edits.items():
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        for pattern, new in changes:
            text, n = re.subn(pattern, new, text)
            assert n == 1, (model, pattern)
        config.write_text(text)
    return ServerProcess(repo, repo / "triton.log", cache_dir=ROOT / ".cache" / "triton")


@pytest.fixture(scope="module")
def small_queue_server(exported_repository, tmp_path_factory):
    """The vocoder's queue capped at 1 request, and at most one stream at a time."""
    streams = r'"max_streams", value: \{ string_value: "\d+"'
    edits = {
        "vocoder": [
            (
                r'"max_queue_size", value: \{ string_value: "\d+"',
                '"max_queue_size", value: { string_value: "1"',
            )
        ],
        "tts_stream": [(streams, '"max_streams", value: { string_value: "1"')],
    }
    with edited_server(exported_repository, tmp_path_factory, edits) as srv:
        yield srv


def outcomes_of(client: TTSClient, n: int) -> tuple[list, list[str]]:
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(client.synthesize, SENTENCES[i % 16]) for i in range(n)]
    outcomes, messages = [], []
    for f in futures:
        try:
            outcomes.append(f.result().duration > 0)
        except ServerOverloaded as e:
            outcomes.append("overloaded")
            messages.append(str(e))
    return outcomes, messages


def test_full_queue_is_a_clear_overload_error(small_queue_server):
    # No retries: this test looks at the refusals themselves.
    with TTSClient(small_queue_server.grpc_url, concurrency=32, retry=NO_RETRY) as client:
        outcomes, messages = outcomes_of(client, 32)
        assert "overloaded" in outcomes and True in outcomes
        assert all("queue" in m.lower() for m in messages), messages
        print(f"\n{outcomes.count('overloaded')} of 32 rejected: {messages[0]}")
        assert client.synthesize("Still serving.").duration > 0.3


def test_one_stream_too_many_is_refused_at_once(small_queue_server):
    """max_streams counts long texts' streams (a short text's is admitted as `tts` is)."""
    long = PARAGRAPH[:400]
    assert len(long) > SHORT_TEXT_CHARS
    with TTSClient(small_queue_server.grpc_url) as client:
        running = client.stream(PARAGRAPH * 10)
        assert next(running).index == 0  # the one allowed stream is running
        with pytest.raises(ServerOverloaded, match="1 long-text streams are running"):
            next(iter(client.stream(long)))
        running.close()  # cancels it; the slot frees once the server has stopped it
        for _ in range(60):
            try:
                assert next(iter(client.stream(long))).duration > 0.3
                break
            except ServerOverloaded:
                time.sleep(0.5)
        else:
            pytest.fail("the stream slot was never freed after cancelling")


async def timed_post(client, url: str, i: int) -> tuple[int | str, float]:
    """The gateway's answer to speech request ``i`` (a sentence), or the error's name (lost),
    and the seconds it took."""
    import httpx2 as httpx

    text = SENTENCES[i % len(SENTENCES)]
    body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": "pcm"}
    start = time.perf_counter()
    try:
        response = await client.post(url, json=body)
        return response.status_code, time.perf_counter() - start
    except httpx.HTTPError as e:  # lost: the test fails on it
        return type(e).__name__, time.perf_counter() - start


async def closed_loop_capacity(client, url: str, limit: int) -> tuple[float, float]:
    """Requests/s at concurrency ``limit`` (closed loop, 15 s), and one alone (s)."""
    import asyncio

    alone = (await timed_post(client, url, 0))[1]
    done, stop = 0, time.perf_counter() + 15

    async def worker(k: int) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            status, _ = await timed_post(client, url, k)
            assert status == 200, status
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(limit)))
    return done / (time.perf_counter() - start), alone


async def open_loop(client, url: str, rate: float, seconds: float) -> list:
    """Arrivals at ``rate`` per second for ``seconds``, whatever the answers: each's result."""
    import asyncio

    tasks, start, i = [], time.perf_counter(), 0
    while (now := time.perf_counter() - start) < seconds:
        tasks.append(asyncio.create_task(timed_post(client, url, i)))
        i += 1
        await asyncio.sleep(max(0.0, i / rate - now))
    return await asyncio.gather(*tasks)


@pytest.mark.long
def test_three_times_capacity_for_60_s_is_shed_at_the_gateway(server, tmp_path_factory):
    """Open-loop arrivals at 3x the measured capacity for 60 s through a gateway admitting 16
    requests: every request is served or refused (429) - none lost -, refusals come at once,
    accepted requests wait a bounded time, and service is normal right after."""
    import asyncio

    import httpx2 as httpx

    from tests.support.gateway import gateway_on

    limit = 16
    with gateway_on(server, tmp_path_factory, f"--max-concurrent-requests={limit}") as gw:
        url = f"{gw.url}/v1/audio/speech"

        async def main():
            limits = httpx.Limits(max_connections=2000, max_keepalive_connections=100)
            async with httpx.AsyncClient(timeout=300, limits=limits) as client:
                rate, alone = await closed_loop_capacity(client, url, limit)
                results = await open_loop(client, url, 3 * rate, 60)
                after = await timed_post(client, url, 1)
                return rate, alone, results, after

        rate, alone, results, after = asyncio.run(main())
    served = sorted(t for s, t in results if s == 200)
    refused = sorted(t for s, t in results if s == 429)
    lost = [s for s, _ in results if s not in (200, 429)]
    p99 = lambda xs: xs[min(len(xs) - 1, int(0.99 * len(xs)))]  # noqa: E731
    print(
        f"\ncapacity {rate:.1f} req/s (alone {alone * 1000:.0f} ms); offered {3 * rate:.1f} req/s "
        f"for 60 s: {len(served)} served (p50 {served[len(served) // 2]:.2f} s, p99 "
        f"{p99(served):.2f} s), {len(refused)} refused (p99 {p99(refused) * 1000:.0f} ms), "
        f"{len(lost)} lost; after: {after[0]} in {after[1] * 1000:.0f} ms"
    )
    assert lost == []
    assert refused and p99(refused) < 0.1
    # Accepted requests wait at most for the `limit` ahead of them, plus their own service.
    assert p99(served) <= limit / rate + 2 * alone + 1.0
    assert after[0] == 200 and after[1] < 5 * alone + 1.0
