"""The routed experts of an MoE layer as two grouped GEMMs and a combine: no host round trip.

The per-expert loop (engine.model.MoE.per_expert, the reference and the CPU path) reads the group
sizes back to the host once per layer and launches three GEMMs per expert in use: at K2 shapes
thousands of launches per verify step and a wait per layer. Here, as in vLLM's and SGLang's fused
MoE, the (token, choice) pairs are grouped by expert on the GPU, each group padded to the row tile
in a buffer sized for the worst case from the shapes alone, so no size is ever read back and each
projection is one launch whatever the expert count:

    route_to_blocks  pairs -> rows grouped by expert (padding rows -1), and each row tile's expert
    _gate_up_kernel  h = silu(x W_gate^T) * (x W_up^T), both products in one program
    _down_kernel     y = routing weight * (h W_down^T), written at the pair's own row
    _combine_kernel  out = shared + y[choice 0] + y[choice 1] + ... (fixed order)

Batch invariance (a token's bits never depend on the other tokens in the call): the tiles are
fixed by the layer's shape, never by the token count; no split-K, no atomics; the combine sums a
token's choices in the same order every time. Expert weights are read stacked, [E, 2I, H] for
gate+up and [E, H, I] for down (engine.model.MoE.stack_experts makes the per-expert parameters
views of them, so the checkpoint names stay and memory is not doubled).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class Routing(NamedTuple):
    """The pairs laid out for the grouped GEMMs; sized from the shapes alone."""
    row_pair: torch.Tensor      # [n_blocks * block_m] int64: the pair on each row, -1 for padding
    block_expert: torch.Tensor  # [n_blocks] int64: the expert of each row tile, -1 past the last
    block_m: int


class MoeTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def moe_tiles(dtype: torch.dtype) -> MoeTiles:
    """Fixed per dtype, never from the token count (batch invariance). bf16: the tiling with the
    smallest worst-case loss over 1 to 1,088 tokens at K2 dims on the H200 (`benchmarks/fused_moe.py
    --tune`, benchmarks/results/fused_moe.json: at most 7% behind the best tiling of each count)."""
    if dtype == torch.float32:
        return MoeTiles(16, 32, 32, 4, 2)
    return MoeTiles(64, 64, 64, 4, 4)


def max_blocks(n_pairs: int, n_experts: int, block_m: int) -> int:
    """Row tiles the pairs can need at most: each expert in use rounds its rows up to a tile, so
    sum(ceil(c_e / m)) <= n_pairs // m + (experts in use <= min(E, n_pairs))."""
    return n_pairs // block_m + min(n_experts, n_pairs)


def route_to_blocks(experts: torch.Tensor, n_experts: int, block_m: int) -> Routing:
    """experts [N, k] -> the row layout of `Routing`: pairs sorted by expert (stable: a token's
    pairs keep their order), each expert's rows starting on a tile boundary. GPU ops only.

    An id outside [0, n_experts) is an expert this rank does not hold (expert parallelism passes
    the ids relative to its first expert): the pair gets no row, and its output stays zero."""
    pairs = experts.flatten()
    n_pairs = pairs.numel()
    n_blocks = max_blocks(n_pairs, n_experts, block_m)
    held = (pairs >= 0) & (pairs < n_experts)
    bucket = torch.where(held, pairs, n_experts)  # other ranks' pairs sort last, into a bucket with no tiles
    counts = pairs.new_zeros(n_experts + 1).scatter_add_(0, bucket, torch.ones_like(pairs))[:n_experts]
    tiles = (counts + block_m - 1) // block_m
    tile_end = tiles.cumsum(0)
    order = bucket.argsort(stable=True)
    expert_of_sorted = bucket[order]
    mine = expert_of_sorted.clamp(max=n_experts - 1)
    rank = torch.arange(n_pairs, device=pairs.device) - (counts.cumsum(0) - counts)[mine]
    rows = (tile_end - tiles)[mine] * block_m + rank
    scratch = n_blocks * block_m  # one row past the layout takes the pairs that get none
    rows = torch.where(expert_of_sorted < n_experts, rows, scratch)
    row_pair = pairs.new_full((scratch + 1,), -1).index_put_((rows,), order)[:scratch]
    block_expert = torch.searchsorted(tile_end, torch.arange(n_blocks, device=pairs.device), right=True)
    return Routing(row_pair, block_expert.masked_fill_(block_expert >= n_experts, -1), block_m)


@triton.jit
def _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M: tl.constexpr):
    """This program's row tile (grid axis 0): its expert (-1 past the last tile), its rows, and the
    pair on each row (-1 for padding)."""
    block = tl.program_id(0)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.load(block_expert_ptr + block), rows, tl.load(row_pair_ptr + rows)


