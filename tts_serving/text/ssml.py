"""SSML documents: a ``<speak>`` text -> segments, each spoken by one voice at one rate.

A text is SSML when it starts with ``<speak``, an XML declaration or a DOCTYPE: OpenAI's
``input`` has no field for a text type, and a text that starts so but is not a well-formed
document is refused whole, never read half as markup and half as words.

The parser is expat with DTDs, entity declarations and external entities refused (no XML
bombs, nothing fetched); depth, attribute size, breaks and segments are bounded. Each segment
keeps where its characters are in the document, so word timestamps point into the document
as sent. Supported (anything else is refused by name): ``speak``, ``p``, ``s``, ``break``
(``time``, ``strength``), ``prosody`` (``rate``, ``volume``; ``pitch`` only at its default),
``emphasis`` (``level``), ``mark`` (``name``), ``say-as``, ``sub``, ``phoneme`` (IPA),
``voice`` (``name``) and ``lang`` (``xml:lang``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from xml.parsers import expat

from tts_wire import MAX_GAIN_DB, SILENT_DB

from ..errors import InvalidInputError
from ..inputs import CleanText
from ..settings import TextSettings
from ..voices import speaker_number
from .inline import CLOSE, OPEN
from .say_as import known, say_as

MAX_DEPTH = 16
MAX_ATTRIBUTE = 1000  # characters; a word's IPA is far shorter
MAX_BREAK_S = 10.0
# Pause lengths (seconds) of <break strength>, and after a sentence and a paragraph.
STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.6,
             "x-strong": 1.0}  # fmt: skip
SENTENCE_PAUSE = STRENGTHS["weak"]
PARAGRAPH_PAUSE = STRENGTHS["strong"]
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25,
         "x-fast": 1.75}  # fmt: skip
NEUTRAL = ("default", "medium", "+0%", "0%", "+0st", "0st", "+0dB", "0dB")
# <prosody volume> (dB); a change ("+6dB", "-3dB") within VOLUME_RANGE_DB.
VOLUMES = {"silent": SILENT_DB, "x-soft": -12.0, "soft": -6.0, "medium": 0.0, "default": 0.0,
           "loud": 6.0, "x-loud": 10.0}  # fmt: skip
VOLUME_RANGE_DB = (-40.0, MAX_GAIN_DB)
# <emphasis level>: (rate, gain dB), as other engines render it: slower and louder, or faster
# and softer.
EMPHASIS = {"strong": (0.85, 4.0), "moderate": (0.92, 2.0), "reduced": (1.1, -4.0),
            "none": (1.0, 0.0)}  # fmt: skip
ALLOWED = {
    "speak": {"version", "xmlns", "xml:lang", "xmlns:xsi", "xsi:schemaLocation"},
    "p": {"xml:lang"},
    "s": {"xml:lang"},
    "break": {"time", "strength"},
    "prosody": {"rate", "pitch", "volume"},
    "emphasis": {"level"},
    "mark": {"name"},
    "say-as": {"interpret-as", "format"},
    "sub": {"alias"},
    "phoneme": {"alphabet", "ph"},
    "voice": {"name"},
    "lang": {"xml:lang"},
}
TAKES_TEXT_ONLY = ("say-as", "sub", "phoneme")
# An XML declaration or a DOCTYPE also makes a text a document (refused if not SSML): read as
# words, its markup would be spoken.
_START = re.compile(r"\ufeff?\s*(<\?xml[\s?]|<!DOCTYPE[\s>]|<speak[\s>/])", re.IGNORECASE)
# Before the document: a byte-order mark (editors on Windows write one) and whitespace, which
# XML does not allow before its declaration; parsed without them, located with them.
_LEAD = "\ufeff \t\r\n"
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*$")


def is_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document (starts with ``<speak``)."""
    return _START.match(text) is not None


