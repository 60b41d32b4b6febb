"""The acoustic half's ONNX Runtime sessions skip the memory-reuse plan on the CPU: on its
graph the plan took most of each session's creation, seconds of every start
(docs/history (notebook), "Startup"). The vocoder's keep it; the latents are the same either way."""

from __future__ import annotations

import numpy as np
import pytest

from tts_serving.engines.models import load_acoustic, load_vocoder
from tts_serving.engines.onnx import OrtAcousticNet, create_session
from tts_serving.settings import AcousticSettings, VocoderSettings

# Two threads: a main session and one single-thread session per thread, as served on 2 cores.
THREADS = {"intra_op_threads": 2, "items_side_by_side": True}


def reuse_plans(model) -> list[bool]:
    nets = [model.net, *model.side_by_side.nets]
    return [net.session.get_session_options().enable_mem_reuse for net in nets]


def test_only_the_acoustic_sessions_skip_the_reuse_plan(exported_repository):
    acoustic = load_acoustic(
        exported_repository / "acoustic/1/model.onnx", AcousticSettings(**THREADS)
    )
    vocoder = load_vocoder(
        exported_repository / "vocoder/1/model.onnx", 256, VocoderSettings(**THREADS)
    )
    assert reuse_plans(acoustic) == [False, False, False]
    assert reuse_plans(vocoder) == [True, True, True]


@pytest.mark.slow  # a session with the plan takes seconds to create
def test_the_acoustic_speaks_the_same_without_the_plan(exported_repository):
    path = exported_repository / "acoustic/1/model.onnx"
    options = AcousticSettings(intra_op_threads=1)
    rng = np.random.default_rng(7)
    lengths = np.array([37, 90, 12], np.int64)
    ids = rng.integers(1, 100, (3, 90)).astype(np.int64)
    ids[np.arange(90)[None, :] >= lengths[:, None]] = 0  # padded, as batches are
    scales = np.tile(np.array([0.0, 1.0, 0.0, 1.0], np.float32), (3, 1))  # no noise drawn
    without, planned = (
        OrtAcousticNet(create_session(path, options, plan))(ids, lengths, scales)
        for plan in (False, True)
    )
    for a, b in zip(without, planned):
        np.testing.assert_array_equal(a, b)
