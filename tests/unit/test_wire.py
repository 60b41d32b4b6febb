"""The wire contract (tts_wire): one place for the options' ranges, used on every side."""

import math
import re

import pytest

from tts_wire import MAX_NOISE, MAX_SPEED, MIN_SPEED, SynthesisOptions, noise_error, speed_error


def test_options_send_only_what_was_set():
    assert SynthesisOptions().inputs() == {"speed": 1.0}
    options = SynthesisOptions(1.5, 0.0, 0.8, False, "joe", priority=2)
    assert options.inputs() == {
        "speed": 1.5,
        "noise_scale": 0.0,
        "noise_w": 0.8,
        "normalize": False,
        "voice": "joe",
    }  # priority is Triton's request priority, not an input


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"speed": MIN_SPEED / 2}, "speed must be between"),
        ({"speed": MAX_SPEED * 2}, "speed must be between"),
        ({"speed": math.nan}, "speed must be between"),
        ({"speed": True}, "speed must be a number"),
        ({"noise_scale": MAX_NOISE + 0.1}, "noise_scale must be between"),
        ({"noise_w": math.inf}, "noise_w must be between"),
        ({"normalize": "yes"}, "normalize must be true or false"),
        ({"voice": b"joe"}, "voice must be a str"),
        ({"priority": 3}, "priority must be 0"),
        ({"priority": True}, "priority must be 0"),
    ],
)
def test_a_bad_option_is_refused_when_built(fields, message):
    with pytest.raises(ValueError, match=message):
        SynthesisOptions(**fields)


def test_the_server_checks_the_same_ranges():
    from tts_serving.errors import InvalidInputError
    from tts_serving.inputs import validate_noise, validate_speed

    assert speed_error(MAX_SPEED) is None and noise_error("noise_w", MAX_NOISE) is None
    with pytest.raises(InvalidInputError, match=re.escape(speed_error(MAX_SPEED + 1))):
        validate_speed(MAX_SPEED + 1)
    with pytest.raises(InvalidInputError, match=re.escape(noise_error("noise_w", MAX_NOISE + 1))):
        validate_noise("noise_w", MAX_NOISE + 1)