@dataclass(frozen=True)
class Limits:
    """One document's bounds, from its model's settings (``TextSettings.ssml_max_*``): ``tts``
    speaks a document in one pass (its pauses and segments held at once), ``tts_stream`` a
    chunk at a time, so its defaults allow far more."""

    segments: int = TextSettings.ssml_max_segments
    pause_s: float = TextSettings.ssml_max_pause_s
    marks: int = TextSettings.ssml_max_marks

    @classmethod
    def of(cls, settings: TextSettings) -> Limits:
        return cls(settings.ssml_max_segments, settings.ssml_max_pause_s, settings.ssml_max_marks)


@dataclass(frozen=True)
class VoiceInfo:
    """What the parser needs of a loaded voice: its name, language and reading rules."""

    name: str
    language: str  # espeak-ng's voice ("en-us", "de")
    english: bool  # the English normalizer reads it (say-as in words)
    speakers: tuple[str, ...] = ()  # a multi-speaker voice's, in id order


@dataclass(frozen=True)
class Segment:
    """A stretch spoken by one voice at one rate, then a pause."""

    voice: str
    rate: float  # 1.0: the request's speed; 0.5: half as fast
    text: str  # what is spoken (aliases, say-as words, [[ phonemes ]])
    source: CleanText  # the document's characters it speaks, and where each one is
    pause_after_s: float = 0.0
    gain_db: float = 0.0  # <prosody volume>, <emphasis>; SILENT_DB: silence of its length
    speaker: int = -1  # <voice name="voice:speaker">'s id; -1: the request's (or the first)


@dataclass(frozen=True)
class SsmlMark:
    """``<mark name>``: no sound; where it is in the document (its ``<``), for its time."""

    name: str
    offset: int


@dataclass(frozen=True)
class Document:
    segments: tuple[Segment, ...]
    leading_pause_s: float = 0.0
    notes: tuple[str, ...] = ()  # what was read otherwise than it says: for the log
    marks: tuple[SsmlMark, ...] = ()


def mark_rows(
    marks: Sequence[SsmlMark], starts: Sequence[int], first_ids: Sequence[int], end_id: int
) -> list[list[int]]:
    """Each mark's row (id position, character): where the first word that starts at or after
    it in the document begins (``starts``: each spoken word's character, ``first_ids``: its
    first id), or ``end_id`` past the last word. A mark is reached when that word is."""
    rows = []
    for mark in marks:
        at = next((i for s, i in zip(starts, first_ids, strict=True) if s >= mark.offset), end_id)
        rows.append([int(at), mark.offset])
    return rows


def language_voice(language: str, current: str, voices: Sequence[VoiceInfo]) -> str:
    """The voice for ``language``: the current one if it speaks it, else the first loaded one
    that does (the same tag, then the same primary language), else InvalidInputError."""
    want = language.lower().replace("_", "-")
    by_name = {v.name: v for v in voices}
    for match in (lambda v: v == want, lambda v: v.split("-")[0] == want.split("-")[0]):
        if match(by_name[current].language.lower()):
            return current
        for v in voices:
            if match(v.language.lower()):
                return v.name
    spoken = ", ".join(f"{v.name} ({v.language})" for v in voices)
    raise InvalidInputError(f"no loaded voice speaks {language!r}; voices: {spoken}")


@dataclass
class _Context:
    tag: str
    voice: str
    rate: float
    gain: float = 0.0
    speaker: int = -1  # <voice name="voice:speaker">'s id; -1: the request's
    pieces: list[tuple[str, list[int], list[int]]] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)


class _Refused(Exception):
    pass


