"""The torch engine equals ONNX Runtime on the exported voice (CPU, float32, noise 0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export.torch_weights import onnx_weights
from tests.support import pb_utils as pb
from tests.support.models import load_model, text_request
from tts_front.sample_texts import SENTENCES
from tts_serving.engines import INT8_FILE, WEIGHTS_FILE
from tts_serving.engines.models import VocoderModel, load_acoustic, load_vocoder, model_file
from tts_serving.engines.torch_decoder import Decoder
from tts_serving.engines.torch_engine import TorchOptions, TorchVocoderNet
from tts_serving.engines.torch_weights import fill
from tts_serving.errors import ModelConfigError
from tts_serving.settings import AcousticSettings, EngineSettings

ORT = EngineSettings(max_padded_length=0)
TORCH = EngineSettings(engine="torch", device="cpu", max_padded_length=0)
SPEEDS = (0.5, 1.0, 2.0, 0.8, 1.25, 1.5, 0.7, 1.0)


@pytest.fixture(scope="module")
def ids(exported_repository):
    phonemizer = load_model(exported_repository, "phonemizer")
    texts = [s.encode() for s in SENTENCES[:8]]
    return [phonemizer.execute([text_request(t)])[0].output("phoneme_ids")[0] for t in texts]


@pytest.fixture(scope="module")
def engines(exported_repository):
    a, v = exported_repository / "acoustic/1", exported_repository / "vocoder/1"
    return {
        name: (load_acoustic(a / model_file(o), o), load_vocoder(v / model_file(o), 256, o))
        for name, o in (("ort", ORT), ("torch", TORCH))
    }


def max_diff(xs, ys) -> float:
    for x, y in zip(xs, ys):
        assert x.shape == y.shape  # same frame counts: durations agree exactly
    return max(float(np.max(np.abs(x - y))) for x, y in zip(xs, ys))


@pytest.mark.slow
@pytest.mark.parametrize("batch", ["one", "padded_8_mixed_speeds"])
def test_torch_equals_onnxruntime(engines, ids, batch):
    if batch == "one":
        items, scales = ids[3:4], np.array([[0.0, 1.0, 0.0]], np.float32)
    else:
        items = ids
        scales = np.array([[0.0, 1 / s, 0.0] for s in SPEEDS], np.float32)
    latents = {name: a(items, scales) for name, (a, _) in engines.items()}
    latent_err = max_diff(latents["torch"], latents["ort"])
    audio = {name: v(latents["ort"]) for name, (_, v) in engines.items()}
    audio_err = max_diff(audio["torch"], audio["ort"])
    print(f"\n{batch}: max |torch - ORT| latent {latent_err:.2e}, audio {audio_err:.2e}")
    assert latent_err < 1e-3 and audio_err < 1e-3


@pytest.mark.parametrize("speed_in", ["length_scale", "speed_column"])
def test_frames_per_id_are_exact_on_both_engines(engines, ids, speed_in):
    """The source of word timings: they sum to each latent's frames, a padded batch of mixed
    speeds gives each item what it gets alone, and both engines agree to the frame; with the
    speed as the 4th column (as acoustic sends it) each item's frames are its speed-1 frames
    / speed, rounded (export/graph.proportional_durations)."""
    if speed_in == "length_scale":  # Piper's own: the length scale divided by the speed
        scales = np.array([[0.0, 1 / s, 0.0] for s in SPEEDS], np.float32)
    else:
        scales = np.array([[0.0, 1.0, 0.0, s] for s in SPEEDS], np.float32)
    results = {}
    for name, (acoustic, _) in engines.items():
        together = acoustic.run(ids, scales)
        alone = [acoustic.run([x], scales[k : k + 1])[0] for k, x in enumerate(ids)]
        for x, t, a in zip(ids, together, alone):
            assert t.durations.dtype == np.int32 and len(t.durations) == len(x)
            assert np.array_equal(t.durations, a.durations), name
            assert max(int(t.durations.sum()), 1) == t.latent.shape[-1], name
        results[name] = [r.durations for r in together]
    for o, t in zip(results["ort"], results["torch"]):
        assert np.array_equal(o, t)
    if speed_in == "speed_column":
        base = engines["ort"][0].run(ids, np.tile([0.0, 1.0, 0.0], (len(ids), 1)))
        for b, r, speed in zip(base, results["ort"], SPEEDS):
            assert int(r.sum()) == round(int(b.durations.sum()) / speed), speed


@pytest.mark.slow
def test_the_adapters_serve_the_torch_engine(exported_repository, ids):
    """model.py with engine torch: same outputs as with ONNX Runtime, one response each."""
    zero = np.zeros((1, 1), np.float32)
    outputs = {}
    for engine in ("onnxruntime", "torch"):
        params = {"engine": engine, "device": "cpu"}
        acoustic = load_model(exported_repository, "acoustic", params)
        vocoder = load_model(exported_repository, "vocoder", params)
        requests = [
            pb.InferenceRequest(phoneme_ids=x[None], noise_scale=zero, noise_w=zero)
            for x in ids[:3]
        ]
        latents = [r.output("latent") for r in acoustic.execute(requests)]
        audio = vocoder.execute([pb.InferenceRequest(latent=lat) for lat in latents])
        outputs[engine] = [r.output("audio") for r in audio]
    assert max_diff(outputs["torch"], outputs["onnxruntime"]) < 1e-3


def test_every_weight_is_used_and_every_parameter_filled(exported_repository):
    weights = onnx_weights(exported_repository / "vocoder/1/model.onnx")
    fill(Decoder(), weights, "vocoder")  # complete: no error
    with pytest.raises(ModelConfigError, match="missing: \\['dec.conv_post.weight'\\]"):
        fill(Decoder(), {k: v for k, v in weights.items() if k != "dec.conv_post.weight"}, "v")
    with pytest.raises(ModelConfigError, match="unused: \\['dec.extra'\\]"):
        fill(Decoder(), {**weights, "dec.extra": np.zeros(3, np.float32)}, "v")
    bad = {**weights, "dec.conv_pre.bias": np.zeros(5, np.float32)}
    with pytest.raises(ModelConfigError, match="dec.conv_pre.bias has shape"):
        fill(Decoder(), bad, "v")


def test_a_missing_weights_file_says_how_to_make_it(tmp_path):
    with pytest.raises(ModelConfigError, match="make export"):
        TorchVocoderNet(tmp_path / WEIGHTS_FILE, TorchOptions(device="cpu"))


def test_a_batch_out_of_memory_is_served_in_halves(exported_repository, engines, ids, monkeypatch):
    """A forced out-of-memory above 2 items: the 8 are served in halves, equal to one call."""
    net = TorchVocoderNet(exported_repository / "vocoder/1" / WEIGHTS_FILE, TorchOptions("cpu"))
    one_bucket = EngineSettings(
        engine="torch", device="cpu", max_padded_length=0, bucket_max_waste=9
    )
    vocoder = VocoderModel(net, 256, one_bucket)
    latents = engines["ort"][0](ids, np.zeros((len(ids), 3), np.float32) + [0, 1, 0])
    whole = vocoder(latents)
    forward = net.module.forward
    calls = []

    def limited(x):
        calls.append(x.shape[0])
        if x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (forced by the test)")
        return forward(x)

    monkeypatch.setattr(net.module, "forward", limited)
    halved = vocoder(latents)
    assert calls == [8, 4, 2, 2, 4, 2, 2]
    assert max_diff(halved, whole) < 1e-3  # padding differs per half: within the batch bound
    monkeypatch.setattr(net.module, "forward", lambda x: (_ for _ in ()).throw(ValueError("x")))
    with pytest.raises(ValueError):  # any other error is not retried
        vocoder(latents)


def test_engine_settings_are_checked():
    with pytest.raises(ValueError, match="engine must be one of"):
        EngineSettings(engine="tensorrt")
    with pytest.raises(ValueError, match="dtype of engine torch must be one of"):
        EngineSettings(engine="torch", dtype="float8")
    with pytest.raises(ValueError, match="dtype of engine torch must be one of"):
        EngineSettings(engine="torch", dtype="int8")  # int8 is ONNX Runtime's (cpu-int8)
    with pytest.raises(ValueError, match="dtype of engine onnxruntime must be one of"):
        EngineSettings(dtype="float16")
    with pytest.raises(ValueError, match="for the vocoder only"):
        AcousticSettings(dtype="int8")
    with pytest.raises(ValueError, match="set both"):
        EngineSettings(engine="torch", cuda_graph_batches="1,8")
    with pytest.raises(ValueError, match="comma-separated integers"):
        EngineSettings(engine="torch", cuda_graph_batches="1,x", cuda_graph_frames="8")
    with pytest.raises(ValueError, match="engine torch only"):
        EngineSettings(cuda_graph_batches="1", cuda_graph_frames="8")
    assert model_file(EngineSettings(dtype="int8")) == INT8_FILE
    assert model_file(EngineSettings(dtype="float32")) == "model.onnx"
    s = EngineSettings(engine="torch", cuda_graph_batches="1, 8,64", cuda_graph_frames="128")
    assert s.graph_batches == (1, 8, 64) and s.graph_frames == (128,)


def test_cuda_asked_for_without_cuda_is_a_config_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelConfigError, match="no CUDA device"):
        TorchOptions(device="cuda").torch_device()


def test_numpy_2_is_refused_at_initialize():
    from tts_serving.triton.adapter import check_numpy

    check_numpy("1.26.4")
    with pytest.raises(ModelConfigError, match="returns every output empty"):
        check_numpy("2.0.2")


def dlpack_handoff(repository, device: str, texts: list[bytes]) -> dict[str, list[np.ndarray]]:
    """Audio of ``texts`` through acoustic and vocoder adapters with latents handed over as
    numpy arrays ("host") and as DLPack tensors left where the engine made them ("dlpack")."""
    phonemizer = load_model(repository, "phonemizer")
    ids = [phonemizer.execute([text_request(t)])[0].output("phoneme_ids") for t in texts]
    zero = np.zeros((1, 1), np.float32)
    requests = [pb.InferenceRequest(phoneme_ids=x, noise_scale=zero, noise_w=zero) for x in ids]
    engine = {"engine": "torch", "device": device}
    dlpack = {**engine, "device_tensors": "true"}
    out = {}
    for name, a_params, v_params in (
        ("host", engine, engine),
        ("dlpack", dlpack, {**dlpack, "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}),
    ):
        acoustic = load_model(repository, "acoustic", a_params)
        vocoder = load_model(repository, "vocoder", v_params)
        latents = [r.output_tensors[0] for r in acoustic.execute(requests)]
        assert all(t.name() == "latent" for t in latents)
        assert all((t._torch is not None) == (name == "dlpack") for t in latents)
        if name == "dlpack":  # and one latent sent from the host, in the same batch
            # Read as a client's copy would be: a GPU tensor has no numpy view (as_numpy()
            # refuses it in the real stub and in the fake), so through DLPack to the host.
            host = torch.from_dlpack(latents[0].to_dlpack()).cpu().numpy()
            latents.append(pb.Tensor("latent", host))
        audio = vocoder.execute([pb.InferenceRequest(latent=t) for t in latents])
        out[name] = [r.output("audio") for r in audio]
    return out


def test_latents_handed_over_by_dlpack_give_the_same_audio(exported_repository):
    texts = [s.encode() for s in SENTENCES[:3]]
    out = dlpack_handoff(exported_repository, "cpu", texts)
    assert max_diff(out["dlpack"][:3], out["host"]) < 1e-6
    # Padded with other items (another bucket than the first's): equal up to the padding's
    # reach into the edge, as batched vs alone everywhere.
    assert max_diff(out["dlpack"][3:], out["host"][:1]) < 1e-3


@pytest.mark.parametrize("device_tensors, force_cpu", [("true", None), ("false", "no")])
def test_device_tensors_and_cpu_only_inputs_are_set_together(
    exported_repository, device_tensors, force_cpu
):
    params = {"engine": "torch", "device": "cpu", "device_tensors": device_tensors}
    if force_cpu:
        params["FORCE_CPU_ONLY_INPUT_TENSORS"] = force_cpu
    with pytest.raises(ModelConfigError, match="FORCE_CPU_ONLY_INPUT_TENSORS: no"):
        load_model(exported_repository, "vocoder", params)
    with pytest.raises(ModelConfigError, match="device_tensors applies to engine torch only"):
        load_model(exported_repository, "acoustic", {"device_tensors": "true"})


@pytest.mark.parametrize("speed_in", ["length_scale", "speed_column"])
def test_durations_from_bucket_sized_batches_equal_the_batch_alone(engines, ids, speed_in):
    """What the acoustic's CUDA graphs do on a GPU (DurationGraphs), run eagerly: a batch padded
    up to a captured (batch, phoneme ids) bucket and cut back gives every item the frames and
    the latent it gets without the bucket's padding."""
    from tts_serving.engines.torch_engine import DurationGraphs

    acoustic = engines["torch"][0]
    net = acoustic.net
    if speed_in == "length_scale":
        scales = np.array([[0.0, 1 / s, 0.0] for s in SPEEDS], np.float32)
    else:
        scales = np.array([[0.0, 1.0, 0.0, s] for s in SPEEDS], np.float32)
    longest = max(len(x) for x in ids)
    plain = acoustic.run(ids, scales)
    buckets = DurationGraphs(
        net.module, (1, 4, 16), (longest, longest + 37, 400), net.device, capture=False
    )
    # The bucket the whole batch replays is 16 x (longest); one item alone: 1 x (longest).
    assert buckets.cells and max(buckets.cells) == (16, 400)
    net.duration_graphs = buckets
    try:
        bucketed = acoustic.run(ids, scales)
        alone = acoustic.run(ids[:1], scales[:1])
    finally:
        net.duration_graphs = None
    for p, b in zip(plain, bucketed):
        assert np.array_equal(p.durations, b.durations)
    # Padded to the bucket, the sums run in another order: within the bound of the other
    # padding checks (1.3e-4 on an AMD EPYC; a padding that leaks into an item moves it by 0.1).
    assert max_diff([b.latent for b in bucketed], [p.latent for p in plain]) < 1e-3
    assert np.array_equal(alone[0].durations, plain[0].durations)


def test_batches_outside_every_bucket_run_eagerly(engines, ids):
    from tts_serving.engines.torch_engine import DurationGraphs

    net = engines["torch"][0].net
    buckets = DurationGraphs(net.module, (1, 2), (8,), net.device, capture=False)
    x = torch.from_numpy(np.stack([ids[0][:8]] * 3))
    scales = torch.tensor([[0.0, 1.0, 0.0, 1.0]] * 3)
    assert buckets(x, torch.full((3,), 8), scales) is None  # 3 items > 2
    assert buckets(x[:1, :8].repeat(1, 2), torch.full((1,), 16), scales[:1]) is None  # 16 > 8
    m_p, logs_p, w = buckets(x[:2], torch.full((2,), 8), scales[:2])
    assert m_p.shape == logs_p.shape == (2, 192, 8) and w.shape == (2, 8)
