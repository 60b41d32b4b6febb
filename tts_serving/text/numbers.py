"""Numbers to English words: cardinals, ordinals, decimals, years."""

from __future__ import annotations

_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = (
    (10**12, "trillion"),
    (10**9, "billion"),
    (10**6, "million"),
    (1000, "thousand"),
    (100, "hundred"),
)
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}


def cardinal(n: int) -> str:
    """1234 -> 'one thousand two hundred thirty-four'."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")
    for value, word in _SCALES:
        if n >= value:
            high, rest = divmod(n, value)
            words = f"{cardinal(high)} {word}"
            return f"{words} {cardinal(rest)}" if rest else words
    raise AssertionError("unreachable")


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = words.rpartition("-" if "-" in words.split(" ")[-1] else " ")
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return head + sep + last


def digits(s: str) -> str:
    """'14' -> 'one four' (after a decimal point)."""
    return " ".join(_ONES[int(c)] for c in s)


def decimal(integer: str, fraction: str) -> str:
    """'3', '14' -> 'three point one four'."""
    whole = cardinal(int(integer.replace(",", ""))) if integer else "zero"
    return f"{whole} point {digits(fraction)}" if fraction else whole


def year(n: int) -> str:
    """1999 -> 'nineteen ninety-nine', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four'."""
    if n < 1000 or n >= 10000:
        return cardinal(n)
    high, low = divmod(n, 100)
    if 2000 <= n < 2010:
        return cardinal(n)
    if low == 0:
        return f"{cardinal(high)} hundred"
    if low < 10:
        return f"{cardinal(high)} oh {cardinal(low)}"
    return f"{cardinal(high)} {cardinal(low)}"
