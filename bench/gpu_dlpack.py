"""Every answer of one profile against another's under load: the DLPack hand-off's check.

Starts one tritonserver per profile (each with its own ``--model-config-name``, all at once),
sends every server the same requests (the perf_analyzer texts, noise 0 so that an answer
depends on its text alone) at ``--concurrency`` through raw tritonclient gRPC (no retries),
and compares each profile's audio with the first profile's, request by request:

    python -m bench.gpu_dlpack --profiles gpu gpu-dlpack --concurrency 256 --requests 1024

A profile fails on any error, on any answer that differs from the baseline's by more than
``--tolerance`` at the same length, or on one whose length moved by more than one frame (a
duration at a ceil() boundary may move by one frame when the batch around it differs: counted
and shown, not a failure). Exit status 1 when a profile fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from perf_analyzer_configs.run import load_texts as perf_analyzer_texts

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ROOT / "perf_analyzer_configs" / "tts_mixed.json"
HOP = 256


@dataclass
class Outcome:
    """One profile's answers (None where the request failed) and its errors by message."""

    audio: list[np.ndarray | None]
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Comparison:
    profile: str
    errors: int
    same_length: int
    max_diff: float  # over the answers of the same length
    worst: int  # answers past the tolerance
    moved_one_frame: int
    moved_more: int

    def failed(self) -> bool:
        return bool(self.errors or self.worst or self.moved_more)


def load_texts(path: Path = TEXTS) -> list[str]:
    return perf_analyzer_texts(path)


async def _send_all(url: str, texts: list[str], concurrency: int) -> Outcome:
    from tritonclient.grpc import InferInput
    from tritonclient.grpc.aio import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    outcome = Outcome([None] * len(texts))
    gate = asyncio.Semaphore(concurrency)
    # Several channels, as perf_analyzer's threads: one HTTP/2 connection caps its streams.
    clients = [InferenceServerClient(url) for _ in range(max(1, concurrency // 32))]

    async def one(k: int, text: str) -> None:
        inputs = [InferInput("text", [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(np.array([[text.encode()]], dtype=object))
        for name in ("noise_scale", "noise_w"):
            tensor = InferInput(name, [1, 1], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 1), np.float32))
            inputs.append(tensor)
        async with gate:
            try:
                result = await clients[k % len(clients)].infer("tts", inputs)
                outcome.audio[k] = result.as_numpy("audio")[0]
            except InferenceServerException as e:
                message = e.message() or str(e)
                outcome.errors[message] = outcome.errors.get(message, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(one(k, t) for k, t in enumerate(texts)))
    outcome.seconds = time.perf_counter() - start
    for client in clients:
        await client.close()
    return outcome


def send_all(url: str, texts: list[str], concurrency: int) -> Outcome:
    return asyncio.run(_send_all(url, texts, concurrency))


def compare(profile: str, base: Outcome, other: Outcome, tolerance: float) -> Comparison:
    same = worst = one_frame = more = 0
    max_diff = 0.0
    for a, b in zip(base.audio, other.audio):
        if a is None or b is None:
            continue
        if len(a) != len(b):
            if abs(len(a) - len(b)) == HOP:
                one_frame += 1
            else:
                more += 1
            continue
        same += 1
        diff = float(np.max(np.abs(a - b))) if len(a) else 0.0
        max_diff = max(max_diff, diff)
        worst += diff > tolerance or not np.all(np.isfinite(b))
    return Comparison(profile, sum(other.errors.values()), same, max_diff, worst, one_frame, more)


def run(
    profiles: list[str],
    texts: list[str],
    concurrency: int,
    tolerance: float,
    extra_args: list[str] | None = None,
) -> tuple[dict[str, Outcome], list[Comparison]]:
    """Serve each profile (all at once), send each the same texts, compare with the first."""
    from tests.support.processes import ServerProcess

    logs = Path(tempfile.mkdtemp(prefix="gpu-dlpack-"))
    servers = [
        ServerProcess(
            ROOT / "model_repository",
            logs / f"{name}.log",
            cache_dir=ROOT / ".cache/triton",
            extra_args=[f"--model-config-name={name}", *(extra_args or [])],
        )
        for name in profiles
    ]
    with ExitStack() as stack, ThreadPoolExecutor(len(servers)) as pool:
        started = list(pool.map(lambda s: s.start(timeout=600), servers))
        for server in started:
            stack.callback(server.stop)
        print(f"{len(started)} servers ready; logs in {logs}", flush=True)
        outcomes = {}
        for name, server in zip(profiles, started):
            outcomes[name] = send_all(f"localhost:{server.grpc_port}", texts, concurrency)
    base = outcomes[profiles[0]]
    comparisons = [compare(p, base, outcomes[p], tolerance) for p in profiles[1:]]
    return outcomes, comparisons


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_dlpack", description=__doc__)
    parser.add_argument("--profiles", nargs="+", default=["gpu", "gpu-dlpack"])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="largest |difference| of one sample between profiles at the same length",
    )
    parser.add_argument(
        "--server-arg", action="append", default=[], help="another tritonserver argument"
    )
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    pool = load_texts()
    texts = [pool[k % len(pool)] for k in range(args.requests)]
    outcomes, comparisons = run(
        args.profiles, texts, args.concurrency, args.tolerance, args.server_arg
    )
    for name, outcome in outcomes.items():
        answered = sum(a is not None for a in outcome.audio)
        seconds = sum(len(a) for a in outcome.audio if a is not None) / 22050
        print(
            f"{name:12s} {answered}/{len(texts)} answered at c={args.concurrency} in "
            f"{outcome.seconds:.1f} s ({seconds / outcome.seconds:.0f} audio-s/s), "
            f"errors {outcome.errors or 0}"
        )
    failed = bool(sum(outcomes[args.profiles[0]].errors.values()))
    for c in comparisons:
        print(
            f"{c.profile} vs {args.profiles[0]}: {c.same_length} at the same length, max "
            f"|diff| {c.max_diff:.2e}, past {args.tolerance:g}: {c.worst}; moved one frame: "
            f"{c.moved_one_frame}, more: {c.moved_more}; errors {c.errors}"
            f" -> {'FAIL' if c.failed() else 'ok'}"
        )
        failed |= c.failed()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
