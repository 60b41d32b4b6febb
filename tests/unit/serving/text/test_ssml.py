"""SSML documents -> segments (tts_serving/text/ssml.py), <say-as> readings, segment rows."""

from __future__ import annotations

import numpy as np
import pytest

from tts_serving.engines.segments import (
    join_with_silence,
    pauses_before,
    segment_rows,
)
from tts_serving.errors import InvalidInputError
from tts_serving.text.say_as import say_as
from tts_serving.text.ssml import MAX_DEPTH, Document, VoiceInfo, is_ssml, parse

VOICES = [
    VoiceInfo("joe", "en-us", True),
    VoiceInfo("joe_de", "de", False),
    VoiceInfo("trio", "en-us", True, ("ann", "bob", "cy")),
]


def doc(text: str, voice: str = "joe") -> Document:
    return parse(text, voice, VOICES)


def said(document: Document) -> list[tuple[str, float, str, float]]:
    return [(s.voice, s.rate, " ".join(s.text.split()), s.pause_after_s) for s in document.segments]


def test_only_a_text_that_starts_with_speak_is_ssml():
    assert is_ssml("<speak>Hi</speak>") and is_ssml('  <?xml version="1.0"?>\n<speak a="b">x')
    assert not is_ssml("Hello <speak>") and not is_ssml("<speaker> said hi")
    assert not is_ssml("I <break/> you")
    assert is_ssml('<!DOCTYPE x [<!ENTITY a "b">]><x/>') and is_ssml("<?xml version='1.0'?><x/>")
    with pytest.raises(InvalidInputError, match="root element must be <speak>"):
        doc("<?xml version='1.0'?><x/>")


def test_breaks_rates_and_structure_become_segments_with_pauses():
    d = doc(
        '<speak><break time="250ms"/>One.<break time="1.5s"/><prosody rate="50%">Two '
        '<prosody rate="x-fast">three</prosody></prosody><s>Four</s><p>Five</p>'
        '<break strength="x-strong"/></speak>'
    )
    assert d.leading_pause_s == 0.25
    assert said(d) == [
        ("joe", 1.0, "One.", 1.5),
        ("joe", 0.5, "Two", 0.0),
        ("joe", 0.875, "three", 0.0),  # nested rates multiply
        ("joe", 1.0, "Four", 0.2),  # </s>: a sentence's pause
        ("joe", 1.0, "Five", 0.6 + 1.0),  # </p>, then the break: pauses add up
    ]


def test_a_mark_after_a_span_stays_with_it_and_spaces_start_nothing():
    d = doc(
        '<speak> <prosody rate="slow">Slow</prosody>. <prosody rate="+20%">fast</prosody>! </speak>'
    )
    assert said(d) == [("joe", 0.75, "Slow.", 0.0), ("joe", 1.2, "fast!", 0.0)]


def test_say_as_sub_and_phoneme_speak_their_reading_and_point_at_their_content():
    text = (
        '<speak>Call <say-as interpret-as="telephone">555-1234</say-as> about '
        '<sub alias="World Wide Web">WWW</sub>, <phoneme alphabet="ipa" ph="wˈɪn">win</phoneme>'
        " &amp; more.</speak>"
    )
    (segment,) = doc(text).segments
    assert " ".join(segment.text.split()) == (
        "Call five five five, one two three four about World Wide Web, [[ wˈɪn ]] & more."
    )
    source = segment.source

    def where(word: str) -> str:
        at = segment.text.index(word)
        start, end = source.sent_span(at, at + len(word))
        return text[start:end]

    assert where("Call") == "Call"
    assert where("three") == "555-1234"  # every word of a reading spans what it replaces
    assert where("Wide") == "WWW"
    assert where("wˈɪn") == "win"
    assert (
        where("&") == "&amp;"
    )  # an entity is one character of the text, all of it in the document
    assert where("more.") == "more."


def test_a_word_span_never_takes_markup_from_a_mark_after_a_closing_tag():
    text = (
        '<speak>Ask for the <sub alias="World Wide Web Consortium">W3C</sub>. On '
        '<say-as interpret-as="date" format="mdy">3/15/2024</say-as>, (<sub alias="x">y</sub>)'
        "!</speak>"
    )
    (segment,) = doc(text).segments
    spans = []
    for word in segment.text.split():
        at = segment.text.index(word, spans[-1][0] if spans else 0)
        spans.append((at + len(word), text[slice(*segment.source.sent_span(at, at + len(word)))]))
    shown = [s for _, s in spans]
    assert shown == ["Ask", "for", "the", "W3C", "W3C", "W3C", "W3C", "On", *["3/15/2024"] * 4,
                     "y"]  # fmt: skip
    assert not any("<" in s or ">" in s for s in shown)


