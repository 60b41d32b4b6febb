"""The CPU scaling rule: at 2 cores it is the served default; beyond, it
splits the instances by the stages' work and keeps two threads per core."""

from __future__ import annotations

import itertools

import pytest

from tests.support.paths import ROOT
from tts_serving.model_config import pbtxt_parameters, read_model_config
from tts_tools.cpu_scaling import MEASURED, cpu_layout, predicted_rate


def served(model: str) -> tuple[int, int | None]:
    """The instances and intra-op threads the served config.pbtxt gives ``model`` (read with
    Triton's schema, as Triton reads it)."""
    path = ROOT / "model_repository" / model / "config.pbtxt"
    (group,) = read_model_config(path).instance_group
    threads = pbtxt_parameters(path).get("intra_op_threads")
    return group.count, int(threads) if threads else None


def test_two_cores_is_the_served_default():
    layout = cpu_layout(2)
    for model in ("acoustic", "vocoder"):
        assert served(model) == (layout[model].instances, layout[model].threads), model
    assert served("phonemizer")[0] == layout["phonemizer"].instances


@pytest.mark.parametrize("cores", [1, 2, 4, 8, 16, 32, 64])
def test_the_rule_uses_every_core_twice_and_favours_the_vocoder(cores):
    layout = cpu_layout(cores)
    ort = [layout["acoustic"], layout["vocoder"]]
    assert sum(s.instances * s.threads for s in ort) == 2 * max(2, cores)
    assert layout["vocoder"].instances >= layout["acoustic"].instances >= 1
    assert layout["phonemizer"].instances == -(-cores // 8)


def test_predictions_start_from_the_measured_points_and_grow_less_than_linearly():
    assert predicted_rate(2) == MEASURED[2]
    rates = [predicted_rate(c) for c in (2, 4, 8, 16, 32)]
    assert all(b > a for a, b in itertools.pairwise(rates))
    assert predicted_rate(32) < 16 * MEASURED[2]
    with pytest.raises(ValueError):
        cpu_layout(0)
