"""GPU DDTree builder: the CPU heapq best-first search, replayed on a sorted frontier held by one warp.

Reference: `engine.tree.build_tree_cpu`. This kernel returns the same `TreeBatch`, bit for bit, for
every request, ties included, because it performs the very same search rather than an equivalent
one: the same float64 arithmetic in the same order (a sibling's score is the popped score minus its
log-prob plus the sibling's; a child's is the popped score plus the first log-prob one depth down),
and the same pop order (score descending, then the path of top-k ranks ascending).

Why it is fast: the frontier is kept *sorted* across the lanes of one warp (lane 0 = next to pop),
so a pop needs no reduction over the heap. Each pop broadcasts lane 0, computes its next sibling
and first child, and merges them into the sorted lanes: every lane compares its entry with the two
newcomers, reads its neighbours' verdicts, and takes its new entry from lane i-1, i or i+1 or from a
newcomer (a few warp shuffles, the same work at every pop, so no request of a batch waits on a slow
path). Entries beyond the pops still to come can never pop, so `budget` lanes always suffice. One
program = one request, one launch for the batch, no host synchronisation. Ancestor sets (the
visibility mask) follow at the end by pointer jumping over the parents. A depth-by-depth
expand-and-select would visit the same prefixes, but only while float64 rounding never reorders a
chain of sibling scores; the replay needs no such proof.

Keys: heapq orders equal scores by the rank path (r_1..r_d) as a tuple (a prefix first). The
kernel writes a path as a bit string, rank r as r + 1 ones and a zero (so (1, 2) is 110 1110),
most significant bit first in one int64: plain integer order is then tuple order, a sibling sets
one more bit (at the path's length - 1) and a child two (10 at its length). A path that can still
pop has sum(r_i + 1) <= budget, so keys need budget + min(L, budget) <= 63 bits. An entry also
carries its own log-prob and the two it will need when popped (next sibling's, first child's).

Tried on the H200 and slower: one warp reduction over an unsorted heap per pop (the first
version: the batch waits for its slowest request), the entry to pop kept outside the lanes (a
shorter dependency chain but more instructions), float64 log-probs in the entries. A pop's cost
is its instruction count and latency chain, not memory: keep both short.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.tree import TreeBatch, max_tree_size

KEY_BITS = 63  # a rank-path key is one non-negative int64 (so budget < 64: ancestor sets fit one too)


@triton.jit
def _first(s1, k1, s2, k2):
    """Heap order: does entry 1 pop before entry 2? Higher score, then smaller rank path."""
    return (s1 > s2) | ((s1 == s2) & (k1 < k2))


@triton.jit
def _merge(moved, src, new_sib, lanes, sib, child):
    """One field of the sorted lanes after a pop: a neighbour's entry, or a newcomer's."""
    return tl.where(moved, lanes.gather(src, 0), tl.where(new_sib, sib, child))


@triton.jit
def _tree_build_kernel(lq_ptr, ids_ptr, tok_out, depth_out, parent_out, vis_out,
                       L: tl.constexpr, K: tl.constexpr, BUDGET: tl.constexpr, LANES: tl.constexpr,
                       JUMPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lq = lq_ptr + b * (L * K)
    ids = ids_ptr + b * (L * K)
    lane = tl.arange(0, LANES)
    neg_inf = float("-inf")
    one = tl.full([], 1, tl.int64)
    zero_lanes = tl.zeros([LANES], tl.int32)
    empty_key = 0x7FFFFFFFFFFFFFFF  # an empty slot's key: it sorts after every real entry

    root_self = tl.load(lq).to(tl.float32)

    # The frontier, sorted across the lanes (lane 0 pops next). An entry: score (float64), key,
    # meta packing rank | depth << 8 | (parent + 1) << 16 | key length << 24, and three float32
    # log-probs (its own, its next sibling's, its first child's). First: depth 1, rank 0 (key 10).
    is_root = lane == 0
    score = tl.where(is_root, root_self.to(tl.float64), neg_inf)
    key = tl.where(is_root, one << 62, empty_key).to(tl.int64)
    meta = tl.where(is_root, (2 << 24) | (1 << 8), 0).to(tl.int32)
    own = tl.where(is_root, root_self, 0.0)
    nxt = tl.load(lq + 1 + zero_lanes, mask=is_root & (K > 1), other=0.0).to(tl.float32)
    kid = tl.load(lq + K + zero_lanes, mask=is_root & (L > 1), other=0.0).to(tl.float32)

    out_rank = tl.zeros([LANES], tl.int32)
    out_depth = tl.zeros([LANES], tl.int32)
    out_parent = tl.zeros([LANES], tl.int32)
    up = tl.minimum(lane + 1, LANES - 1)
    down = tl.maximum(lane - 1, 0)
    for n in range(BUDGET):
        # Pop lane 0 (every lane gets a copy): node n.
        w_score, w_key = score.gather(zero_lanes, 0), key.gather(zero_lanes, 0)
        w_meta, w_own, w_nxt, w_kid = meta.gather(zero_lanes, 0), own.gather(zero_lanes, 0), \
            nxt.gather(zero_lanes, 0), kid.gather(zero_lanes, 0)
        rank = w_meta & 255
        depth = (w_meta >> 8) & 255
        here = lane == n
        out_rank = tl.where(here, rank, out_rank)
        out_depth = tl.where(here, depth, out_depth)
        out_parent = tl.where(here, ((w_meta >> 16) & 255) - 1, out_parent)
        length = (w_meta >> 24).to(tl.int64)
        at_depth = lq + (depth - 1) * K  # w's row of log-probs; its first child's is the next one

        more = n < BUDGET - 1  # the last pop pushes nothing that could still be popped
        # Next sibling (depth, rank + 1): same parent; its last rank's code gets one more 1.
        has_sib = more & (rank + 1 < K)
        s_score = tl.where(has_sib, (w_score - w_own.to(tl.float64)) + w_nxt.to(tl.float64), neg_inf)
        s_key = tl.where(has_sib, w_key + (one << (63 - length)), empty_key)
        s_meta = w_meta + ((1 << 24) | 1)
        s_nxt = tl.load(at_depth + rank + 2, mask=has_sib & (rank + 2 < K), other=0.0).to(tl.float32)
        # First child (depth + 1, rank 0): its parent is node n; the path's code gets 10 appended.
        has_child = more & (depth < L)
        c_score = tl.where(has_child, w_score + w_kid.to(tl.float64), neg_inf)
        c_key = tl.where(has_child, w_key + (one << (62 - length)), empty_key)
        c_meta = (((w_meta >> 24) + 2) << 24) | ((n + 1) << 16) | ((depth + 1) << 8)
        c_nxt = tl.load(at_depth + K + 1, mask=has_child & (K > 1), other=0.0).to(tl.float32)
        c_kid = tl.load(at_depth + 2 * K, mask=has_child & (depth + 1 < L), other=0.0).to(tl.float32)

        # Lane j >= 1 moves to j - 1 + (newcomers that pop before it): lane i reads who lands on
        # it, else takes a newcomer: the first of the two unless its old entry sorts after both.
        sib_first = _first(s_score, s_key, c_score, c_key)
        ahead = _first(s_score, s_key, score, key).to(tl.int32) + _first(c_score, c_key, score, key).to(tl.int32)
        from_up = (lane + 1 < LANES) & (ahead.gather(up, 0) == 0)
        from_here = (lane >= 1) & (ahead == 1)
        from_down = (lane >= 2) & (ahead.gather(down, 0) == 2)
        moved = from_up | from_here | from_down
        src = tl.where(from_up, up, tl.where(from_here, lane, down))
        new_sib = ((lane == 0) | (ahead == 0)) == sib_first
        score = _merge(moved, src, new_sib, score, s_score, c_score)
        key = _merge(moved, src, new_sib, key, s_key, c_key)
        meta = _merge(moved, src, new_sib, meta, s_meta, c_meta)
        own = _merge(moved, src, new_sib, own, w_nxt, w_kid)
        nxt = _merge(moved, src, new_sib, nxt, s_nxt, c_nxt)
        kid = _merge(moved, src, new_sib, kid, w_kid, c_kid)

    valid = lane < BUDGET
    # Ancestor sets by pointer jumping: after j rounds each node holds its ancestors within 2**j.
    anc = tl.where(valid, one << lane.to(tl.int64), 0)
    jump = out_parent
    for _ in range(JUMPS):
        has = jump >= 0
        at = tl.where(has, jump, 0)
        anc = anc | tl.where(has, anc.gather(at, 0), 0)
        jump = tl.where(has, jump.gather(at, 0), -1)

    tokens = tl.load(ids + (out_depth - 1) * K + out_rank, mask=valid, other=0)
    out = b * BUDGET + lane
    tl.store(tok_out + out, tokens.to(tl.int64), mask=valid)
    tl.store(depth_out + out, out_depth.to(tl.int64), mask=valid)
    tl.store(parent_out + out, out_parent.to(tl.int64), mask=valid)
    vis_col = tl.arange(0, LANES)
    vis = ((anc[:, None] >> vis_col[None, :].to(tl.int64)) & 1) != 0
    vis_offs = b * (BUDGET * BUDGET) + lane[:, None] * BUDGET + vis_col[None, :]
    tl.store(vis_out + vis_offs, vis, mask=valid[:, None] & (vis_col[None, :] < BUDGET))


def build_tree_gpu(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int) -> TreeBatch:
    """Same contract as `build_tree_cpu`, on the inputs' device; one launch, no host sync."""
    if top_log_probs.dim() == 2:
        top_log_probs, top_token_ids = top_log_probs[None], top_token_ids[None]
    bs, depth_limit, k = top_log_probs.shape
    if top_token_ids.shape != top_log_probs.shape:
        raise ValueError(f"tree_build: top_token_ids {tuple(top_token_ids.shape)} must match "
                         f"top_log_probs {tuple(top_log_probs.shape)}")
    if budget < 1 or budget > max_tree_size(depth_limit, k):
        raise ValueError(f"budget {budget} must be in 1..{max_tree_size(depth_limit, k)} "
                         f"for L={depth_limit}, K={k}")
    if budget + min(depth_limit, budget) > KEY_BITS or depth_limit > 255 or k > 255:
        raise ValueError(f"tree_build: the GPU builder needs budget + min(L, budget) <= {KEY_BITS} (its "
                         f"rank-path keys) and L, K <= 255 (got budget {budget}, L={depth_limit}, K={k})")
    device = top_log_probs.device
    tokens = torch.empty(bs, budget, dtype=torch.int64, device=device)
    depths = torch.empty_like(tokens)
    parents = torch.empty_like(tokens)
    visibility = torch.empty(bs, budget, budget, dtype=torch.bool, device=device)
    if bs:
        _tree_build_kernel[(bs,)](
            top_log_probs.contiguous(), top_token_ids.contiguous(), tokens, depths, parents, visibility,
            L=depth_limit, K=k, BUDGET=budget, LANES=max(2, triton.next_power_of_2(budget)),
            JUMPS=(min(depth_limit, budget) - 1).bit_length(), num_warps=1)
    return TreeBatch(tokens, depths, parents, visibility)
