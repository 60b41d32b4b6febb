"""Why each ONNX Runtime call has a padded-size budget: batch cost on this CPU, in-process.

    python -m bench.budget [--threads 1 2]

1. Equal-length random latents through the vocoder in sub-batches of 1, 2, 4 and 16: cost per
   item against batch x frames (no padding involved).
2. The 16 test sentences as one batch through the real AcousticModel / VocoderModel classes with
   different ``max_padded_length`` / ``bucket_max_waste`` settings (median of repeats).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tts_front.sample_texts import SENTENCES
from tts_serving.engines.models import AcousticModel, VocoderModel
from tts_serving.engines.onnx import create_session
from tts_serving.settings import load_settings
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


def best_of(fn, repeats: int = 2) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.budget",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    repo = args.repository
    voice = load_voice_config(repo / "acoustic/1/voice.json")
    phonemizer = Phonemizer(voice)
    ids = [np.array(phonemizer.ids(s)) for s in SENTENCES]
    scales = np.tile(np.array([[voice.noise_scale, 1.0, voice.noise_w_scale]], np.float32), (16, 1))
    rng = np.random.default_rng(0)

    # Start from the settings the server runs with; each experiment changes one knob.
    served = {m: load_settings(repo, m) for m in ("acoustic", "vocoder")}
    for threads in args.threads:
        opts = replace(served["vocoder"], intra_op_threads=threads)
        acoustic_session = create_session(repo / "acoustic/1/model.onnx", opts)
        vocoder_session = create_session(repo / "vocoder/1/model.onnx", opts)

        print(f"\n## {threads} thread(s): vocoder, 16 equal-length items in sub-batches")
        print("| frames | sub-batch 1 | 2 | 4 | 16 |\n|---|---|---|---|---|")
        for frames in (100, 300):
            x = (rng.standard_normal((16, 192, frames)) * 0.5).astype(np.float32)
            row = []
            for b in (1, 2, 4, 16):

                def run(b=b, x=x, session=vocoder_session):
                    for i in range(0, 16, b):
                        session.run(None, {"latent": x[i : i + b]})

                row.append(f"{best_of(run, 1):.2f} s")
            print(f"| {frames} | " + " | ".join(row) + " |")

        latents = AcousticModel(acoustic_session, served["acoustic"])(ids, scales)
        print(f"\n## {threads} thread(s): the 16 test sentences as one batch")
        print("| stage | max_padded_length | bucket_max_waste | time |\n|---|---|---|---|")
        for budget, waste in ((0, 1.0), (1, 1.0), (400, 1.0), (800, 1.0), (0, 0.3)):
            o = replace(served["acoustic"], max_padded_length=budget, bucket_max_waste=waste)
            a = AcousticModel(acoustic_session, o)
            print(
                f"| acoustic | {budget} | {waste} | {best_of(lambda a=a: a(ids, scales)):.2f} s |"
            )
        for budget, waste in ((0, 1.0), (1, 1.0), (200, 1.0), (400, 1.0), (600, 1.0), (400, 0.3)):
            o = replace(served["vocoder"], max_padded_length=budget, bucket_max_waste=waste)
            v = VocoderModel(vocoder_session, voice.hop_length, o)
            seconds = best_of(lambda v=v, lat=latents: v(lat))
            print(f"| vocoder | {budget} | {waste} | {seconds:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
