"""The ONNX Runtime engine's session choice: a spinning twin only while a lone request has
the cores to itself."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np

from tests.support.memory import rss_mb
from tts_serving.engines.models import _spins_when_alone, sessions
from tts_serving.engines.onnx import OrtVocoderNet, SpinWhenAlone
from tts_serving.settings import AcousticSettings, VocoderSettings


class Session:
    def __init__(self, name: str) -> None:
        self.name, self.calls = name, []

    def run(self, outputs, feeds, run_options=None):
        self.calls.append((outputs, feeds, run_options))
        return self.name


def test_a_call_spins_only_while_alone_in_the_server_and_others_leave_the_cpu_free():
    plain, spinning = Session("plain"), Session("spinning")
    state = {"alone": True, "busy": False}
    session = SpinWhenAlone(plain, spinning, lambda: state["alone"], lambda: state["busy"])
    assert session.run(["latent"], {"x": 1}, "options") == "spinning"
    assert spinning.calls == [(["latent"], {"x": 1}, "options")]
    state["alone"] = False  # another request is in a stage: its cores are not ours to spin on
    assert session.run(["latent"], {}) == "plain"
    state["alone"], state["busy"] = True, True  # other processes take the CPU
    assert session.run(["latent"], {}) == "plain"


def test_a_spinning_twin_is_made_on_the_cpu_for_several_threads_that_do_not_spin():
    options = AcousticSettings(device="cpu")
    assert options.spin_when_alone and options.intra_op_threads == 2
    assert _spins_when_alone(options)
    assert not _spins_when_alone(replace(options, spin_when_alone=False))
    assert not _spins_when_alone(replace(options, intra_op_threads=1))  # no threads to wait on
    assert not _spins_when_alone(replace(options, allow_spinning=True))  # spins anyway


def test_the_twin_shares_the_buffers_the_plain_session_warmed(exported_repository):
    """A twin with an arena of its own grew the stub by its half's peak the first time a lone
    item ran on it (84 MB for these two calls of 200 frames), long after the warm-up: the
    memory test's bound failed in CI on 0.9.9 when its lone items ran on the other session
    than its warm-up's (which one runs is chosen per call)."""
    net, _ = sessions(
        exported_repository / "vocoder" / "1" / "model.onnx",
        VocoderSettings(device="cpu"),
        OrtVocoderNet,
        None,
        alone=lambda: True,
    )
    pair = net.session
    assert isinstance(pair, SpinWhenAlone)
    latent = np.random.default_rng(0).standard_normal((1, 192, 200)).astype(np.float32)
    for _ in range(2):  # the first call sizes the buffers, the second the memory plan
        expected = pair.session.run(["audio"], {"latent": latent})[0]
    before = rss_mb(os.getpid())
    for _ in range(2):
        audio = pair.spinning.run(["audio"], {"latent": latent})[0]
    grown = rss_mb(os.getpid()) - before
    assert np.allclose(audio, expected, atol=1e-5)
    assert grown < 10, f"the spinning twin grew the process by {grown:.1f} MB"
