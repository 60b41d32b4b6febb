"""SSML through the real server: ``tts``, ``tts_stream`` and the gateway.

A document's segments are spoken as plain requests are (its ids, its voice, its speed) and
joined with pauses exact in samples, so each document here is compared with the plain
requests that speak its parts: equal within batch padding's rounding, batched or alone.
"""

from __future__ import annotations

import ast
import json
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import numpy as np
import pytest

from tests.support.guides import run_guide
from tts_client import InvalidInput

EXACT = {"noise_scale": 0.0, "noise_w": 0.0}
RATE = 22050
FRAME = 256  # samples per latent frame (the voice's hop length)
A, B = "The quick brown fox jumps over the lazy dog.", "Then it ran home."
BREAK = f'<speak>{A}<break time="500ms"/>{B}</speak>'
SLOW = f'<speak><prosody rate="50%">{A}</prosody></speak>'
READINGS = (
    '<speak>Call <say-as interpret-as="telephone">555-1234</say-as> about '
    '<sub alias="World Wide Web">WWW</sub> and <phoneme alphabet="ipa" ph="wˈɪn">win</phoneme>'
    ' on <say-as interpret-as="date" format="mdy">3/15/2024</say-as>.</speak>'
)
HOSTILE = {
    "<speak>Hi</speek>": "mismatched tag (line 1, column 12)",
    "<speak>\nHi <b>x</b></speak>": "line 2, column 4: <b> is not supported",
    '<?xml version="1.0"?><!DOCTYPE s [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
    "<speak>&b;</speak>": "a DOCTYPE is not allowed",
    "<speak>" + "<s>" * 20 + "x" + "</s>" * 20 + "</speak>": "nest deeper than 16",
    '<speak><sub alias="' + "a" * 5000 + '">x</sub></speak>': "alias is over 1000 characters",
    '<speak><phoneme ph="h☃">x</phoneme></speak>': "unknown phoneme '☃' (U+2603)",
    '<speak><prosody rate="5%">x</prosody></speak>': "outside 0.25..4",
    '<speak><prosody pitch="high">x</prosody></speak>': "cannot change its pitch",
}


