"""Piper's HTTP API on the gateway (tts_gateway/piper_api.py), with a fake backend: the fields'
mapping, the WAV, the shapes of /voices and /info, and the refusals."""

from __future__ import annotations

import io
import json

import pytest
import soundfile

from tests.support.fake_backend import RATE, FakeBackend, client_for
from tests.support.paths import ROOT
from tts_gateway.piper_api import model_id, voice_configs
from tts_gateway.settings import Voice

VOICES = ROOT / "model_repository" / "phonemizer" / "1"


@pytest.fixture
def exported_voice(tmp_path):
    """A phonemizer folder as the export writes it: joe, and joe_slow (its length_scale 1.3)."""
    config = {
        "dataset": "joe",
        "language": {"code": "en_US"},
        "audio": {"sample_rate": RATE, "quality": "medium"},
        "espeak": {"voice": "en-us"},
        "inference": {"noise_scale": 0.667, "length_scale": 1.0, "noise_w": 0.8},
        "num_speakers": 1,
        "speaker_id_map": {},
    }
    (tmp_path / "voice.json").write_text(json.dumps(config))
    (tmp_path / "voices" / "joe_slow").mkdir(parents=True)
    slow = {**config, "inference": {**config["inference"], "length_scale": 1.3}}
    (tmp_path / "voices" / "joe_slow" / "voice.json").write_text(json.dumps(slow))
    (tmp_path / "voices.json").write_text(json.dumps({"voices": ["joe", "joe_slow"]}))
    return tmp_path


def client(backend, folder, **settings):
    return client_for(
        backend, triton_voices="joe=en-us,joe_slow=en-us", voice_configs=str(folder), **settings
    )


def test_pipers_request_becomes_a_wav_of_the_voice_at_the_speed_its_length_scale_says(
    exported_voice,
):
    backend = FakeBackend()
    with client(backend, exported_voice) as c:
        r = c.post("/synthesize", json={"text": "Hello there.", "length_scale": 1.5})
        slow = c.post("/", json={"text": "Hello there.", "voice": "joe_slow"})  # Pipecat's path
        noisy = c.post(
            "/synthesize",
            content=json.dumps({"text": "Hi.", "noise_scale": 0, "noise_w_scale": 0.1}),
            headers={"content-type": "application/x-www-form-urlencoded"},  # curl -d's default
        )
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    audio, rate = soundfile.read(io.BytesIO(r.content))
    assert len(audio) == pytest.approx(0.1 * len("Hello there.") * 1.5 * RATE, abs=1)
    assert rate == RATE and r.content[36:40] == b"data"  # the 44-byte header Pipecat skips
    speeds = [o.speed for o in backend.options]
    assert speeds[0] == pytest.approx(1 / 1.5)  # 1.5x as long
    assert slow.status_code == 200
    assert speeds[1] == pytest.approx(1.0) and backend.options[1].voice == "joe_slow"
    assert noisy.status_code == 200
    assert (backend.options[2].noise_scale, backend.options[2].noise_w) == (0.0, 0.1)


def test_a_voice_is_found_by_its_name_or_pipers_model_id_and_a_speaker_by_id(exported_voice):
    backend = FakeBackend()
    with client(backend, exported_voice) as c:
        by_id = c.post("/synthesize", json={"text": "Hi.", "voice": "en_US-joe-medium"})
        speaker = c.post("/synthesize", json={"text": "Hi.", "speaker_id": 2})
        only = c.post("/synthesize", json={"text": "Hi.", "speaker_id": 0})
    assert by_id.status_code == speaker.status_code == only.status_code == 200
    # en_US-joe-medium is both voices' file: it names the first (joe_slow is a variant of it).
    assert backend.options[0].voice in (None, "joe") and backend.options[1].speaker == "2"
    # Speaker 0 of a single-speaker voice is its one speaker, as Piper reads it; any other
    # number is the server's to refuse (a 400 naming the voice's speakers).
    assert backend.options[2].speaker is None


@pytest.mark.parametrize(
    "body, says",
    [
        (b"{", "not valid JSON"),
        (b"[1]", "must be a JSON object"),
        (b'{"text": "  "}', "No text provided"),
        (b'{"text": "Hi.", "voice": "amy"}', "unknown voice 'amy'; voices: joe, joe_slow, en_US-"),
        (b'{"text": "Hi.", "length_scale": 0}', "length_scale must be above 0"),
        (b'{"text": "Hi.", "length_scale": 9}', "length_scale must be between 0.25 and 4"),
        (b'{"text": "Hi.", "length_scale": "1"}', "length_scale must be a finite number"),
        (b'{"text": "Hi.", "noise_scale": 5}', "noise_scale"),
        (b'{"text": "Hi.", "noise_w_scale": -1}', "noise_w_scale"),
        (b'{"text": "Hi.", "speaker_id": true}', "speaker_id must be a number or a name"),
        (b'{"text": "Hi.", "sentence_silence": 1}', "unknown field(s) sentence_silence"),
    ],
)
def test_bad_input_is_a_400_that_says_what_to_fix(exported_voice, body, says):
    backend = FakeBackend()
    with client(backend, exported_voice) as c:
        r = c.post("/synthesize", content=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"]
    assert not backend.calls  # refused before any synthesis


def test_voices_and_info_have_pipers_shapes(exported_voice):
    with client(FakeBackend(), exported_voice) as c:
        voices = c.get("/voices").json()
        info = c.get("/info").json()
        download = c.post("/download", json={"voice": "en_US-amy-medium"})
        every = c.get("/all-voices")
    assert list(voices) == ["joe", "joe_slow"]
    assert voices["joe_slow"]["inference"]["length_scale"] == 1.3  # each voice's own config
    assert info == {"voice": {"name": "joe", "language": "en-us", "num_speakers": 1}, "last": None}
    assert download.status_code == every.status_code == 501
    assert "exported into its model repository" in download.json()["error"]["message"]


def test_the_api_key_guards_pipers_routes_too(exported_voice):
    with client(FakeBackend(), exported_voice, api_key="k3y") as c:
        assert c.post("/synthesize", json={"text": "Hi."}).status_code == 401
        assert c.get("/voices").status_code == 401
        assert c.get("/").status_code == 200  # the page itself
        ok = c.post("/", json={"text": "Hi."}, headers={"authorization": "Bearer k3y"})
        assert ok.status_code == 200


def test_without_the_repository_the_voice_table_is_listed():
    with client_for(FakeBackend(), voices=(Voice("joe", language="en-us"),)) as c:
        assert c.get("/voices").json() == {
            "joe": {"dataset": "joe", "espeak": {"voice": "en-us"}, "num_speakers": 1}
        }


def test_pipers_model_id_is_its_files_name():
    if not (VOICES / "voice.json").exists():
        pytest.skip("the voice is not exported")
    (config,) = voice_configs(VOICES).values()
    assert model_id(config) == "en_US-joe-medium"


def test_a_repository_without_voice_configs_still_serves_speech(tmp_path):
    backend = FakeBackend()
    with client_for(backend, voice_configs=str(tmp_path / "missing")) as c:
        assert c.post("/synthesize", json={"text": "Hi."}).status_code == 200
        assert list(c.get("/voices").json()) == ["joe"]
