"""Whisper tiny.en must understand what the server says (word error rate <= 10%)."""

from __future__ import annotations

import re

import jiwer
import pytest

from tests.texts import SENTENCES

# A dozen varied sentences, all sent at once so the server batches them.
DOZEN = SENTENCES[2:14]


def normalize(text: str) -> str:
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^a-z' ]+", " ", text)
    return " ".join(text.split())


def transcribe(whisper, audio, tmp_path, name: str) -> str:
    path = audio.write(tmp_path / f"{name}.wav")  # faster-whisper resamples from the file
    segments, _ = whisper.transcribe(str(path), language="en", beam_size=1)
    return " ".join(s.text for s in segments)


@pytest.mark.slow
def test_batched_speech_is_intelligible(grpc_client, whisper, tmp_path):
    audios = grpc_client.synthesize_many(list(DOZEN))
    references = [normalize(t) for t in DOZEN]
    hypotheses = [
        normalize(transcribe(whisper, a, tmp_path, f"s{i}")) for i, a in enumerate(audios)
    ]
    wer = jiwer.wer(references, hypotheses)
    detail = "\n".join(f"  {r!r}\n  {h!r}" for r, h in zip(references, hypotheses) if r != h)
    print(f"\nWER over {len(DOZEN)} batched sentences: {wer:.3f}\n{detail}")
    assert wer <= 0.10, detail
