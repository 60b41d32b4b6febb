"""SSML ``<say-as interpret-as=...>``: a span of text rewritten as it should be read.

English voices get words from our normalizer's own rules (``numbers``, ``normalize``); other
voices get the span as espeak-ng reads it in their language, except spelled letters and digits,
which every language reads one by one when they are spaced out.
"""

from __future__ import annotations

import re

from ..errors import InvalidInputError
from .normalize import MONTHS, normalize
from .numbers import cardinal, decimal, digits, ordinal, year

KINDS = (
    "characters",
    "spell-out",
    "cardinal",
    "number",
    "ordinal",
    "digits",
    "date",
    "time",
    "telephone",
)
DATE_FORMATS = ("mdy", "dmy", "ymd", "md", "dm", "ym", "my", "y")
_NUMBER = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th|\.)?$", re.IGNORECASE)


def known(kind: str, fmt: str | None) -> bool:
    """Whether ``kind`` (and a date's ``fmt``) is one this reads. SSML 1.1 (3.1.9): content of
    an unknown one is read as if the element were not there."""
    return kind in KINDS and (kind != "date" or fmt is None or fmt in DATE_FORMATS)


def say_as(kind: str, text: str, fmt: str | None, english: bool) -> str:
    """``text`` as ``kind`` is read (``fmt``: a date's field order), or InvalidInputError;
    ``kind`` and ``fmt`` are :func:`known` ones."""
    text = " ".join(text.split())
    if not known(kind, fmt):
        raise InvalidInputError(f"<say-as>: interpret-as {kind!r}, format {fmt!r} is not known")
    if not text:
        raise InvalidInputError(f"<say-as interpret-as={kind!r}> is empty; put the text inside")
    if kind in ("characters", "spell-out"):
        return " ".join(_letter(c, english) for c in text if not c.isspace())
    if kind == "digits":
        if not any(c.isdigit() for c in text):
            raise InvalidInputError(f"<say-as interpret-as='digits'>: {text!r} has no digits")
        return digits(text) if english else " ".join(c for c in text if c.isdigit())
    if not english:
        return text  # espeak-ng's own reading in the voice's language
    if kind in ("cardinal", "number"):
        return _cardinal(text)
    if kind == "ordinal":
        m = _ORDINAL.match(text)
        if not m:
            raise InvalidInputError(f"<say-as interpret-as='ordinal'>: {text!r} is not a number")
        return ordinal(int(m.group(1)))
    if kind == "date":
        return _date(text, fmt)
    if kind == "time":
        return _time(text)
    return _telephone(text)


def _letter(c: str, english: bool) -> str:
    if c.isdigit():
        return digits(c) if english else c
    return c.upper()


def _cardinal(text: str) -> str:
    m = _NUMBER.match(text)
    if not m:
        raise InvalidInputError(
            f"<say-as interpret-as='cardinal'>: {text!r} is not a number (digits, optional sign, "
            "commas between thousands, a decimal point)"
        )
    sign, whole, fraction = m.groups()
    words = decimal(whole, fraction) if fraction else cardinal(int(whole.replace(",", "")))
    return ("minus " if sign == "-" else "") + words


def _date(text: str, fmt: str | None) -> str:
    fmt = fmt or ("ymd" if re.match(r"^\d{4}\D", text) else "mdy")
    parts = [p for p in re.split(r"[-/.\s]+", text) if p]
    if len(parts) != len(fmt) or not all(p.isdigit() for p in parts):
        raise InvalidInputError(
            f"<say-as interpret-as='date' format={fmt!r}>: {text!r} is not a date in that "
            f"order (numbers separated by - / or .)"
        )
    field = {k: int(p) for k, p in zip(fmt, parts, strict=True)}
    y, m, d = field.get("y"), field.get("m"), field.get("d")
    if (m is not None and not 1 <= m <= 12) or (d is not None and not 1 <= d <= 31):
        raise InvalidInputError(f"<say-as interpret-as='date'>: {text!r} is not a valid date")
    if y is not None and len(parts[fmt.index("y")]) == 2:
        y += 2000
    if m is None:
        return year(y)  # type: ignore[arg-type]
    said = MONTHS[m - 1] + (f" {ordinal(d)}" if d is not None else "")
    return (
        f"{said}, {year(y)}"
        if y is not None and d is not None
        else (f"{said} {year(y)}" if y is not None else said)
    )


_TIME = re.compile(r"^([01]?\d|2[0-3])(:[0-5]\d)?\s*([ap]\.?m\.?)?$", re.IGNORECASE)


def _time(text: str) -> str:
    m = _TIME.match(text)
    if not m or not (m.group(2) or m.group(3)):
        raise InvalidInputError(
            f"<say-as interpret-as='time'>: {text!r} is not a time (10:30, 7pm, 7:05 a.m.)"
        )
    return normalize(text)


def _telephone(text: str) -> str:
    groups = re.findall(r"\d+", text)
    if not groups:
        raise InvalidInputError(f"<say-as interpret-as='telephone'>: {text!r} has no digits")
    said = ", ".join(digits(g) for g in groups)
    return ("plus " if text.lstrip().startswith("+") else "") + said
