"""What a perf_analyzer sweep reports: one row per (model, protocol, concurrency), the CSV and
the plot (``python -m perf_analyzer_configs.run`` measures them)."""

from __future__ import annotations

import csv
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

STAGES = ("phonemizer", "acoustic", "vocoder")


@dataclass
class Row:
    model: str
    protocol: str
    concurrency: int
    requests_per_s: float
    audio_s_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    client_ms: float  # client send + receive, as perf_analyzer reports it
    stable: bool  # False: perf_analyzer found no stable window (see perf_analyzer.log)
    breakdown: str  # JSON: per stage queue/compute ms per request and average batch size
    # JSON: CPU ms per request of tritonserver, each stage's stubs and perf_analyzer itself
    # (empty when the server is not this run's own)
    cpu_ms: str = "{}"
    gpu_memory_mib: float = 0.0  # in use at the end of the run (the served profile's), 0: no GPU


def make_row(model, protocol, c, r, before, after, seconds, cpu=None) -> Row:
    """One point; ``cpu``: CPU seconds per process over the run, shared out per request (the
    requests the model under load completed, from Triton's statistics)."""
    breakdown = {}
    for stage in STAGES:
        d = after[stage] - before[stage]
        if d.requests:
            breakdown[stage] = {
                "requests": d.requests,
                "queue_ms": d.queue_ns / d.requests / 1e6,
                "compute_ms": d.compute_ns / d.requests / 1e6,
                # Its parts: inputs in, the model's execute, outputs out.
                "input_ms": d.input_ns / d.requests / 1e6,
                "infer_ms": d.infer_ns / d.requests / 1e6,
                "output_ms": d.output_ns / d.requests / 1e6,
                "avg_batch": d.average_batch,
            }
    rps = float(r["Inferences/Second"])
    loaded = model if model in STAGES else STAGES[-1]  # tts: each request ends in the vocoder
    done = (after[loaded] - before[loaded]).requests if loaded in after else 0
    cpu_ms = {k: round(1000 * v / done, 3) for k, v in (cpu or {}).items() if done}
    return Row(
        model=model,
        protocol=protocol,
        concurrency=c,
        requests_per_s=rps,
        audio_s_per_s=rps * seconds,
        p50_ms=float(r["p50 latency"]) / 1000,
        p90_ms=float(r["p90 latency"]) / 1000,
        p95_ms=float(r["p95 latency"]) / 1000,
        p99_ms=float(r["p99 latency"]) / 1000,
        client_ms=(float(r["Client Send"]) + float(r["Client Recv"])) / 1000,
        stable=r["stable"] == "true",
        breakdown=json.dumps(breakdown),
        cpu_ms=json.dumps(cpu_ms),
        gpu_memory_mib=gpu_memory_mib(),
    )


def gpu_memory_mib() -> float:
    """GPU memory in use on this machine (nvidia-smi, every GPU), 0 without one."""
    import shutil

    if not shutil.which("nvidia-smi"):
        return 0.0
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    result = subprocess.run(query, capture_output=True, text=True)
    if result.returncode:
        return 0.0
    return float(sum(float(x) for x in result.stdout.split()))


def write_csv(rows: list[Row], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tts = [r for r in rows if r.model == "tts"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for protocol, color in (("grpc", "tab:blue"), ("http", "tab:orange")):
        rs = sorted((r for r in tts if r.protocol == protocol), key=lambda r: r.concurrency)
        if not rs:
            continue
        for ax, metric in ((axes[0], "audio_s_per_s"), (axes[1], "requests_per_s")):
            y = [getattr(r, metric) for r in rs]
            ax.plot([r.p50_ms for r in rs], y, "o-", color=color, label=f"{protocol} p50")
            ax.plot(
                [r.p99_ms for r in rs], y, "s--", color=color, alpha=0.6, label=f"{protocol} p99"
            )
            for r, yy in zip(rs, y):
                ax.annotate(f"c{r.concurrency}", (r.p50_ms, yy), fontsize=8,
                            textcoords="offset points", xytext=(4, -10))  # fmt: skip
    axes[0].set(
        xlabel="latency (ms)", ylabel="audio seconds per second", title="tts throughput vs latency"
    )
    axes[1].set(
        xlabel="latency (ms)", ylabel="requests per second", title="tts requests/s vs latency"
    )
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    rs = sorted((r for r in tts if r.protocol == "grpc"), key=lambda r: r.concurrency)
    if rs:
        x = np.arange(len(rs))
        bottom = np.zeros(len(rs))
        colors = {"phonemizer": "tab:green", "acoustic": "tab:purple", "vocoder": "tab:red"}
        for stage in STAGES:
            for part, alpha in (("queue_ms", 0.35), ("compute_ms", 0.9)):
                vals = np.array([json.loads(r.breakdown).get(stage, {}).get(part, 0.0) for r in rs])
                axes[2].bar(x, vals, bottom=bottom, color=colors[stage], alpha=alpha,
                            label=f"{stage} {part.split('_')[0]}")  # fmt: skip
                bottom += vals
        axes[2].set_xticks(x, [f"c{r.concurrency}" for r in rs])
        axes[2].set(
            ylabel="ms per request (server side)", title="tts over gRPC: where the time goes"
        )
        axes[2].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
