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
import tempfile
from pathlib import Path

from bench.front import cost
from bench.machine import cpu_line
from tests.support.launcher import Launcher

ROOT = Path(__file__).resolve().parent.parent


def front_ports(log: str) -> dict[str, int]:
    """The front door's own ports, from its start line ("front: grpc on 127.0.0.1:P, ...")."""
    line = next(x for x in log.splitlines() if x.startswith("front: grpc on"))
    return {kind: int(port) for kind, port in re.findall(r"(grpc|http) on [^:]+:(\d+)", line)}


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
                f = cost(door, edge, a.requests, a.concurrency)  # "direct": the door alone
                p50 = f["front_p50_ms"] / f["direct_p50_ms"]
                rate = f["front_audio_s_per_s"] / f["direct_audio_s_per_s"]
                print(
                    f"{scheme}: c=1 p50 door {f['direct_p50_ms']:.1f} ms, edge "
                    f"{f['front_p50_ms']:.1f} ms ({p50:.3f}x); c={a.concurrency} door "
                    f"{f['direct_audio_s_per_s']:.2f} audio-s/s, edge "
                    f"{f['front_audio_s_per_s']:.2f} ({rate:.3f}x)"
                )
        finally:
            launcher.close()


if __name__ == "__main__":
    main()
