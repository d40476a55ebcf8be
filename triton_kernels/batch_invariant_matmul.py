"""A GEMM whose result for a row does not depend on how many rows share the call.

cuBLAS picks its kernel (tile shape, split-K) from the row count M, so a token's product inside a
verify block of bs * (1 + budget) rows differs in the last bits from the same token's product in an
autoregressive step of bs rows, and greedy DDTree stops equalling AR (issue 29's probe at K2 shapes
in bf16: 0 of 16 root rows bit-identical). Here the tile shape, the warp count and the K loop are
chosen from (N, K) and the dtype alone, and no reduction is split: every output element is the same
sequence of fp32 MMA steps whatever M is, and a row's place inside its tile does not change them.
A batch axis (one matrix per head: MLA's absorbed projections) rides on the grid's third axis.

Reference: a float64 product (tests/triton_kernels/test_batch_invariant_matmul.py). The engine's
CPU path keeps its row-by-row products (engine.model.linear).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# bf16 tilings of Kimi K2's projections, (N, K) -> Tiles, picked on the H200 by
# `benchmarks/batch_invariant_matmul.py --tune` (benchmarks/results/batch_invariant_matmul.json).
TUNED: dict[tuple[int, int], Tiles] = {
    (1536, 7168): Tiles(64, 64, 128, 4, 3),    # q_a_proj
    (12288, 1536): Tiles(64, 128, 64, 8, 3),   # q_b_proj
    (576, 7168): Tiles(64, 32, 128, 4, 4),     # kv_a_proj
    (16384, 512): Tiles(64, 128, 64, 8, 3),    # kv_b_proj
    (7168, 8192): Tiles(64, 128, 64, 4, 4),    # o_proj
}


def tiles_for(n: int, k: int, dtype: torch.dtype) -> Tiles:
    """The tiling of an [M, k] x [k, n] product, from (n, k) and the dtype alone (never from M).

    One tiling must serve M = 1 (memory-bound on the weight: narrow tiles, many programs) and
    M = 1,088 (compute-bound: wide tiles), so each tuned shape takes the one whose worst ratio to
    cuBLAS over the decode range is smallest. float32 (the router, the CPU tests) runs IEEE products.
    """
    if dtype == torch.float32:
        return Tiles(32, 32, 32, 4, 2)
    if (n, k) in TUNED:
        return TUNED[n, k]
    # Untuned shapes: the tiling that did best at large M among the tuned shapes of their kind.
    return Tiles(128, 128, 64, 8, 3) if n >= 7168 else Tiles(64, 64, 128, 4, 3)


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K,
                   stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                   stride_ob, stride_om, stride_on,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    # Axis 0 walks M fastest: programs launched together share an N tile of the weight (read once into L2).
    pid_m, pid_n, batch = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x = x_ptr + batch * stride_xb + rows[:, None].to(tl.int64) * stride_xm + ks[None, :] * stride_xk
    w = w_ptr + batch * stride_wb + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_in = (k + ks) < K
        a = tl.load(x, mask=(rows[:, None] < M) & k_in[None, :], other=0.0)
        b = tl.load(w, mask=(cols[None, :] < N) & k_in[:, None], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        x += BLOCK_K * stride_xk
        w += BLOCK_K * stride_wk
    out = out_ptr + batch * stride_ob + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def _launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tiles: Tiles | None) -> None:
    """x [B, M, K], w [B, N, K], out [B, M, N] (any strides)."""
    batch, m, k = x.shape
    n = w.shape[1]
    t = tiles or tiles_for(n, k, x.dtype)
    if m == 0 or n == 0:
        return
    grid = (triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), batch)
    _matmul_kernel[grid](x, w, out, m, n, k, *x.stride(), *w.stride(), *out.stride(),
                         BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, IEEE=x.dtype == torch.float32,
                         num_warps=t.num_warps, num_stages=t.num_stages)


def _check(x: torch.Tensor, w: torch.Tensor, where: str) -> None:
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"{where}: x ({x.dtype}, {x.device}) and weight ({w.dtype}, {w.device}) must match")


def batch_invariant_linear(x: torch.Tensor, weight: torch.Tensor, tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., K] times weight [N, K]^T -> [..., N] in x's dtype, fp32 accumulation (F.linear's contract)."""
    _check(x, weight, "batch_invariant_linear")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"batch_invariant_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not chain")
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    _launch(rows[None], weight[None], out[None], tiles)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def batch_invariant_per_head(x: torch.Tensor, weight: torch.Tensor, tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., H, a] times each head's matrix weight [H, b, a] -> [..., H, b] (engine.model.per_head)."""
    _check(x, weight, "batch_invariant_per_head")
    heads, b, a = weight.shape
    if x.shape[-2:] != (heads, a):
        raise ValueError(f"batch_invariant_per_head: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    rows = x.reshape(-1, heads, a)
    out = torch.empty(rows.shape[0], heads, b, dtype=x.dtype, device=x.device)
    _launch(rows.transpose(0, 1), weight, out.transpose(0, 1), tiles)
    return out.reshape(*x.shape[:-1], b)
