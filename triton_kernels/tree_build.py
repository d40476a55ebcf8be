"""GPU DDTree builder: the CPU heapq best-first search, replayed by one warp per request.

Reference: `engine.tree.build_tree_cpu`. This kernel returns the same `TreeBatch`, bit for bit, for
every request, ties included, because it performs the very same search rather than an equivalent
one: the same float64 arithmetic in the same order (a sibling's score is the popped score minus its
log-prob plus the sibling's; a child's is the popped score plus the first log-prob one depth down),
and the same heap order (score descending, then the path of top-k ranks ascending).

Why a replay is fast: the heap never holds more than `budget` entries, so one warp keeps one entry
per lane and a pop is a single warp reduction (shuffles only) over (score, rank path) carrying the
entry's payload. `budget` pops give the tree; no host synchronisation, one launch for the batch
(one program = one request). A depth-by-depth expand-and-select would visit the same prefixes, but
only while float64 rounding never reorders a chain of sibling scores; the replay needs no such proof.

Keys: a rank path (r_1..r_d) is ordered like the tuple `(r_1, .., r_L padded with 0, d)`, packed
most significant first into two int64 words (`NB` bits per digit, the depth in the low bits of the
second word), so a sibling adds one unit at digit d and a child adds one to the depth field.
Ancestors travel as an int64 bit set (bit j = node j), which gives the visibility mask for free.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.tree import TreeBatch, max_tree_size

MAX_BUDGET = 64  # ancestor sets are one int64 bit set per node


@triton.jit
def _first(s1, a1, b1, s2, a2, b2):
    """Heap order: does entry 1 pop before entry 2? Higher score, then smaller rank path."""
    return (s1 > s2) | ((s1 == s2) & ((a1 < a2) | ((a1 == a2) & (b1 < b2))))


@triton.jit
def _better(s1, a1, b1, m1, an1, s2, a2, b2, m2, an2):
    """The entry that pops first, with its payload (a reduction combiner)."""
    first = _first(s1, a1, b1, s2, a2, b2)
    return (tl.where(first, s1, s2), tl.where(first, a1, a2), tl.where(first, b1, b2),
            tl.where(first, m1, m2), tl.where(first, an1, an2))


@triton.jit
def _tree_build_kernel(lq_ptr, ids_ptr, tok_out, depth_out, parent_out, vis_out,
                       L: tl.constexpr, K: tl.constexpr, BUDGET: tl.constexpr, LANES: tl.constexpr,
                       L_PAD: tl.constexpr, K_PAD: tl.constexpr,
                       NB: tl.constexpr, M0: tl.constexpr, DB: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lq = lq_ptr + b * (L * K)
    ids = ids_ptr + b * (L * K)
    lane = tl.arange(0, LANES)
    neg_inf = float("-inf")
    empty_key = 0x7FFFFFFFFFFFFFFF
    one = tl.full([], 1, tl.int64)

    # Read the [L, K] log-probs once with wide loads: the pops below then re-read single values
    # from L1 instead of waiting on L2 in every step. The root's log-prob comes out of the tile.
    row = tl.arange(0, L_PAD)[:, None]
    col = tl.arange(0, K_PAD)[None, :]
    in_table = (row < L) & (col < K)
    lq_tile = tl.load(lq + row * K + col, mask=in_table, other=neg_inf).to(tl.float32)
    root_self = tl.max(tl.max(tl.where((row == 0) & (col == 0), lq_tile, neg_inf), 1), 0)

    # Heap entry per lane: score (float64), rank-path key (two words), meta packing
    # slot | rank << 8 | depth << 16 | (parent + 1) << 24, and the ancestor set of its parent.
    is_root = lane == 0
    score = tl.where(is_root, root_self.to(tl.float64), neg_inf)
    key0 = tl.where(is_root, 0, empty_key).to(tl.int64)
    key1 = tl.where(is_root, 1, empty_key).to(tl.int64)
    meta = tl.where(is_root, 1 << 16, 0).to(tl.int32)
    anc = tl.zeros([LANES], tl.int64)

    out_rank = tl.zeros([LANES], tl.int32)
    out_depth = tl.zeros([LANES], tl.int32)
    out_parent = tl.zeros([LANES], tl.int32)
    out_anc = tl.zeros([LANES], tl.int64)
    free_slot = 1
    # w: the entry to pop now; r: the best of all other entries (the runner-up). Most pops take
    # the popped node's sibling or child; those beat the runner-up with two scalar comparisons,
    # and only when the runner-up wins does the warp reduce over the lanes again.
    w_score, w_key0, w_key1, w_meta, w_anc = root_self.to(tl.float64), tl.zeros([], tl.int64), \
        tl.full([], 1, tl.int64), tl.full([], 1 << 16, tl.int32), tl.zeros([], tl.int64)
    r_score, r_key0, r_key1, r_meta, r_anc = tl.full([], neg_inf, tl.float64), tl.full([], empty_key, tl.int64), \
        tl.full([], empty_key, tl.int64), tl.zeros([], tl.int32), tl.zeros([], tl.int64)
    for n in range(BUDGET):
        slot = w_meta & 255
        rank = (w_meta >> 8) & 255
        depth = (w_meta >> 16) & 255
        node_anc = w_anc | (one << n)
        here = lane == n
        out_rank = tl.where(here, rank, out_rank)
        out_depth = tl.where(here, depth, out_depth)
        out_parent = tl.where(here, (w_meta >> 24) - 1, out_parent)
        out_anc = tl.where(here, node_anc, out_anc)

        more = n < BUDGET - 1  # the last pop pushes nothing that could still be popped
        has_sib = more & (rank + 1 < K)
        has_child = more & (depth < L)
        at = lq + (depth - 1) * K + rank
        l_self = tl.load(at).to(tl.float32).to(tl.float64)
        l_sib = tl.load(at + 1, mask=has_sib, other=0.0).to(tl.float32).to(tl.float64)
        l_child = tl.load(lq + depth * K, mask=has_child, other=0.0).to(tl.float32).to(tl.float64)
        # Next sibling (depth, rank + 1): same parent, same ancestors; one unit more at digit `depth`.
        s_score = tl.where(has_sib, (w_score - l_self) + l_sib, neg_inf)
        digit = depth - 1
        in_key0 = digit < M0
        shift0 = tl.maximum((M0 - 1 - digit) * NB, 0).to(tl.int64)
        shift1 = tl.maximum((L - 1 - digit) * NB + DB, 0).to(tl.int64)
        s_key0 = tl.where(has_sib, w_key0 + tl.where(in_key0, one << shift0, 0), empty_key)
        s_key1 = tl.where(has_sib, w_key1 + tl.where(in_key0, 0, one << shift1), empty_key)
        s_meta = w_meta + (1 << 8)
        # First child (depth + 1, rank 0): parent is node n, which joins the ancestor set.
        c_score = tl.where(has_child, w_score + l_child, neg_inf)
        c_key0 = tl.where(has_child, w_key0, empty_key)
        c_key1 = tl.where(has_child, w_key1 + 1, empty_key)
        c_meta = ((n + 1) << 24) | ((depth + 1) << 16) | free_slot

        at_sib = lane == slot
        at_child = (lane == free_slot) & has_child
        score = tl.where(at_child, c_score, tl.where(at_sib, s_score, score))
        key0 = tl.where(at_child, c_key0, tl.where(at_sib, s_key0, key0))
        key1 = tl.where(at_child, c_key1, tl.where(at_sib, s_key1, key1))
        meta = tl.where(at_child, c_meta, tl.where(at_sib, s_meta, meta))
        anc = tl.where(at_child, node_anc, anc)
        free_slot += has_child.to(tl.int32)

        # n: the better of the two new entries, o: the other one.
        sib_first = _first(s_score, s_key0, s_key1, c_score, c_key0, c_key1)
        n_score, n_key0, n_key1, n_meta, n_anc = _better(s_score, s_key0, s_key1, s_meta, w_anc,
                                                         c_score, c_key0, c_key1, c_meta, node_anc)
        o_score = tl.where(sib_first, c_score, s_score)
        o_key0 = tl.where(sib_first, c_key0, s_key0)
        o_key1 = tl.where(sib_first, c_key1, s_key1)
        o_meta = tl.where(sib_first, c_meta, s_meta)
        o_anc = tl.where(sib_first, node_anc, w_anc)
        if _first(n_score, n_key0, n_key1, r_score, r_key0, r_key1):
            w_score, w_key0, w_key1, w_meta, w_anc = n_score, n_key0, n_key1, n_meta, n_anc
            r_score, r_key0, r_key1, r_meta, r_anc = _better(o_score, o_key0, o_key1, o_meta, o_anc,
                                                             r_score, r_key0, r_key1, r_meta, r_anc)
        else:
            w_score, w_key0, w_key1, w_meta, w_anc = r_score, r_key0, r_key1, r_meta, r_anc
            others = lane != (r_meta & 255)
            r_score, r_key0, r_key1, r_meta, r_anc = tl.reduce(
                (tl.where(others, score, neg_inf), tl.where(others, key0, empty_key),
                 tl.where(others, key1, empty_key), meta, anc), 0, _better)

    valid = lane < BUDGET
    tokens = tl.load(ids + (out_depth - 1) * K + out_rank, mask=valid, other=0)
    out = b * BUDGET + lane
    tl.store(tok_out + out, tokens.to(tl.int64), mask=valid)
    tl.store(depth_out + out, out_depth.to(tl.int64), mask=valid)
    tl.store(parent_out + out, out_parent.to(tl.int64), mask=valid)
    vis_col = tl.arange(0, LANES)
    vis = ((out_anc[:, None] >> vis_col[None, :]) & 1) != 0
    vis_offs = b * (BUDGET * BUDGET) + lane[:, None] * BUDGET + vis_col[None, :]
    tl.store(vis_out + vis_offs, vis, mask=valid[:, None] & (vis_col[None, :] < BUDGET))


def _key_layout(depth_limit: int, k: int, budget: int) -> tuple[int, int, int]:
    """Bits per rank digit, digits in the first key word, bits for the depth field."""
    max_rank = min(k, budget) - 1  # a rank-r entry needs its r elder siblings popped first
    digit_bits = max(1, max_rank.bit_length())
    depth_bits = depth_limit.bit_length()
    first_word = 63 // digit_bits
    if max(0, depth_limit - first_word) * digit_bits + depth_bits > 63:
        raise ValueError(f"tree_build: rank paths of L={depth_limit}, K={k}, budget={budget} "
                         "do not fit the kernel's two 63-bit key words")
    return digit_bits, first_word, depth_bits


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
    if budget > MAX_BUDGET or depth_limit > 255 or k > 255:
        raise ValueError(f"tree_build: the GPU builder supports budget <= {MAX_BUDGET} and L, K <= 255 "
                         f"(got budget {budget}, L={depth_limit}, K={k})")
    digit_bits, first_word, depth_bits = _key_layout(depth_limit, k, budget)
    device = top_log_probs.device
    tokens = torch.empty(bs, budget, dtype=torch.int64, device=device)
    depths = torch.empty_like(tokens)
    parents = torch.empty_like(tokens)
    visibility = torch.empty(bs, budget, budget, dtype=torch.bool, device=device)
    if bs:
        _tree_build_kernel[(bs,)](
            top_log_probs.contiguous(), top_token_ids.contiguous(), tokens, depths, parents, visibility,
            L=depth_limit, K=k, BUDGET=budget, LANES=max(2, triton.next_power_of_2(budget)),
            L_PAD=triton.next_power_of_2(depth_limit), K_PAD=triton.next_power_of_2(k), NB=digit_bits, M0=first_word, DB=depth_bits, num_warps=1)
    return TreeBatch(tokens, depths, parents, visibility)
