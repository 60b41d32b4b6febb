"""Items side by side (one single-thread ONNX Runtime session per item, the CPU default)
through model.py as Triton loads it: the same audio, item for item, as the padded calls; a
lone item cut in stretches over the sessions too (``split_items``)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import pb_utils as pb
from tests.support.models import load_model, served_latents
from tests.support.speech import TEXTS
from tts_serving.model_config import pbtxt_parameters

SENTENCES = TEXTS[:6]


@pytest.mark.slow
def test_side_by_side_serves_what_padded_calls_serve(exported_repository):
    defaults = pbtxt_parameters(exported_repository / "vocoder/config.pbtxt")
    assert defaults["items_side_by_side"] == "true" and int(defaults["intra_op_threads"]) > 1
    latents = served_latents(exported_repository, SENTENCES)
    audio = {}
    for side_by_side in ("true", "false"):
        vocoder = load_model(
            exported_repository, "vocoder", {**defaults, "items_side_by_side": side_by_side}
        )
        _, (model, _) = next(iter(vocoder.voices))
        assert len(model.side_by_side.nets) == (2 if side_by_side == "true" else 0)
        responses = vocoder.execute([pb.InferenceRequest(latent=lat) for lat in latents])
        audio[side_by_side] = [r.output("audio").ravel() for r in responses]
        # Each alone: on the CPU default a lone item runs in stretches on both sessions.
        if side_by_side == "true":
            assert model.context is not None and latents[0].shape[-1] > 6 * model.context
        lone = [vocoder.execute([pb.InferenceRequest(latent=lat)])[0] for lat in latents[:2]]
        audio[f"lone {side_by_side}"] = [r.output("audio").ravel() for r in lone]
    for alone, padded, latent in zip(audio["true"], audio["false"], latents):
        assert alone.shape == padded.shape == (latent.shape[-1] * 256,)
        np.testing.assert_allclose(alone, padded, atol=2e-3)
    for split, whole in zip(audio["lone true"], audio["lone false"]):
        assert split.shape == whole.shape
        np.testing.assert_allclose(split, whole, atol=1e-4)
