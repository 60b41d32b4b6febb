"""English text normalization: write out what a reader would say.

``normalize("Dr. Smith paid $5.50 on 3/15/2024.")`` ->
``"Doctor Smith paid five dollars and fifty cents on March fifteenth, twenty twenty-four."``

Each rule is a regular expression with a function; they run in a fixed order (URLs and e-mail
before symbols, currency before plain numbers). The result holds no digits, and normalizing it
again changes nothing.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from .numbers import cardinal, decimal, digits, fraction, ordinal, plural, year

MONTHS = (
    "January February March April May June July August September October November December"
).split()
_MONTH_ABBR = {m[:3].lower(): m for m in MONTHS}

ABBREVIATIONS = {
    "Dr.": "Doctor",
    "Mr.": "Mister",
    "Mrs.": "Missus",
    "Ms.": "Miz",
    "Prof.": "Professor",
    "Jr.": "Junior",
    "Sr.": "Senior",
    "Mt.": "Mount",
    "Ave.": "Avenue",
    "Rd.": "Road",
    "Blvd.": "Boulevard",
    "vs.": "versus",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
    "approx.": "approximately",
    "Inc.": "Incorporated",
    "Ltd.": "Limited",
    "Co.": "Company",
    "Dept.": "Department",
    "Gov.": "Governor",
    "Sen.": "Senator",
    "Rep.": "Representative",
    "Capt.": "Captain",
    "Lt.": "Lieutenant",
    "Sgt.": "Sergeant",
    "Gen.": "General",
}

CURRENCIES = {  # symbol or code -> (singular, plural, cent singular, cent plural)
    "$": ("dollar", "dollars", "cent", "cents"),
    "USD": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "EUR": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "GBP": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "sen", "sen"),
    "JPY": ("yen", "yen", "sen", "sen"),
}

UNITS = {  # after a number: singular, plural
    "km": ("kilometer", "kilometers"),
    "m": ("meter", "meters"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "in": ("inch", "inches"),
    "kg": ("kilogram", "kilograms"),
    "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"),
    "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "l": ("liter", "liters"),
    "ml": ("milliliter", "milliliters"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "h": ("hour", "hours"),
    "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "sec": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "kb": ("kilobyte", "kilobytes"),
    "mb": ("megabyte", "megabytes"),
    "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"),
    "ghz": ("gigahertz", "gigahertz"),
    "mhz": ("megahertz", "megahertz"),
    "khz": ("kilohertz", "kilohertz"),
    "hz": ("hertz", "hertz"),
    "kw": ("kilowatt", "kilowatts"),
    "w": ("watt", "watts"),
    "°c": ("degree Celsius", "degrees Celsius"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}

SYMBOLS = {
    "&": " and ",
    "%": " percent ",
    "+": " plus ",
    "=": " equals ",
    "@": " at ",
    "#": " number ",
    "°": " degrees ",
    "~": " about ",
    "×": " times ",
    "÷": " divided by ",
    "<": " less than ",
    ">": " greater than ",
    "/": " slash ",
    "*": " ",
    "_": " ",
    "|": " ",
    "^": " ",
    "\\": " ",
}

_NUM = r"\d{1,3}(?:,\d{3})+|\d+"  # 1,234,567 or 1234567


def _int(s: str) -> int:
    return int(s.replace(",", ""))


def _plural(n_words: str, singular: str, plural: str) -> str:
    return f"{n_words} {singular if n_words == 'one' else plural}"


def _money(m: re.Match) -> str:
    symbol = m.group("sym") or m.group("code")
    one, many, cent, cents = CURRENCIES[symbol.upper() if symbol.isalpha() else symbol]
    whole, frac, scale = m.group("int"), m.group("frac"), m.group("scale")
    if scale:  # $2.5 million -> two point five million dollars
        return f"{decimal(whole, frac or '')} {scale.lower()} {many}"
    amount = _int(whole)
    parts = []
    if amount or not frac:
        parts.append(_plural(cardinal(amount), one, many))
    if frac:
        c = int((frac + "0")[:2])
        if c:
            parts.append(_plural(cardinal(c), cent, cents))
    return " and ".join(parts) or f"zero {many}"


def _percent(m: re.Match) -> str:
    return f"{decimal(m.group(1), m.group(2) or '')} percent"


def _time(m: re.Match) -> str:
    hour, minute, ampm = int(m.group(1)), int(m.group(2)), m.group(3)
    if hour > 23 or minute > 59:
        return m.group(0)
    if minute == 0:
        words = f"{cardinal(hour)} o'clock" if not ampm else cardinal(hour)
    elif minute < 10:
        words = f"{cardinal(hour)} oh {cardinal(minute)}"
    else:
        words = f"{cardinal(hour)} {cardinal(minute)}"
    return words + _ampm(m, ampm)


def _ampm(m: re.Match, ampm: str | None) -> str:
    """' a m' for am/a.m.; a final period that also ends the sentence is kept."""
    if not ampm:
        return ""
    spoken = " " + " ".join(ampm.replace(".", "").lower())
    rest = m.string[m.end() : m.end() + 2]
    if ampm.endswith(".") and (not rest.strip() or re.match(r"\s[A-Z\"'(]", rest)):
        spoken += "."
    return spoken


def _hour_ampm(m: re.Match) -> str:
    hour = int(m.group(1))
    if not 1 <= hour <= 12:
        return m.group(0)
    return cardinal(hour) + _ampm(m, m.group(2))


def _decade(m: re.Match) -> str:
    n = m.group(1)
    return plural(year(int(n)) if len(n) == 4 else cardinal(int(n)))


def _phone(m: re.Match) -> str:
    groups = [g for g in m.groups() if g]
    return ", ".join(digits(g) for g in groups)


def _fraction(m: re.Match) -> str:
    whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
    if den == 0 or (num, den) == (24, 7):
        return m.group(0).replace("/", " ")  # 24/7 reads "twenty-four seven"
    words = fraction(num, den)
    return f"{cardinal(int(whole))} and {words}" if whole else words


def _dotted_numbers(m: re.Match) -> str:
    """192.168.0.1 (four parts up to 255): an address, read with 'dot'; 2.0.1: a version."""
    parts = m.group(2).split(".")
    is_address = len(parts) == 4 and all(int(p) <= 255 for p in parts) and not m.group(1)
    joined = (" dot " if is_address else " point ").join(cardinal(int(p)) for p in parts)
    return ("version " if m.group(1) else "") + joined


def _date_text(month: int, day: int, yr: int | None) -> str:
    text = f"{MONTHS[month - 1]} {ordinal(day)}"
    return f"{text}, {year(yr)}" if yr is not None else text


def _iso_date(m: re.Match) -> str:
    y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    return _date_text(mo, d, y)


def _us_date(m: re.Match) -> str:
    mo, d, y = int(m.group(1)), int(m.group(2)), m.group(3)
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return m.group(0)
    yr = int(y) + (2000 if len(y) == 2 else 0) if y else None
    return _date_text(mo, d, yr)


def _month_day(m: re.Match) -> str:
    month = MONTHS.index(_MONTH_ABBR[m.group(1)[:3].lower()]) + 1
    return _date_text(month, int(m.group(2)), int(m.group(3)) if m.group(3) else None)


def _ordinal(m: re.Match) -> str:
    return ordinal(_int(m.group(1)))


def _unit(m: re.Match) -> str:
    number, frac, unit = m.group(1), m.group(2), m.group(3)
    singular, plural = UNITS[unit.lower()]
    if frac:
        return f"{decimal(number, frac)} {plural}"
    return _plural(cardinal(_int(number)), singular, plural)


def _url(m: re.Match) -> str:
    url = re.sub(r"^(https?://)", "", m.group(0))
    url = url.rstrip("/")
    spoken = re.sub(r"\.", " dot ", url)
    spoken = spoken.replace("/", " slash ").replace("-", " dash ").replace("?", " ")
    return " ".join(spoken.split())


def _email(m: re.Match) -> str:
    user, domain = m.group(1), m.group(2)
    user = user.replace(".", " dot ").replace("_", " underscore ").replace("-", " dash ")
    return f"{user} at {domain.replace('.', ' dot ')}"


def _number(m: re.Match) -> str:
    sign, whole, frac = m.group(1), m.group(2), m.group(3)
    words = decimal(whole, frac) if frac is not None else cardinal(_int(whole))
    if not frac and "," not in whole and 1100 <= _int(whole) <= 2099 and not sign:
        words = year(_int(whole))  # a bare four-digit number here is most often a year
    return ("minus " if sign else "") + words


def _abbreviation(m: re.Match) -> str:
    return ABBREVIATIONS[m.group(0)]


def _saint_or_street(m: re.Match) -> str:
    # "St. Louis" is a saint; "Main St." is a street.
    return "Saint" if m.group(1) else "Street"


def _temperature(m: re.Match) -> str:
    scale = "Celsius" if m.group(3) == "C" else "Fahrenheit"
    return f"{_num_words(m.group(1), m.group(2))} degrees {scale}"


_CURRENCY_SYMBOLS = "".join(re.escape(s) for s in CURRENCIES if not s.isalpha())
_CURRENCY_CODES = "|".join(s for s in CURRENCIES if s.isalpha())
_UNIT_PATTERN = "|".join(
    re.escape(u) for u in sorted(UNITS, key=len, reverse=True) if not u.startswith("°")
)

_ABBREVIATION_PATTERN = "|".join(re.escape(k) for k in ABBREVIATIONS)
_MONTH_PATTERN = r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"

# Order matters: addresses before symbols, money/percent/time/dates before plain numbers.
RULES: list[tuple[re.Pattern, str | Callable[[re.Match], str]]] = [
    # Linear in the input: each pattern may start only where its run begins (look-behind)
    # and its parts are bounded, so 'a.a.a.…' or 'www.www.…' cannot make it backtrack.
    (
        re.compile(r"(?<![\w.+-])([\w.+-]{1,64})@([\w-]{1,63}(?:\.[\w-]{1,63}){1,8})\b"),
        _email,
    ),
    (re.compile(r"(?<![\w./:-])(?:https?://|www\.)\S{0,2000}[^\s.,;:!?)\]]"), _url),
    (
        re.compile(
            r"(?<![a-z0-9-])[a-z0-9-]{1,63}\.(?:com|org|net|io|dev|edu|gov|ai)\b"
            r"(?:/\S{0,2000}[^\s.,;:!?)\]])?"
        ),
        _url,
    ),
    # Digit runs past what any number rule reads (CLDR stops below 10**15): digit by digit.
    (re.compile(r"\d(?:,?\d){15,}"), lambda m: f" {digits(m.group(0))} "),
    # (555) 123-4567, 555-123-4567, +1 555.123.4567: digit groups, not numbers.
    (
        re.compile(r"(?<![\w+-])(?:\+?(1)[\s.-])?\(?(\d{3})\)?[\s.-](\d{3})[.-](\d{4})(?![\w-])"),
        _phone,
    ),
    (re.compile(r"(?<![\w.])([vV])?(\d{1,9}(?:\.\d{1,9}){2,})(?!\w|\.\d)"), _dotted_numbers),
    (re.compile(r"(?<![\w.])(" + _ABBREVIATION_PATTERN + r")(?=\s|$)"), _abbreviation),
    (re.compile(r"\bSt\.(?=\s+([A-Z]))|(?<=\w )St\.(?!\w)"), _saint_or_street),
    (re.compile(r"\bNo\.\s?(?=\d)"), "number "),
    (
        re.compile(
            r"(?:(?P<sym>["
            + _CURRENCY_SYMBOLS
            + r"])\s?|(?P<code>\b(?:"
            + _CURRENCY_CODES
            + r"))\s)"
            r"(?P<int>" + _NUM + r")(?:\.(?P<frac>\d+))?"
            r"(?:\s?(?P<scale>thousand|million|billion|trillion)\b)?"
        ),
        _money,
    ),
    (re.compile(r"(\d+)(?:\.(\d+))?\s?%"), _percent),
    (re.compile(r"\b(\d{1,2}):(\d{2})(?:\s?([AaPp]\.?[Mm]\b\.?))?(?!\d)"), _time),
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), _iso_date),
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b"), _us_date),
    (
        re.compile(r"\b" + _MONTH_PATTERN + r"\s+(\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(\d{4}))?\b"),
        _month_day,
    ),
    (re.compile(r"\b(\d{1,2})\s?([AaPp]\.?[Mm]\b\.?)"), _hour_ampm),
    (re.compile(r"(?<![\w/.])(?:(\d{1,3})\s)?(\d{1,3})/(\d{1,3})(?![\w/]|\.\d)"), _fraction),
    (re.compile(r"(?<![\w.,])['\u2019]?(\d0|\d{3}0)['\u2019]?s\b"), _decade),
    (re.compile(r"\b(\d+)(?:st|nd|rd|th)\b"), _ordinal),
    (re.compile(r"(-?\d+(?:,\d{3})*)(?:\.(\d+))?\s?°\s?([CF])\b"), _temperature),
    (
        re.compile(r"\b(" + _NUM + r")(?:\.(\d+))?\s?(" + _UNIT_PATTERN + r")\b(?!\.\w)", re.I),
        _unit,
    ),
    (re.compile(r"(?<![\w.])(-)?(" + _NUM + r")(?:\.(\d+))?(?!\w)"), _number),
    (re.compile(r"(\d+)"), lambda m: f" {cardinal(int(m.group(1)))} "),  # glued to letters
]


def _num_words(whole: str, frac: str | None) -> str:
    sign = "minus " if whole.startswith("-") else ""
    whole = whole.lstrip("-")
    return sign + (decimal(whole, frac) if frac else cardinal(_int(whole)))


def _speakable(c: str) -> bool:
    cat = unicodedata.category(c)
    if cat.startswith(("L", "N", "Z")) or cat in ("Pd", "Po", "Ps", "Pe", "Pi", "Pf"):
        return True
    return c in SYMBOLS or c in _CURRENCY_SYMBOLS or c in "$€£¥°'"


def normalize(text: str) -> str:
    """Rewrite ``text`` the way an English reader would say it."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    text = " ".join(text.split())  # single spaces: no rule below meets a long whitespace run
    # Emoji and other pictographs have no reading here: drop them, keep the words around them.
    text = "".join(c if _speakable(c) else " " for c in text)
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    for pattern, replacement in RULES:
        text = pattern.sub(replacement, text)
    for symbol, words in SYMBOLS.items():
        text = text.replace(symbol, words)
    text = re.sub(r" ([,.;:!?])", r"\1", " ".join(text.split()))
    return " ".join(text.split())