@triton.jit
def _gate_up_kernel(x_ptr, w13_ptr, h_ptr, row_pair_ptr, block_expert_ptr, H, I,
                    stride_we, stride_wn, stride_wk, TOP_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    expert, rows, pair = _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M)
    if expert < 0:
        return
    token = tl.where(pair >= 0, pair // TOP_K, 0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x = x_ptr + token[:, None] * H + ks[None, :]
    w_gate = w13_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk
    w_up = w_gate + I * stride_wn
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        k_in = (k + ks) < H
        a = tl.load(x, mask=(pair[:, None] >= 0) & k_in[None, :], other=0.0)
        bg = tl.load(w_gate, mask=(cols[None, :] < I) & k_in[:, None], other=0.0)
        bu = tl.load(w_up, mask=(cols[None, :] < I) & k_in[:, None], other=0.0)
        if IEEE:
            gate = tl.dot(a, bg, gate, input_precision="ieee")
            up = tl.dot(a, bu, up, input_precision="ieee")
        else:
            gate = tl.dot(a, bg, gate)
            up = tl.dot(a, bu, up)
        x += BLOCK_K
        w_gate += BLOCK_K * stride_wk
        w_up += BLOCK_K * stride_wk
    h = gate / (1.0 + tl.exp(-gate)) * up
    out = h_ptr + rows[:, None].to(tl.int64) * I + cols[None, :]
    tl.store(out, h.to(h_ptr.dtype.element_ty), mask=(pair[:, None] >= 0) & (cols[None, :] < I))


@triton.jit
def _down_kernel(h_ptr, w2_ptr, y_ptr, weight_ptr, row_pair_ptr, block_expert_ptr, H, I,
                 stride_we, stride_wn, stride_wk,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    expert, rows, pair = _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M)
    if expert < 0:
        return
    used = pair >= 0
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    h = h_ptr + rows[:, None].to(tl.int64) * I + ks[None, :]
    w = w2_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, I, BLOCK_K):
        k_in = (k + ks) < I
        a = tl.load(h, mask=used[:, None] & k_in[None, :], other=0.0)
        b = tl.load(w, mask=(cols[None, :] < H) & k_in[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        h += BLOCK_K
        w += BLOCK_K * stride_wk
    acc *= tl.load(weight_ptr + pair, mask=used, other=0.0)[:, None]
    out = y_ptr + tl.where(used, pair, 0)[:, None].to(tl.int64) * H + cols[None, :]
    tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=used[:, None] & (cols[None, :] < H))


@triton.jit
def _combine_kernel(y_ptr, shared_ptr, out_ptr, H, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token, pid = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    inside = cols < H
    routed = tl.load(y_ptr + token * TOP_K * H + cols, mask=inside, other=0.0).to(tl.float32)
    for j in tl.static_range(1, TOP_K):
        routed += tl.load(y_ptr + (token * TOP_K + j) * H + cols, mask=inside, other=0.0).to(tl.float32)
    shared = tl.load(shared_ptr + token * H + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * H + cols, (shared + routed).to(out_ptr.dtype.element_ty), mask=inside)


def fused_moe(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              shared: torch.Tensor, tiles: MoeTiles | None = None) -> torch.Tensor:
    """x [N, H] routed to experts [N, k] with weights [N, k] (float32) through stacked w13 [E, 2I, H]
    and w2 [E, H, I]; plus the shared experts' output shared [N, H]. Returns [N, H] in x's dtype."""
    return combine_pairs(routed_pairs(x, weights, experts, w13, w2, tiles), shared)


def routed_pairs(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 tiles: MoeTiles | None = None) -> torch.Tensor:
    """Each (token, choice) pair's weighted expert output, [N, k, H] in x's dtype; zero for a pair
    whose expert id lies outside [0, E) (another rank's expert, under expert parallelism)."""
    n, hidden = x.shape
    n_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = experts.shape[1]
    if w13.shape[2] != hidden or w2.shape != (n_experts, hidden, inter) or weights.shape != experts.shape:
        raise ValueError(f"fused_moe: x {tuple(x.shape)}, experts {tuple(experts.shape)}, w13 {tuple(w13.shape)} "
                         f"and w2 {tuple(w2.shape)} do not fit together")
    t = tiles or moe_tiles(x.dtype)
    y = torch.zeros(n, top_k, hidden, dtype=x.dtype, device=x.device)  # pairs given no row stay zero
    if n == 0:
        return y
    x = x.contiguous()
    routing = route_to_blocks(experts, n_experts, t.block_m)
    n_blocks = routing.block_expert.shape[0]
    ieee = x.dtype == torch.float32
    h = torch.empty(n_blocks * t.block_m, inter, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(n_blocks, triton.cdiv(inter, t.block_n))](
        x, w13, h, routing.row_pair, routing.block_expert, hidden, inter, *w13.stride(), TOP_K=top_k,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, IEEE=ieee, num_warps=t.num_warps,
        num_stages=t.num_stages)
    _down_kernel[(n_blocks, triton.cdiv(hidden, t.block_n))](
        h, w2, y, weights.float().contiguous(), routing.row_pair, routing.block_expert, hidden, inter, *w2.stride(),
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, IEEE=ieee, num_warps=t.num_warps,
        num_stages=t.num_stages)
    return y


def combine_pairs(y: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """shared [N, H] plus each token's pair outputs y [N, k, H] in choice order (fixed: batch-invariant)."""
    n, top_k, hidden = y.shape
    out = torch.empty_like(shared)
    if n == 0:
        return out
    block = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(n, triton.cdiv(hidden, block))](y, shared.contiguous(), out, hidden, TOP_K=top_k, BLOCK=block)
    return out