def zero_runs(samples: np.ndarray) -> list[int]:
    """Lengths of the runs of exact zeros (silence written as zeros, not quiet speech)."""
    zero = np.concatenate([[0], (samples == 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(zero))
    return (edges[1::2] - edges[::2]).tolist()


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and float(np.max(np.abs(a - b))) < 1e-3


def test_a_break_is_exact_silence_between_the_parts_spoken_alone(grpc_client):
    doc = grpc_client.synthesize(BREAK, **EXACT).samples
    a, b = (grpc_client.synthesize(t, **EXACT).samples for t in (A, B))
    assert max(zero_runs(doc)) == 11025  # 500 ms at 22050 Hz, to the sample
    assert close(doc, np.concatenate([a, np.zeros(11025, np.float32), b]))


def test_a_rate_of_half_doubles_the_span_as_speed_half_does(grpc_client):
    slow = grpc_client.synthesize(SLOW, **EXACT)
    normal = grpc_client.synthesize(A, word_timestamps=True, **EXACT)
    assert 1.9 < slow.duration / normal.duration < 2.1  # the bar: within 10 %
    assert close(slow.samples, grpc_client.synthesize(A, speed=0.5, **EXACT).samples)
    doc = f'<speak>{B} <prosody rate="50%">{A}</prosody> {B}</speak>'
    mixed = grpc_client.synthesize(doc, word_timestamps=True, **EXACT)
    inside = [w for w in mixed.words if doc.index(A) <= w.char_start < doc.index("</prosody>")]
    assert [w.text for w in inside] == A.split()
    span = inside[-1].end - inside[0].start
    alone = normal.words[-1].end - normal.words[0].start
    assert 1.8 < span / alone < 2.2  # the span alone slows down, in a mixed document


def test_mixed_documents_batch_with_plain_requests_as_alone(grpc_client):
    texts = [A, BREAK, SLOW, READINGS, B, A, BREAK, READINGS]
    alone = {t: grpc_client.synthesize(t, **EXACT).samples for t in set(texts)}
    with ThreadPoolExecutor(len(texts)) as pool:
        together = list(pool.map(lambda t: grpc_client.synthesize(t, **EXACT).samples, texts))
    for text, samples in zip(texts, together):
        assert close(samples, alone[text]), text


def test_word_timestamps_point_into_the_document(grpc_client):
    spoken = grpc_client.synthesize(READINGS, word_timestamps=True, **EXACT)
    words = [w.text for w in spoken.words]
    # A reading is one word, timed over all that is said for it (as "$5.50" in plain text).
    assert words[:3] == ["Call", "555-1234", "about"]
    assert spoken.words[1].end - spoken.words[1].start > 1.5  # seven digits, read out
    assert "WWW" in words and "win" in words and "3/15/2024" in words
    for w in spoken.words:
        assert READINGS[w.char_start : w.char_end] == w.text
    starts = [w.start for w in spoken.words]
    assert starts == sorted(starts) and spoken.words[-1].end <= spoken.duration
    gap = grpc_client.synthesize(BREAK, word_timestamps=True, **EXACT).words
    then = next(w for w in gap if w.text == "Then")
    dog = next(w for w in gap if w.text == "dog.")
    assert then.start - dog.end >= 0.5  # the break lies between them


# A byte-order mark first, marks right after closing tags, a say-as kind this server does not
# know (read as plain text).
AFTER_TAGS = (
    '\ufeff<speak>Ask for the <sub alias="World Wide Web Consortium">W3C</sub>. It weighs '
    '<say-as interpret-as="unit">5 kg</say-as>, since <say-as interpret-as="date" '
    'format="mdy">3/15/2024</say-as>, yes.</speak>'
)


def test_words_after_closing_tags_hold_no_markup_in_tts_and_tts_stream(grpc_client):
    alone = grpc_client.synthesize(AFTER_TAGS, word_timestamps=True, **EXACT)
    streamed = list(grpc_client.stream(AFTER_TAGS, word_timestamps=True, **EXACT))
    expected = ["Ask", "for", "the", "W3C", "It", "weighs", "5", "kg", "since", "3/15/2024",
                "yes."]  # fmt: skip
    for words in (alone.words, [w for chunk in streamed for w in chunk.words]):
        assert [w.text for w in words] == expected
        for w in words:
            assert AFTER_TAGS[w.char_start : w.char_end] == w.text
    assert alone.duration > 4.0  # "five kilograms", the date: read, not the markup


MARKED = (
    f'<speak><mark name="start"/>{A[:20]}<mark name="mid &amp; more"/>{A[20:]}'
    f'<break time="500ms"/><mark name="after"/>{B}<mark name="end"/></speak>'
)


def test_marks_are_timed_where_the_next_word_starts_in_tts_and_tts_stream(grpc_client):
    timed = grpc_client.synthesize(MARKED, word_timestamps=True, **EXACT)
    marks = {m.name: m for m in timed.marks}
    assert list(marks) == ["start", "mid & more", "after", "end"]
    starts = {w.text: w.start for w in timed.words}
    assert marks["start"].time == pytest.approx(starts["The"], abs=1e-4)
    assert marks["mid & more"].time == pytest.approx(starts["jumps"], abs=1e-4)
    assert marks["after"].time == pytest.approx(starts["Then"], abs=1e-4)
    assert marks["after"].time - starts["dog."] > 0.5  # after the break
    assert marks["end"].time == pytest.approx(timed.duration, abs=2e-3)
    for m in timed.marks:
        assert MARKED[m.char_start :].startswith("<mark name=")
    untimed = grpc_client.synthesize(MARKED, **EXACT)  # marks without words asked for
    assert untimed.words == () and [m.time for m in untimed.marks] == [m.time for m in timed.marks]
    chunks = list(grpc_client.stream(MARKED, word_timestamps=True, **EXACT))
    streamed = {m.name: m.time for c in chunks for m in c.marks}
    stream_starts = {w.text: w.start for c in chunks for w in c.words}
    assert list(streamed) == list(marks)
    for name, word in [("start", "The"), ("mid & more", "jumps"), ("after", "Then")]:
        assert streamed[name] == pytest.approx(stream_starts[word], abs=1e-4)
    assert streamed["end"] == pytest.approx(sum(c.duration for c in chunks), abs=0.05)


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


def test_volume_and_emphasis_change_the_level_and_the_pace(grpc_client):
    def spoken(inner: str, stream: bool = False) -> np.ndarray:
        document = f"<speak>{inner}</speak>"
        if stream:
            return np.concatenate([c.samples for c in grpc_client.stream(document, **EXACT)])
        return grpc_client.synthesize(document, **EXACT).samples

    plain = spoken(A)
    soft = spoken(f'<prosody volume="-6dB">{A}</prosody>')
    assert len(soft) == len(plain) and rms(soft) / rms(plain) == pytest.approx(0.501, rel=0.01)
    silent = spoken(f'<prosody volume="silent">{A}</prosody>')
    assert len(silent) == len(plain) and not silent.any()
    strong = spoken(f'<emphasis level="strong">{A}</emphasis>')
    assert len(strong) / len(plain) == pytest.approx(1 / 0.85, rel=0.05)
    assert rms(strong) / rms(plain) > 1.3  # +4 dB, where nothing clips
    streamed = spoken(f'<prosody volume="x-soft">{A}</prosody>', stream=True)
    loud = spoken(A, stream=True)
    assert rms(streamed) / rms(loud) == pytest.approx(10 ** (-12 / 20), rel=0.02)


def test_hostile_documents_get_clear_errors_and_the_batch_beside_them_is_served(grpc_client):
    texts = [A, *HOSTILE, B]

    def one(text: str):
        try:
            return grpc_client.synthesize(text, **EXACT)
        except InvalidInput as e:
            return e

    with ThreadPoolExecutor(len(texts)) as pool:
        results = list(pool.map(one, texts))
    for result, (text, message) in zip(results[1:-1], HOSTILE.items()):
        assert isinstance(result, InvalidInput), text
        assert message in str(result) and "Traceback" not in str(result)
    assert results[0].duration > 1 and results[-1].duration > 0.5


def test_a_stream_speaks_each_segment_with_its_pauses(grpc_client):
    doc = (
        f'<speak><break time="300ms"/>{A} {B}<break time="1s"/>'
        f'<prosody rate="50%">{B}</prosody></speak>'
    )
    chunks = list(grpc_client.stream(doc, word_timestamps=True, **EXACT))
    audio = np.concatenate([c.samples for c in chunks])
    runs = zero_runs(audio)
    assert runs[0] >= 6615 and abs(max(runs) - RATE) <= FRAME  # 300 ms first, 1 s between
    slow = [w for c in chunks for w in c.words if w.char_start > doc.index("<prosody")]
    assert [w.text for w in slow] == B.split()
    for c in chunks:
        for w in c.words:
            assert doc[w.char_start : w.char_end] == w.text
    plain = sum(c.duration for c in grpc_client.stream(B, **EXACT))
    assert 1.8 < (slow[-1].end - slow[0].start) / (plain - 0.1) < 2.4  # (its fades and edges)
    with pytest.raises(InvalidInput, match="outside 0.25..4"):
        list(grpc_client.stream('<speak><prosody rate="5%">x</prosody></speak>'))
    with pytest.raises(InvalidInput, match="<b> is not supported"):
        list(grpc_client.stream("<speak>x <b>y</b></speak>"))


def test_the_gateway_speaks_ssml_and_names_the_problem(gateway):
    body = {"model": "tts-1", "voice": "alloy", "response_format": "pcm"}
    url = f"{gateway.url}/v1/audio/speech"
    ok = httpx.post(url, json={**body, "input": BREAK}, timeout=60)
    assert ok.status_code == 200
    pcm = np.frombuffer(ok.content, np.int16)
    assert max(zero_runs(pcm)) >= 11025
    for text, message in list(HOSTILE.items())[:3]:
        bad = httpx.post(url, json={**body, "input": text}, timeout=60)
        assert bad.status_code == 400, bad.text
        assert message in bad.json()["error"]["message"]
    sse = httpx.post(url, json={**body, "input": READINGS, "stream_format": "sse"}, timeout=60)
    assert sse.status_code == 200 and "speech.audio.done" in sse.text
    sse = httpx.post(url, json={**body, "input": MARKED, "stream_format": "sse"}, timeout=60)
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line]
    names = [m["name"] for e in events for m in e.get("marks", [])]
    assert names == ["start", "mid & more", "after", "end"]


def test_the_guide_runs_as_written(server, gateway, tmp_path):
    """docs/ssml.md's curl and Python, ports substituted."""
    out = run_guide("ssml.md", server, gateway, tmp_path)
    assert (tmp_path / "code.wav").read_bytes()[:4] == b"RIFF"
    words = [text for text, _ in ast.literal_eval(out.strip())]
    for word in ("Call", "555-1234", "Nguyen", "W3C", "3/15/2024"):
        assert word in words, out
    assert not any("<" in w or ">" in w for w in words), out  # "W3C</sub>." was one
