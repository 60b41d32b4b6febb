"""What the front door (``tts_front``) costs and what it changes under overload:
``python -m bench.front``

One tritonserver, the front door before it; clients alternate between the two so they share
the same cores and the same warm server.

1. Cost: `tts` c=1 latency (requests alternate direct / front; medians) and throughput at
   ``--concurrency`` (16; runs in the order direct, front, front, direct).
2. Overload: ``--burst`` (200) concurrent `tts` requests over gRPC, no client retries, straight
   to Triton and then through the front door: how many were served and how fast (p50, p99,
   max), how many refused and how fast the refusal came.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.processes import FrontProcess, ServerProcess
from tts_client import AsyncTTSClient, ServerOverloaded, TTSClient
from tts_client.protocol import RetryPolicy
from tts_front.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent
NO_RETRY = RetryPolicy(retries=0)


def cost(direct: str, front: str, requests: int, concurrency: int = 16) -> dict[str, float]:
    """c=1 medians (requests alternate) and throughput at ``concurrency`` (runs in the order
    direct, front, front, direct), one client per thread and URL (tritonclient's HTTP client
    is not shared between threads)."""
    local = threading.local()

    def synthesize(url: str, text: str) -> float:
        clients = local.__dict__.setdefault("clients", {})
        if url not in clients:
            clients[url] = TTSClient(url)
        return clients[url].synthesize(text).duration

    times: dict[str, list[float]] = {direct: [], front: []}
    for i in range(requests):
        for url in (direct, front):
            start = time.perf_counter()
            synthesize(url, SENTENCES[i % len(SENTENCES)])
            times[url].append(time.perf_counter() - start)
    rates: dict[str, list[float]] = {direct: [], front: []}
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(max(requests, 3 * concurrency))]
    with ThreadPoolExecutor(concurrency) as pool:
        for url in (direct, front, front, direct):
            start = time.perf_counter()
            audio_s = sum(pool.map(lambda t, u=url: synthesize(u, t), texts))
            rates[url].append(audio_s / (time.perf_counter() - start))
    return {
        "direct_p50_ms": 1e3 * statistics.median(times[direct]),
        "front_p50_ms": 1e3 * statistics.median(times[front]),
        "direct_audio_s_per_s": statistics.mean(rates[direct]),
        "front_audio_s_per_s": statistics.mean(rates[front]),
    }


async def burst(url: str, n: int) -> dict[str, float]:
    served: list[float] = []
    refused: list[float] = []
    other: list[str] = []
    async with AsyncTTSClient(url, retry=NO_RETRY, timeout=600) as client:
        await client.synthesize("Warm up.")

        async def one(i: int) -> None:
            start = time.perf_counter()
            try:
                await client.synthesize(SENTENCES[i % len(SENTENCES)])
                served.append(time.perf_counter() - start)
            except ServerOverloaded:
                refused.append(time.perf_counter() - start)
            except Exception as e:  # counted, never hidden
                other.append(f"{type(e).__name__}: {e}")

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - start
    if other:
        print(f"  {len(other)} other errors, first: {other[0]}", file=sys.stderr)
    return {
        "served": len(served),
        "served_p50_s": percentile(served, 50),
        "served_p99_s": percentile(served, 99),
        "served_max_s": max(served, default=float("nan")),
        "refused": len(refused),
        "refused_p99_s": percentile(refused, 99),
        "other_errors": len(other),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.front", description=__doc__)
    p.add_argument("--requests", type=int, default=40, help="cost: requests per side")
    p.add_argument("--concurrency", type=int, default=16, help="cost: throughput's concurrency")
    p.add_argument("--burst", type=int, default=200, help="overload: concurrent requests")
    p.add_argument("--front-args", default="", help="flags of the front door")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(
            ROOT / "model_repository",
            Path(tmp) / "server.log",
            cache_dir=ROOT / ".cache/triton",
            supervisor_options={"canary_interval": 0},
        )
        with server, FrontProcess(server, Path(tmp) / "front.log", a.front_args.split()) as front:
            print(f"cost ({a.requests} requests each side; throughput at c={a.concurrency}):")
            for k, v in cost(server.grpc_url, front.grpc_url, a.requests, a.concurrency).items():
                print(f"  {k:24s} {v:8.1f}")
            for name, url in (("direct", server.grpc_url), ("front", front.grpc_url)):
                print(f"overload, {a.burst} concurrent `tts` requests, {name}:")
                for k, v in asyncio.run(burst(url, a.burst)).items():
                    print(f"  {k:24s} {v:8.2f}")
                time.sleep(2)
            with urllib.request.urlopen(f"{front.http_url}/metrics") as response:
                for line in response.read().decode().splitlines():
                    if line.startswith(("tts_front_requests_total", "tts_front_waiting")):
                        print(f"  {line}")


if __name__ == "__main__":
    main()
