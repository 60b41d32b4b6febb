"""A request's inputs checked before any work: text decoding and size limits, speed and noise.

Pure functions, shared by the phonemizer, tts_stream and the stream planner; each raises
``InvalidInputError`` with a message that says what to fix. The speed range is the wire
contract's (``tts_wire.speed_error``, ``noise_error``), written once.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from tts_wire import MAX_SPEED, MIN_SPEED, TEXT_TOO_LONG, noise_error, speed_error

from .errors import InvalidInputError


@dataclass(frozen=True)
class CleanText:
    """Text made speakable (NFC, control characters as spaces, whitespace runs as one space,
    none at the ends), and where each of its characters came from in the text as sent: word
    spans are found in the clean text and must be given back in the sent one (a decomposed
    accent or a control character moved every later word's span by one)."""

    text: str
    starts: tuple[int, ...]  # per character: its first character in the sent text
    ends: tuple[int, ...]  # per character: one past its last (a base and its marks)

    def sent_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the sent text that ``text[start:end]`` came from. Marks at its ends
        that come from past a gap in the sent text (markup between: the "." after
        ``</sub>``) are left out, so a word's span never covers markup."""
        n = len(self.text)
        if not n:
            return 0, 0
        start, end = int(start), int(end)  # (a stream's rows are float32)
        start = min(max(start, 0), n - 1)
        end = min(max(end, start + 1), n)
        start, end = self._trim(start, end)
        return self.starts[start], self.ends[end - 1]

    def _trim(self, start: int, end: int) -> tuple[int, int]:
        text, starts, ends = self.text, self.starts, self.ends
        first = start
        while first < end - 1 and not text[first].isalnum():
            first += 1
        last = end - 1
        while last > first and not text[last].isalnum():
            last -= 1
        for k in range(last + 1, end):  # the first gap after the word's last letter or digit
            if starts[k] > ends[k - 1]:
                end = k
                break
        for k in range(first, start, -1):  # the last gap before its first
            if starts[k] > ends[k - 1]:
                start = k
                break
        return start, end


def clean_text(text: str) -> CleanText:
    """:class:`CleanText` of ``text``."""
    chars: list[str] = []
    spans: list[tuple[int, int]] = []
    i, n = 0, len(text)
    while i < n:
        # A base character and the combining marks after it compose (NFC) among themselves.
        j = i + 1
        while j < n and unicodedata.combining(text[j]):
            j += 1
        for c in unicodedata.normalize("NFC", text[i:j]):
            # Control characters (other than whitespace) are unspeakable and confuse espeak-ng.
            chars.append(" " if unicodedata.category(c) == "Cc" else c)
            spans.append((i, j))
        i = j
    out: list[str] = []
    kept: list[tuple[int, int]] = []
    space: tuple[int, int] | None = None
    for c, span in zip(chars, spans, strict=True):
        if c.isspace():
            space = space or span
            continue
        if space is not None and out:
            out.append(" ")
            kept.append(space)
        space = None
        out.append(c)
        kept.append(span)
    return CleanText("".join(out), tuple(a for a, _ in kept), tuple(b for _, b in kept))


def decode_utf8(raw: bytes | str) -> str:
    """UTF-8 bytes from a TYPE_STRING tensor as the text sent, or InvalidInputError."""
    if not isinstance(raw, bytes):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(
            f"text is not valid UTF-8 (bad byte at offset {e.start}); send UTF-8 encoded text"
        ) from None


def decode_clean(raw: bytes | str) -> CleanText:
    """UTF-8 bytes from a TYPE_STRING tensor to :class:`CleanText`, or InvalidInputError."""
    clean = clean_text(decode_utf8(raw))
    if not clean.text:
        raise InvalidInputError("text is empty or only whitespace; send at least one word")
    return clean


def sent_rows(rows: list, clean: CleanText) -> list:
    """Word rows ``[a, b, first character, end character]`` with their characters moved from
    the clean text to the text as sent."""
    return [[a, b, *clean.sent_span(c0, c1)] for a, b, c0, c1 in rows]


def decode_text(raw: bytes | str) -> str:
    """UTF-8 bytes from a TYPE_STRING tensor to clean text, or InvalidInputError."""
    return decode_clean(raw).text


def validate_speed(speed: float) -> float:
    """Speed factor (1.0 = the voice's natural pace) within [MIN_SPEED, MAX_SPEED]."""
    speed = float(speed)
    problem = speed_error(speed)
    if problem:
        raise InvalidInputError(problem)
    return speed


def validate_rate(speed: float, rate: float) -> float:
    """The speed of an SSML span: the request's ``speed`` times its ``<prosody rate>``, within
    the same range (its error names the rate when the rate put it out)."""
    try:
        return validate_speed(speed * rate)
    except InvalidInputError:
        if rate == 1.0:
            raise
        raise InvalidInputError(
            f"<prosody rate> makes a span's speed {speed * rate:g} (the request's {speed:g} "
            f"times the rate {rate:g}), outside {MIN_SPEED:g}..{MAX_SPEED:g}"
        ) from None


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
