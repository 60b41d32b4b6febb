"""What asking for word timestamps costs: tts with and without them, side by side.

    python -m bench.word_cost [--requests 40]

Starts its own server; the same sentences alternate between the two ways, one at a time
(c=1 p50) and then 8 at a time (throughput in requests per second).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tests.support.processes import ServerProcess
from tts_client import TTSClient
from tts_front.sample_texts import SENTENCES

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.word_cost", description=__doc__)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    log = Path(tempfile.mkdtemp(prefix="word-cost-")) / "triton.log"
    cache = ROOT / ".cache" / "triton"
    with ServerProcess(ROOT / "model_repository", log, cache_dir=cache) as server:
        with TTSClient(server.grpc_url, concurrency=8) as client:
            client.synthesize("Warm up.", word_timestamps=True)
            latency: dict[bool, list[float]] = {False: [], True: []}
            for k in range(args.requests):
                for words in (False, True) if k % 2 else (True, False):
                    start = time.perf_counter()
                    client.synthesize(SENTENCES[k % len(SENTENCES)], word_timestamps=words)
                    latency[words].append(time.perf_counter() - start)
            rate: dict[bool, list[float]] = {False: [], True: []}
            texts = [SENTENCES[k % len(SENTENCES)] for k in range(args.requests)]
            for round_ in range(3):
                for words in (False, True) if round_ % 2 else (True, False):
                    with ThreadPoolExecutor(8) as pool:
                        start = time.perf_counter()
                        list(
                            pool.map(
                                lambda t, w=words: client.synthesize(t, word_timestamps=w), texts
                            )
                        )
                        rate[words].append(len(texts) / (time.perf_counter() - start))
    off, on = np.median(latency[False]) * 1000, np.median(latency[True]) * 1000
    r_off, r_on = np.median(rate[False]), np.median(rate[True])
    print(
        f"c=1 p50: {off:.1f} ms without, {on:.1f} ms with word timestamps ({on - off:+.1f} ms); "
        f"c=8: {r_off:.2f} vs {r_on:.2f} requests/s ({100 * (r_on / r_off - 1):+.1f}%)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
