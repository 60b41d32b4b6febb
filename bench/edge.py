"""What the nginx edge costs: ``python -m bench.edge``

The launcher as ``make serve`` runs it (nginx on the public ports, the front door on loopback
ports behind it). Clients alternate between the public port (through nginx) and the front
door's own port (read from the launcher's log), so both sides share the same cores and the same
warm server: `tts` c=1 latency (requests alternate; medians) and throughput at
``--concurrency`` (runs in the order door, edge, edge, door), over gRPC and over HTTP.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tts_client import TTSClient
from tts_tools.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent


def front_ports(log: str) -> dict[str, int]:
    """The front door's own ports, from its start line ("front: grpc on 127.0.0.1:P, ...")."""
    line = next(x for x in log.splitlines() if x.startswith("front: grpc on"))
    return {kind: int(port) for kind, port in re.findall(r"(grpc|http) on [^:]+:(\d+)", line)}


def cost(door: str, edge: str, requests: int, concurrency: int) -> dict[str, float]:
    """c=1 medians (alternating) and throughput at ``concurrency`` (door, edge, edge, door),
    one client per thread (tritonclient's HTTP client is not shared between threads)."""
    local = threading.local()

    def synthesize(url: str, text: str) -> float:
        clients = local.__dict__.setdefault("clients", {})
        if url not in clients:
            clients[url] = TTSClient(url)
        return clients[url].synthesize(text).duration

    times: dict[str, list[float]] = {door: [], edge: []}
    for i in range(requests):
        for url in (door, edge):
            start = time.perf_counter()
            synthesize(url, SENTENCES[i % len(SENTENCES)])
            times[url].append(time.perf_counter() - start)
    rates: dict[str, list[float]] = {door: [], edge: []}
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(max(requests, 3 * concurrency))]
    with ThreadPoolExecutor(concurrency) as pool:
        for url in (door, edge, edge, door):
            start = time.perf_counter()
            audio_s = sum(pool.map(lambda t, u=url: synthesize(u, t), texts))
            rates[url].append(audio_s / (time.perf_counter() - start))
    return {
        "door_p50_ms": 1e3 * statistics.median(times[door]),
        "edge_p50_ms": 1e3 * statistics.median(times[edge]),
        "door_audio_s_per_s": statistics.mean(rates[door]),
        "edge_audio_s_per_s": statistics.mean(rates[edge]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.edge", description=__doc__)
    p.add_argument("--requests", type=int, default=40, help="c=1: requests per side")
    p.add_argument("--concurrency", type=int, default=16, help="throughput's concurrency")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}")
    with tempfile.TemporaryDirectory() as tmp:
        launcher = Launcher(ROOT / "model_repository", Path(tmp) / "launcher.log")
        try:
            launcher.wait_ready()
            inner = front_ports(launcher.log())
            for scheme, public in (("grpc", launcher.grpc), ("http", launcher.http)):
                door = f"{scheme}://127.0.0.1:{inner[scheme]}"
                edge = f"{scheme}://127.0.0.1:{public}"
                figures = cost(door, edge, a.requests, a.concurrency)
                p50 = figures["edge_p50_ms"] / figures["door_p50_ms"]
                rate = figures["edge_audio_s_per_s"] / figures["door_audio_s_per_s"]
                print(
                    f"{scheme}: c=1 p50 door {figures['door_p50_ms']:.1f} ms, edge "
                    f"{figures['edge_p50_ms']:.1f} ms ({p50:.3f}x); c={a.concurrency} door "
                    f"{figures['door_audio_s_per_s']:.2f} audio-s/s, edge "
                    f"{figures['edge_audio_s_per_s']:.2f} ({rate:.3f}x)"
                )
        finally:
            launcher.close()


if __name__ == "__main__":
    main()
