"""The CUDA-graph grid and the GPU device binding, without a GPU (pure selection, a fake)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.support.paths import REPOSITORY as REPO
from tts_serving.engines import torch_engine
from tts_serving.engines.torch_engine import TorchOptions, bind_device, graph_cells, pick_bucket
from tts_serving.model_config import parse_settings, pbtxt_parameters
from tts_serving.settings import SETTINGS

BATCHES, FRAMES = (1, 2, 4, 8, 16, 32, 64), (128, 256, 512, 1024)


def used_cells(cells, budget: int) -> set:
    """Every bucket some call within the budget replays (brute force over all calls)."""
    used = set()
    for batch, frames in itertools.product(range(1, max(BATCHES) + 1), range(1, 1025)):
        if batch * frames <= budget:
            used.add(pick_bucket(cells, batch, frames))
    return used


def test_the_vocoder_profiles_grid_loses_its_six_unreachable_graphs():
    full = graph_cells(BATCHES, FRAMES)
    assert len(full) == 28
    cells = graph_cells(BATCHES, FRAMES, budget=4096)
    assert sorted(set(full) - set(cells)) == [
        (16, 1024), (32, 512), (32, 1024), (64, 256), (64, 512), (64, 1024)
    ]  # fmt: skip
    # Every captured graph is replayed by some call, and every call replays the bucket the
    # whole grid would have given it (nothing it could use was dropped).
    assert used_cells(cells, 4096) == set(cells)
    for batch, frames in [(1, 1), (3, 700), (17, 240), (33, 124), (8, 512), (5, 800)]:
        assert pick_bucket(cells, batch, frames) == pick_bucket(full, batch, frames)
    assert cells[0][0] * cells[0][1] == max(b * t for b, t in cells)  # captured first


def test_calls_outside_every_bucket_run_eagerly():
    cells = graph_cells(BATCHES, FRAMES, budget=4096)
    assert pick_bucket(cells, 65, 10) is None
    assert pick_bucket(cells, 1, 1025) is None


@pytest.mark.parametrize("profile", sorted(REPO.glob("vocoder/configs/*.pbtxt")))
def test_each_vocoder_profile_captures_only_graphs_it_can_replay(profile):
    settings = parse_settings(SETTINGS["vocoder"], pbtxt_parameters(profile), "vocoder")
    if not (settings.graph_batches and settings.graph_frames):
        pytest.skip(f"{profile.name} captures no CUDA graphs")
    cells = graph_cells(settings.graph_batches, settings.graph_frames, settings.max_padded_length)
    assert cells and used_cells(cells, settings.max_padded_length) == set(cells)


def test_an_instance_binds_the_gpu_triton_gave_it(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))

    class Module(torch.nn.Module):
        def to(self, *args, **kwargs):
            calls.append(("to", args[0]))
            return self

    net = torch_engine._TorchNet(Module(), TorchOptions(device="cuda", device_id=1))
    assert net.device == torch.device("cuda", 1)
    # Bound before anything touches the device (streams and graph pools use the current one).
    assert calls[:2] == [("set_device", torch.device("cuda", 1)), ("to", torch.device("cuda", 1))]
    calls.clear()
    bind_device(torch.device("cpu"))
    assert calls == []


class _FakeStream:
    def wait_stream(self, other) -> None:
        pass


class _FakeGraph:
    replays = 0

    def replay(self) -> None:
        _FakeGraph.replays += 1


def test_the_graphs_are_captured_per_bucket_and_replayed_by_a_call_that_fits(monkeypatch):
    """The capture code with CUDA's graph API faked on the CPU (a capture runs the function
    once, a replay counts): each cell of the grid is captured, largest first, and a call is
    answered by its bucket's replay, cut back to its own shape (a name shadowed by a parameter
    broke this once, before any GPU saw it)."""
    import contextlib

    from tts_serving.engines.torch_engine import DurationGraphs, GraphBuckets
    from tts_serving.engines.torch_vits import VitsAcoustic

    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, pool=None: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        durations = DurationGraphs(VitsAcoustic().eval(), (1, 4), (16, 32), cpu)
        assert list(durations.graphs) == [(4, 32), (4, 16), (1, 32), (1, 16)]
        before = _FakeGraph.replays
        ids = torch.randint(1, 50, (3, 20))
        m_p, logs_p, w = durations(ids, torch.tensor([20, 15, 10]), torch.tensor([[0.0, 1, 0]] * 3))
        assert _FakeGraph.replays == before + 1  # bucket (4, 32)
        assert m_p.shape == logs_p.shape == (3, 192, 20) and w.shape == (3, 20)
        assert durations(torch.ones((5, 8), dtype=torch.int64), torch.full((5,), 8),
                         torch.zeros((5, 4))) is None  # fmt: skip
        vocoder = GraphBuckets(lambda x: x * 2, [(192,)], [torch.float32], (1, 2), (8, 16), cpu)
        assert len(vocoder.graphs) == 4
        assert vocoder(torch.ones(1, 192, 5)).shape == (1, 192, 5)
