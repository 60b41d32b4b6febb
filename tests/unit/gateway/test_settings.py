"""The gateway's settings (tts_gateway.settings): flags, environment, voices files, secrets."""

from __future__ import annotations

import json

import pytest

from tts_gateway.settings import GatewaySettings, load_voices, parse_args


def test_settings_from_flags_and_environment(tmp_path):
    voices = tmp_path / "voices.json"
    voices.write_text(json.dumps([{"id": "a", "aliases": ["alloy"]}, {"id": "b", "speed": 0.8}]))
    settings, level = parse_args(
        ["--port", "9000", f"--voices-file={voices}"], {"TTS_GATEWAY_MAX_INPUT_CHARS": "8000"}
    )
    assert settings.port == 9000 and settings.max_input_chars == 8000 and level == "info"
    assert [v.id for v in settings.voices] == ["a", "b"]
    assert {k: v.id for k, v in settings.voice_names().items()} == {
        "a": "a",
        "b": "b",
        "alloy": "a",
    }


@pytest.mark.parametrize(
    "content,message",
    [
        ("{", "cannot read voices file"),
        ('{"id": "a"}', "JSON list of objects"),
        ('[{"id": "a", "pitch": 2}]', "unknown key"),
        ('[{"aliases": []}]', "needs an 'id'"),
        ('[{"id": "a", "noise_w": 5}]', "voice 'a': noise_w must be between 0 and 2"),
        ('[{"id": "a", "speed": 0}]', "voice 'a': speed must be between 0.25 and 4.0"),
    ],
)
def test_bad_voices_files_are_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "voices.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_voices(path)


def test_the_front_doors_token_is_read_from_a_mounted_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    assert GatewaySettings(front_token_file=str(token)).front_token == "t0k3n"
    assert GatewaySettings(front_token="direct", front_token_file=str(token)).front_token == (
        "direct"
    )
    with pytest.raises(ValueError, match="front_token_file: cannot read it"):
        GatewaySettings(front_token_file=str(tmp_path / "missing"))
    token.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        GatewaySettings(front_token_file=str(token))


def test_settings_refuse_a_body_limit_below_the_input_limit():
    with pytest.raises(ValueError, match="max_body_bytes"):
        GatewaySettings(max_input_chars=100_000, max_body_bytes=100_000)


def test_bool_settings_read_true_and_false(tmp_path):
    settings, _ = parse_args(["--check-voices", "false"], environ={})
    assert settings.check_voices is False
    settings, _ = parse_args([], environ={"TTS_GATEWAY_CHECK_VOICES": "0"})
    assert settings.check_voices is False
    assert parse_args([], environ={})[0].check_voices is True
