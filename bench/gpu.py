"""The torch engine alone: speed per batch and dtype, CUDA graphs on and off, and its error.

Runs the serving code (TorchAcousticNet / TorchVocoderNet: numpy in, numpy out, host copies
included; the vocoder also with its latent on the device, as gpu-dlpack hands it over, with and
without the copy of its audio to the host) on the exported voice's weights, on CUDA when there
is one, else on the CPU, with ONNX Runtime beside it where the ONNX files are present. Error
is measured against torch on the CPU in float32, which equals ONNX Runtime within 1.2e-4
(`python -m export` checks it).

    python -m bench.gpu [--repository model_repository] [--ids ids.json] [--out result.json]

Phoneme ids come from the CPU benchmark's sentences (tts_front.sample_texts) through the phonemizer,
or from ``--ids`` (written by ``--save-ids``) on a machine without the phonemizer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bench.machine import cpu_line
from tts_serving.engines.models import load_acoustic, load_vocoder, model_file
from tts_serving.settings import EngineSettings

SAMPLE_RATE, HOP = 22050, 256


def sentence_ids(repository: Path) -> list[list[int]]:
    from tts_front.sample_texts import SENTENCES
    from tts_serving.text.phonemize import Phonemizer
    from tts_serving.voices import load_voice_config

    voice = load_voice_config(repository / "phonemizer/1/voice.json")
    phonemizer = Phonemizer(voice, max_phoneme_ids=10_000)
    return [list(map(int, phonemizer.ids(s))) for s in SENTENCES]


def timed(fn, sync, repeat: int) -> float:
    """Median seconds of ``fn()`` after two warm-up calls."""
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sentence(acoustic, vocoder, ids: list[np.ndarray], scales: np.ndarray) -> list[np.ndarray]:
    return vocoder(acoustic(ids, scales))


def batch_of(ids: list[list[int]], n: int) -> list[np.ndarray]:
    return [np.array(ids[i % len(ids)], np.int64) for i in range(n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--ids", type=Path, help="phoneme ids (JSON list of lists) instead of espeak")
    p.add_argument("--save-ids", type=Path, help="write the sentences' ids here and exit")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 64])
    p.add_argument("--frames", nargs="+", type=int, default=[150, 400])
    p.add_argument("--graphs", default="both", choices=("both", "on", "off"), help="CUDA graphs")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--out", type=Path, help="write every figure here as JSON")
    args = p.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)

    if args.save_ids:
        args.save_ids.write_text(json.dumps(sentence_ids(args.repository)))
        return 0
    ids = json.loads(args.ids.read_text()) if args.ids else sentence_ids(args.repository)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = "cuda" if cuda else "cpu"
    dtypes = args.dtypes if cuda else ["float32"]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    a_dir, v_dir = args.repository / "acoustic/1", args.repository / "vocoder/1"
    results: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "rows": []}
    print(f"device: {results['device']}, torch {torch.__version__}", flush=True)

    # Reference: torch float32 on the CPU, noise 0, one padded batch of 8 with mixed speeds.
    cpu = EngineSettings(engine="torch", device="cpu", intra_op_threads=0, max_padded_length=0)
    ref_a = load_acoustic(a_dir / model_file(cpu), cpu)
    ref_v = load_vocoder(v_dir / model_file(cpu), HOP, cpu)
    eight = batch_of(ids, 8)
    speeds = np.array([[0, ls, 0] for ls in (0.5, 1, 2, 0.8, 1.25, 1.5, 0.7, 1)], np.float32)
    ref_latents = ref_a(eight, speeds)
    ref_audio = ref_v(ref_latents)

    def row(**kw) -> None:
        results["rows"].append(kw)
        print("  ".join(f"{k}={v}" for k, v in kw.items()), flush=True)

    modes = (
        {"both": (False, True), "on": (True,), "off": (False,)}[args.graphs] if cuda else (False,)
    )
    engines = [("torch", d, g) for d in dtypes for g in modes]
    if not cuda and (a_dir / "model.onnx").exists():
        engines.append(("onnxruntime", "float32", False))
    for engine, dtype, graphs in engines:
        settings = dict(engine=engine, device=device, max_padded_length=0)
        if engine == "torch":
            settings.update(dtype=dtype, intra_op_threads=0)
        if graphs:
            settings.update(
                cuda_graph_batches=",".join(map(str, args.batches)),
                cuda_graph_frames=",".join(map(str, args.frames)),
            )
        opts = EngineSettings(**settings)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        acoustic = load_acoustic(a_dir / model_file(opts), opts)
        vocoder = load_vocoder(v_dir / model_file(opts), HOP, opts)
        load_s = time.perf_counter() - start
        latents = acoustic(eight, speeds)
        audio = vocoder(ref_latents)
        # A duration on the edge of a frame can round the other way: count those, compare
        # the frames both have.
        moved = sum(a.shape != b.shape for a, b in zip(latents, ref_latents))
        err_latent = max(
            float(np.abs(a[:, : b.shape[1]] - b[:, : a.shape[1]]).max())
            for a, b in zip(latents, ref_latents)
        )
        err_audio = max(float(np.abs(a - b).max()) for a, b in zip(audio, ref_audio))
        tag = dict(engine=engine, dtype=dtype, cuda_graphs=graphs)
        row(
            **tag,
            load_s=round(load_s, 2),
            frames_moved=moved,
            err_latent=f"{err_latent:.2e}",
            err_audio=f"{err_audio:.2e}",
        )
        one = [np.array(ids[3], np.int64)]  # "The quick brown fox...": about 3 s of speech
        plain = np.array([[0.667, 1, 0.8]], np.float32)
        for b in args.batches:
            batch = batch_of(ids, b)
            scales = np.tile(plain, (b, 1))
            seconds = sum(lat.shape[-1] for lat in acoustic(batch, scales)) * HOP / SAMPLE_RATE
            t = timed(partial(acoustic, batch, scales), sync, args.repeat)
            row(
                **tag,
                stage="acoustic",
                batch=b,
                ms=round(t * 1e3, 2),
                audio_s_per_s=round(seconds / t),
            )
            for frames in args.frames:
                lat = [np.random.default_rng(0).standard_normal((192, frames), np.float32)] * b
                t = timed(partial(vocoder, lat), sync, args.repeat)
                secs = b * frames * HOP / SAMPLE_RATE
                row(
                    **tag,
                    stage="vocoder",
                    batch=b,
                    frames=frames,
                    ms=round(t * 1e3, 2),
                    audio_s_per_s=round(secs / t),
                )
                if engine == "torch":
                    # The latent already on the device (gpu-dlpack's hand-off): with the audio's
                    # one copy to pinned host memory, and with no copy at all (the engine alone).
                    x = torch.from_numpy(np.stack(lat)).to(device)
                    for stage, fn in (
                        ("vocoder_device_in", vocoder.net),
                        ("vocoder_on_device", vocoder.net.on_device),
                    ):
                        t = timed(partial(fn, x), sync, args.repeat)
                        row(
                            **tag,
                            stage=stage,
                            batch=b,
                            frames=frames,
                            ms=round(t * 1e3, 2),
                            audio_s_per_s=round(secs / t),
                        )
        t = timed(partial(sentence, acoustic, vocoder, one, plain), sync, args.repeat)
        secs = acoustic(one, plain)[0].shape[-1] * HOP / SAMPLE_RATE
        row(**tag, stage="sentence", batch=1, audio_s=round(secs, 2), ms=round(t * 1e3, 2))
        if cuda:
            row(**tag, peak_gpu_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
