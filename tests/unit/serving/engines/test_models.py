"""The batched halves with a multi-speaker network: each item keeps its own speaker through
length sorting, buckets and the split back; a one-speaker network refuses any other."""

from __future__ import annotations

import numpy as np
import pytest

from tts_serving.engines.models import (
    AcousticModel,
    SideBySide,
    VocoderModel,
    check_speakers,
    speaker_ids,
)
from tts_serving.errors import ModelConfigError
from tts_serving.settings import AcousticSettings, EngineSettings

# Small buckets: the items are sorted by length and split over several calls.
OPTIONS = EngineSettings(max_padded_length=24)


class SpeakerNets:
    """Fake halves that write each item's speaker into its output, as a real one's embedding
    would colour it; ``calls`` records the speakers of each engine call."""

    takes_speakers = True

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        return False


class AcousticNet(SpeakerNets):
    def __call__(self, ids, lengths, scales, speakers):
        self.calls.append(speakers.tolist())
        durations = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        latent = np.broadcast_to(
            speakers[:, None, None].astype(np.float32), (len(ids), 192, ids.shape[1])
        ).copy()
        return latent, lengths, durations


class VocoderNet(SpeakerNets):
    def __call__(self, latent, speakers):
        self.calls.append(speakers.tolist())
        return latent[:, 0, :] * 10 + speakers[:, None]


def test_each_item_keeps_its_speaker_through_sorting_and_buckets():
    lengths = [3, 9, 5, 12, 2, 7]
    speakers = [2, 0, 1, 1, 2, 0]
    net = AcousticNet()
    acoustic = AcousticModel(net, OPTIONS)
    latents = acoustic([np.zeros(n, np.int64) for n in lengths], np.ones((6, 4)), speakers)
    assert len(net.calls) > 1  # several buckets
    for latent, n, s in zip(latents, lengths, speakers):
        assert latent.shape == (192, n) and np.all(latent == s)
    vocoder_net = VocoderNet()
    audio = VocoderModel(vocoder_net, 1, OPTIONS)(latents, speakers)
    for samples, s in zip(audio, speakers):
        assert np.all(samples == s * 11)
    # No speakers given: each item the first.
    assert all(np.all(lat == 0) for lat in acoustic([np.zeros(4, np.int64)] * 2, np.ones((2, 4))))


def test_a_one_speaker_network_refuses_another_speaker():
    assert speaker_ids(False, None, 2) == [0, 0] and speaker_ids(False, [0, 0], 2) == [0, 0]
    with pytest.raises(ValueError, match="one speaker"):
        speaker_ids(False, [0, 1], 2)
    with pytest.raises(ValueError, match="3 speakers for 2 items"):
        speaker_ids(True, [0, 1, 2], 2)


@pytest.mark.parametrize("engine,dtype", [("torch", "float32"), ("onnxruntime", "int8")])
def test_multi_speaker_voices_run_on_onnxruntime_float32_only(engine, dtype):
    check_speakers("joe", 1, EngineSettings(engine=engine, dtype=dtype))  # one speaker: fine
    check_speakers("trio", 3, EngineSettings())
    with pytest.raises(ModelConfigError, match="voice 'trio' has 3 speakers: multi-speaker"):
        check_speakers("trio", 3, EngineSettings(engine=engine, dtype=dtype))


def test_several_items_run_one_each_side_by_side_and_a_lone_item_on_the_main_net():
    """On the CPU each of several items goes alone to a free single-thread net, in parallel
    (no padding: each call holds one item); a lone item takes the multi-thread net."""
    import threading

    lengths = [3, 9, 5, 12, 2, 7]
    speakers = [2, 0, 1, 1, 2, 0]
    main, items = AcousticNet(), [AcousticNet(), AcousticNet()]
    both_busy = threading.Barrier(2, timeout=10)

    class Waiting(AcousticNet):
        def __init__(self, into: AcousticNet) -> None:
            self.into = into
            self.calls = into.calls

        def __call__(self, ids, lengths, scales, speakers):
            if not self.calls:  # each net's first call waits for the other's: side by side
                both_busy.wait()
            return self.into(ids, lengths, scales, speakers)

    acoustic = AcousticModel(main, OPTIONS, SideBySide([Waiting(n) for n in items]))
    latents = acoustic([np.zeros(n, np.int64) for n in lengths], np.ones((6, 4)), speakers)
    for latent, n, s in zip(latents, lengths, speakers):
        assert latent.shape == (192, n) and np.all(latent == s)
    assert main.calls == []
    calls = items[0].calls + items[1].calls
    assert sorted(map(len, calls)) == [1] * 6 and items[0].calls and items[1].calls
    (alone,) = acoustic([np.zeros(4, np.int64)], np.ones((1, 4)), [1])
    assert main.calls == [[1]] and alone.shape == (192, 4)