class _Builder:
    """Expat's handlers: a stack of contexts, the runs of the open segment, the segments."""

    def __init__(
        self,
        document: str,
        voice: str,
        voices: Sequence[VoiceInfo],
        limits: Limits,
        offset: int = 0,
    ) -> None:
        self.limits = limits
        self.offset = offset  # where ``document`` starts in the text as sent
        self.document = document
        self.encoded = document.encode()
        self.ascii = len(self.encoded) == len(document)
        self.char_at = None if self.ascii else _char_index(document)
        self.voices = {v.name: v for v in voices}
        self.voice_list = voices
        self.stack: list[_Context] = []
        self.root = _Context("", voice, 1.0)
        self.runs: list[tuple[str, str, list[int], list[int]]] = []  # spoken, shown, starts, ends
        self.context: tuple[str, float, float, int] | None = None  # voice, rate, gain, speaker
        self.segments: list[Segment] = []
        self.leading = 0.0
        self.paused = 0.0
        self.notes: list[str] = []
        self.marks: list[SsmlMark] = []
        self.parser: expat.XMLParserType | None = None

    # -- positions ----------------------------------------------------------------------------
    def _char(self, byte: int) -> int:
        return byte if self.char_at is None else self.char_at[min(byte, len(self.char_at) - 1)]

    def _spans(self, data: str) -> tuple[list[int], list[int]]:
        """Where each character of a text callback is in the document (an entity such as
        ``&amp;``: all of it)."""
        at = self.parser.CurrentByteIndex  # type: ignore[union-attr]
        start = self._char(at)
        n = len(data)
        if self.document.startswith("&", start):  # (a bare & is not well-formed XML)
            end = self.document.find(";", start) + 1 or start + 1
            starts, ends = [start] * n, [end] * n
        elif self.encoded.startswith(data.encode(), at):
            starts, ends = list(range(start, start + n)), list(range(start + 1, start + 1 + n))
        else:
            last = len(self.document)  # a line end expat normalized ("\r\n" -> "\n")
            starts = [min(start + i, last - 1) for i in range(n)]
            ends = [i + 1 for i in starts]
        if self.offset:
            starts, ends = [i + self.offset for i in starts], [i + self.offset for i in ends]
        return starts, ends

    # -- segments -----------------------------------------------------------------------------
    def top(self) -> _Context:
        return self.stack[-1] if self.stack else self.root

    def _add_run(self, spoken: str, shown: str, starts: list[int], ends: list[int]) -> None:
        top = self.top()
        if _speaks(spoken):
            here = (top.voice, top.rate, top.gain, top.speaker)
            if self.runs and self.context != here:
                self.close(0.0)
            if not self.runs:
                self.context = here
        elif not self.runs:
            return  # spaces or marks between segments: nothing of their own to say
        self.runs.append((spoken, shown, starts, ends))

    def close(self, pause: float) -> None:
        """End the open segment (if it speaks anything) and add ``pause`` after it."""
        self.paused += pause
        if self.paused > self.limits.pause_s:
            raise _Refused(f"breaks add up to more than {self.limits.pause_s:g} s")
        if any(_speaks(spoken) for spoken, *_ in self.runs):
            if len(self.segments) >= self.limits.segments:
                raise _Refused(
                    f"more than {self.limits.segments} segments (each change of voice, rate, "
                    "volume or a break starts one); send it in parts or through the streaming "
                    "model"
                )
            voice, rate, gain, speaker = self.context  # type: ignore[misc]
            shown = "".join(r[1] for r in self.runs)
            source = CleanText(
                shown,
                tuple(i for r in self.runs for i in r[2]),
                tuple(i for r in self.runs for i in r[3]),
            )
            text = "".join(r[0] for r in self.runs)
            self.segments.append(Segment(voice, rate, text, source, pause, gain, speaker))
        elif self.segments:
            last = self.segments[-1]
            self.segments[-1] = replace(last, pause_after_s=last.pause_after_s + pause)
        else:
            self.leading += pause
        self.runs = []  # (what was left spoke nothing: spaces between elements)

    def unpause(self) -> None:
        """Take back the pauses added since the last spoken text (``</s>``, ``</p>``)."""
        if any(_speaks(spoken) for spoken, *_ in self.runs):
            return
        if self.segments:
            last = self.segments[-1]
            self.paused -= last.pause_after_s
            self.segments[-1] = replace(last, pause_after_s=0.0)
        else:
            self.paused -= self.leading
            self.leading = 0.0

    # -- expat handlers -----------------------------------------------------------------------
    def start(self, tag: str, attrs: dict) -> None:
        top = self.top()
        if not self.stack and tag != "speak":
            raise _Refused(f"the root element must be <speak>, not <{tag}>")
        if self.stack and tag == "speak":
            raise _Refused("<speak> inside <speak>")
        if top.tag in TAKES_TEXT_ONLY:
            raise _Refused(f"<{top.tag}> takes text only, not <{tag}>")
        if len(self.stack) >= MAX_DEPTH:
            raise _Refused(f"elements nest deeper than {MAX_DEPTH}")
        if tag not in ALLOWED:
            raise _Refused(f"<{tag}> is not supported; supported: {', '.join(ALLOWED)}")
        unknown = sorted(
            a
            for a in attrs
            if a not in ALLOWED[tag] and not (tag == "speak" and a.startswith("xmlns:"))
        )
        if unknown:
            raise _Refused(
                f"<{tag}> has no attribute {unknown[0]!r}; it takes {sorted(ALLOWED[tag])}"
            )
        for name, value in attrs.items():
            if len(value) > MAX_ATTRIBUTE:
                raise _Refused(f"<{tag}> {name} is over {MAX_ATTRIBUTE} characters")
        voice, rate, gain, speaker = top.voice, top.rate, top.gain, top.speaker
        if "xml:lang" in attrs:
            voice = self._language(attrs["xml:lang"], voice)
            speaker = speaker if voice == top.voice else -1
        if tag == "voice":
            voice, speaker = self._named_voice(attrs)
        elif tag == "prosody":
            rate *= _rate(attrs)
            gain = _louder(gain, _volume(attrs))
        elif tag == "emphasis":
            factor, db = _emphasis(attrs)
            rate, gain = rate * factor, _louder(gain, db)
        elif tag == "mark":
            self._mark(attrs)
        elif tag == "break":
            pause = _break(attrs)
            if pause == 0.0 and attrs.get("strength") == "none" and "time" not in attrs:
                self.unpause()  # "none": no break here, not even a sentence's or paragraph's
            self.close(pause)
        elif tag in ("p", "s"):
            self.close(0.0)
        self.stack.append(_Context(tag, voice, rate, gain, speaker, attrs=attrs))

    def end(self, tag: str) -> None:
        context = self.stack.pop()
        if tag in TAKES_TEXT_ONLY:
            self._text_element(context)
        elif tag == "s":
            self.close(SENTENCE_PAUSE)
        elif tag == "p":
            self.close(PARAGRAPH_PAUSE)
        elif tag == "speak":
            self.close(0.0)

    def text(self, data: str) -> None:
        if not self.stack:
            return
        starts, ends = self._spans(data)
        top = self.top()
        if top.tag in TAKES_TEXT_ONLY:
            top.pieces.append((data, starts, ends))
        else:
            self._add_run(data, data, starts, ends)

    def _text_element(self, context: _Context) -> None:
        shown = "".join(p[0] for p in context.pieces)
        if not shown.strip():
            raise _Refused(f"<{context.tag}> is empty; put the words it speaks inside")
        starts = [i for p in context.pieces for i in p[1]]
        ends = [i for p in context.pieces for i in p[2]]
        attrs = context.attrs
        if context.tag == "sub":
            spoken = _required(attrs, "sub", "alias")
        elif context.tag == "phoneme":
            spoken = _phonemes(attrs)
        else:
            english = self.voices[context.voice].english
            kind, fmt = _required(attrs, "say-as", "interpret-as"), attrs.get("format")
            if not known(kind, fmt):
                self.notes.append(
                    f"<say-as interpret-as={kind!r}"
                    + (f" format={fmt!r}" if fmt is not None else "")
                    + "> is not one this server knows: its text is read as plain text"
                )
                for data, starts, ends in context.pieces:
                    self._add_run(data, data, starts, ends)
                return
            try:
                spoken = say_as(kind, shown, fmt, english)
            except InvalidInputError as e:
                raise _Refused(str(e)) from None
        # What it says is its own text for the word timestamps, every character of it at the
        # element's content in the document: each word of an alias, a say-as reading or a
        # [[ ]] block spans the words it replaces.
        n = len(spoken)
        self._add_run(spoken, spoken, [starts[0]] * n, [ends[-1]] * n)

    def _mark(self, attrs: dict) -> None:
        if len(self.marks) >= self.limits.marks:
            raise _Refused(f"more than {self.limits.marks} marks")
        where = self._char(self.parser.CurrentByteIndex) + self.offset  # type: ignore[union-attr]
        self.marks.append(SsmlMark(_required(attrs, "mark", "name"), where))

    def _named_voice(self, attrs: dict) -> tuple[str, int]:
        """The voice and speaker id (-1: its default) of ``name="voice"`` or
        ``name="voice:speaker"`` (a speaker's name or id, as the gateway names them)."""
        name = _required(attrs, "voice", "name")
        voice, _, speaker = name.partition(":")
        if name in self.voices or voice not in self.voices:
            voice, speaker = name, ""
        if voice not in self.voices:
            raise _Refused(
                f"<voice>: no voice {name!r} is loaded; voices: {', '.join(self.voices)}"
            )
        if not speaker:
            return voice, -1
        names = self.voices[voice].speakers
        if speaker in names:
            return voice, names.index(speaker)
        number = speaker_number(speaker, len(names))
        if number is not None:
            return voice, number
        has = f"its speakers: {', '.join(names[:20])}" if names else "it has one speaker"
        raise _Refused(f"<voice>: voice {voice!r} has no speaker {speaker[:64]!r}; {has}")

    def _language(self, language: str, voice: str) -> str:
        try:
            return language_voice(language, voice, self.voice_list)
        except InvalidInputError as e:
            raise _Refused(str(e)) from None


