"""The committed model configs parse with Triton's own schema and keep the tensor contract."""

from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tts_serving.config import pbtxt_parameters

ROOT = Path(__file__).resolve().parents[2]
REPO = ROOT / "model_repository"


def load(name: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((REPO / name / "config.pbtxt").read_text(), config)
    return config


@pytest.mark.parametrize("name", ["phonemizer", "acoustic", "vocoder", "tts", "tts_stream"])
def test_config_parses_and_is_named_after_its_folder(name):
    assert load(name).name == name


@pytest.mark.parametrize("name", ["phonemizer", "acoustic", "vocoder", "tts", "tts_stream"])
def test_pbtxt_parameters_agree_with_tritons_parser(name):
    expected = {k: v.string_value for k, v in load(name).parameters.items()}
    assert expected
    assert pbtxt_parameters(REPO / name / "config.pbtxt") == expected


def test_ensemble_tensor_names_are_identical_end_to_end():
    tts = load("tts")
    assert tts.platform == "ensemble"
    steps = tts.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["phonemizer", "acoustic", "vocoder"]
    for step in steps:
        for key, value in list(step.input_map.items()) + list(step.output_map.items()):
            assert key == value, f"{step.model_name}: {key} -> {value}"
        model = load(step.model_name)
        assert set(step.input_map) <= {i.name for i in model.input}
        assert set(step.output_map) <= {o.name for o in model.output}
        assert tts.max_batch_size <= model.max_batch_size


def test_tts_contract():
    tts = load("tts")
    inputs = {i.name: i for i in tts.input}
    assert inputs["text"].data_type == model_config_pb2.TYPE_STRING
    assert list(inputs["text"].dims) == [1]
    assert inputs["speed"].data_type == model_config_pb2.TYPE_FP32 and inputs["speed"].optional
    (audio,) = tts.output
    assert (audio.name, audio.data_type, list(audio.dims)) == (
        "audio",
        model_config_pb2.TYPE_FP32,
        [-1],
    )
    assert tts.parameters["sample_rate"].string_value == "22050"


@pytest.mark.parametrize("name", ["acoustic", "vocoder"])
def test_batched_stages_batch_ragged_inputs(name):
    config = load(name)
    assert config.max_batch_size >= 16
    assert list(config.dynamic_batching.preferred_batch_size)
    assert 0 < config.dynamic_batching.max_queue_delay_microseconds <= 10_000
    assert config.dynamic_batching.default_queue_policy.max_queue_size > 0
    ragged = [i for i in config.input if -1 in i.dims]
    assert ragged and all(i.allow_ragged_batch for i in ragged)


def test_tts_stream_is_decoupled_and_speaks_the_tts_contract():
    stream, tts = load("tts_stream"), load("tts")
    assert stream.model_transaction_policy.decoupled
    assert {i.name: i.data_type for i in stream.input} == {i.name: i.data_type for i in tts.input}
    assert "audio" in {o.name for o in stream.output}


def test_compose_runs_the_matching_ngc_image():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["triton"]
    assert service["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"  # Triton 2.51
    assert (ROOT / service["entrypoint"][0].replace("/workspace/", "")).exists()