def test_an_items_error_is_raised_once_every_net_has_stopped():
    from concurrent.futures import ThreadPoolExecutor

    from tts_serving.engines.batching import run_side_by_side

    done: list[int] = []

    def run(items):
        if items[0] == 5:
            raise ValueError("item 5")
        done.append(items[0])
        return [items[0] * 10]

    with ThreadPoolExecutor(2) as pool:
        assert run_side_by_side([1, 2, 3], [1, 2, 3], [run, run], pool) == [10, 20, 30]
        with pytest.raises(ValueError, match="item 5"):
            run_side_by_side([5, 1, 2, 3], [9, 1, 2, 3], [run, run], pool)
    assert sorted(done) == [1, 1, 2, 2, 3, 3]  # the other items still ran


class ConvVocoderNet:
    """A fake vocoder that reaches ``reach`` frames each side (a convolution over frames of
    the latent's channel sum, zero-padded, ``hop`` samples a frame); ``calls``: the frames of
    each call."""

    takes_speakers = False

    def __init__(self, reach: int, hop: int, barrier=None) -> None:
        self.kernel = np.arange(1, 2 * reach + 2, dtype=np.float32)
        self.hop, self.barrier = hop, barrier
        self.calls: list[int] = []

    def __call__(self, latent):
        if self.barrier is not None and not self.calls:  # both nets busy at once
            self.barrier.wait()
        self.calls.append(latent.shape[-1])
        frames = [np.convolve(x, self.kernel, mode="same") for x in latent.sum(axis=1)]
        return np.repeat(np.stack(frames), self.hop, axis=-1)

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        return False


def test_the_vocoder_measures_its_reach_and_runs_a_lone_item_on_every_lane():
    import threading

    from tts_serving.engines.models import CONTEXT_MARGIN

    main = ConvVocoderNet(7, 4)
    lanes = [ConvVocoderNet(7, 4), ConvVocoderNet(7, 4)]
    vocoder = VocoderModel(main, 4, OPTIONS, SideBySide(lanes))  # measures the reach on a lane
    assert vocoder.context == 7 + CONTEXT_MARGIN
    both_busy = threading.Barrier(2, timeout=10)
    for lane in lanes:
        lane.calls, lane.barrier = [], both_busy
    latent = np.random.default_rng(2).standard_normal((192, 300)).astype(np.float32)
    (audio,) = vocoder([latent])
    assert main.calls == [] and lanes[0].calls and lanes[1].calls  # no 2-thread call
    (whole,) = VocoderModel(main, 4, OPTIONS)([latent])
    assert audio.shape == whole.shape == (1200,)
    np.testing.assert_allclose(audio, whole, rtol=1e-5, atol=1e-4)
    # A short lone item stays whole, on the multi-thread net; split_items false: always.
    vocoder([latent[:, :20]])
    VocoderModel(main, 4, OPTIONS, SideBySide(lanes), split_items=False)([latent])
    assert main.calls == [300, 20, 300]


def test_a_vocoder_reaching_past_the_window_runs_items_whole():
    from tts_serving.engines.models import MAX_REACH

    nets = [ConvVocoderNet(MAX_REACH + 10, 4) for _ in range(3)]
    assert VocoderModel(nets[0], 4, OPTIONS, SideBySide(nets[1:])).context is None


class Share:
    """A CpuShare stand-in: ``busy`` says whether other processes take the CPU."""

    def __init__(self, busy: bool) -> None:
        self.busy = busy

    def others_busy(self) -> bool:
        return self.busy