def _speaks(text: str) -> bool:
    """A letter, a digit or inline phonemes: a run that starts (or switches) a segment. Marks
    and spaces join the open segment whatever their context ("</prosody>." ends a sentence)."""
    return OPEN in text or any(c.isalnum() for c in text)


def _char_index(text: str) -> list[int]:
    index: list[int] = []
    for i, c in enumerate(text):
        index.extend([i] * len(c.encode()))
    index.append(len(text))
    return index


def _required(attrs: dict, tag: str, name: str) -> str:
    value = attrs.get(name, "").strip()
    if not value:
        raise _Refused(f"<{tag}> needs a {name} attribute")
    return value


def _louder(gain: float, db: float) -> float:
    """``gain`` changed by ``db``: silence stays silence; never over MAX_GAIN_DB."""
    if gain <= SILENT_DB or db <= SILENT_DB:
        return SILENT_DB
    return min(gain + db, MAX_GAIN_DB)


def _volume(attrs: dict) -> float:
    """<prosody volume> in dB (0 when absent)."""
    value = attrs.get("volume", "medium").strip()
    if value in VOLUMES:
        return VOLUMES[value]
    m = re.match(r"^([+-])(\d+(?:\.\d+)?)\s*dB$", value, re.IGNORECASE)
    low, high = VOLUME_RANGE_DB
    if m:
        db = float(m.group(2)) * (1 if m.group(1) == "+" else -1)
        if low <= db <= high:
            return db
    raise _Refused(
        f"<prosody volume={value!r}>: use one of {', '.join(VOLUMES)} or a change in dB from "
        f"{low:+g}dB to {high:+g}dB (+6dB, -3dB)"
    )


