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


def ranked(*arrays: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The sorted distinct values of all `arrays` together, and each element's index among them.

    One stable argsort: timsort merges the sorted runs that trace columns are made of (starts in
    order, ends nearly so) in close to linear time, where a sort plus a binary search per element
    (searchsorted) pays for cache misses on millions of elements.
    """
    values = np.concatenate([np.asarray(a, np.int64) for a in arrays])
    order = np.argsort(values, kind="stable")
    in_order = values[order]
    new = np.empty(values.size, bool)
    new[:1] = True
    np.not_equal(in_order[1:], in_order[:-1], out=new[1:])
    index = np.empty(values.size, np.int64)
    index[order] = np.cumsum(new) - 1
    return in_order[new], np.split(index, np.cumsum([np.size(a) for a in arrays])[:-1])


def first_cover(starts: np.ndarray, ends: np.ndarray, precedence: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boundaries `b` and, per elementary segment [b[k], b[k+1]), the winning covering interval.

    `precedence` lists interval indices best first; the winner of a segment is the covering
    interval that comes first in it, or -1 where no interval covers the segment. Empty intervals
    cover nothing. Each interval's segment range is written into O(log n) tree nodes (a range
    update); then each level of the tree passes its minimum down to the next, so every leaf
    (segment) ends with the minimum over its ancestors.
    """
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    precedence = np.asarray(precedence, np.int64)
    rank = np.empty(starts.size, np.int64)
    rank[precedence] = np.arange(starts.size)
    keep = np.flatnonzero(ends > starts)
    bounds, (lo, hi) = ranked(starts[keep], ends[keep])
    n = bounds.size - 1
    if n <= 0:
        return bounds, np.full(max(n, 0), -1, np.int64)

    lo += n
    hi += n
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

    level = 2  # nodes [level, 2 * level) are one tree level; node j's parent is j >> 1
    while level < 2 * n:
        below = tree[level:min(2 * level, 2 * n)]
        np.minimum(below, np.repeat(tree[level >> 1:level], 2)[:below.size], out=below)
        level <<= 1
    best = tree[n:]
    return bounds, np.where(best == _NONE, -1, precedence[np.minimum(best, starts.size - 1)])


def segment_of(bounds: np.ndarray, winners: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The winner (from `first_cover`) at each instant in `t`; -1 outside every interval."""
    return winner_of(np.searchsorted(bounds, np.asarray(t, np.int64), side="right") - 1, winners)


def winner_of(segment: np.ndarray, winners: np.ndarray) -> np.ndarray:
    """The winner of each elementary segment index (from `first_cover`); -1 outside them all.

    Indices run from -1 (before the first boundary) to len(winners) (after the last): one -1
    appended to `winners` answers both, so each lookup is a single gather.
    """
    return np.append(np.asarray(winners, np.int64), -1)[segment]


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