def test_similar_items_share_a_padded_call_on_the_lanes_each_keeping_its_own_result():
    """The acoustic half's calls cost about ``shared_call_ids`` ids whatever their size, so
    sixteen short items of similar length run as four padded calls, two a lane; every item
    comes back cut to its own length with its own speaker."""
    lengths = [9, 7, 8, 6] * 4
    speakers = [k % 3 for k in range(16)]
    lanes = [AcousticNet(), AcousticNet()]
    acoustic = AcousticModel(AcousticNet(), AcousticSettings(), SideBySide(lanes))
    latents = acoustic([np.zeros(n, np.int64) for n in lengths], np.ones((16, 4)), speakers)
    for latent, n, s in zip(latents, lengths, speakers):
        assert latent.shape == (192, n) and np.all(latent == s)
    calls = lanes[0].calls + lanes[1].calls
    assert sorted(map(len, calls)) == [4, 4, 4, 4]
    alone = AcousticModel(AcousticNet(), AcousticSettings(shared_call_ids=0), SideBySide(lanes))
    alone([np.zeros(n, np.int64) for n in lengths], np.ones((16, 4)), speakers)
    assert len(lanes[0].calls + lanes[1].calls) == 4 + 16


def test_a_batch_runs_on_the_more_lanes_only_while_others_keep_the_cpu_busy():
    import threading

    main = ConvVocoderNet(7, 4)
    lanes = [ConvVocoderNet(7, 4), ConvVocoderNet(7, 4)]
    more = [ConvVocoderNet(7, 4), ConvVocoderNet(7, 4)]
    share = Share(False)
    vocoder = VocoderModel(main, 4, OPTIONS, SideBySide(lanes, more, share))
    latent = np.random.default_rng(3).standard_normal((192, 400)).astype(np.float32)
    (whole,) = VocoderModel(main, 4, OPTIONS)([latent])
    for lane in lanes + more:
        lane.calls = []
    (quiet,) = vocoder([latent])
    assert sum(len(n.calls) for n in lanes) == 2 and not more[0].calls and not more[1].calls
    share.busy = True
    all_busy = threading.Barrier(4, timeout=10)  # four stretches, side by side
    for lane in lanes + more:
        lane.calls, lane.barrier = [], all_busy
    (busy,) = vocoder([latent])
    assert [len(n.calls) for n in lanes + more] == [1, 1, 1, 1]
    np.testing.assert_allclose(quiet, whole, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(busy, whole, rtol=1e-5, atol=1e-4)

    # The acoustic half, as served: the more lanes are the same sessions called again.
    class Meeting(AcousticNet):
        """Each call waits at ``barrier`` (when set) for the others: side by side."""

        barrier: threading.Barrier | None = None

        def __call__(self, ids, lengths, scales, speakers):
            if self.barrier is not None:
                self.barrier.wait()
            return super().__call__(ids, lengths, scales, speakers)

    nets = [Meeting(), Meeting()]
    acoustic = AcousticModel(AcousticNet(), OPTIONS, SideBySide(nets, nets, share))
    ids = [np.zeros(n, np.int64) for n in (9, 8, 7, 6)]
    share.busy = False
    acoustic(ids, np.ones((4, 4)), [0, 1, 2, 3])
    assert sum(len(n.calls) for n in nets) == 4
    share.busy = True
    Meeting.barrier = threading.Barrier(4, timeout=10)  # four calls at once, or it breaks
    latents = acoustic(ids, np.ones((4, 4)), [0, 1, 2, 3])
    assert [lat.shape[-1] for lat in latents] == [9, 8, 7, 6]


def test_a_half_logs_each_turn_with_its_lane_count():
    from tts_serving.engines.cpu_share import CpuShare

    now, machine = [0.0], [0.0]
    share = CpuShare(
        root=1, clock=lambda: now[0], sample=lambda: (machine[0], 0.0), background=False
    )
    lines: list[str] = []
    nets = [ConvVocoderNet(7, 4), ConvVocoderNet(7, 4)]
    side_by_side = SideBySide(nets, nets * 3, share, lines.append)
    machine[0], now[0] = 1.2, 1.0
    assert len(side_by_side.lanes()) == 8
    machine[0], now[0] = 1.2, 2.0
    assert len(side_by_side.lanes()) == 2
    assert lines == [
        "other processes took 1.2 cores: a batch runs on 8 lanes",
        "other processes took 0.0 cores: a batch runs on 2 lanes",
    ]
