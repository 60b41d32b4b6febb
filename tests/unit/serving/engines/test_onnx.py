"""The ONNX Runtime engine's session choice: a spinning twin only while a lone request has
the cores to itself."""

from __future__ import annotations

from dataclasses import replace

from tts_serving.engines.models import _spins_when_alone
from tts_serving.engines.onnx import SpinWhenAlone
from tts_serving.settings import AcousticSettings


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