def _emphasis(attrs: dict) -> tuple[float, float]:
    level = attrs.get("level", "moderate").strip()
    if level not in EMPHASIS:
        raise _Refused(f"<emphasis level={level!r}>: use one of {', '.join(EMPHASIS)}")
    return EMPHASIS[level]


def _rate(attrs: dict) -> float:
    if "pitch" in attrs and attrs["pitch"].strip() not in NEUTRAL:
        raise _Refused(
            f"<prosody pitch={attrs['pitch']!r}>: this voice cannot change its pitch (a Piper "
            "voice has no pitch control); remove the attribute"
        )
    value = attrs.get("rate", "medium").strip()
    if value in RATES:
        return RATES[value]
    m = re.match(r"^([+-]?)(\d+(?:\.\d+)?)(%?)$", value)
    if m:
        sign, number, percent = m.group(1), float(m.group(2)), m.group(3)
        if percent and sign:  # "+20%": a change from the current rate
            rate = 1 + (number if sign == "+" else -number) / 100
        else:
            rate = number / 100 if percent else number
        if rate > 0:
            return rate
    raise _Refused(
        f"<prosody rate={value!r}>: use a percentage (50% is half as fast), a change (+20%), a "
        f"factor (1.5) or one of {', '.join(RATES)}"
    )


