"""Vectorised interval arithmetic on int64 ns timelines: who covers each instant, and unions.

The critical-path attribution asks, for every instant, "which of these overlapping intervals wins?"
(the earliest-launched GPU op, the innermost stage range). Asking per nanosecond or per range in
Python would take minutes on a million-range trace, so the answer is computed once per
*elementary segment* (the pieces between consecutive interval boundaries, over which the set of
covering intervals cannot change) with a segment tree built and read level by level in numpy.
All intervals are half-open: [start, end).
"""

from __future__ import annotations

import numpy as np

_NONE = np.iinfo(np.int64).max


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """np.unique for int64 boundaries: numpy 2's hash-based unique is ~10x slower than a sort here."""
    values = np.sort(values)
    keep = np.empty(values.size, bool)
    keep[:1] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def first_cover(starts: np.ndarray, ends: np.ndarray, precedence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries `b` and, per elementary segment [b[k], b[k+1]), the winning covering interval.

    `precedence` lists interval indices best first; the winner of a segment is the covering
    interval that comes first in it, or -1 where no interval covers the segment. Empty intervals
    cover nothing. Each interval's segment range is written into O(log n) tree nodes (a range
    update) and each segment reads the minimum over its ancestors (a point query).
    """
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    rank = np.empty(starts.size, np.int64)
    rank[np.asarray(precedence, np.int64)] = np.arange(starts.size)
    keep = np.flatnonzero(ends > starts)
    bounds = sorted_unique(np.concatenate([starts[keep], ends[keep]]))
    n = bounds.size - 1
    if n <= 0:
        return bounds, np.full(max(n, 0), -1, np.int64)

    lo = np.searchsorted(bounds, starts[keep]) + n
    hi = np.searchsorted(bounds, ends[keep]) + n
    value = rank[keep]
    nodes, values = [], []
    while lo.size:
        odd = (lo & 1).astype(bool)
        nodes.append(lo[odd])
        values.append(value[odd])
        lo = lo + odd
        odd = (hi & 1).astype(bool)
        hi = hi - odd
        nodes.append(hi[odd])
        values.append(value[odd])
        lo >>= 1
        hi >>= 1
        live = lo < hi
        lo, hi, value = lo[live], hi[live], value[live]
    tree = np.full(2 * n, _NONE, np.int64)
    np.minimum.at(tree, np.concatenate(nodes), np.concatenate(values))

    best = tree[n:].copy()
    node = np.arange(n, 2 * n) >> 1
    while node[-1] >= 1:  # the last leaf has the deepest ancestor chain
        np.minimum(best, tree[node], out=best)
        node >>= 1
    order = np.argsort(rank)  # rank -> interval index
    return bounds, np.where(best == _NONE, -1, order[np.minimum(best, starts.size - 1)])


def segment_of(bounds: np.ndarray, winners: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The winner (from `first_cover`) at each instant in `t`; -1 outside every interval."""
    t = np.asarray(t, np.int64)
    if winners.size == 0:
        return np.full(t.shape, -1, np.int64)
    k = np.searchsorted(bounds, t, side="right") - 1
    inside = (k >= 0) & (k < winners.size)
    return np.where(inside, winners[np.clip(k, 0, winners.size - 1)], -1)


def union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint [start, end) pieces."""
    keep = ends > starts
    starts, ends = np.asarray(starts, np.int64)[keep], np.asarray(ends, np.int64)[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new_piece = np.concatenate([[True], starts[1:] > reach[:-1]])
    first = np.flatnonzero(new_piece)
    last = np.concatenate([first[1:], [starts.size]]) - 1
    return starts[first], reach[last]


def contains(piece_starts: np.ndarray, piece_ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each instant in `t` lies inside the disjoint sorted pieces."""
    t = np.asarray(t, np.int64)
    if piece_starts.size == 0:
        return np.zeros(t.shape, bool)
    k = np.searchsorted(piece_starts, t, side="right") - 1
    return (k >= 0) & (t < piece_ends[np.clip(k, 0, None)])


def covered_length(piece_starts: np.ndarray, piece_ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a, b) covered by the disjoint sorted pieces, for each query pair."""
    if piece_starts.size == 0:
        return np.zeros(np.shape(a), np.int64)
    before = np.concatenate([[0], np.cumsum(piece_ends - piece_starts)])

    def covered_before(t):
        k = np.searchsorted(piece_starts, t, side="right") - 1
        inside = np.clip(t - piece_starts[np.clip(k, 0, None)], 0, (piece_ends - piece_starts)[np.clip(k, 0, None)])
        return np.where(k >= 0, before[np.clip(k, 0, None)] + inside, 0)

    return covered_before(np.asarray(b, np.int64)) - covered_before(np.asarray(a, np.int64))
