"""The wire contract (tts_wire): one place for the options' ranges, used on every side."""

import math
import re
from dataclasses import fields

import pytest

from tts_client.protocol import OptionKeywords
from tts_wire import MAX_NOISE, MAX_SPEED, MIN_SPEED, SynthesisOptions, noise_error, speed_error
from tts_wire.tensors import MODEL_IO, OPTIONS, ModelIO, Tensor, check_ensemble


def test_options_send_only_what_was_set():
    assert SynthesisOptions().inputs() == {}
    assert SynthesisOptions(speed=1.0, word_timestamps=False).inputs() == {}
    options = SynthesisOptions(1.5, 0.0, 0.8, False, "joe", priority=2, word_timestamps=True)
    assert options.inputs() == {
        "speed": 1.5,
        "noise_scale": 0.0,
        "noise_w": 0.8,
        "normalize": False,
        "voice": "joe",
        "word_timestamps": True,
    }  # priority is Triton's request priority, not an input


def test_each_option_field_is_an_input_of_tts_and_tts_stream_and_a_client_keyword():
    """One declaration: the fields (priority, caller and listener aside: Triton's request
    priority and headers) are the options tensors.py declares, and the client's loose keywords
    (a static type) list the same."""
    relayed = ("priority", "caller", "listener")
    names = [f.name for f in fields(SynthesisOptions) if f.name not in relayed]
    assert names == [o.name for o in OPTIONS]
    for model in ("tts", "tts_stream"):
        assert set(names) <= {t.name for t in MODEL_IO[model].inputs}
    assert list(OptionKeywords.__annotations__) == names


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


def test_the_ensemble_steps_must_connect(monkeypatch):
    check_ensemble("tts")  # as declared
    vocoder = MODEL_IO["vocoder"]
    volume = Tensor("volume", "FP32", (1,), optional=True, stages=("vocoder",))
    monkeypatch.setitem(MODEL_IO, "vocoder", ModelIO((*vocoder.inputs, volume), vocoder.outputs))
    with pytest.raises(ValueError, match=r"vocoder needs \['volume'\], which nothing before"):
        check_ensemble("tts")
    tts = MODEL_IO["tts"]
    monkeypatch.setitem(MODEL_IO, "tts", ModelIO((*tts.inputs, volume), tts.outputs))
    check_ensemble("tts")  # declared on tts too: it connects
    monkeypatch.setitem(MODEL_IO, "vocoder", vocoder)
    with pytest.raises(ValueError, match=r"inputs no step takes \['volume'\]"):
        check_ensemble("tts")


def test_the_docs_tensor_table_of_tts_is_the_wire_contracts():
    """docs/models.md's table names each tensor of `tts` once, with its declared type, dims
    and whether it is optional (a row may name two tensors alike: "`noise_scale`, `noise_w`")."""
    import re

    from tests.support.paths import ROOT

    text = (ROOT / "docs" / "models.md").read_text().split("## `tts`", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in text.splitlines()[2:]:
        names, dtype, dims = [c.strip() for c in line.strip("|").split("|")][:3]
        dtype, dims = dtype.strip("`"), dims.strip("`")
        for name in re.findall(r"`(\w+)`", names):
            rows[name] = (dtype, dims, "optional" in names, "output" in names)
    io = MODEL_IO["tts"]
    declared = {
        t.name: (f"TYPE_{t.dtype}", "[" + ", ".join(map(str, t.dims)) + "]", t.optional, out)
        for out, tensors in ((False, io.inputs), (True, io.outputs))
        for t in tensors
    }
    assert rows == declared
