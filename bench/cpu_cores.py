"""Throughput on 1 core and on 2: ``python -m bench.cpu_cores [--cpus 0 0,1]``

Starts the launcher without the gateway, pinned with ``taskset`` to each CPU list in turn, and
measures over raw tritonclient gRPC (no retries) the c=1 p50 of 24 normal sentences and the
requests served per second by a closed loop of 16 (twice). The points
``tts_tools.cpu_scaling`` starts from (docs/performance.md, "Bigger CPUs").
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tritonclient.grpc import aio as grpc_aio

from bench.admission import capacity, one
from bench.compare import percentile
from bench.machine import cpu_line
from tts_launcher.commands import free_port

ROOT = Path(__file__).resolve().parent.parent


async def single(url: str, n: int = 24) -> float:
    """p50 seconds of ``n`` sentences one after another."""
    client = grpc_aio.InferenceServerClient(url)
    try:
        return percentile([(await one(client, i))[1] for i in range(n)], 50)
    finally:
        await client.close()


def measure(cpus: str, repository: Path, log: Path) -> str:
    http, grpc, metrics, supervisor = (free_port() for _ in range(4))
    command = ["taskset", "-c", cpus, sys.executable, "-m", "tts_launcher",
               f"--model-repository={repository}", f"--cache-dir={ROOT / '.cache/triton'}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--gateway-port=0", f"--supervisor-metrics-port={supervisor}"]  # fmt: skip
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        ready = f"http://127.0.0.1:{http}/v2/health/ready"
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"not ready; see {log}") from None
                time.sleep(1)
        url = f"127.0.0.1:{grpc}"
        p50 = asyncio.run(single(url))
        rates = [asyncio.run(capacity(url)) for _ in range(2)]
        return (
            f"cpus {cpus}: c=1 p50 {p50 * 1000:.0f} ms; c=16 "
            + ", ".join(f"{r:.2f}" for r in rates)
            + " requests/s served"
        )
    finally:
        server.send_signal(2)
        server.wait(60)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_cores", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--cpus", nargs="+", default=["0", "0,1"], help="taskset CPU lists")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for cpus in a.cpus:
            print(measure(cpus, a.repository, Path(tmp) / f"{cpus}.log"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
