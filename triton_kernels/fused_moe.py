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

Batch invariance (a token's bits never depend on the other tokens in the call): each GEMM's tiles
are fixed by its own (N, K) and the dtype (`moe_config`), never by the token count; no split-K, no
atomics; the combine sums a token's choices in the same order every time. Expert weights are read
stacked, [E, 2I, H] for gate+up and [E, H, I] for down (engine.model.MoE.stack_experts makes the
per-expert parameters views of them, so the checkpoint names stay and memory is not doubled).
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
    top_k: int                  # a pair's id is token * top_k + choice


class MoeTiles(NamedTuple):
    """One grouped GEMM's tiling (block sizes powers of two, as tl.arange needs)."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


class MoeConfig(NamedTuple):
    """The two projections' tilings, each fixed by its own GEMM's shape.

    Both GEMMs read the one row layout of `route_to_blocks` (gate+up writes h at a row, down reads
    that row), so the layout is routed at the larger block_m and the GEMM with the smaller one walks
    each row tile as sub-tiles (powers of two: the smaller divides the larger), a sub-tile holding
    only padding leaving at once. Its work is what its own routing would give (an expert's padding
    rows lie at its end, so the skipped sub-tiles are exactly the extra padding), for a few empty
    programs. Not re-routed per GEMM: a second sort, and down would have to gather h through a map
    between the two layouts; nor one block_m for both: each projection is tuned on its own."""
    gate_up: MoeTiles
    down: MoeTiles

    @property
    def block_m(self) -> int:
        """The row tile the pairs are routed to."""
        return max(self.gate_up.block_m, self.down.block_m)


# bf16 tilings of Kimi K2's two expert GEMMs, (N, K) -> MoeTiles, each projection tuned apart on
# the H200 by `benchmarks/fused_moe.py --tune` (benchmarks/results/fused_moe.json, its "tuned" block;
# a test checks that they agree).
TUNED: dict[tuple[int, int], MoeTiles] = {
    (2 * 2048, 7168): MoeTiles(64, 128, 64, 8, 4),  # gate+up: w13 [E, 2I, H]
    (7168, 2048): MoeTiles(64, 256, 64, 8, 4),      # down: w2 [E, H, I]
}
UNTUNED = MoeTiles(64, 64, 64, 4, 4)  # other shapes: the joint tuning's pick for both K2 GEMMs
FLOAT32 = MoeTiles(16, 32, 32, 4, 2)  # IEEE products (the CPU tests, in Triton's interpreter)


def moe_tiles(n: int, k: int, dtype: torch.dtype) -> MoeTiles:
    """The tiling of one grouped GEMM with weights [E, n, k], from (n, k) and the dtype alone, never
    from the token count (batch invariance). A tuned shape takes `--tune`'s pick: the candidate
    whose worst ratio to the best candidate over 1 to 1,088 tokens is smallest."""
    if dtype == torch.float32:
        return FLOAT32
    return TUNED.get((n, k), UNTUNED)


def moe_config(w13: torch.Tensor, w2: torch.Tensor) -> MoeConfig:
    """Each projection's tiling from its stacked weights' shape and dtype."""
    return MoeConfig(moe_tiles(*w13.shape[1:], w13.dtype), moe_tiles(*w2.shape[1:], w2.dtype))


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
    return Routing(row_pair, block_expert.masked_fill_(block_expert >= n_experts, -1), block_m, experts.shape[1])


@triton.jit
def _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M: tl.constexpr, ROUTE_M: tl.constexpr):
    """This program's BLOCK_M rows (grid axis 0) inside the layout's ROUTE_M-row tiles: the pair on
    the first row (-1: no pair on any, as an expert's padding lies at its end and tiles past the last
    are all padding), their expert, the rows, and the pair on each row (-1 for padding)."""
    start = tl.program_id(0) * BLOCK_M
    rows = start + tl.arange(0, BLOCK_M)
    expert = tl.load(block_expert_ptr + start // ROUTE_M)
    return tl.load(row_pair_ptr + start), expert, rows, tl.load(row_pair_ptr + rows)


@triton.jit
def _gate_up_kernel(x_ptr, w13_ptr, h_ptr, row_pair_ptr, block_expert_ptr, H, I,
                    stride_we, stride_wn, stride_wk, TOP_K: tl.constexpr, ROUTE_M: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    first, expert, rows, pair = _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M, ROUTE_M)
    if first < 0:
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
                 stride_we, stride_wn, stride_wk, ROUTE_M: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    first, expert, rows, pair = _row_tile(block_expert_ptr, row_pair_ptr, BLOCK_M, ROUTE_M)
    if first < 0:
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
              shared: torch.Tensor, config: MoeConfig | None = None) -> torch.Tensor:
    """x [N, H] routed to experts [N, k] with weights [N, k] (float32) through stacked w13 [E, 2I, H]
    and w2 [E, H, I]; plus the shared experts' output shared [N, H]. Returns [N, H] in x's dtype."""
    return combine_pairs(routed_pairs(x, weights, experts, w13, w2, config), shared)


def routed_pairs(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 config: MoeConfig | None = None) -> torch.Tensor:
    """Each (token, choice) pair's weighted expert output, [N, k, H] in x's dtype; zero for a pair
    whose expert id lies outside [0, E) (another rank's expert, under expert parallelism)."""
    n_experts, two_i, hidden = w13.shape
    if x.shape[1] != hidden or w2.shape != (n_experts, hidden, two_i // 2) or weights.shape != experts.shape:
        raise ValueError(f"fused_moe: x {tuple(x.shape)}, experts {tuple(experts.shape)}, w13 {tuple(w13.shape)} "
                         f"and w2 {tuple(w2.shape)} do not fit together")
    if x.shape[0] == 0:
        return x.new_zeros(0, experts.shape[1], hidden)
    config = config or moe_config(w13, w2)
    routing = route_to_blocks(experts, n_experts, config.block_m)
    return down_projection(gate_up_projection(x, routing, w13, config.gate_up), weights, routing, w2, config.down)


def gate_up_projection(x: torch.Tensor, routing: Routing, w13: torch.Tensor, tiles: MoeTiles) -> torch.Tensor:
    """h [layout rows, I] = silu(x W_gate^T) * (x W_up^T) on each row holding a pair (padding rows
    unset): the first grouped GEMM, one launch."""
    _, two_i, hidden = w13.shape
    rows = routing.row_pair.shape[0]
    h = torch.empty(rows, two_i // 2, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(rows // tiles.block_m, triton.cdiv(two_i // 2, tiles.block_n))](
        x.contiguous(), w13, h, routing.row_pair, routing.block_expert, hidden, two_i // 2, *w13.stride(),
        TOP_K=routing.top_k, **_launch(tiles, routing, x.dtype))
    return h


def down_projection(h: torch.Tensor, weights: torch.Tensor, routing: Routing, w2: torch.Tensor, tiles: MoeTiles
                    ) -> torch.Tensor:
    """y [N, k, H]: each pair's h row through its expert's W_down, times its routing weight, at the
    pair's own place (pairs given no row stay zero): the second grouped GEMM, one launch."""
    _, hidden, inter = w2.shape
    y = torch.zeros(*weights.shape, hidden, dtype=h.dtype, device=h.device)
    _down_kernel[(h.shape[0] // tiles.block_m, triton.cdiv(hidden, tiles.block_n))](
        h, w2, y, weights.float().contiguous(), routing.row_pair, routing.block_expert, hidden, inter, *w2.stride(),
        **_launch(tiles, routing, h.dtype))
    return y


def _launch(tiles: MoeTiles, routing: Routing, dtype: torch.dtype) -> dict:
    """A grouped GEMM's tiling as launch arguments; its row tile must divide the layout's (see
    MoeConfig); float32 runs IEEE products."""
    if routing.block_m % tiles.block_m:
        raise ValueError(f"fused_moe: a row tile of {tiles.block_m} does not divide the layout's {routing.block_m}")
    return dict(ROUTE_M=routing.block_m, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                IEEE=dtype == torch.float32, num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def combine_pairs(y: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """shared [N, H] plus each token's pair outputs y [N, k, H] in choice order (fixed: batch-invariant)."""
    n, top_k, hidden = y.shape
    out = torch.empty_like(shared)
    if n == 0:
        return out
    block = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(n, triton.cdiv(hidden, block))](y, shared.contiguous(), out, hidden, TOP_K=top_k, BLOCK=block)
    return out
