"""Admission as a Triton user meets it: ``python -m bench.admission``

Starts the launcher as ``make serve`` does (front door, gateway) from a cold start and uses raw
tritonclient over gRPC with no retries (as perf_analyzer and plain clients do):

1. the front door's warm-up line (the rate it saw at start; admission does not count on it);
2. bursts of c = 1, 16, 64 concurrent normal sentences on the cold server, and again after
   ``--idle`` seconds without traffic;
3. the service's capacity: c=16 closed loop, requests per second;
4. open-loop load at 1x, 2x and 3x that capacity for ``--seconds`` each (requests sent at a
   steady rate whatever the answers): served, refused (UNAVAILABLE), other errors, p50/p99 of
   the served, and the median time to a refusal;
5. with ``--halve``: the server's processes pinned to half the cores after all that (capacity
   halved after the warm-up), 1x of the old capacity (2x of the new) and a c=64 burst; then the
   cores given back and 1x again (capacity restored).

Requests carry no deadline of their own unless ``--deadline`` (then as their gRPC deadline):
the server's default applies. Every figure is printed; docs/admission.md records runs.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import InferenceServerException, InferInput, aio as grpc_aio

from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.busy import halved
from tests.support.launcher import Launcher
from tts_front.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent
TEXTS = SENTENCES[3:15]  # normal sentences, 2-5 s of speech each


def text_input(i: int) -> InferInput:
    text = InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[TEXTS[i % len(TEXTS)].encode()]], dtype=object))
    return text


DEADLINE_S: float | None = None  # the requests' own (--deadline); None: the server's default


async def one(client: grpc_aio.InferenceServerClient, i: int) -> tuple[str, float]:
    """(outcome, seconds): served, refused (UNAVAILABLE from the front door) or the error."""
    start = time.monotonic()
    try:
        await client.infer("tts", [text_input(i)], client_timeout=DEADLINE_S)
        return "served", time.monotonic() - start
    except InferenceServerException as e:
        kind = "refused" if "UNAVAILABLE" in str(e.status()) else f"error {e.status()}"
        return kind, time.monotonic() - start


async def burst(url: str, n: int) -> list[tuple[str, float]]:
    client = grpc_aio.InferenceServerClient(url)
    try:
        return await asyncio.gather(*(one(client, i) for i in range(n)))
    finally:
        await client.close()


async def capacity(url: str, concurrency: int = 16, requests: int = 96) -> float:
    """Requests served per second by a closed loop at ``concurrency`` (a refusal comes back at
    once and is not capacity: only served requests count)."""
    client = grpc_aio.InferenceServerClient(url)
    queue = list(range(requests))
    served = 0

    async def worker() -> None:
        nonlocal served
        while queue:
            outcome, _ = await one(client, queue.pop())
            served += outcome == "served"  # after the await: workers interleave there

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return served / (time.monotonic() - start)


async def open_loop(url: str, rate: float, seconds: float) -> list[tuple[str, float]]:
    """Requests at ``rate`` per second for ``seconds``, whatever the answers."""
    client = grpc_aio.InferenceServerClient(url)
    tasks, start, i = [], time.monotonic(), 0
    while (now := time.monotonic()) - start < seconds:
        due = start + i / rate
        if now < due:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.ensure_future(one(client, i)))
        i += 1
    results = await asyncio.gather(*tasks)
    await client.close()
    return results


def summary(results: list[tuple[str, float]]) -> str:
    served = sorted(s for o, s in results if o == "served")
    refused = sorted(s for o, s in results if o == "refused")
    other = [o for o, _ in results if o not in ("served", "refused")]
    line = f"{len(results)} sent: {len(served)} served"
    if served:
        line += f" (p50 {percentile(served, 50):.2f} s, p99 {percentile(served, 99):.2f} s)"
    line += f", {len(refused)} refused"
    if refused:
        line += f" (median {percentile(refused, 50) * 1000:.0f} ms to the refusal)"
    return line + (f", {len(other)} other errors: {sorted(set(other))}" if other else "")


def halve_and_restore(launcher: Launcher, url: str, rate: float, seconds: float) -> None:
    """Capacity halved after the warm-up (the server pinned to half the cores), then given back."""
    time.sleep(5)
    with halved(launcher.triton_pid()) as cores:
        print(f"halved: tritonserver and its stubs on cores {sorted(cores)}", flush=True)
        halved_rate = asyncio.run(capacity(url))
        print(f"  capacity (c=16 closed loop): {halved_rate:.1f} requests/s "
              f"({halved_rate / rate:.2f} of before)", flush=True)  # fmt: skip
        time.sleep(5)
        results = asyncio.run(open_loop(url, rate, seconds))
        print(f"  the old 1x ({rate:.1f}/s for {seconds:g} s, {rate / halved_rate:.1f}x now): "
              f"{summary(results)}", flush=True)  # fmt: skip
        time.sleep(5)
        print(f"  burst c=64: {summary(asyncio.run(burst(url, 64)))}", flush=True)
    time.sleep(5)
    print("restored: all cores again", flush=True)
    results = asyncio.run(open_loop(url, rate, seconds))
    print(f"  1x ({rate:.1f}/s for {seconds:g} s): {summary(results)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--profile", help="serve configs/<profile>.pbtxt (default: config.pbtxt)")
    p.add_argument("--idle", type=float, default=45.0, help="seconds idle before the 2nd bursts")
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of each open-loop load")
    p.add_argument("--deadline", type=float, help="the requests' own deadline (gRPC), seconds")
    p.add_argument("--halve", action="store_true", help="then halve the server's cores (5.)")
    a = p.parse_args(argv)
    global DEADLINE_S
    DEADLINE_S = a.deadline
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        extra = [f"--model-config-name={a.profile}"] if a.profile else []
        launcher = Launcher(a.repository, Path(tmp) / "launcher.log", extra)
        try:
            launcher.wait_ready()
            url = f"127.0.0.1:{launcher.grpc}"
            warm = re.search(r"warm-up: .*", launcher.log())
            print(f"at start: {warm.group(0) if warm else 'no warm-up line'}", flush=True)
            for when in ("cold", f"after {a.idle:g} s idle"):
                if when != "cold":
                    time.sleep(a.idle)
                for n in (1, 16, 64):
                    print(
                        f"burst c={n} ({when}): {summary(asyncio.run(burst(url, n)))}", flush=True
                    )
            rate = asyncio.run(capacity(url))
            print(f"capacity (c=16 closed loop): {rate:.1f} requests/s", flush=True)
            for load in (1, 2, 3):
                time.sleep(5)  # let the queues empty
                results = asyncio.run(open_loop(url, load * rate, a.seconds))
                print(f"{load}x load ({load * rate:.1f}/s for {a.seconds:g} s): "
                      f"{summary(results)}", flush=True)  # fmt: skip
            if a.halve:
                halve_and_restore(launcher, url, rate, a.seconds)
        finally:
            launcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
