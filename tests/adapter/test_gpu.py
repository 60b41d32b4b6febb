"""The acoustic and vocoder models on ONNX Runtime's CUDA provider equal the CPU (GPU only)."""

from __future__ import annotations

import numpy as np
import pytest

from tests import fake_pb_utils as pb
from tests.adapter.test_model_adapters import load_model, text_request

pytestmark = pytest.mark.gpu


def test_cuda_models_equal_cpu_models(exported_repository):
    phonemizer = load_model(exported_repository, "phonemizer")
    texts = [b"Hello world.", b"A longer sentence that takes a little while to say."]
    ids = [phonemizer.execute([text_request(t)])[0].output("phoneme_ids") for t in texts]
    zero = np.zeros((1, 1), np.float32)
    outputs = {}
    for device in ("cpu", "cuda"):
        acoustic = load_model(exported_repository, "acoustic", {"device": device})
        vocoder = load_model(exported_repository, "vocoder", {"device": device})
        requests = [pb.InferenceRequest(phoneme_ids=x, noise_scale=zero, noise_w=zero) for x in ids]
        latents = [r.output("latent") for r in acoustic.execute(requests)]
        audio = vocoder.execute([pb.InferenceRequest(latent=lat) for lat in latents])
        outputs[device] = [r.output("audio") for r in audio]
    for cpu, cuda in zip(outputs["cpu"], outputs["cuda"]):
        assert cpu.shape == cuda.shape
        assert np.max(np.abs(cpu - cuda)) < 1e-3
