"""The batched halves with a multi-speaker network: each item keeps its own speaker through
length sorting, buckets and the split back; a one-speaker network refuses any other."""

from __future__ import annotations

import numpy as np
import pytest

from tts_serving.engines.models import AcousticModel, Vocoder, check_speakers, speaker_ids
from tts_serving.errors import ModelConfigError
from tts_serving.settings import EngineSettings

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
    audio = Vocoder(vocoder_net, 1, OPTIONS)(latents, speakers)
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
