"""The autoscaler's signal, measured on a real replica: ``python -m bench.queue_signal``

Starts the launcher as ``make serve`` does and sends normal sentences over raw tritonclient gRPC
(no retries) at random (Poisson) arrivals, one steady rate after another. Around each rate it
reads Triton's counters from the metrics port and computes, with the same arithmetic as
deploy/monitoring/prometheus-adapter-rules.yaml, the pods metric the HorizontalPodAutoscaler
scales on:

    sum of increase(nv_inference_queue_duration_us) over phonemizer, acoustic and vocoder
    / (increase(nv_inference_request_success{model="vocoder"}) + 1)

and prints it per rate with each stage's share, batch size and batch time, the served
requests' p50/p99 and what was refused. The rates are fractions of the replica's capacity (a
closed loop of 16, measured first). docs/scaling.md takes the HPA's target from these
figures; ``bench.autoscale`` reports the same quantity, so the simulated runs can be set beside
them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

from tritonclient.grpc import aio as grpc_aio

from bench.admission import capacity, one
from bench.compare import percentile
from bench.machine import cpu_line
from tests.support.launcher import Launcher
from tts_triton.statistics import model_counters

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("phonemizer", "acoustic", "vocoder")


def counters(url: str) -> dict[tuple[str, str], float]:
    """(metric, model) -> value for the queue and success counters of the three stages."""
    wanted = (
        "nv_inference_queue_duration_us",
        "nv_inference_request_success",
        "nv_inference_compute_infer_duration_us",  # each request: its batch's time
        "nv_inference_count",  # requests in batches
        "nv_inference_exec_count",  # batches
    )
    return {key: v for key, v in model_counters(url, wanted).items() if key[1] in STAGES}


def grown(before: dict, after: dict, name: str, stage: str) -> float:
    """How much counter ``name`` of ``stage`` grew between the two readings."""
    return after.get((name, stage), 0.0) - before.get((name, stage), 0.0)


def rule_metric(before: dict, after: dict) -> tuple[float, dict[str, float]]:
    """(the adapter rule's value in seconds, each stage's queue seconds per vocoder request)."""
    served = grown(before, after, "nv_inference_request_success", "vocoder")
    per_stage = {
        s: grown(before, after, "nv_inference_queue_duration_us", s) / (served + 1) / 1e6
        for s in STAGES
    }
    return sum(per_stage.values()), per_stage


def batches(before: dict, after: dict) -> dict[str, tuple[float, float]]:
    """Each stage's (mean batch size, mean seconds a batch took) between the two readings."""
    out = {}
    for s in STAGES:
        items = grown(before, after, "nv_inference_count", s)
        runs = grown(before, after, "nv_inference_exec_count", s)
        seconds = grown(before, after, "nv_inference_compute_infer_duration_us", s) / 1e6
        out[s] = (items / max(runs, 1), seconds / max(items, 1))
    return out


async def poisson(url: str, rate: float, seconds: float, seed: int) -> list[tuple[str, float]]:
    """Requests at random times, ``rate`` a second on average, for ``seconds``."""
    rng = random.Random(seed)
    client = grpc_aio.InferenceServerClient(url)
    tasks, start, due, i = [], time.monotonic(), 0.0, 0
    while (due := due + rng.expovariate(rate)) < seconds:
        await asyncio.sleep(max(0.0, start + due - time.monotonic()))
        tasks.append(asyncio.ensure_future(one(client, i)))
        i += 1
    results = await asyncio.gather(*tasks)
    await client.close()
    return results


async def measure(url: str, metrics_url: str, rate: float, seconds: float, warmup: float):
    """Load at ``rate`` for ``warmup + seconds``; the counters are read after the warm-up and
    when the last request sent in the window has been answered."""
    run = asyncio.ensure_future(poisson(url, rate, warmup + seconds, seed=int(rate * 1000)))
    await asyncio.sleep(warmup)
    before = counters(metrics_url)
    results = await run
    after = counters(metrics_url)
    return rule_metric(before, after), batches(before, after), results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.queue_signal", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument(
        "--loads",
        type=float,
        nargs="+",
        default=[0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0],
        help="request rates as fractions of the capacity (c=16 closed loop, measured first)",
    )
    p.add_argument("--seconds", type=float, default=120.0, help="measured seconds per rate")
    p.add_argument("--warmup", type=float, default=20.0, help="seconds before the counters")
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        launcher = Launcher(a.repository, Path(tmp) / "launcher.log")
        try:
            launcher.wait_ready()
            url, metrics_url = (
                f"127.0.0.1:{launcher.grpc}",
                f"http://127.0.0.1:{launcher.metrics}/metrics",
            )
            print("| rate (of capacity) | served, p50 / p99 | refused, other | rule's metric "
                  "| phonemizer / acoustic / vocoder queue | batch, ms a batch: phonemizer / "
                  "acoustic / vocoder |\n|---|---|---|---|---|---|", flush=True)  # fmt: skip
            full = asyncio.run(capacity(url))
            print(f"capacity (c=16 closed loop): {full:.2f} requests/s\n", flush=True)
            for rate in (load * full for load in a.loads):
                (metric, stages), sizes, results = asyncio.run(
                    measure(url, metrics_url, rate, a.seconds, a.warmup)
                )
                served = sorted(s for o, s in results if o == "served")
                refused = sum(o == "refused" for o, _ in results)
                other = len(results) - len(served) - refused
                shares = " / ".join(f"{stages[s] * 1000:.0f}" for s in STAGES)
                runs = " / ".join(f"{sizes[s][0]:.1f}, {sizes[s][1] * 1000:.0f}" for s in STAGES)
                print(
                    f"| {rate:.2f}/s ({rate / full:.0%}) | {len(served)}, "
                    f"{percentile(served, 50):.2f} / {percentile(served, 99):.2f} s | "
                    f"{refused}, {other} | "
                    f"**{metric * 1000:.0f} ms** | {shares} ms | {runs} |",
                    flush=True,
                )
                time.sleep(5)  # let the queues empty before the next rate
        except Exception:
            print("launcher log (tail):\n" + "\n".join(launcher.log().splitlines()[-40:]))
            raise
        finally:
            launcher.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
