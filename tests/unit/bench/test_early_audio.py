"""What bench.early_audio computes: the piece the text cut sends first, the repository copy
with the windows off, and PESQ telling the same audio from a changed one."""

from __future__ import annotations

import numpy as np
import pytest

from bench import early_audio
from tts_serving.model_config import pbtxt_parameters


def test_the_sentence_is_twenty_words_and_the_cut_sends_its_first_three():
    assert len(early_audio.SENTENCE.split()) == 20
    assert early_audio.first_piece(early_audio.SENTENCE) == "Turn on the"


def test_the_copy_without_windows_changes_that_parameter_only(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tts_stream").mkdir(parents=True)
    source = early_audio.ROOT / "model_repository/tts_stream/config.pbtxt"
    (repo / "tts_stream/config.pbtxt").write_text(source.read_text())
    (tmp_path / "out").mkdir()
    copy = early_audio.without_windows(repo, tmp_path / "out")
    before = pbtxt_parameters(source)
    after = pbtxt_parameters(copy / "tts_stream/config.pbtxt")
    assert int(before["first_window_frames"]) > 0 and after["first_window_frames"] == "0"
    assert {k: v for k, v in after.items() if k != "first_window_frames"} == {
        k: v for k, v in before.items() if k != "first_window_frames"
    }


def test_pesq_is_highest_for_the_same_audio_and_lower_for_a_changed_one():
    rate = 22050
    t = np.arange(2 * rate) / rate
    speech_like = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(
        np.float32
    )
    resampled = early_audio.resampled(speech_like, rate, 16_000)
    assert len(resampled) == pytest.approx(2 * 16_000, abs=64)
    same = early_audio.pesq_wideband(speech_like, speech_like.copy(), rate)
    noise = np.random.default_rng(0).standard_normal(len(t)).astype(np.float32)
    noisy = speech_like + 0.05 * noise
    assert same > 4.5 and early_audio.pesq_wideband(speech_like, noisy, rate) < same - 1
