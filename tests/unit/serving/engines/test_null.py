"""The null engine (benchmark only): real lengths, no network, never outside its profiles."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from bench import baselines
from tts_launcher import profiles, server
from tts_serving.engines.null import (
    FRAMES_PER_ID,
    NullAcousticNet,
    NullVocoderNet,
    null_durations,
)
from tts_serving.model_config import pbtxt_parameters
from tts_serving.settings import AcousticSettings


def test_durations_follow_the_ids_and_the_length_scale():
    lengths = np.array([10, 1, 4, 0])
    scales = np.array([1.0, 0.25, 2.0, 1.0])
    durations = null_durations(lengths, scales, 10)
    assert durations.shape == (4, 10) and durations.min() >= 0
    totals = durations.sum(axis=1)
    assert totals[0] == round(10 * FRAMES_PER_ID)
    assert totals[1] == 1  # 0.54 frames rounds to none: an item still gets one
    assert totals[2] == round(4 * FRAMES_PER_ID * 2)  # slower speech, more frames
    assert totals[3] == 0  # no ids, no frames (never sent: the acoustic model refuses it)
    assert not durations[2, 4:].any()  # nothing past an item's own ids


def test_the_nets_return_the_real_shapes_in_silence():
    ids = np.zeros((2, 7), np.int64)
    latent, frames, durations = NullAcousticNet()(
        ids, np.array([7, 3]), np.array([[0.667, 1.0, 0.8], [0.667, 1.5, 0.8]], np.float32)
    )
    assert list(frames) == list(durations.sum(axis=1)) == [15, 10]
    assert latent.shape == (2, 192, 15) and not latent.any()
    audio = NullVocoderNet(256)(latent)
    assert audio.shape == (2, 15 * 256) and audio.dtype == np.float32 and not audio.any()


def test_it_is_never_a_default_and_only_benchmark_profiles_select_it():
    assert AcousticSettings().engine == "onnxruntime"
    with pytest.raises(ValueError, match="dtype of engine null must be one of auto,"):
        AcousticSettings(engine="null", dtype="float16")
    with pytest.raises(ValueError, match="cuda_graph_"):
        AcousticSettings(engine="null", cuda_graph_batches="1", cuda_graph_frames="8")
    ceilings = ("host-ceiling", "gpu-host-ceiling")
    served = profiles.expected().items()
    for path, text in [*served, *baselines.configs(profiles.REPOSITORY / "b").items()]:
        config = model_config_pb2.ModelConfig()
        text_format.Parse(text, config)
        engine = config.parameters["engine"].string_value if "engine" in config.parameters else ""
        null = engine == "null"
        voice = path.parts[-3] in ("acoustic", "vocoder")  # the models that run the voice
        baseline = path.is_relative_to(profiles.REPOSITORY / "b")
        assert null == (voice and baseline and path.stem in ceilings), path
    for path in profiles.REPOSITORY.glob("*/config.pbtxt"):
        assert pbtxt_parameters(path).get("engine") != "null", path
    bad = {"gpu": {"vocoder": profiles.Override(parameters={"engine": "null"})}}
    with pytest.raises(ValueError, match="serves silence"):
        profiles.check_engines(bad)


@pytest.mark.parametrize(
    "flags",
    [["--model-config-name=host-ceiling"], ["--model-config-name", "gpu-host-ceiling"]],
)
def test_the_launcher_refuses_to_serve_a_benchmark_profile(flags, capsys, tmp_path):
    repository = baselines.baseline_repository(tmp_path / "baselines")
    with pytest.raises(SystemExit) as stop:
        server.main(["--gateway-port", "0", f"--model-repository={repository}", *flags])
    assert stop.value.code == 2
    assert "serves silence" in capsys.readouterr().err
    assert server.profile_problem("gpu", repository) is None
    # From the served repository, which has no such profile: refused, not config.pbtxt served.
    with pytest.raises(SystemExit) as stop:
        server.main(["--gateway-port", "0", *flags])
    assert stop.value.code == 2
    assert "no model in" in capsys.readouterr().err and "bench.baselines" in server.profile_problem(
        "host-ceiling", profiles.REPOSITORY
    )
