import numpy as np
import pytest
import soundfile
from tritonclient.utils import InferenceServerException

from tts_client import (
    Audio,
    Endpoint,
    InferenceFailed,
    InvalidInput,
    ServerOverloaded,
    ServerUnavailable,
)
from tts_client.client import sample_rate_from_config
from tts_client.errors import TTSError, map_exception


@pytest.mark.parametrize(
    "url, expected",
    [
        ("grpc://localhost:8001", ("grpc", "localhost", 8001)),
        ("grpc://tts.example", ("grpc", "tts.example", 8001)),
        ("http://127.0.0.1:9000", ("http", "127.0.0.1", 9000)),
        ("http://host/", ("http", "host", 8000)),
    ],
)
def test_url_picks_protocol_and_default_port(url, expected):
    ep = Endpoint.parse(url)
    assert (ep.protocol, ep.host, ep.port) == expected
    assert ep.address == f"{expected[1]}:{expected[2]}"


@pytest.mark.parametrize(
    "url, message",
    [
        ("localhost:8001", "must start with grpc:// or http://"),
        ("https://host", "must start with grpc:// or http://"),
        ("grpc://", "has no host"),
        ("http://host:99999", "invalid port"),
        ("http://host/v2", "must not have a path"),
    ],
)
def test_bad_urls_say_what_to_fix(url, message):
    with pytest.raises(ValueError, match=message):
        Endpoint.parse(url)


@pytest.mark.parametrize(
    "status, message, cls",
    [
        ("StatusCode.INVALID_ARGUMENT", "in ensemble 'tts', speed must be ...", InvalidInput),
        ("400", "text is empty", InvalidInput),
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", ServerOverloaded),
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", ServerUnavailable),
        ("StatusCode.NOT_FOUND", "Request for unknown model", ServerUnavailable),
        ("StatusCode.INTERNAL", "vocoder failed on this batch", InferenceFailed),
    ],
)
def test_triton_errors_map_to_client_exceptions(status, message, cls):
    err = map_exception(InferenceServerException(msg=message, status=status))
    assert type(err) is cls
    assert isinstance(err, TTSError)
    assert "in ensemble" not in str(err)


def test_stream_errors_without_status_map_by_prefix():
    err = map_exception(InferenceServerException(msg="invalid input: text is empty"))
    assert type(err) is InvalidInput and str(err) == "text is empty"
    assert type(map_exception(InferenceServerException(msg="boom"))) is InferenceFailed


def test_connection_errors_are_server_unavailable():
    assert isinstance(map_exception(ConnectionRefusedError(111, "refused")), ServerUnavailable)


def test_sample_rate_from_http_and_grpc_configs():
    http = {"name": "tts", "parameters": {"sample_rate": {"string_value": "22050"}}}
    assert sample_rate_from_config(http) == 22050
    assert sample_rate_from_config({"config": http}) == 22050
    with pytest.raises(TTSError, match="no sample_rate"):
        sample_rate_from_config({"name": "tts"})


@pytest.mark.parametrize("suffix", ["wav", "flac"])
def test_audio_writes_wav_and_flac(tmp_path, suffix):
    samples = np.sin(np.linspace(0, 100, 22050)).astype(np.float32) * 0.5
    audio = Audio(samples, 22050)
    assert audio.duration == pytest.approx(1.0)
    path = audio.write(tmp_path / f"a.{suffix}")
    data, rate = soundfile.read(path, dtype="float32")
    assert rate == 22050 and len(data) == 22050
    assert np.max(np.abs(data - samples)) < 1e-3


def test_audio_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="unsupported audio format"):
        Audio(np.zeros(10, np.float32), 22050).write(tmp_path / "a.mp3")
