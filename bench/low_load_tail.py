"""The latency tail at low load, straight to Triton and through the front door:
``python -m bench.low_load_tail [--rate 2.5] [--seconds 60]``

Starts tritonserver (no launcher) and the front door before it, then sends normal sentences at
random (Poisson) arrivals over raw gRPC: straight to Triton, through the front door, straight
again. Prints p50/p90/p99/max of each run (docs/scaling.md: the queue the model lacks).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from bench.compare import percentile
from bench.machine import cpu_line
from bench.queue_signal import poisson
from tests.support.processes import FrontProcess, ServerProcess

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.low_load_tail", description=__doc__)
    p.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    p.add_argument("--rate", type=float, default=2.5, help="requests per second")
    p.add_argument("--seconds", type=float, default=60.0)
    a = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess(
            a.repository, Path(tmp) / "triton.log", cache_dir=ROOT / ".cache/triton"
        )
        server.start()
        try:
            with FrontProcess(server, Path(tmp) / "front.log") as front:
                for name, port in (("straight", server.grpc_port), ("front door", front.grpc_port),
                                   ("straight", server.grpc_port)):  # fmt: skip
                    results = asyncio.run(poisson(f"127.0.0.1:{port}", a.rate, a.seconds, seed=7))
                    served = sorted(s for o, s in results if o == "served")
                    print(
                        f"{name}: {len(served)} of {len(results)} served, p50 "
                        f"{percentile(served, 50):.3f} s, p90 {percentile(served, 90):.3f}, "
                        f"p99 {percentile(served, 99):.3f}, max {served[-1]:.3f}",
                        flush=True,
                    )
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
