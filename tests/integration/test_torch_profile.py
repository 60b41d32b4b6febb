"""The torch engine end to end: tritonserver with ``--model-config-name=torch-cpu``."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from tests.support.paths import ROOT
from tests.support.processes import ServerProcess, profile_server
from tts_client import TTSClient
from tts_front.sample_texts import SENTENCES
from tts_triton.statistics import model_statistics

EXACT = {"noise_scale": 0.0, "noise_w": 0.0}


@pytest.fixture(scope="module")
def torch_server(exported_repository, tmp_path_factory):
    logs = tmp_path_factory.mktemp("triton-torch")
    with profile_server(exported_repository, logs, "torch-cpu") as srv:
        yield srv


def test_the_profile_serves_the_torch_engine(torch_server, grpc_client):
    log = torch_server.log_path.read_text()
    assert "acoustic ready on torch" in log and "vocoder ready on torch" in log
    # The configs Triton loaded say torch (a log line alone passed with the wrong config) ...
    for model in ("acoustic", "vocoder"):
        url = f"{torch_server.http_url}/v2/models/{model}/config"
        with urllib.request.urlopen(url, timeout=10) as response:
            parameters = json.load(response)["parameters"]
        assert parameters["engine"]["string_value"] == "torch", (model, parameters)
    # ... and the audio is torch's: within float rounding of ONNX Runtime's, never identical.
    text = SENTENCES[3]
    with TTSClient(torch_server.grpc_url) as client:
        ours = client.synthesize(text, **EXACT).samples
    theirs = grpc_client.synthesize(text, **EXACT).samples
    assert ours.shape == theirs.shape and 0 < np.max(np.abs(ours - theirs)) < 1e-3


def test_batched_equals_alone_and_equals_onnxruntime(torch_server, grpc_client):
    """Within 1e-3 of ONNX Runtime's audio for every sentence, batched and alone: as
    intelligible as it, whose WER tests/integration/test_intelligibility.py measures (a Whisper
    pass over this profile's audio too heard the same words, and took 32 s of the suite)."""
    texts = [SENTENCES[i % 8] for i in range(16)]
    address = f"localhost:{torch_server.grpc_port}"
    before = model_statistics(address, ["acoustic"], torch_server.admin_headers)["acoustic"]
    with TTSClient(torch_server.grpc_url, concurrency=16) as client:
        batched = client.synthesize_many(texts, **EXACT)  # all 16 in flight at once
        alone = {t: client.synthesize(t, **EXACT) for t in set(texts)}
    after = model_statistics(address, ["acoustic"], torch_server.admin_headers)["acoustic"]
    delta = after - before
    assert delta.inferences == 16 + len(alone) and delta.executions < delta.inferences
    onnxruntime = {t: grpc_client.synthesize(t, **EXACT) for t in alone}  # the default server
    for text, audio in zip(texts, batched):
        assert audio.samples.shape == alone[text].samples.shape, text
        assert np.max(np.abs(audio.samples - alone[text].samples)) < 1e-3, text
        assert audio.samples.shape == onnxruntime[text].samples.shape, text
        assert np.max(np.abs(audio.samples - onnxruntime[text].samples)) < 1e-3, text


def test_latents_handed_over_by_dlpack_sound_the_same(exported_repository, torch_server, tmp_path):
    # Profile torch-cpu-dlpack: acoustic returns its latent as a DLPack tensor and the vocoder
    # (FORCE_CPU_ONLY_INPUT_TENSORS: no) takes it as one, in the ensemble and in a stream's BLS
    # calls; on a GPU the same path (gpu-dlpack) keeps the latents in device memory.
    texts = list(SENTENCES[:3])
    paragraph = " ".join(SENTENCES[3:7])
    heard = {}
    with ServerProcess(
        exported_repository,
        tmp_path / "server.log",
        cache_dir=ROOT / ".cache" / "triton",
        extra_args=["--model-config-name=torch-cpu-dlpack"],
        supervisor_options={"canary_interval": 0},
    ) as dlpack_server:
        assert "device_tensors=True" in dlpack_server.log_path.read_text()
        for name, server in (("dlpack", dlpack_server), ("host", torch_server)):
            with TTSClient(server.grpc_url) as client:
                alone = [client.synthesize(t, **EXACT).samples for t in texts]
                stream = [c.samples for c in client.stream(paragraph, **EXACT)]
            heard[name] = alone, np.concatenate(stream)
    for dlpack, host in zip(heard["dlpack"][0], heard["host"][0]):
        assert dlpack.shape == host.shape and np.max(np.abs(dlpack - host)) < 1e-5
    dlpack, host = heard["dlpack"][1], heard["host"][1]
    assert dlpack.shape == host.shape and np.max(np.abs(dlpack - host)) < 1e-5
