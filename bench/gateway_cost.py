"""What the gateway costs in CPU, measured through it: ``python -m bench.gateway_cost``

Starts tritonserver and the gateway (``python -m tts_gateway``) as separate processes, sends
OpenAI ``/v1/audio/speech`` requests through the gateway at ``--concurrency`` for each format,
and reads the gateway process's own CPU time (user + system, all its threads, from /proc)
around each run. Prints per format: audio seconds served, the gateway's CPU milliseconds per
audio second and per request, and the cores it used meanwhile; then what that means for a
deployment: gateway cores and gateway pods (``--pod-cpu`` each, scaled at ``--utilization``)
for ``--audio-rate`` audio seconds per second (default: 1,844, one H100 replica end to end,
docs/gpu.md).

The audio seconds of the encoded formats are taken from the pcm run of the same texts (one
round each; the voice's durations vary by a few percent between runs). Triton shares this
machine's cores with the gateway, which changes the gateway's throughput, not its CPU time
per audio second: that is the figure the sizing uses.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from pathlib import Path

import httpx2 as httpx
import tomllib

from bench.machine import cpu_line
from tests.support.processes import server_and_gateway
from tts_front.sample_texts import SENTENCES
from tts_launcher.stub_healing import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
# What deploy/overlays/gpu/gateway.yaml is sized for (deploy/sizing.toml, docs/scaling.md "The
# gateway"), which this benchmark measures again.
SIZED = tomllib.loads((ROOT / "deploy" / "sizing.toml").read_text())["gateway"]
TEXTS = SENTENCES[3:15]  # normal sentences, 3 to 5 s of speech each (as bench.queue_signal)
PCM_RATE = 24_000  # the gateway's pcm: 16-bit mono at OpenAI's 24 kHz


async def run(url: str, fmt: str, requests: int, concurrency: int) -> tuple[list[int], float]:
    """(bytes of each response, wall seconds) for ``requests`` in ``fmt``."""
    sizes: list[int] = []
    queue = list(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            i = queue.pop()
            body = {"model": "tts-1", "voice": "alloy", "response_format": fmt}
            response = await client.post(
                f"{url}/v1/audio/speech", json={**body, "input": TEXTS[i % len(TEXTS)]}
            )
            response.raise_for_status()
            sizes.append(len(response.content))

    start = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return sizes, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_cost", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--formats", nargs="+", default=["pcm", "mp3", "opus", "wav"])
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument(
        "--audio-rate", type=float, default=SIZED["audio_rate"], help="audio s/s to size for"
    )
    p.add_argument("--pod-cpu", type=float, default=1.0, help="CPUs of one gateway pod")
    p.add_argument("--utilization", type=float, default=0.7, help="the gateway HPA's target")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    if "pcm" not in a.formats:
        a.formats.insert(0, "pcm")  # its bytes give the audio seconds
    logs = Path(tempfile.mkdtemp(prefix="gateway-cost-"))
    rows = []
    with server_and_gateway(a.repository, logs, ROOT / ".cache/triton") as (_, gateway):
        pid = gateway.process.pid
        asyncio.run(run(gateway.url, "mp3", 8, 4))  # first-use costs out of the way
        audio_per_request = 0.0
        for fmt in a.formats:
            before = cpu_seconds({pid})
            sizes, wall = asyncio.run(run(gateway.url, fmt, a.requests, a.concurrency))
            used = cpu_seconds({pid}) - before
            if fmt == "pcm":
                audio_per_request = sum(sizes) / 2 / PCM_RATE / len(sizes)
            audio = audio_per_request * len(sizes)
            rows.append((fmt, len(sizes), audio, wall, used))
    print(
        f"through the gateway, c={a.concurrency}, {a.requests} requests a format "
        f"({audio_per_request:.2f} s of audio each):\n"
        "| format | audio s/s | gateway CPU | CPU ms per audio s | CPU ms per request | "
        f"gateway cores for {a.audio_rate:g} audio s/s | pods of {a.pod_cpu:g} CPU at "
        f"{a.utilization:.0%} |\n|---|---|---|---|---|---|---|"
    )
    for row in rows:
        print(sizing_row(*row, a.audio_rate, a.pod_cpu, a.utilization))
    return 0


def sizing_row(
    fmt: str, n: int, audio: float, wall: float, used: float, rate: float, pod: float, use: float
) -> str:
    """One format's row: ``n`` requests of ``audio`` seconds in all took ``wall`` seconds and
    ``used`` CPU-seconds of the gateway; the cores and pods (of ``pod`` CPUs at ``use``) that
    ``rate`` audio seconds per second need."""
    per_audio = used / audio
    cores = rate * per_audio
    pods = math.ceil(cores / (pod * use))
    return (
        f"| {fmt} | {audio / wall:.1f} | {used / wall:.2f} cores | {per_audio * 1000:.1f} | "
        f"{used / n * 1000:.1f} | {cores:.1f} | {pods} |"
    )


if __name__ == "__main__":
    sys.exit(main())
