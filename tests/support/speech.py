"""Hearing what the server says: Whisper's transcript against the text, both normalized."""

from __future__ import annotations

import re

from tts_front.sample_texts import SENTENCES
from tts_serving.text import normalize as speak

# A dozen varied sentences plus text that needs normalization, all sent at once so the server
# batches them. Whisper should hear "five dollars and fifty cents" where the text says $5.50.
NORMALIZATION = (
    "The ticket costs $5.50 at the door.",
    "Dr. Smith arrives at 3:30 pm on March 15.",
    "Sales grew by 45% in 2023.",
    "The store is on Main St. and opens on the 2nd of May.",
    "Send it to help@example.com by Friday.",
    "We walked 5 km and it was 20°C outside.",
    # Classes the normalizer reads (numbers, units, times); Whisper writes digits, which
    # words() reads the same way.
    "We met at 10:05 am. The company's office was closed.",
    "Music from the 1990s is popular again.",
    "Call 555-123-4567 for help.",
    "Add 1/2 cup of sugar.",
    "Please install version 2.0.1 today.",
)
TEXTS = SENTENCES[2:14] + NORMALIZATION


def words(text: str) -> str:
    """Whisper writes numbers its own way ("$5.50"): both sides get the same normalization."""
    text = speak(text).lower().replace("-", " ")
    text = re.sub(r"[^a-z' ]+", " ", text)
    return " ".join(text.split())


def transcribe(whisper, audio, tmp_path, name: str) -> str:
    path = audio.write(tmp_path / f"{name}.wav")  # faster-whisper resamples from the file
    segments, _ = whisper.transcribe(str(path), language="en", beam_size=1)
    return " ".join(s.text for s in segments)
