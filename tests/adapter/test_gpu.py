"""On a GPU: ONNX Runtime's CUDA provider and the torch engine (float32 and float16, CUDA graphs
on and off) equal the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import pb_utils as pb
from tests.support.models import load_model, text_request

pytestmark = pytest.mark.gpu


def test_cuda_models_equal_cpu_models(exported_repository):
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("onnxruntime has no CUDA provider here")
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


# (max |error| of a sample, error RMS / signal RMS) of each item against torch float32 on the
# CPU, noise 0. float16 runs the flow and the vocoder in half precision: its error is spread
# over the whole waveform, not a few wrong samples. Measured on an H100 (2026-11-27, the 8
# items here, graphs on and off alike): float16 max |error| 0.0022-0.0191, RMS ratio
# 0.0041-0.0190 (-34 dB and below); float32 at most 9.6e-5 and 7.1e-5. The bounds are 1.5x
# the largest float16 value (an item of the same texts is not expected to move more between
# drivers than between these items) and 10x float32's.
TOLERANCES = {"float32": (1e-3, 1e-3), "float16": (3e-2, 3e-2)}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("graphs", [False, True])
def test_torch_on_cuda_equals_the_cpu(exported_repository, dtype, graphs):
    import torch

    from tts_serving.engines.models import load_acoustic, load_vocoder, model_file
    from tts_serving.settings import AcousticSettings, EngineSettings

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    phonemizer = load_model(exported_repository, "phonemizer")
    texts = [b"Hello world.", b"A longer sentence that takes a little while to say."] * 4
    ids = [phonemizer.execute([text_request(t)])[0].output("phoneme_ids")[0] for t in texts]
    scales = np.array([[0.0, ls, 0.0] for ls in (0.5, 1, 2, 0.8, 1.25, 1.5, 0.7, 1)], np.float32)
    graph = {"cuda_graph_batches": "1,8", "cuda_graph_frames": "256,512"} if graphs else {}
    phonemes = {"cuda_graph_phonemes": "16,64"} if graphs else {}
    audio = {}
    for device, a_opts, v_opts in (
        ("cpu", *[AcousticSettings(engine="torch", device="cpu", max_padded_length=0)] * 2),
        (
            "cuda",
            AcousticSettings(engine="torch", device="cuda", dtype=dtype, **graph, **phonemes),
            EngineSettings(engine="torch", device="cuda", dtype=dtype, **graph),
        ),
    ):
        a, v = exported_repository / "acoustic/1", exported_repository / "vocoder/1"
        acoustic = load_acoustic(a / model_file(a_opts), a_opts)
        if graphs:
            assert acoustic.net.duration_graphs or device == "cpu", acoustic.net.description
        latents = acoustic(ids, scales)
        audio[device] = load_vocoder(v / model_file(v_opts), 256, v_opts)(latents)
    errors = []
    for cpu, cuda in zip(audio["cpu"], audio["cuda"]):
        assert cpu.shape == cuda.shape  # the same frames: durations are float32 on both
        err = cuda - cpu
        errors.append((float(np.max(np.abs(err))), float(np.std(err) / np.std(cpu))))
    print(f"\n{dtype}, graphs {graphs}: (max |err|, err RMS / RMS) per item", errors)
    max_bound, rms_bound = TOLERANCES[dtype]
    assert max(e[0] for e in errors) < max_bound
    assert max(e[1] for e in errors) < rms_bound


def test_latents_stay_on_the_gpu_between_acoustic_and_vocoder(exported_repository):
    # The gpu-dlpack profile's hand-off: the latent the vocoder reads is the acoustic model's
    # CUDA tensor (no host copy), and the audio equals the hand-off through the host.
    from tests.adapter.test_torch_engine import dlpack_handoff, max_diff
    from tts_front.sample_texts import SENTENCES

    out = dlpack_handoff(exported_repository, "cuda", [s.encode() for s in SENTENCES[:3]])
    # The same latents; float16 kernels that cuDNN picks by batch size (3 items through the
    # host, 4 with the host-sent one on the device path) moved the audio by 2.7e-4 on an H100.
    # On the CPU, float32, the two paths agree to 1e-6 (test_torch_engine.py).
    assert max_diff(out["dlpack"][:3], out["host"]) < 1e-3
