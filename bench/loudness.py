"""Loudness of one streamed paragraph, chunk by chunk: one voice gain vs per-chunk peaks.

    python -m bench.loudness [--repository model_repository] [--seed 0]

Plans the paragraph exactly as ``tts_stream`` does (its served settings), synthesizes each
chunk in-process with the served acoustic and vocoder settings, and prints each chunk's
active speech level (RMS over 23 ms frames above -50 dBFS, so pauses do not count) under
``loudness: voice`` (one gain for the voice, the default) and ``loudness: peak`` (each
chunk's peak normalized on its own, as Piper does and as this server did before).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.machine import cpu_line
from tts_front.sample_texts import PARAGRAPH
from tts_serving.engines.loudness import (
    LOUDNESS_FILE,
    VoiceLoudness,
    active_level_dbfs,
    apply_gain,
    peak_normalize,
)
from tts_serving.engines.models import AcousticModel, VocoderModel
from tts_serving.engines.onnx import create_session
from tts_serving.settings import load_settings
from tts_serving.stream.plan import plan_chunks
from tts_serving.text.front_end import Reader
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loudness", description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    repo = args.repository
    voice = load_voice_config(repo / "vocoder/1/voice.json")
    stream = load_settings(repo, "tts_stream")
    a_settings, v_settings = load_settings(repo, "acoustic"), load_settings(repo, "vocoder")
    acoustic = AcousticModel(create_session(repo / "acoustic/1/model.onnx", a_settings), a_settings)
    vocoder = VocoderModel(
        create_session(repo / "vocoder/1/model.onnx", v_settings), voice.hop_length, v_settings
    )
    gain = VoiceLoudness.read(repo / "vocoder/1" / LOUDNESS_FILE).gain
    chunks = list(plan_chunks(PARAGRAPH, stream, Reader(Phonemizer(voice), stream.normalize_text)))
    scales = np.array([[voice.noise_scale, voice.length_scale, voice.noise_w_scale]], np.float32)
    raw = [vocoder(acoustic([np.array(c.ids)], scales))[0] for c in chunks]

    modes = {
        "voice": [apply_gain(a, gain) for a in raw],
        "peak": [peak_normalize(a) for a in raw],
    }
    levels = {m: [active_level_dbfs(a) for a in audio] for m, audio in modes.items()}
    whole = {m: active_level_dbfs(np.concatenate(audio)) for m, audio in modes.items()}
    print(f"{len(PARAGRAPH)} characters, {len(chunks)} chunks, voice gain {gain}")
    print("| chunk | voice (dBFS) | peak (dBFS) | text |\n|---|---|---|---|")
    for c, v, p in zip(chunks, levels["voice"], levels["peak"]):
        print(f"| {c.index} | {v:.1f} | {p:.1f} | {c.text[:40]} |")
    print("\n| loudness | stream level | chunk min | chunk max | spread | worst vs stream |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        lv = levels[m]
        worst = max(abs(x - whole[m]) for x in lv)
        print(
            f"| {m} | {whole[m]:.1f} | {min(lv):.1f} | {max(lv):.1f} | "
            f"{max(lv) - min(lv):.1f} dB | {worst:.1f} dB |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
