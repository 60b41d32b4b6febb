"""Numbers to English words, from CLDR's rule-based number formats (``unicode-rbnf``).

``unicode-rbnf`` is maintained by the same people as Piper and reads the Unicode CLDR
spell-out rules, so cardinals, ordinals and years follow the standard US English forms
instead of a hand-written table. Numbers too long for those rules (CLDR stops below 10**15)
are read digit by digit, which is also how a person reads a long serial number.
"""

from __future__ import annotations

from functools import lru_cache

from unicode_rbnf import FormatPurpose, RbnfEngine

# CLDR's English rules spell out up to 999 trillion; past that, digits.
MAX_SPELLED = 10**15 - 1
_DIGITS = "zero one two three four five six seven eight nine".split()


@lru_cache(maxsize=1)
def _engine() -> RbnfEngine:
    return RbnfEngine.for_language("en")


def _spell(n: int, purpose: FormatPurpose) -> str:
    return _engine().format_number(n, purpose=purpose).text


def digits(s: str) -> str:
    """'14' -> 'one four' (after a decimal point, in phone numbers, long serials)."""
    return " ".join(_DIGITS[int(c)] for c in s if c.isdigit())


def cardinal(n: int) -> str:
    """1234 -> 'one thousand two hundred thirty-four'."""
    if abs(n) > MAX_SPELLED:
        return ("minus " if n < 0 else "") + digits(str(abs(n)))
    return _spell(n, FormatPurpose.CARDINAL)


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    if abs(n) > MAX_SPELLED:
        return cardinal(n)
    return _spell(n, FormatPurpose.ORDINAL)


def decimal(integer: str, fraction: str) -> str:
    """'3', '14' -> 'three point one four'."""
    whole = cardinal(int(integer.replace(",", ""))) if integer else "zero"
    return f"{whole} point {digits(fraction)}" if fraction else whole


def year(n: int) -> str:
    """1999 -> 'nineteen ninety-nine', 2005 -> 'two thousand five', 1905 -> 'nineteen oh five'."""
    if not 1000 <= n < 10000:
        return cardinal(n)
    return _spell(n, FormatPurpose.YEAR).replace("oh-", "oh ")


def plural(words: str) -> str:
    """'nineteen ninety' -> 'nineteen nineties', 'sixty' -> 'sixties' (decades)."""
    if words.endswith("y"):
        return words[:-1] + "ies"
    if words.endswith("x"):
        return words + "es"
    return words + "s"


def fraction(numerator: int, denominator: int) -> str:
    """1/2 -> 'one half', 3/4 -> 'three quarters', 5/8 -> 'five eighths'."""
    one = numerator == 1
    if denominator == 2:
        part = "half" if one else "halves"
    elif denominator == 4:
        part = "quarter" if one else "quarters"
    else:
        part = ordinal(denominator)
        part = part if one else plural(part)
    return f"{cardinal(numerator)} {part}"
