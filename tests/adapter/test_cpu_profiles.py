"""The ``cpu-int8`` profile through model.py as Triton loads it, held to the quality
gates of ``bench.cpu_variants`` against the float32 default."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cpu_variants import GATES, report
from tests.support import pb_utils as pb
from tests.support.models import load_model, served_latents
from tests.support.speech import TEXTS
from tts_serving.model_config import pbtxt_parameters

EVALUATION = TEXTS[::4]  # six of the gates' sentences: a few seconds


@pytest.mark.slow
def test_the_int8_profile_serves_the_exported_int8_vocoder_within_the_gates(
    exported_repository,
):
    params = pbtxt_parameters(exported_repository / "vocoder/configs/cpu-int8.pbtxt")
    assert params["dtype"] == "int8"
    latents = served_latents(exported_repository, EVALUATION)
    audio = {}
    for name, vocoder_params in (("float32", None), ("int8", params)):
        vocoder = load_model(exported_repository, "vocoder", vocoder_params)
        responses = vocoder.execute([pb.InferenceRequest(latent=lat) for lat in latents])
        audio[name] = [r.output("audio").ravel() for r in responses]
    r = report(audio["float32"], audio["int8"])
    assert GATES.failures(r, float_wer=None) == [], r
    # Not float32 itself: a profile that loaded model.onnx would pass the gates too.
    assert np.median(r.snr) < 60, r.snr
