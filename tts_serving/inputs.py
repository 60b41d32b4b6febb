"""A request's inputs checked before any work: text decoding and size limits, speed and noise.

Pure functions, shared by the phonemizer, tts_stream and the stream planner; each raises
``InvalidInputError`` with a message that says what to fix. The speed range is the wire
contract's (``tts_wire.speed_error``, ``noise_error``), written once.
"""

from __future__ import annotations

import unicodedata

from tts_wire import TEXT_TOO_LONG, noise_error, speed_error

from .errors import InvalidInputError


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
    problem = speed_error(speed)
    if problem:
        raise InvalidInputError(problem)
    return speed


def validate_noise(name: str, value: float) -> float:
    """Noise scales are >= 0 and finite; 0 makes synthesis deterministic."""
    value = float(value)
    problem = noise_error(name, value)
    if problem:
        raise InvalidInputError(problem)
    return value


def check_encoded_size(raw: bytes | str, limit: int) -> bytes | str:
    """Refuse text whose UTF-8 size alone proves it is over ``limit`` characters (4 bytes per
    character at most), before it is decoded or copied: a 50 MB body costs nothing."""
    if isinstance(raw, bytes) and len(raw) > 4 * limit:
        raise InvalidInputError(
            f"{TEXT_TOO_LONG}: {len(raw)} bytes, the limit is {limit} characters; "
            "split it into shorter requests or use the streaming model"
        )
    return raw


def check_characters(text: str, limit: int) -> str:
    """Refuse text over ``limit`` characters before any work is done on it."""
    if len(text) > limit:
        raise InvalidInputError(
            f"{TEXT_TOO_LONG}: {len(text)} characters, the limit is {limit}; "
            "split it into shorter requests or use the streaming model"
        )
    return text
