"""Streaming figures on one machine: time to first audio, whole paragraph, mixed load.

    python -m bench.streaming [--runs 5] [--mixed-seconds 20]

1. A ~2,000-character paragraph streamed at concurrency 1: time to first audio and to the end
   (median of runs), against the non-streaming path: the same chunks sent to `tts` at once.
2. Mixed load: eight users sending short sentences back to back, first alone, then while two
   users stream long texts; the short sentences' p50 latency in both cases and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tests.support.processes import ServerProcess
from tts_client import TTSClient
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_serving.settings import load_settings
from tts_serving.stream.plan import plan_chunks
from tts_serving.text.front_end import Reader
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

ROOT = Path(__file__).resolve().parent.parent


def stream_once(client: TTSClient, text: str) -> tuple[float, float, float]:
    start = time.perf_counter()
    first = None
    samples = 0
    for part in client.stream(text):
        first = first if first is not None else time.perf_counter() - start
        samples += len(part.samples)
    return first, time.perf_counter() - start, samples / client.sample_rate


def short_users(url: str, users: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def user(k: int) -> None:
        with TTSClient(url) as client:
            i = k
            while time.monotonic() < stop:
                start = time.perf_counter()
                client.synthesize(SENTENCES[i % len(SENTENCES)])
                with lock:
                    latencies.append(time.perf_counter() - start)
                i += users

    threads = [threading.Thread(target=user, args=(k,)) for k in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streaming",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mixed-seconds", type=float, default=20.0)
    parser.add_argument("--profile", help="serve configs/<profile>.pbtxt (gpu, torch-cpu)")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    repo = ROOT / "model_repository"
    log = Path(tempfile.mkdtemp(prefix="bench-stream-")) / "triton.log"
    extra = [f"--model-config-name={args.profile}"] if args.profile else None
    with (
        ServerProcess(repo, log, cache_dir=ROOT / ".cache/triton", extra_args=extra) as server,
        TTSClient(server.grpc_url, concurrency=64) as client,
    ):
        client.synthesize("Warm up.")
        # The non-streaming path gets exactly the chunks the stream would make.
        settings = load_settings(repo, "tts_stream")
        phonemizer = Phonemizer(load_voice_config(repo / "tts_stream/1/voice.json"))
        plan = plan_chunks(PARAGRAPH, settings, Reader(phonemizer, settings.normalize_text))
        chunks = [c.text for c in plan]

        firsts, totals, plain = [], [], []
        audio = 0.0
        for _ in range(args.runs):
            first, total, audio = stream_once(client, PARAGRAPH)
            firsts.append(first)
            totals.append(total)
            start = time.perf_counter()
            client.synthesize_many(chunks)
            plain.append(time.perf_counter() - start)
        first, total, batch = (statistics.median(x) for x in (firsts, totals, plain))
        print(
            f"\nparagraph: {len(PARAGRAPH)} characters, {len(chunks)} chunks, "
            f"{audio:.1f} s of audio, median of {args.runs} runs"
        )
        print("| path | time to first audio | whole paragraph | audio s/s |")
        print("|---|---|---|---|")
        print(f"| tts_stream | {first:.2f} s ({100 * first / total:.0f}% of total) | {total:.2f} s "
              f"| {audio / total:.1f} |")  # fmt: skip
        print(
            f"| same chunks to tts at once | {batch:.2f} s (no audio before the end) "
            f"| {batch:.2f} s | {audio / batch:.1f} |"
        )

        alone = short_users(server.grpc_url, 8, args.mixed_seconds)
        stop = threading.Event()

        def long_user() -> None:
            with TTSClient(server.grpc_url) as c:
                while not stop.is_set():
                    for _ in c.stream(PARAGRAPH * 3):
                        if stop.is_set():
                            break

        longs = [threading.Thread(target=long_user) for _ in range(2)]
        for t in longs:
            t.start()
        time.sleep(1.0)
        mixed = short_users(server.grpc_url, 8, args.mixed_seconds)
        stop.set()
        for t in longs:
            t.join()
        p_alone, p_mixed = (float(np.percentile(x, 50)) for x in (alone, mixed))
        print("\n| short sentences, 8 users | requests | p50 | p95 |")
        print("|---|---|---|---|")
        for name, lat in (("alone", alone), ("with 2 long streams", mixed)):
            print(f"| {name} | {len(lat)} | {1000 * np.percentile(lat, 50):.0f} ms "
                  f"| {1000 * np.percentile(lat, 95):.0f} ms |")  # fmt: skip
        print(f"\nshort-sentence p50 with long streams / alone: {p_mixed / p_alone:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
