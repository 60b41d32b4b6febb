"""bench.cpu_time: the padding it reports is the served bucketing's, (its run on the real voice:
tests/adapter/test_cpu_time_bench.py)."""

from __future__ import annotations

import numpy as np

from bench.cpu_time import Padding, Recording, RecordingAcousticNet, bucket_padding


def test_padding_is_counted_over_the_buckets_the_server_forms():
    # One bucket (waste allowed): 3 items padded to 10 -> 30 computed, 10 + 8 + 2 real.
    assert bucket_padding([2, 10, 8], max_waste=1.0, max_padded=0).share() == 1 - 20 / 30
    # 0.5 waste splits the 2 off: 10 + 8 padded to 10, 2 alone -> 22 computed, 20 real.
    assert bucket_padding([2, 10, 8], max_waste=0.5, max_padded=0).share() == 1 - 20 / 22
    assert Padding().share() == 0.0


def test_the_recording_net_passes_through_and_counts_ids_and_frames():
    recording = Recording()

    def net(padded, lengths, scales):
        return np.zeros((2, 192, 7)), [7, 3], np.ones(padded.shape)

    wrapped = RecordingAcousticNet(net, recording)
    latent, frames, _ = wrapped(np.zeros((2, 5)), np.array([5, 1]), None)
    assert latent.shape == (2, 192, 7) and frames == [7, 3]
    assert (recording.ids.computed, recording.ids.real) == (10, 6)
    assert (recording.acoustic_frames.computed, recording.acoustic_frames.real) == (14, 10)