def test_a_byte_order_mark_and_spaces_before_the_document_are_taken():
    text = '\ufeff <speak>Hello<break time="1s"/>world.</speak>'
    assert is_ssml(text) and is_ssml('\ufeff<?xml version="1.0"?><speak>x</speak>')
    d = doc(text)
    assert said(d) == [("joe", 1.0, "Hello", 1.0), ("joe", 1.0, "world.", 0.0)]
    second = d.segments[1]
    assert text[slice(*second.source.sent_span(0, 6))] == "world."  # located in the text as sent
    with pytest.raises(InvalidInputError, match="line 2, column 8: <b> is not supported"):
        doc("\ufeff\n<speak><b>x</b></speak>")


@pytest.mark.parametrize(
    ("element", "reads"),
    [
        ('<say-as interpret-as="unit">5 kg</say-as>', "5 kg"),
        ('<say-as interpret-as="fraction">3/4</say-as>', "3/4"),
        ('<say-as interpret-as="verbatim">abc</say-as>', "abc"),
        ('<say-as interpret-as="currency">$5</say-as>', "$5"),
        ('<say-as interpret-as="address">1 Main St</say-as>', "1 Main St"),
        ('<say-as interpret-as="date" format="dym">15/2024/3</say-as>', "15/2024/3"),
    ],
)
def test_an_unknown_say_as_is_read_as_plain_text_and_noted(element, reads):
    """SSML 1.1, 3.1.9: an unknown interpret-as or format is read as if it were absent (the
    normalizer then reads the text as it reads any text)."""
    d = doc(f"<speak>It is {element} now.</speak>")
    assert said(d) == [("joe", 1.0, f"It is {reads} now.", 0.0)]
    assert len(d.notes) == 1 and "read as plain text" in d.notes[0]


def test_break_strength_none_takes_back_the_pause_of_a_sentence_or_paragraph():
    d = doc(
        '<speak><s>One</s><break strength="none"/><s>Two</s><p>Three</p> <break strength="none"/>'
        'Four<break strength="none"/>five</speak>'
    )
    assert [s.pause_after_s for s in d.segments] == [0.0, 0.2, 0.0, 0.0, 0.0]
    assert doc('<speak><s>One</s><break time="0s"/>Two</speak>').segments[0].pause_after_s == 0.2


def test_volume_and_emphasis_are_a_gain_and_a_rate_per_span():
    d = doc(
        '<speak>Plain <prosody volume="loud">loud <prosody volume="-3dB">less</prosody></prosody>'
        ' <emphasis level="strong">strong</emphasis> <emphasis>moderate</emphasis> '
        '<emphasis level="reduced">reduced</emphasis> <prosody volume="silent">quiet '
        '<prosody volume="x-loud">still</prosody></prosody> <prosody volume="x-loud">'
        '<emphasis level="strong">max</emphasis></prosody></speak>'
    )
    assert [(" ".join(s.text.split()), s.rate, s.gain_db) for s in d.segments] == [
        ("Plain", 1.0, 0.0),
        ("loud", 1.0, 6.0),
        ("less", 1.0, 3.0),  # changes add up
        ("strong", 0.85, 4.0),
        ("moderate", 0.92, 2.0),  # the default level
        ("reduced", 1.1, -4.0),
        ("quiet still", 1.0, -100.0),  # silence stays silence
        ("max", 0.85, 12.0),  # never over 12 dB
    ]


def test_marks_are_noted_where_they_are_in_the_document():
    text = (
        '\ufeff<speak><mark name="start"/>Hello <mark name="mid"/>world.<mark name="end"/></speak>'
    )
    d = doc(text)
    assert [(m.name, text[m.offset :].split(">")[0]) for m in d.marks] == [
        ("start", '<mark name="start"/'),
        ("mid", '<mark name="mid"/'),
        ("end", '<mark name="end"/'),
    ]
    assert said(d) == [("joe", 1.0, "Hello world.", 0.0)]  # a mark splits nothing


def test_a_voice_name_picks_a_speaker_of_a_multi_speaker_voice():
    d = doc(
        '<speak>Hi <voice name="trio:bob">Bob</voice> <voice name="trio:2">Cy</voice> '
        '<voice name="trio">first</voice></speak>'
    )
    assert [(s.voice, s.speaker, " ".join(s.text.split())) for s in d.segments] == [
        ("joe", -1, "Hi"),
        ("trio", 1, "Bob"),
        ("trio", 2, "Cy"),
        ("trio", -1, "first"),  # the voice alone: the request's speaker rule
    ]
    for name, says in [
        ("trio:dan", "no speaker 'dan'; its speakers: ann, bob, cy"),
        ("trio:3", "no speaker '3'"),
        ("joe:ann", "has no speaker 'ann'; it has one speaker"),
        ("nobody:ann", "no voice 'nobody:ann' is loaded"),
    ]:
        with pytest.raises(InvalidInputError, match=says):
            doc(f'<speak><voice name="{name}">x</voice></speak>')


