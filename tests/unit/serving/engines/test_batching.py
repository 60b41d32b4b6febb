from itertools import pairwise

import numpy as np
import pytest

from tts_serving.engines.batching import (
    FrameSpan,
    join_spans,
    lane_makespan,
    length_buckets,
    pad_stack,
    run_in_buckets,
    run_side_by_side,
    shared_calls,
    sort_by_length,
    split_by_lengths,
    split_for_lanes,
)


def test_sort_by_length_longest_first_and_stable():
    assert sort_by_length([3, 5, 1, 5]) == [1, 3, 0, 2]
    assert sort_by_length([3, 5, 1], descending=False) == [2, 0, 1]


def test_pad_stack_1d_pads_with_zeros_and_reports_lengths():
    batch, lengths = pad_stack([np.array([1, 2, 3], np.int64), np.array([4], np.int64)])
    assert batch.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert lengths.tolist() == [3, 1]
    assert batch.dtype == np.int64


def test_pad_stack_along_last_axis_of_2d_items():
    a = np.ones((2, 3), np.float32)
    b = np.full((2, 1), 7, np.float32)
    batch, lengths = pad_stack([a, b], axis=-1)
    assert batch.shape == (2, 2, 3)
    assert batch[1, :, 0].tolist() == [7, 7]
    assert batch[1, :, 1:].sum() == 0
    assert lengths.tolist() == [3, 1]


def test_pad_stack_rejects_mismatched_other_dims_and_empty():
    with pytest.raises(ValueError, match="must match"):
        pad_stack([np.ones((2, 3)), np.ones((3, 3))], axis=-1)
    with pytest.raises(ValueError, match="at least one"):
        pad_stack([])


def test_split_by_lengths_inverts_pad_stack():
    rng = np.random.default_rng(0)
    items = [rng.normal(size=(4, n)).astype(np.float32) for n in (5, 1, 9, 3)]
    batch, lengths = pad_stack(items, axis=-1)
    for got, want in zip(split_by_lengths(batch, lengths, axis=-1), items):
        np.testing.assert_array_equal(got, want)
        assert got.flags["C_CONTIGUOUS"]


def test_split_by_lengths_checks_counts_and_bounds():
    batch = np.zeros((2, 4))
    with pytest.raises(ValueError, match="2 lengths for a batch of 2|lengths for a batch"):
        split_by_lengths(batch, [1])
    with pytest.raises(ValueError, match="outside"):
        split_by_lengths(batch, [1, 5])


def test_length_buckets_split_when_padding_waste_is_large():
    assert length_buckets([100, 90, 40, 35, 10], max_waste=0.5) == [
        slice(0, 2),
        slice(2, 4),
        slice(4, 5),
    ]
    assert length_buckets([100, 1], max_waste=1.0) == [slice(0, 2)]


def test_length_buckets_keep_padded_size_within_budget():
    # 3 x 100 = 300 fits a budget of 300; a fourth item would make 400.
    assert length_buckets([100, 100, 90, 80, 50, 10], max_padded=300) == [
        slice(0, 3),
        slice(3, 6),
    ]
    # An item longer than the budget still gets a bucket of its own.
    assert length_buckets([500, 20], max_padded=300) == [slice(0, 1), slice(1, 2)]
    assert length_buckets([5] * 4, max_padded=0) == [slice(0, 4)]


def test_run_in_buckets_returns_results_in_input_order():
    items = [np.arange(n) for n in (2, 7, 4)]
    calls = []

    def run(batch):
        calls.append([len(x) for x in batch])
        return [int(x.sum()) for x in batch]

    out = run_in_buckets(items, [len(x) for x in items], run)
    assert out == [1, 21, 6]
    assert calls == [[7, 4, 2]]  # one padded call, longest first


def test_run_in_buckets_with_a_budget_still_returns_input_order():
    items = [np.arange(n) for n in (3, 9, 4, 8)]
    calls = []

    def run(batch):
        calls.append([len(x) for x in batch])
        return [len(x) for x in batch]

    assert run_in_buckets(items, [len(x) for x in items], run, max_padded=18) == [3, 9, 4, 8]
    assert calls == [[9, 8], [4, 3]]


