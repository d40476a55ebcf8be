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

Keys: a rank path (r_1..r_d) is ordered like the tuple `(r_1, .., r_L padded with 0, d)`, packed
most significant first into two int64 words (`NB` bits per digit, the depth in the low bits of the
second word), so a sibling adds one unit at digit d and a child adds one to the depth field.
An entry also carries its own log-prob and the two it will need when popped (next sibling's, first
child's), loaded when it is pushed, so no pop waits on memory.
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
def _pick(take_first, x1, y1, z1, w1, u1, v1, t1, x2, y2, z2, w2, u2, v2, t2):
    """One of two entries (score, key0, key1, meta, own, next sibling's and first child's log-probs)."""
    return (tl.where(take_first, x1, x2), tl.where(take_first, y1, y2), tl.where(take_first, z1, z2),
            tl.where(take_first, w1, w2), tl.where(take_first, u1, u2), tl.where(take_first, v1, v2),
            tl.where(take_first, t1, t2))


@triton.jit
def _log_prob(lq, depth, rank, present, L: tl.constexpr, K: tl.constexpr):
    """lq[depth - 1][rank] as float32 where `present` and the cell exists, else 0."""
    ok = present & (depth >= 1) & (depth <= L) & (rank < K)
    return tl.load(lq + (depth - 1) * K + rank, mask=ok, other=0.0).to(tl.float32)


@triton.jit
def _tree_build_kernel(lq_ptr, ids_ptr, tok_out, depth_out, parent_out, vis_out,
                       L: tl.constexpr, K: tl.constexpr, BUDGET: tl.constexpr, LANES: tl.constexpr,
                       L_PAD: tl.constexpr, K_PAD: tl.constexpr, NB: tl.constexpr, M0: tl.constexpr,
                       DB: tl.constexpr, JUMPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    lq = lq_ptr + b * (L * K)
    ids = ids_ptr + b * (L * K)
    lane = tl.arange(0, LANES)
    neg_inf = float("-inf")
    one = tl.full([], 1, tl.int64)
    zero_lanes = tl.zeros([LANES], tl.int32)
    empty_key = 0x7FFFFFFFFFFFFFFF  # an empty slot's key: it sorts after every real entry

    # Read the [L, K] log-probs once with wide loads, so the pops' single-value loads hit L1.
    row = tl.arange(0, L_PAD)[:, None]
    col = tl.arange(0, K_PAD)[None, :]
    lq_tile = tl.load(lq + row * K + col, mask=(row < L) & (col < K), other=neg_inf).to(tl.float32)
    root_self = tl.max(tl.max(tl.where((row == 0) & (col == 0), lq_tile, neg_inf), 1), 0)

    # The sorted frontier, one entry per lane: score (float64), rank-path key (two words), meta
    # packing rank | depth << 8 | (parent + 1) << 16, and three float32 log-probs (own, next
    # sibling's, first child's). It starts with the root's first child: depth 1, rank 0.
    is_root = lane == 0
    score = tl.where(is_root, root_self.to(tl.float64), neg_inf)
    key0 = tl.where(is_root, 0, empty_key).to(tl.int64)
    key1 = tl.where(is_root, 1, empty_key).to(tl.int64)
    meta = tl.where(is_root, 1 << 8, 0).to(tl.int32)
    own = tl.where(is_root, root_self, 0.0)
    nxt = _log_prob(lq, 1 + zero_lanes, 1 + zero_lanes, is_root, L, K)
    kid = _log_prob(lq, 2 + zero_lanes, zero_lanes, is_root, L, K)

    out_rank = tl.zeros([LANES], tl.int32)
    out_depth = tl.zeros([LANES], tl.int32)
    out_parent = tl.zeros([LANES], tl.int32)
    up = tl.minimum(lane + 1, LANES - 1)
    down = tl.maximum(lane - 1, 0)
    for n in range(BUDGET):
        # Pop lane 0 (every lane gets a copy).
        w_score, w_key0, w_key1 = score.gather(zero_lanes, 0), key0.gather(zero_lanes, 0), key1.gather(zero_lanes, 0)
        w_meta, w_own, w_nxt, w_kid = meta.gather(zero_lanes, 0), own.gather(zero_lanes, 0), \
            nxt.gather(zero_lanes, 0), kid.gather(zero_lanes, 0)
        rank = w_meta & 255
        depth = (w_meta >> 8) & 255
        here = lane == n
        out_rank = tl.where(here, rank, out_rank)
        out_depth = tl.where(here, depth, out_depth)
        out_parent = tl.where(here, (w_meta >> 16) - 1, out_parent)

        more = n < BUDGET - 1  # the last pop pushes nothing that could still be popped
        # Next sibling (depth, rank + 1): same parent; one unit more at digit `depth`.
        has_sib = more & (rank + 1 < K)
        digit = depth - 1
        in_key0 = digit < M0
        shift0 = tl.maximum((M0 - 1 - digit) * NB, 0).to(tl.int64)
        shift1 = tl.maximum((L - 1 - digit) * NB + DB, 0).to(tl.int64)
        s_score = tl.where(has_sib, (w_score - w_own.to(tl.float64)) + w_nxt.to(tl.float64), neg_inf)
        s_key0 = tl.where(has_sib, w_key0 + tl.where(in_key0, one << shift0, 0), empty_key)
        s_key1 = tl.where(has_sib, w_key1 + tl.where(in_key0, 0, one << shift1), empty_key)
        s_meta = tl.where(has_sib, w_meta + 1, 0)
        s_nxt = _log_prob(lq, depth, rank + 2, has_sib, L, K)
        # First child (depth + 1, rank 0): its parent is node n.
        has_child = more & (depth < L)
        c_score = tl.where(has_child, w_score + w_kid.to(tl.float64), neg_inf)
        c_key0 = tl.where(has_child, w_key0, empty_key)
        c_key1 = tl.where(has_child, w_key1 + 1, empty_key)
        c_meta = tl.where(has_child, ((n + 1) << 16) | ((depth + 1) << 8), 0)
        c_nxt = _log_prob(lq, depth + 1, 1 + zero_lanes, has_child, L, K)
        c_kid = _log_prob(lq, depth + 2, zero_lanes, has_child, L, K)

        # a: the newcomer that pops first, b: the other (an absent one is an empty entry).
        sib_first = _first(s_score, s_key0, s_key1, c_score, c_key0, c_key1)
        a = _pick(sib_first, s_score, s_key0, s_key1, s_meta, w_nxt, s_nxt, w_kid,
                  c_score, c_key0, c_key1, c_meta, w_kid, c_nxt, c_kid)
        b_ = _pick(sib_first, c_score, c_key0, c_key1, c_meta, w_kid, c_nxt, c_kid,
                   s_score, s_key0, s_key1, s_meta, w_nxt, s_nxt, w_kid)
        # Lane j >= 1 moves to j - 1 + (a first) + (b first); lane i reads who lands on it.
        a_before = _first(a[0], a[1], a[2], score, key0, key1)
        b_before = _first(b_[0], b_[1], b_[2], score, key0, key1)
        verdict = a_before.to(tl.int32) + 2 * b_before.to(tl.int32)  # 0, 1 or 3 (b first => a first)
        v_up = verdict.gather(up, 0)
        v_down = verdict.gather(down, 0)
        from_up = (lane + 1 < LANES) & (v_up == 0)
        from_here = (lane >= 1) & (verdict == 1)
        from_down = (lane >= 2) & (v_down == 3)
        moved = from_up | from_here | from_down
        src = tl.where(from_up, up, tl.where(from_here, lane, down))
        take_a = (lane == 0) | (verdict == 0)  # a newcomer lands here: `a` unless lane i moved past both
        new = _pick(take_a, *a, *b_)
        score = tl.where(moved, score.gather(src, 0), new[0])
        key0 = tl.where(moved, key0.gather(src, 0), new[1])
        key1 = tl.where(moved, key1.gather(src, 0), new[2])
        meta = tl.where(moved, meta.gather(src, 0), new[3])
        own = tl.where(moved, own.gather(src, 0), new[4])
        nxt = tl.where(moved, nxt.gather(src, 0), new[5])
        kid = tl.where(moved, kid.gather(src, 0), new[6])

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
            L_PAD=triton.next_power_of_2(depth_limit), K_PAD=triton.next_power_of_2(k), NB=digit_bits,
            M0=first_word, DB=depth_bits, JUMPS=(min(depth_limit, budget) - 1).bit_length(), num_warps=1)
    return TreeBatch(tokens, depths, parents, visibility)
