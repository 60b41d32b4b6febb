"""Plain helpers for batching ragged items: sort by length, pad into one array, cut back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor, wait
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

import numpy as np

R = TypeVar("R")


def sort_by_length(lengths: Sequence[int], descending: bool = True) -> list[int]:
    """Indices that order items by length (longest first by default), stable for ties.

    Sorting before padding keeps similar lengths together, so buckets waste less padding.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=descending)
    return order


def is_numpy(x) -> bool:
    """numpy (or a list); anything else here is a torch tensor (the DLPack path, on its
    device), which the helpers below handle without importing torch themselves."""
    return isinstance(x, np.ndarray | list | tuple)


def pad_stack(
    items: Sequence[np.ndarray], axis: int = -1, pad_value: float | int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Stack arrays that differ only along ``axis`` into one zero-padded batch.

    Returns the batch (new leading batch dimension) and each item's length along ``axis``.
    Torch tensors are stacked into a torch tensor on their own device.
    """
    if not items:
        raise ValueError("pad_stack needs at least one item")
    first = np.asarray(items[0]) if is_numpy(items[0]) else items[0]
    ndim = first.ndim
    ax = axis % ndim
    lengths = np.array([np.shape(it)[ax] for it in items], dtype=np.int64)  # torch's too
    for it in items:
        shape = tuple(np.shape(it))
        if len(shape) != ndim or any(
            s != f for k, (s, f) in enumerate(zip(shape, first.shape)) if k != ax
        ):
            raise ValueError(
                f"pad_stack items must match outside axis {axis}: {first.shape} vs {shape}"
            )
    out_shape = (len(items),) + tuple(
        int(lengths.max()) if k == ax else s for k, s in enumerate(first.shape)
    )
    if is_numpy(first):
        out = np.full(out_shape, pad_value, dtype=first.dtype)
    else:
        out = first.new_full(out_shape, pad_value)
    for i, it in enumerate(items):
        index = [i] + [slice(None)] * ndim
        index[1 + ax] = slice(0, int(lengths[i]))
        out[tuple(index)] = it
    return out, lengths


def split_by_lengths(batch: np.ndarray, lengths: Sequence[int], axis: int = -1) -> list[np.ndarray]:
    """Cut each item of a padded batch back to its own length along ``axis`` (batch axis 0).

    ``axis`` counts in the item's own dimensions, as in :func:`pad_stack`.
    """
    if len(lengths) != batch.shape[0]:
        raise ValueError(f"{len(lengths)} lengths for a batch of {batch.shape[0]}")
    item_ndim = batch.ndim - 1
    ax = axis % item_ndim
    out = []
    for i, n in enumerate(lengths):
        if n < 0 or n > batch.shape[1 + ax]:
            raise ValueError(f"length {n} outside 0..{batch.shape[1 + ax]}")
        index: list[slice | int] = [i] + [slice(None)] * item_ndim
        index[1 + ax] = slice(0, int(n))
        item = batch[tuple(index)]
        out.append(np.ascontiguousarray(item) if is_numpy(item) else item.contiguous())
    return out


def length_buckets(
    sorted_lengths: Sequence[int], max_waste: float = 1.0, max_padded: int = 0
) -> list[slice]:
    """Split a length-sorted (descending) list into contiguous runs, one padded call each.

    A new bucket starts when padding the next item up to its bucket's longest item would waste
    more than ``max_waste`` of that longest length (``>= 1`` never splits for waste), or when
    the bucket's padded size (items x longest) would pass ``max_padded`` (0 = no budget). On a
    CPU large padded calls cost more per item than small ones (memory-bound activations), so
    the budget keeps each call in the cheap range; on a GPU leave it 0.
    """
    buckets: list[slice] = []
    start = 0
    for i in range(1, len(sorted_lengths) + 1):
        if i == len(sorted_lengths):
            buckets.append(slice(start, i))
            break
        longest = sorted_lengths[start]
        wasteful = longest - sorted_lengths[i] > max_waste * longest
        over_budget = max_padded > 0 and (i - start + 1) * longest > max_padded
        if wasteful or over_budget:
            buckets.append(slice(start, i))
            start = i
    return buckets


def run_in_buckets(
    items: Sequence[np.ndarray],
    lengths: Sequence[int],
    run_batch,
    max_waste: float = 1.0,
    max_padded: int = 0,
) -> list:
    """Run ``run_batch`` over length-sorted buckets of ``items``; results in the input order.

    ``run_batch(list_of_items) -> list_of_results`` sees items sorted longest first, so one
    padded call per bucket wastes little work on padding.
    """
    order = sort_by_length(lengths)
    results: list = [None] * len(items)
    for bucket in length_buckets([lengths[i] for i in order], max_waste, max_padded):
        idx = order[bucket]
        outputs = run_batch([items[i] for i in idx])
        if len(outputs) != len(idx):
            raise RuntimeError(f"batch function returned {len(outputs)} results for {len(idx)}")
        for i, out in zip(idx, outputs):
            results[i] = out
    return results


def run_grouped(
    keys: Sequence[Hashable], run_group: Callable[[Hashable, list[int]], list[R]]
) -> list[R]:
    """Results in input order from one ``run_group(key, indices)`` call per distinct key.

    Items of one voice (one network) run as one batch; different networks cannot share one.
    """
    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    results: list = [None] * len(keys)
    for key, indices in groups.items():
        outputs = run_group(key, indices)
        if len(outputs) != len(indices):
            raise ValueError(f"group {key!r}: {len(outputs)} results for {len(indices)} items")
        for index, output in zip(indices, outputs):
            results[index] = output
    return results


def halve_on_error(
    run_batch: Callable[[list], list], items: list, retry: Callable[[BaseException], bool]
) -> list:
    """``run_batch(items)``, split in halves and retried while it fails with a ``retry`` error.

    A batch that runs out of accelerator memory is thus served in smaller batches instead of
    failing every request in it; a single item that still fails raises.
    """
    try:
        return run_batch(items)
    except Exception as error:
        if len(items) < 2 or not retry(error):
            raise
    mid = len(items) // 2
    return halve_on_error(run_batch, items[:mid], retry) + halve_on_error(
        run_batch, items[mid:], retry
    )


def lane_makespan(costs: Sequence[float], lanes: int) -> float:
    """The busiest lane's work when ``costs`` run largest first, each on the least loaded of
    ``lanes`` (as :func:`run_side_by_side` hands them out)."""
    loads = [0.0] * max(1, lanes)
    for cost in sorted(costs, reverse=True):
        loads[loads.index(min(loads))] += cost
    return max(loads)


def shared_calls(
    lengths: Sequence[int], lanes: int, call_cost: int, max_items: int = 4
) -> list[list[int]]:
    """Items (indices, longest first) grouped into padded calls for ``lanes`` side by side.

    A call costs ``call_cost`` (in lengths' units) whatever its size, and a padded call of
    ``n`` items as much as ``n`` of its longest. Neighbours by length share a call where that
    saves work (the call cost is more than the padding) and the busiest lane gets no more
    work than before, at most ``max_items`` to a call (bigger padded calls cost more per item
    on a CPU). Short items of similar length, a batch of first pieces, share the most.
    ``call_cost`` 0: every item alone."""
    groups = [[i] for i in sort_by_length(lengths)]
    if call_cost <= 0:
        return groups

    def cost(group: list[int]) -> int:
        return call_cost + len(group) * lengths[group[0]]

    busiest = lane_makespan([cost(g) for g in groups], lanes)
    merged = True
    while merged:
        merged = False
        for k in range(len(groups) - 1):
            pair = groups[k] + groups[k + 1]
            if len(pair) > max_items or cost(pair) >= cost(groups[k]) + cost(groups[k + 1]):
                continue
            trial = [*groups[:k], pair, *groups[k + 2 :]]
            makespan = lane_makespan([cost(g) for g in trial], lanes)
            if makespan <= busiest:
                groups, busiest, merged = trial, makespan, True
                break
    return sorted(groups, key=cost, reverse=True)


def run_side_by_side(
    items: Sequence,
    lengths: Sequence[int],
    runners: Sequence[Callable[[list], list]],
    pool: Executor,
    groups: Sequence[Sequence[int]] | None = None,
) -> list:
    """Each item alone (``runner([item])``, no padding), longest first, on whichever of
    ``runners`` is free, side by side on ``pool``'s threads; results in the input order.
    ``groups``: indices of items that share one call each, in the order to run them
    (:func:`shared_calls`); default: every item alone.

    On a CPU one single-thread session per core, each on its own item, does more per second
    than one multi-thread session on a padded batch: its threads wait on each other at every
    operator and padding is work too (docs/performance.md).
    """
    units = iter(groups if groups is not None else [[i] for i in sort_by_length(lengths)])
    lock = threading.Lock()
    results: list = [None] * len(items)

    def work(run: Callable[[list], list]) -> None:
        while True:
            with lock:
                unit = next(units, None)
            if unit is None:
                return
            outputs = run([items[i] for i in unit])
            if len(outputs) != len(unit):
                raise RuntimeError(f"{len(outputs)} results for a call of {len(unit)} items")
            for i, out in zip(unit, outputs):
                results[i] = out

    count = len(groups) if groups is not None else len(items)
    futures = [pool.submit(work, run) for run in runners[:count]]
    wait(futures)  # every runner has stopped before an error is raised
    for future in futures:
        future.result()
    return results


@dataclass(frozen=True)
class FrameSpan:
    """A stretch of one item's frames computed alone: it keeps ``start:end`` and is computed
    from ``lo:hi`` (``context`` frames more on each side where the item has them)."""

    item: int
    start: int
    end: int
    lo: int
    hi: int


def split_for_lanes(
    lengths: Sequence[int], lanes: int, context: int, min_span: int
) -> list[FrameSpan]:
    """The items, laid end to end, cut into ``lanes`` stretches of about equal length; an item
    a cut falls in is computed as two spans, each with ``context`` frames of the other side
    (a convolutional network's receptive field: the kept frames then equal the whole item's).
    So every lane gets the same work, whatever the items' lengths (a lone item runs on all of
    them), for at most ``lanes - 1`` cuts of ``2 * context`` frames' extra work. No span keeps
    fewer than ``min_span`` frames: a cut nearer an item's end moves to it. Where whole items,
    longest first on the least loaded lane (as ``run_side_by_side`` runs them), load no lane
    more than a cut stretch would (``context`` more than an equal share), they stay whole: the
    same time, without the cuts' work."""
    total = sum(lengths)
    stretch = -(-total // max(1, lanes))  # ceil
    if lane_makespan(lengths, lanes) <= stretch + context:
        return [FrameSpan(item, 0, n, 0, n) for item, n in enumerate(lengths)]
    cuts = {k * stretch for k in range(1, lanes)}
    spans: list[FrameSpan] = []
    offset = 0
    for item, n in enumerate(lengths):
        inside = sorted(c - offset for c in cuts if offset < c < offset + n)
        bounds = [0]
        for cut in inside:
            if cut - bounds[-1] >= min_span and n - cut >= min_span:
                bounds.append(cut)
        bounds.append(n)
        for start, end in pairwise(bounds):
            lo = max(0, start - context) if start else 0
            hi = min(n, end + context) if end < n else n
            spans.append(FrameSpan(item, start, end, lo, hi))
        offset += n
    return spans


def join_spans(
    spans: Sequence[FrameSpan], outputs: Sequence[np.ndarray], count: int, scale: int
) -> list[np.ndarray]:
    """Each of ``count`` items' output from its spans' (``outputs[k]`` computed from
    ``spans[k].lo:hi``, ``scale`` output samples per frame): the kept parts, in order."""
    parts: list[list[np.ndarray]] = [[] for _ in range(count)]
    for span, out in sorted(zip(spans, outputs), key=lambda so: (so[0].item, so[0].start)):
        offset = span.start - span.lo
        parts[span.item].append(out[..., offset * scale : (offset + span.end - span.start) * scale])
    return [p[0] if len(p) == 1 else np.concatenate(p, axis=-1) for p in parts]
