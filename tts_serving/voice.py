"""The voice's text side: input validation and espeak-ng phonemization (from piper-tts)."""

from __future__ import annotations

import json
import math
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from piper.config import PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import ESPEAK_DATA_DIR, EspeakPhonemizer

from .errors import InvalidInputError

MIN_SPEED = 0.25
MAX_SPEED = 4.0
DEFAULT_MAX_PHONEME_IDS = 400


def load_voice_config(path: str | Path) -> PiperConfig:
    """Read a Piper ``.onnx.json`` voice config."""
    with open(path, encoding="utf-8") as f:
        return PiperConfig.from_dict(json.load(f))


def decode_text(raw: bytes | str) -> str:
    """UTF-8 bytes from a TYPE_STRING tensor to clean text, or InvalidInputError."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidInputError(
                f"text is not valid UTF-8 (bad byte at offset {e.start}); send UTF-8 encoded text"
            ) from None
    else:
        text = raw
    # Control characters (other than whitespace) are unspeakable and confuse espeak-ng.
    text = "".join(
        " " if unicodedata.category(c) == "Cc" else c for c in unicodedata.normalize("NFC", text)
    )
    text = " ".join(text.split())
    if not text:
        raise InvalidInputError("text is empty or only whitespace; send at least one word")
    return text


def validate_speed(speed: float) -> float:
    """Speed factor (1.0 = the voice's natural pace) within [MIN_SPEED, MAX_SPEED]."""
    speed = float(speed)
    if math.isnan(speed) or not (MIN_SPEED <= speed <= MAX_SPEED):
        raise InvalidInputError(
            f"speed must be between {MIN_SPEED} and {MAX_SPEED} (1.0 = normal pace), got {speed}"
        )
    return speed


def validate_noise(name: str, value: float) -> float:
    """Noise scales are >= 0 and finite; 0 makes synthesis deterministic."""
    value = float(value)
    if not math.isfinite(value) or value < 0 or value > 2:
        raise InvalidInputError(f"{name} must be between 0 and 2, got {value}")
    return value


# espeak-ng keeps global state in the C library: one engine and one call at a time per process.
_ESPEAK_LOCK = threading.Lock()
_ESPEAK: EspeakPhonemizer | None = None


def _espeak() -> EspeakPhonemizer:
    global _ESPEAK
    if _ESPEAK is None:
        _ESPEAK = EspeakPhonemizer(ESPEAK_DATA_DIR)
    return _ESPEAK


@dataclass(frozen=True)
class Phonemizer:
    """Text -> phoneme ids for one voice, with a limit on ids per request."""

    config: PiperConfig
    max_phoneme_ids: int = DEFAULT_MAX_PHONEME_IDS

    def phonemes(self, text: str) -> list[str]:
        """One phoneme list for the whole text; sentences joined by a space."""
        with _ESPEAK_LOCK:
            sentences = _espeak().phonemize(
                self.config.espeak_voice, text, vowel_clusters=self.config.vowel_clusters
            )
        joined: list[str] = []
        for sentence in sentences:
            if sentence:
                if joined:
                    joined.append(" ")
                joined.extend(sentence)
        return joined

    def ids(self, text: str) -> list[int]:
        """Phoneme ids (with BOS/EOS/padding) for ``text``, or InvalidInputError."""
        phonemes = self.phonemes(text)
        if not any(p in self.config.phoneme_id_map and not p.isspace() for p in phonemes):
            raise InvalidInputError(
                "text has nothing speakable (no letters or digits after phonemization)"
            )
        ids = phonemes_to_ids(phonemes, self.config.phoneme_id_map)
        if len(ids) > self.max_phoneme_ids:
            raise InvalidInputError(
                f"text is too long: {len(ids)} phoneme ids, the limit is {self.max_phoneme_ids} "
                f"(about {len(text) * self.max_phoneme_ids // len(ids)} characters of this text); "
                "split it into shorter requests or use the streaming model"
            )
        return ids