def test_voice_and_lang_pick_loaded_voices():
    d = doc(
        '<speak xml:lang="en-US">One <voice name="joe_de">zwei</voice> <lang xml:lang="de-DE">drei'
        '</lang> <lang xml:lang="en">four</lang></speak>'
    )
    assert [(s.voice, " ".join(s.text.split())) for s in d.segments] == [
        ("joe", "One"),
        ("joe_de", "zwei drei"),  # the same voice and rate: one segment
        ("joe", "four"),
    ]
    # the request's own voice is kept when it speaks the language
    assert said(doc('<speak xml:lang="de">eins</speak>', voice="joe_de"))[0][0] == "joe_de"
    # say-as on a voice without our normalizer: spelled and digits only, the rest as written
    (segment,) = doc(
        '<speak><voice name="joe_de"><say-as interpret-as="cardinal">3</say-as> '
        '<say-as interpret-as="digits">42</say-as></voice></speak>'
    ).segments
    assert " ".join(segment.text.split()) == "3 4 2"


@pytest.mark.parametrize(
    ("kind", "text", "fmt", "expected"),
    [
        ("characters", "AB1", None, "A B one"),
        ("spell-out", "ok", None, "O K"),
        ("cardinal", "1,234", None, "one thousand two hundred thirty-four"),
        ("cardinal", "-3.5", None, "minus three point five"),
        ("ordinal", "21st", None, "twenty-first"),
        ("digits", "1984", None, "one nine eight four"),
        ("date", "2024-03-15", None, "March fifteenth, twenty twenty-four"),
        ("date", "15/3/2024", "dmy", "March fifteenth, twenty twenty-four"),
        ("date", "3/15", "md", "March fifteenth"),
        ("date", "1999", "y", "nineteen ninety-nine"),
        ("time", "10:30", None, "ten thirty"),
        ("time", "7pm", None, "seven p m"),
        ("telephone", "+1 555-1234", None, "plus one, five five five, one two three four"),
    ],
)
def test_say_as_readings(kind, text, fmt, expected):
    assert say_as(kind, text, fmt, english=True) == expected


@pytest.mark.parametrize(
    ("kind", "text", "fmt", "message"),
    [
        ("cardinal", "x1", None, "is not a number"),
        ("date", "2024-13-01", "ymd", "not a valid date"),
        ("date", "3/15", "ymd", "not a date in that order"),
        ("time", "noon-ish 99", None, "is not a time"),
        ("digits", "abc", None, "has no digits"),
    ],
)
def test_say_as_refuses_what_it_cannot_read(kind, text, fmt, message):
    with pytest.raises(InvalidInputError, match=message):
        say_as(kind, text, fmt, english=True)


