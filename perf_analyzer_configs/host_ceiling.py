"""The host path's own ceiling: perf_analyzer against the null engine.

    python -m perf_analyzer_configs.host_ceiling                       # this machine, ~4 min
    python -m perf_analyzer_configs.host_ceiling --profiles gpu-host-ceiling --concurrency 16 64 256

Each profile is served by its own tritonserver with ``--model-config-name=<profile>``:
``host-ceiling`` is the default config's batching and ``gpu-host-ceiling`` the gpu profile's,
both with the null engine (tts_serving/engines/null.py: no network, silence of the real
lengths), so what is measured is Triton, the Python stubs, the ensemble, the shared-memory
hops and the phonemizer (espeak-ng runs for real). ``default`` serves config.pbtxt (the real
voice) for a side-by-side figure. Every stage is loaded alone and ``tts`` end to end, over gRPC
with perf_analyzer (C++), in count windows; the audio seconds per second are requests/s x the
mean audio of the texts as that server gives it (the null engine's frames per id are the real
voice's, so within ~1 % of the real audio). CPU per request is shared out per process:
tritonserver, each stage's stubs, and perf_analyzer itself.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

from perf_analyzer_configs import run

OUT = run.ROOT / "out" / "host-ceiling"
MODELS = ("tts", "phonemizer", "acoustic", "vocoder")


def measure(profile: str, args: argparse.Namespace) -> Path:
    """One profile's sweep (its own server); the results.csv it wrote."""
    out = args.out / profile
    argv = [
        "--models", *args.models,
        "--protocols", "grpc",
        "--concurrency", *map(str, args.concurrency),
        "--texts", str(args.texts),
        "--request-count", str(args.request_count),
        "--max-trials", str(args.max_trials),
        "--out", str(out),
    ]  # fmt: skip
    if profile != "default":
        argv += ["--profile", profile]
    print(f"== {profile}", flush=True)
    if run.main(argv) != 0:
        raise SystemExit(f"perf_analyzer_configs.run failed for {profile}")
    return out / "results.csv"


def summary(results: dict[str, Path]) -> str:
    """A table per profile and model: the best point and the CPU per request there."""
    lines = [
        f"{'profile':<17} {'model':<10} {'c':>4} {'req/s':>8} {'audio s/s':>10} {'p50 ms':>7} "
        f"{'p99 ms':>7}  CPU ms per request (server processes; perf_analyzer)"
    ]
    best: dict[tuple[str, str], float] = {}
    for profile, path in results.items():
        with open(path) as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            cpu = json.loads(row["cpu_ms"])
            load = cpu.pop("perf_analyzer", 0.0)
            cpu_text = " ".join(f"{k} {v:.2f}" for k, v in cpu.items() if v >= 0.005)
            lines.append(
                f"{profile:<17} {row['model']:<10} {row['concurrency']:>4} "
                f"{float(row['requests_per_s']):8.1f} {float(row['audio_s_per_s']):10.1f} "
                f"{float(row['p50_ms']):7.1f} {float(row['p99_ms']):7.1f}  {cpu_text}; {load:.2f}"
            )
            key = (profile, row["model"])
            best[key] = max(best.get(key, 0.0), float(row["requests_per_s"]))
    lines.append("")
    lines.append("ceiling (best req/s over the concurrencies):")
    for (profile, model), rps in best.items():
        ratio = ""
        if profile != "default" and ("default", model) in best:
            ratio = f"  ({rps / best[('default', model)]:.2f}x the real voice's)"
        lines.append(f"  {profile:<17} {model:<10} {rps:8.1f} req/s{ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf_analyzer_configs.host_ceiling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=["host-ceiling"],
        help="host-ceiling, gpu-host-ceiling, default (the real voice, config.pbtxt)",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--texts", type=Path, default=run.HERE / "tts_mixed.json")
    parser.add_argument("--request-count", type=int, default=200, help="requests per count window")
    parser.add_argument("--max-trials", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    results = {profile: measure(profile, args) for profile in args.profiles}
    text = summary(results)
    print(f"\n{os.cpu_count()} CPUs\n{text}")
    (args.out / "summary.txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
