"""OpenVINO against ONNX Runtime on the voice's vocoder, the way the vocoder stage calls it.

The vocoder is about two thirds of the work per audio second (``make flops``); a served vocoder
sees a new length on almost every call. Each round draws new lengths in the served sentences'
range, so an engine that builds kernels per input shape pays for it here as it would served;
the rounded rows pad every latent to a multiple of ``--multiple`` frames (a few shapes, reused)
and cut the audio back. Prints audio seconds per second per round, the median's ratio to
ONNX Runtime's, and each engine's largest difference from ONNX Runtime's audio.

    pip install openvino==2026.4.1   # not in requirements: it did not win (docs/performance.md)
    python -m bench.vocoder_engines [--rounds 3] [--lengths 40] [--multiple 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.machine import cpu_line
from tts_wire.tensors import LATENT_CHANNELS

ROOT = Path(__file__).resolve().parent.parent
VOCODER = ROOT / "model_repository" / "vocoder" / "1" / "model.onnx"
HOP = 256  # samples per latent frame (the voice's hop length)
RATE = 22050

Vocoder = Callable[[np.ndarray], np.ndarray]


def rounded_up(frames: int, multiple: int) -> int:
    """``frames`` padded to the next multiple of ``multiple`` (0: unchanged)."""
    return -(-frames // multiple) * multiple if multiple else frames


def padded(call: Vocoder, multiple: int) -> Vocoder:
    """``call`` on the latent padded with zeros to ``rounded_up`` frames, cut back."""

    def run(latent: np.ndarray) -> np.ndarray:
        frames = latent.shape[2]
        extra = rounded_up(frames, multiple) - frames
        audio = call(np.pad(latent, ((0, 0), (0, 0), (0, extra))) if extra else latent)
        return audio.reshape(1, -1)[:, : frames * HOP]

    return run


def onnx_runtime(threads: int) -> Vocoder:
    """ONNX Runtime as the vocoder stage makes a session (spinning off)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(VOCODER), options, providers=["CPUExecutionProvider"])
    return lambda latent: session.run(["audio"], {"latent": latent})[0].reshape(1, -1)


def openvino(threads: int, precision: str) -> Vocoder:
    import openvino as ov

    compiled = ov.Core().compile_model(
        str(VOCODER),
        "CPU",
        {
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": precision,
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
            # Pinned threads of two stages would share cores; the served stages share two.
            "ENABLE_CPU_PINNING": False,
        },
    )
    request = compiled.create_infer_request()
    return lambda latent: np.asarray(request.infer({0: latent})[0]).reshape(1, -1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.vocoder_engines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lengths", type=int, default=40, help="latents per round")
    parser.add_argument("--multiple", type=int, default=32, help="frames the rounded rows pad to")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    try:
        import openvino as ov
    except ImportError:
        print("OpenVINO is not installed: pip install openvino==2026.4.1", file=sys.stderr)
        return 2
    if not VOCODER.is_file():
        print(f"no exported voice at {VOCODER}: run `make export` first", file=sys.stderr)
        return 2
    print(f"machine: {cpu_line()}")
    print(f"ONNX Runtime {ort.__version__}, OpenVINO {ov.__version__}, {args.threads} threads")
    m = args.multiple
    engines: dict[str, Vocoder] = {
        "onnxruntime float32": onnx_runtime(args.threads),
        f"onnxruntime float32, rounded to {m}": padded(onnx_runtime(args.threads), m),
        "openvino float32": openvino(args.threads, "f32"),
        f"openvino float32, rounded to {m}": padded(openvino(args.threads, "f32"), m),
        f"openvino bfloat16, rounded to {m}": padded(openvino(args.threads, "bf16"), m),
    }
    rng = np.random.default_rng(0)
    warm = rng.standard_normal((1, LATENT_CHANNELS, 100), dtype=np.float32)
    reference = engines["onnxruntime float32"](warm)
    difference = {n: float(np.abs(call(warm) - reference).max()) for n, call in engines.items()}
    speeds: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        lengths = rng.integers(60, 400, args.lengths)  # the sample sentences' 60-366 frames
        latents = [rng.standard_normal((1, LATENT_CHANNELS, int(n)), np.float32) for n in lengths]
        audio_seconds = float(lengths.sum()) * HOP / RATE
        order = list(engines)[r % len(engines) :] + list(engines)[: r % len(engines)]
        for name in order:
            start = time.perf_counter()
            for latent in latents:
                engines[name](latent)
            speeds[name].append(audio_seconds / (time.perf_counter() - start))
        print(
            f"round {r + 1}: " + ", ".join(f"{name} {speeds[name][-1]:.1f}" for name in engines),
            file=sys.stderr,
            flush=True,
        )
    base = statistics.median(speeds["onnxruntime float32"])
    print("\n| engine | audio s/s per round | median / ONNX Runtime | largest difference |")
    print("|---|---|---|---|")
    for name, values in speeds.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        ratio = statistics.median(values) / base
        print(f"| {name} | {rounds} | {ratio:.2f}x | {difference[name]:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