def _break(attrs: dict) -> float:
    if "time" in attrs:
        m = _TIME.match(attrs["time"])
        if not m:
            raise _Refused(
                f"<break time={attrs['time']!r}>: use milliseconds or seconds (500ms, 1.5s)"
            )
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        if seconds > MAX_BREAK_S:
            raise _Refused(f"<break time={attrs['time']!r}> is over {MAX_BREAK_S:g} s")
        return seconds
    strength = attrs.get("strength", "medium")
    if strength not in STRENGTHS:
        raise _Refused(f"<break strength={strength!r}>: use one of {', '.join(STRENGTHS)}")
    return STRENGTHS[strength]


def _phonemes(attrs: dict) -> str:
    alphabet = attrs.get("alphabet", "ipa")
    if alphabet != "ipa":
        raise _Refused(f"<phoneme alphabet={alphabet!r}>: only ipa is supported")
    ph = _required(attrs, "phoneme", "ph")
    if OPEN in ph or CLOSE in ph:
        raise _Refused(f"<phoneme ph={ph!r}> holds {OPEN} or {CLOSE}")
    return f"{OPEN} {ph} {CLOSE}"


def _located(parser, handler):
    """``handler``, its refusals carrying where in the document it was called (expat's
    position has moved on by the time ``Parse`` returns)."""

    def located(*args):
        try:
            handler(*args)
        except _Refused as e:
            if len(e.args) == 1:
                raise _Refused(
                    e.args[0], (parser.CurrentLineNumber, parser.CurrentColumnNumber)
                ) from None
            raise

    return located


def parse(
    document: str, voice: str, voices: Sequence[VoiceInfo], limits: Limits = Limits()
) -> Document:
    """The segments of ``document`` (spoken by ``voice`` unless it says otherwise), or
    InvalidInputError naming the line, column and tag of the first problem."""
    skip = len(document) - len(document.lstrip(_LEAD))
    builder = _Builder(document[skip:], voice, voices, limits, skip)
    parser = expat.ParserCreate()
    builder.parser = parser
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def refuse(what: str):
        def handler(*_args):
            raise _Refused(what)

        return handler

    parser.StartDoctypeDeclHandler = refuse("a DOCTYPE is not allowed in SSML here")
    parser.EntityDeclHandler = refuse("entity declarations are not allowed")
    parser.ExternalEntityRefHandler = refuse("external entities are not allowed")
    parser.StartCdataSectionHandler = refuse("CDATA sections are not supported; escape the text")
    parser.StartElementHandler = _located(parser, builder.start)
    parser.EndElementHandler = _located(parser, builder.end)
    parser.CharacterDataHandler = _located(parser, builder.text)
    lead = document[:skip].split("\n")  # what was skipped, for the line and column

    def place(line: int, column: int) -> str:
        column += 1 + (len(lead[-1]) if line == 1 else 0)
        return f"line {line + len(lead) - 1}, column {column}"

    try:
        parser.Parse(builder.encoded, True)
    except _Refused as e:
        where = (
            e.args[1] if len(e.args) > 1 else (parser.CurrentLineNumber, parser.CurrentColumnNumber)
        )
        raise InvalidInputError(f"SSML {place(*where)}: {e.args[0]}") from None
    except expat.ExpatError as e:
        raise InvalidInputError(
            f"SSML is not well-formed: {expat.errors.messages[e.code]} "
            f"({place(e.lineno, e.offset)})"
        ) from None
    if not builder.segments:
        raise InvalidInputError("the SSML document has no text to speak")
    return Document(
        tuple(builder.segments), builder.leading, tuple(builder.notes), tuple(builder.marks)
    )
