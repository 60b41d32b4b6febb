"""The windows a chunk's latent is decoded in: their sizes, context, the samples each keeps,
the rows each carries, and the reach file the export writes."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from tts_serving.stream.windows import kept, read_reach, rows_in, windows, write_reach


@pytest.mark.parametrize("frames", [1, 31, 48, 49, 95, 96, 200, 551, 2000])
def test_windows_cover_the_latent_once_doubling_with_context_inside_it(frames):
    spans = windows(frames, 32, 13)
    assert spans[0].start == 0 and spans[-1].end == frames
    assert all(a.end == b.start for a, b in pairwise(spans))  # no gap, no overlap
    for k, span in enumerate(spans):
        assert span.lo == max(0, span.start - 13) and span.hi == min(frames, span.end + 13)
        if k < len(spans) - 1:  # 32, 64, 128, ...; the last takes a rest of at least half
            assert span.end - span.start == 32 * 2**k
            assert frames - span.end > (32 * 2**k) // 2
    if frames <= 48:
        assert len(spans) == 1


def test_no_first_window_is_the_whole_latent():
    assert [(s.start, s.end, s.lo, s.hi) for s in windows(500, 0, 13)] == [(0, 500, 0, 500)]


def test_a_window_keeps_the_samples_of_its_own_frames():
    hop = 4
    audio = np.arange(100 * hop, dtype=np.float32)  # sample i of the whole latent's audio
    for span in windows(100, 10, 3):
        computed = audio[span.lo * hop : span.hi * hop]  # what the vocoder returns for lo:hi
        np.testing.assert_array_equal(
            kept(computed, span, hop), audio[span.start * hop : span.end * hop]
        )


def test_each_row_goes_with_the_window_it_starts_in_and_none_is_lost():
    seconds = 0.01  # a frame
    spans = windows(200, 32, 13)  # frames 0-32, 32-96, 96-200
    rows = np.array([[0.0, 0.1], [0.31, 0.5], [0.32, 0.6], [0.959, 1.0], [1.5, 2.0], [2.5, 2.6]])
    parts = [rows_in(rows, s, k == len(spans) - 1, seconds) for k, s in enumerate(spans)]
    assert [p[:, 0].tolist() for p in parts] == [[0.0, 0.31], [0.32, 0.959], [1.5, 2.5]]
    assert rows_in(None, spans[0], False, seconds) is None


def test_the_words_of_one_token_go_together_with_its_first():
    seconds = 0.01
    spans = windows(200, 32, 13)
    # (start, end, first char, end char): "W3C" spoken as three words, across frame 32.
    rows = np.array([[0.1, 0.2, 0, 3], [0.25, 0.3, 4, 7], [0.31, 0.33, 4, 7], [0.4, 0.5, 4, 7],
                     [0.5, 0.6, 8, 9]])  # fmt: skip
    parts = [rows_in(rows, s, k == 2, seconds, slice(2, 4)) for k, s in enumerate(spans)]
    assert [p[:, 0].tolist() for p in parts] == [[0.1, 0.25, 0.31, 0.4], [0.5], []]


def test_the_reach_file_round_trips_and_a_missing_one_reads_as_none(tmp_path):
    path = tmp_path / "vocoder_reach.json"
    assert read_reach(path) is None
    write_reach(path, 11)
    assert read_reach(path) == 11
    path.write_text('{"vocoder_reach_frames": -1}')
    with pytest.raises(ValueError, match="whole number"):
        read_reach(path)