def test_run_in_buckets_rejects_wrong_result_count():
    with pytest.raises(RuntimeError, match="returned 0 results"):
        run_in_buckets([np.arange(2)], [2], lambda batch: [])


def test_run_grouped_runs_each_key_once_and_keeps_input_order():
    from tts_serving.engines.batching import run_grouped

    calls = []

    def run(key, indices):
        calls.append((key, indices))
        return [f"{key}{i}" for i in indices]

    assert run_grouped(["a", "b", "a", "c", "b"], run) == ["a0", "b1", "a2", "c3", "b4"]
    assert calls == [("a", [0, 2]), ("b", [1, 4]), ("c", [3])]
    assert run_grouped([], run) == []


def test_run_grouped_refuses_a_group_that_loses_items():
    import pytest

    from tts_serving.engines.batching import run_grouped

    with pytest.raises(ValueError, match="1 results for 2 items"):
        run_grouped(["a", "a"], lambda key, indices: [0])


def test_halve_on_error_splits_until_it_fits_and_keeps_order():
    from tts_serving.engines.batching import halve_on_error

    seen = []

    def run(items):
        seen.append(len(items))
        if len(items) > 3:
            raise MemoryError("too big")
        return [x * 10 for x in items]

    retry = lambda e: isinstance(e, MemoryError)  # noqa: E731
    assert halve_on_error(run, list(range(7)), retry) == [x * 10 for x in range(7)]
    assert seen == [7, 3, 4, 2, 2]
    with pytest.raises(MemoryError):  # one item that still fails raises
        halve_on_error(lambda items: (_ for _ in ()).throw(MemoryError()), [1], retry)
    with pytest.raises(ValueError):  # other errors are not retried
        halve_on_error(lambda items: (_ for _ in ()).throw(ValueError()), [1, 2], retry)


def _spans_by_item(spans: list[FrameSpan]) -> dict[int, list[FrameSpan]]:
    by_item: dict[int, list[FrameSpan]] = {}
    for span in spans:
        by_item.setdefault(span.item, []).append(span)
    return by_item


@pytest.mark.parametrize(
    "lengths,lanes",
    [([250], 2), ([300, 100], 2), ([100] * 16, 2), ([40, 3000, 40], 4), ([7], 2), ([90, 91], 3)],
)
def test_split_for_lanes_keeps_every_frame_once_with_context_inside_the_item(lengths, lanes):
    context, min_span = 12, 36
    spans = split_for_lanes(lengths, lanes, context, min_span)
    by_item = _spans_by_item(spans)
    assert sorted(by_item) == list(range(len(lengths)))
    for item, n in enumerate(lengths):
        kept = by_item[item]
        assert kept[0].start == 0 and kept[-1].end == n
        assert all(a.end == b.start for a, b in pairwise(kept))
        for span in kept:
            assert span.end - span.start >= min(min_span, n)
            assert span.lo == max(0, span.start - context) and span.hi == min(n, span.end + context)
    assert len(spans) - len(lengths) <= lanes - 1  # at most one cut per lane boundary


def test_split_for_lanes_gives_every_lane_the_same_work():
    # A lone item: one half each (plus context); items of 300 and 100 frames: 200 each.
    assert [(s.start, s.end) for s in split_for_lanes([250], 2, 12, 36)] == [(0, 125), (125, 250)]
    spans = split_for_lanes([300, 100], 2, 12, 36)
    assert [(s.item, s.start, s.end) for s in spans] == [(0, 0, 200), (0, 200, 300), (1, 0, 100)]
    # Whole items already even: no cut. A cut within min_span of an end moves to it.
    assert len(split_for_lanes([100] * 16, 2, 12, 36)) == 16
    assert len(split_for_lanes([210, 10], 2, 12, 36)) == 3  # the cut at 110 stays
    assert len(split_for_lanes([120, 100], 2, 12, 36)) == 2  # the cut at 110 is 10 from the end
    # Whole items that load the lanes as evenly as cut stretches would (200 + 50 and 150 +
    # 100; 260 + 40 against 150 + 150 is past one context): no cut, no context work.
    assert [(s.start, s.end) for s in split_for_lanes([200, 150, 100, 50], 2, 15, 45)] == [
        (0, 200), (0, 150), (0, 100), (0, 50)
    ]  # fmt: skip
    assert len(split_for_lanes([260, 40], 2, 15, 45)) == 3