BILLION_LAUGHS = (
    '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
    + "".join(f'<!ENTITY lol{i} "{("&lol" + str(i - 1) + ";") * 10}">' for i in range(1, 10))
    + "]><speak>&lol9;</speak>"
).replace("&lol0;", "&lol;")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<speak>Hi</speek>", r"not well-formed: mismatched tag \(line 1, column 12\)"),
        ("<speak>\n\nHi <b>there</b></speak>", r"line 3, column 4: <b> is not supported"),
        ("<speak>Hi<speak>x</speak></speak>", "<speak> inside <speak>"),
        (BILLION_LAUGHS, "a DOCTYPE is not allowed"),
        (
            '<!DOCTYPE speak [<!ENTITY x SYSTEM "file:///etc/passwd">]><speak>&x;</speak>',
            "a DOCTYPE is not allowed",
        ),
        ("<speak>&nbsp;</speak>", "undefined entity"),
        (
            "<speak>" + "<s>" * (MAX_DEPTH + 1) + "x" + "</s>" * (MAX_DEPTH + 1) + "</speak>",
            f"nest deeper than {MAX_DEPTH}",
        ),
        ('<speak><sub alias="' + "a" * 1001 + '">x</sub></speak>', "alias is over 1000 characters"),
        ('<speak><break time="11s"/>x</speak>', "is over 10 s"),
        ("<speak>" + 'x<break time="9s"/>' * 7 + "</speak>", "add up to more than 60 s"),
        ('<speak><break time="fast"/>x</speak>', "use milliseconds or seconds"),
        ('<speak><break strength="loud"/>x</speak>', "use one of none, x-weak"),
        ('<speak><prosody rate="2x">x</prosody></speak>', "use a percentage"),
        ('<speak><prosody pitch="+2st">x</prosody></speak>', "cannot change its pitch"),
        ('<speak><prosody volume="+20dB">x</prosody></speak>', "a change in dB from -40dB"),
        ('<speak><prosody volume="50">x</prosody></speak>', "use one of silent, x-soft"),
        ('<speak><emphasis level="loudest">x</emphasis></speak>', "use one of strong"),
        ("<speak>x<mark/></speak>", "<mark> needs a name attribute"),
        ("<speak>" + '<mark name="m"/>' * 257 + "x</speak>", "more than 256 marks"),
        ('<speak><prosody duration="2s">x</prosody></speak>', "no attribute 'duration'"),
        ('<speak><voice name="alloy">x</voice></speak>', "no voice 'alloy' is loaded"),
        ('<speak><voice gender="female">x</voice></speak>', "no attribute 'gender'"),
        ('<speak><lang xml:lang="fr">x</lang></speak>', "no loaded voice speaks 'fr'"),
        ('<speak><phoneme alphabet="x-sampa" ph="w">x</phoneme></speak>', "only ipa"),
        ('<speak><phoneme ph="a ]] b">x</phoneme></speak>', r"holds \[\[ or \]\]"),
        ('<speak><sub alias="x"><s>y</s></sub></speak>', "takes text only"),
        ("<speak><sub>y</sub></speak>", "needs a alias attribute"),
        ('<speak><say-as interpret-as="cardinal"></say-as>x</speak>', "is empty"),
        ("<speak><![CDATA[x]]></speak>", "CDATA sections are not supported"),
        ("<speak> <break/> ! </speak>", "no text to speak"),
        ("<p>x</p>", None),  # not SSML at all: a text like any other (is_ssml is False)
    ],
)
def test_hostile_and_malformed_documents_are_refused_with_where_and_what(text, message):
    if message is None:
        assert not is_ssml(text)
        return
    with pytest.raises(InvalidInputError, match=message):
        doc(text)


def test_segment_rows_are_checked_and_pauses_are_exact():
    rows = segment_rows(
        np.array([[0, 0, 1, 0.3, 0, -1], [5, 1, 0.5, 0.5, -6, 2], [9, 0, 1, 0, -200, -1]]),
        9,
        2,
        6,
        "s",
    )
    assert [(r.start, r.end, r.voice, r.rate, r.pause, r.gain_db, r.speaker) for r in rows] == [
        (0, 0, 0, 1.0, 0.3, 0.0, -1),
        (0, 5, 1, 0.5, 0.5, -6.0, 2),
        (5, 9, 0, 1.0, 0.0, -100.0, -1),  # below silence: silence
    ]
    assert [r.speaker_of([4, 0]) for r in rows] == [4, 2, 4]  # -1: the request's
    frames = segment_rows(np.array([[7, 1, 300, 450, 1]]), 7, 2, 5, "f")  # gain: 0.01 dB
    assert [(f.rate, f.pause, f.gain_db, f.speaker) for f in frames] == [(1.0, 300.0, 4.5, 1)]
    assert pauses_before(rows, np.array([0, 4, 5, 8])).tolist() == [0.3, 0.3, 0.8, 0.8]
    assert (
        segment_rows(None, 9, 2, 6, "s") == []
        and segment_rows(np.zeros((0, 6)), 9, 2, 6, "s") == []
    )
    for bad, message in [
        ([[5, 0, 1, 0, 0, -1]], "must end at 9"),
        ([[10, 0, 1, 0, 0, -1]], "within 0..9"),
        ([[4.5, 0, 1, 0, 0, -1], [9, 0, 1, 0, 0, -1]], "whole"),
        ([[9, 2, 1, 0, 0, -1]], "voice index 2"),
        ([[9, 0, 0, 0, 0, -1]], "positive"),
        ([[9, 0, 1, -1, 0, -1]], "not negative"),
        ([[9, 0, np.nan, 0, 0, -1]], "finite"),
        ([[9, 0, 1, 0, 13, -1]], "over 12 dB"),
        ([[9, 0, 1, 0, 0, -2]], "speaker must be"),
        ([[9, 0, 1, 0, 0, 1.5]], "speaker must be"),
        ([[9, 0, 1, 0, 0]], "rows of 6 values"),
    ]:
        with pytest.raises(InvalidInputError, match=message):
            segment_rows(np.array(bad, np.float32), 9, 2, 6, "s")
    audio = join_with_silence([np.ones(3), [], np.ones(2)], [2, 4, 1])
    assert audio.tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0]
