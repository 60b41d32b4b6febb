"""Do interactive requests (priority 1) overtake bulk load? ``python -m bench.priority``

A background of ``--bulk`` concurrent clients sends sentences at the default level (bulk) with
no pause; meanwhile one client sends a sentence at a time, alternating priority 1 and the
default level, and its latencies are compared. Same server, same texts, same moment.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machine import cpu_line
from tests.support.processes import ServerProcess
from tts_client import TTSClient
from tts_front.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.priority", description=__doc__)
    parser.add_argument("--bulk", type=int, default=24, help="concurrent bulk clients")
    parser.add_argument("--requests", type=int, default=20, help="interactive requests per level")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)

    log = Path(tempfile.mkdtemp(prefix="priority-")) / "triton.log"
    with ServerProcess(args.repository, log, cache_dir=ROOT / ".cache/triton") as server:
        stop = threading.Event()
        bulk_done = [0]

        def bulk(k: int) -> None:
            with TTSClient(server.grpc_url, priority=2) as client:
                while not stop.is_set():
                    client.synthesize(SENTENCES[k % len(SENTENCES)])
                    bulk_done[0] += 1

        threads = [threading.Thread(target=bulk, args=(k,), daemon=True) for k in range(args.bulk)]
        for t in threads:
            t.start()
        time.sleep(5)  # let the queues fill
        latencies: dict[int, list[float]] = {1: [], 0: []}
        clients = {p: TTSClient(server.grpc_url, priority=p) for p in latencies}
        for i in range(args.requests):
            for priority in (1, 0) if i % 2 else (0, 1):
                start = time.perf_counter()
                clients[priority].synthesize(SENTENCES[i % len(SENTENCES)])
                latencies[priority].append(time.perf_counter() - start)
        stop.set()
        for t in threads:
            t.join(120)
    p50 = {p: statistics.median(v) for p, v in latencies.items()}
    p90 = {p: sorted(v)[int(0.9 * len(v))] for p, v in latencies.items()}
    print(f"bulk clients {args.bulk} (default level), {bulk_done[0]} bulk requests served")
    print("| interactive request | p50 ms | p90 ms |")
    print("|---|---|---|")
    print(f"| priority 1 | {1000 * p50[1]:.0f} | {1000 * p90[1]:.0f} |")
    print(f"| default level (bulk) | {1000 * p50[0]:.0f} | {1000 * p90[0]:.0f} |")
    print(f"p50 priority 1 / default: {p50[1] / p50[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
