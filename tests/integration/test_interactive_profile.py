"""Profile ``cpu-interactive`` end to end: tritonserver with ``--model-config-name=
cpu-interactive`` runs the voice's stages one item per batch, with the audio the default's."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.metrics import settled
from tests.support.processes import profile_server
from tts_client import TTSClient
from tts_front.sample_texts import SENTENCES
from tts_launcher.served import front_slots
from tts_triton.statistics import model_statistics

EXACT = {"noise_scale": 0.0, "noise_w": 0.0}


@pytest.fixture(scope="module")
def interactive(exported_repository, tmp_path_factory):
    logs = tmp_path_factory.mktemp("triton-interactive")
    with profile_server(exported_repository, logs, "cpu-interactive") as srv:
        yield srv


def test_eight_at_once_run_one_item_per_batch_and_sound_as_the_default(interactive, grpc_client):
    texts = SENTENCES[:8]
    stages = ["acoustic", "vocoder"]
    address = f"localhost:{interactive.grpc_port}"
    before = model_statistics(address, stages, interactive.admin_headers)
    with TTSClient(interactive.grpc_url, concurrency=8) as client:
        ours = client.synthesize_many(texts, **EXACT)
    after = settled(
        lambda: model_statistics(address, stages, interactive.admin_headers),
        lambda now: all((now[s] - before[s]).inferences >= len(texts) for s in stages),
    )
    for stage in stages:
        delta = after[stage] - before[stage]
        assert delta.inferences == 8 and delta.batch_sizes == {1: 8}, (stage, delta)
    for text, audio in zip(texts, ours):
        default = grpc_client.synthesize(text, **EXACT).samples
        assert audio.samples.shape == default.shape
        assert np.max(np.abs(audio.samples - default)) < 1e-3, text
    assert front_slots("cpu-interactive") == 2  # the front door passes on two at a time