def _convolve(latent: np.ndarray, reach: int, scale: int) -> np.ndarray:
    """A convolutional "network" that reaches ``reach`` frames each side, ``scale`` samples a
    frame, zero-padded at the ends as a real one is."""
    kernel = np.arange(1, 2 * reach + 2, dtype=np.float64)
    frames = np.convolve(latent, kernel, mode="same")
    return np.repeat(frames, scale)


def test_spans_computed_with_the_reach_as_context_join_into_the_whole_items_output():
    rng = np.random.default_rng(1)
    lengths, reach, scale = [300, 100, 57], 5, 4
    items = [rng.standard_normal(n) for n in lengths]
    whole = [_convolve(x, reach, scale) for x in items]
    for context, equal in ((reach, True), (reach - 2, False)):
        spans = split_for_lanes(lengths, 3, context, 3 * context)
        assert len(spans) > len(lengths)
        outputs = [_convolve(items[s.item][s.lo : s.hi], reach, scale) for s in spans]
        joined = join_spans(spans, outputs, len(items), scale)
        assert [len(j) for j in joined] == [n * scale for n in lengths]
        assert all(np.allclose(j, w) for j, w in zip(joined, whole)) is equal


def test_shared_calls_put_similar_short_items_in_one_call_each_lane_busy():
    # Sixteen first pieces of Wyoming's texts (phoneme ids): four calls of four, two a lane.
    firsts = [33, 31, 55, 41, 53, 43, 49, 37, 29, 37, 37, 31, 55, 53, 41, 49]
    groups = shared_calls(firsts, 2, 16)
    assert sorted(i for g in groups for i in g) == list(range(16))
    assert len(groups) == 4 and all(len(g) == 4 for g in groups)
    for g in groups:  # neighbours by length, longest first in each call
        assert [firsts[i] for i in g] == sorted((firsts[i] for i in g), reverse=True)
        assert firsts[g[0]] - firsts[g[-1]] <= 16


def test_shared_calls_leave_items_alone_where_sharing_costs_more():
    assert shared_calls([145, 60, 20], 2, 16) == [[0], [1], [2]]  # padding past the call cost
    assert shared_calls([40, 38], 2, 16) == [[0], [1]]  # one a lane is quicker
    assert shared_calls([40, 38, 36], 2, 16) == [[0, 1], [2]]
    assert shared_calls([40, 38, 36], 2, 0) == [[0], [1], [2]]  # 0: every item alone
    assert shared_calls([5] * 9, 1, 16) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]  # at most 4


@pytest.mark.parametrize("seed", range(20))
def test_shared_calls_never_load_a_lane_more_than_items_alone(seed):
    rng = np.random.default_rng(seed)
    lengths = [int(n) for n in rng.integers(5, 160, rng.integers(1, 17))]
    lanes, cost = int(rng.integers(1, 5)), 16
    groups = shared_calls(lengths, lanes, cost)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    alone = lane_makespan([cost + n for n in lengths], lanes)
    shared = lane_makespan([cost + len(g) * max(lengths[i] for i in g) for g in groups], lanes)
    assert shared <= alone


def test_run_side_by_side_runs_each_group_as_one_call_in_input_order():
    from concurrent.futures import ThreadPoolExecutor

    calls: list[list[int]] = []

    def run(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    with ThreadPoolExecutor(2) as pool:
        out = run_side_by_side([1, 2, 3, 4], [1, 2, 3, 4], [run, run], pool, [[3, 2], [1], [0]])
    assert out == [10, 20, 30, 40]
    assert sorted(calls) == [[1], [2], [4, 3]]
