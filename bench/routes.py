"""Two of the gateway's routes under one load: the requests alternate between them, so both see
the same server, the same batches and the same moment (runs taken in turns drifted by more
than the difference between them on a shared 2-core machine).

    python -m bench.routes --concurrency 16 --requests 480     # Piper's /synthesize vs OpenAI's

Prints each route's p50, p90 and p99 and their ratio; ``--routes`` picks the pair (``piper``:
POST /synthesize, Piper's API; ``openai-<format>``: POST /v1/audio/speech).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tests.support.processes import server_and_gateway
from tts_front.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent


def request_for(route: str, text: str) -> tuple[str, dict]:
    """The path and JSON body of one request of ``route``."""
    if route == "piper":
        return "/synthesize", {"text": text}
    if route.startswith("openai-"):
        fmt = route.split("-", 1)[1]
        body = {"model": "tts-1", "voice": "alloy", "input": text, "response_format": fmt}
        return "/v1/audio/speech", body
    raise ValueError(f"unknown route {route!r}: piper or openai-<format>")


async def alternate(url: str, routes: list[str], requests: int, concurrency: int) -> dict:
    """``requests`` in all, the k-th of them on ``routes[k % len(routes)]``, ``concurrency`` in
    flight: each route's latencies (seconds)."""
    import httpx2 as httpx

    queue = list(range(requests))
    latencies: dict[str, list[float]] = {r: [] for r in routes}
    limits = httpx.Limits(max_connections=4 * concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def worker() -> None:
            while queue:
                k = queue.pop()
                route = routes[k % len(routes)]
                path, body = request_for(route, SENTENCES[(k // len(routes)) % len(SENTENCES)])
                start = time.perf_counter()
                response = await client.post(path, json=body)
                response.raise_for_status()
                latencies[route].append(time.perf_counter() - start)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def summary(latencies: dict[str, list[float]]) -> str:
    """A line per route, and the second's percentiles over the first's."""
    rows, first = [], None
    for route, values in latencies.items():
        p = np.percentile(values, [50, 90, 99]) * 1000
        ratio = "" if first is None else "  " + " ".join(f"{a / b:.2f}x" for a, b in zip(p, first))
        first = p if first is None else first
        rows.append(f"{route:>12} {len(values):4} requests: p50 {p[0]:.0f}, p90 {p[1]:.0f}, "
                    f"p99 {p[2]:.0f} ms{ratio}")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.routes", description=__doc__)
    p.add_argument("--routes", nargs=2, default=["openai-wav", "piper"])
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--requests", type=int, default=480)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        with server_and_gateway(a.repository, Path(tmp), ROOT / ".cache/triton") as (_, gw):
            asyncio.run(alternate(gw.url, a.routes, 4 * len(a.routes), 4))  # first-use costs
            found = asyncio.run(alternate(gw.url, a.routes, a.requests, a.concurrency))
    print(f"c={a.concurrency}, requests alternating between the routes:\n{summary(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
