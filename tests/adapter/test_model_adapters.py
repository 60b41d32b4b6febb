"""model.py adapters under a fake pb_utils, with the real exported ONNX files."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np
import pytest

from tests import fake_pb_utils as pb

pb.install()

from tts_serving.config import config_parameters, parse_dataclass  # noqa: E402
from tts_serving.errors import ModelConfigError  # noqa: E402
from tts_serving.inference import RuntimeOptions  # noqa: E402


def load_model(repository, name, params=None, max_batch_size=16):
    """Import model_repository/<name>/1/model.py and initialize it like the stub does."""
    spec = importlib.util.spec_from_file_location(
        f"model_{name}", repository / name / "1" / "model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = {
        "name": name,
        "max_batch_size": max_batch_size,
        "parameters": {k: {"string_value": v} for k, v in (params or {}).items()},
    }
    model = module.TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(repository / name),
            "model_version": "1",
            "model_instance_kind": "CPU",
        }
    )
    return model


def text_request(text: bytes) -> pb.InferenceRequest:
    return pb.InferenceRequest(text=np.array([[text]], dtype=object))


def test_config_parameters_and_typed_parsing():
    config = {
        "parameters": {"intra_op_threads": {"string_value": "2"}, "device": {"string_value": "cpu"}}
    }
    params = config_parameters(config)
    assert params == {"intra_op_threads": "2", "device": "cpu"}
    options = parse_dataclass(RuntimeOptions, params)
    assert options.intra_op_threads == 2 and options.device == "cpu"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"intra_op_threads": "two"}, "not a valid int"),
        ({"graph_optimization": "max"}, "graph_optimization must be one of"),
        ({"device": "tpu"}, "device must be auto, cpu or cuda"),
    ],
)
def test_bad_parameters_fail_initialize(params, message):
    with pytest.raises(ModelConfigError, match=message):
        parse_dataclass(RuntimeOptions, params)


def test_acoustic_requires_a_batching_config(exported_repository):
    with pytest.raises(ModelConfigError, match="max_batch_size must be >= 16"):
        load_model(exported_repository, "acoustic", max_batch_size=4)


def test_missing_model_file_says_to_export(exported_repository, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(
        exported_repository / "vocoder", repo / "vocoder", ignore=shutil.ignore_patterns("*.onnx")
    )
    with pytest.raises(ModelConfigError, match="run `make export`"):
        load_model(repo, "vocoder")


def test_phonemizer_one_response_per_request_bad_items_isolated(exported_repository):
    model = load_model(exported_repository, "phonemizer", {"max_phoneme_ids": "400"})
    responses = model.execute(
        [
            text_request(b"Hello there."),
            text_request(b"   "),
            text_request(b"\xc3\x28"),
            text_request(b"Bye."),
        ]
    )
    assert len(responses) == 4
    assert not responses[0].has_error() and not responses[3].has_error()
    assert responses[0].output("phoneme_ids").shape[0] == 1
    assert responses[1].error().code() == pb.TritonError.INVALID_ARG
    assert "empty" in responses[1].error().message()
    assert "UTF-8" in responses[2].error().message()


def test_acoustic_and_vocoder_batch_equals_single(exported_repository):
    phonemizer = load_model(exported_repository, "phonemizer")
    acoustic = load_model(exported_repository, "acoustic")
    vocoder = load_model(exported_repository, "vocoder")
    texts = [
        b"Short one.",
        b"A much longer sentence that takes more time to say out loud.",
        b"Medium length here.",
    ]
    ids = [phonemizer.execute([text_request(t)])[0].output("phoneme_ids") for t in texts]
    zero = np.zeros((1, 1), np.float32)

    def acoustic_request(x, speed=1.0):
        return pb.InferenceRequest(
            phoneme_ids=x, speed=np.array([[speed]], np.float32), noise_scale=zero, noise_w=zero
        )

    batched = acoustic.execute([acoustic_request(x) for x in ids])
    latents = [r.output("latent") for r in batched]
    assert [lat.shape[1] for lat in latents] == [192] * 3
    singles = [acoustic.execute([acoustic_request(x)])[0].output("latent") for x in ids]
    for a, b in zip(latents, singles):
        assert a.shape == b.shape  # each item cut back to its own frames
        assert np.max(np.abs(a - b)) < 1e-3

    audio = [
        r.output("audio")[0]
        for r in vocoder.execute([pb.InferenceRequest(latent=lat) for lat in latents])
    ]
    for a, lat in zip(audio, latents):
        assert a.shape == (lat.shape[-1] * 256,)
        assert np.max(np.abs(a)) == pytest.approx(1.0)  # peak-normalized like Piper


def test_acoustic_bad_item_does_not_fail_the_batch(exported_repository):
    acoustic = load_model(exported_repository, "acoustic")
    good = np.array([[1, 0, 20, 0, 59, 0, 2]], np.int64)
    requests = [
        pb.InferenceRequest(phoneme_ids=good, speed=np.array([[1.0]], np.float32)),
        pb.InferenceRequest(phoneme_ids=good, speed=np.array([[np.nan]], np.float32)),
        pb.InferenceRequest(phoneme_ids=np.array([[1, 999, 2]], np.int64)),
        pb.InferenceRequest(phoneme_ids=np.zeros((2, 3), np.int64)),
        pb.InferenceRequest(phoneme_ids=good),
    ]
    responses = acoustic.execute(requests)
    assert len(responses) == 5
    assert not responses[0].has_error() and not responses[4].has_error()
    messages = [r.error().message() for r in responses[1:4]]
    assert "speed must be between" in messages[0]
    assert "phoneme_ids must be in 0..255" in messages[1]
    assert "batch size 2" in messages[2]
    assert all(r.error().code() == pb.TritonError.INVALID_ARG for r in responses[1:4])


def test_vocoder_rejects_malformed_latents(exported_repository):
    vocoder = load_model(exported_repository, "vocoder")
    bad_nan = np.full((1, 192, 5), np.nan, np.float32)
    responses = vocoder.execute(
        [
            pb.InferenceRequest(latent=np.zeros((1, 100, 5), np.float32)),
            pb.InferenceRequest(latent=bad_nan),
            pb.InferenceRequest(latent=np.zeros((1, 192, 5), np.float32)),
        ]
    )
    assert "latent must be [192, frames]" in responses[0].error().message()
    assert "NaN" in responses[1].error().message()
    # All-zero latent: silent but valid audio of 5 frames.
    assert responses[2].output("audio").shape == (1, 5 * 256)


def test_internal_failure_is_an_error_not_silence(exported_repository):
    vocoder = load_model(exported_repository, "vocoder")

    def broken(_items):
        raise RuntimeError("onnxruntime exploded")

    vocoder.model = broken
    (response,) = vocoder.execute([pb.InferenceRequest(latent=np.zeros((1, 192, 5), np.float32))])
    assert response.error().code() == pb.TritonError.INTERNAL
    assert (
        "vocoder failed on this batch (RuntimeError); see the server log"
        == response.error().message()
    )
    assert any("onnxruntime exploded" in m for level, m in pb.Logger.lines if level == "error")


def test_phonemizer_normalizes_text_first(exported_repository):
    model = load_model(exported_repository, "phonemizer")
    plain = load_model(exported_repository, "phonemizer", {"normalize_text": "false"})

    def ids(m, text):
        return m.execute([text_request(text.encode())])[0].output("phoneme_ids").tolist()

    assert ids(model, "$5.50") == ids(model, "five dollars and fifty cents")
    assert ids(plain, "$5.50") != ids(plain, "five dollars and fifty cents")
