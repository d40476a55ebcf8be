"""Merge split-KV partial attention outputs into final outputs.

`tree_verify_attention` cuts a long key range into splits, one program each, and each leaves per
(query, split, head) its normalised partial output o_s (softmax over its own keys, times v) and
lse_s, the base-2 log of its softmax sum (float32). The output is sum_s 2^(lse_s - M) o_s /
sum_s 2^(lse_s - M), with M the largest lse_s. A split that saw no key holds (0, -inf) and weighs
0; split 0 always holds keys, so M is finite.

Two kernels, chosen by the split count alone (never by the batch, so a tree node and plain decoding
of its path still get the same bits): up to COMBINE_LOOP_MAX_SPLITS, an unrolled loop over the
splits on tiles of heads x all value dims (unrolled, every split's loads are in flight at once: 136
queries x 7 bf16 splits merge in 18.8 us instead of 24.0 rolled, benchmarks/results/combine_splits.json
before and after the change); beyond (batch 1-8 with 64-key splits), all splits of one head's value
slice at once, since a rolled loop loads one split after another: a batch-1 decode call over 32k
keys took 89 us with the loop and 64 splits, 30 us with this kernel and 119 (H200,
benchmarks/results/verify_attention.json of commits 9f638bd and cc61c12). Its programs run head
after head of one query (neighbours read neighbouring rows), on value slices of COMBINE_TILE /
splits dims (more values per program spill registers).

The partials are in the output's dtype (bf16 at K2 dims: half the bytes of float32 to write and to
read back); benchmarks/results/combine_splits.json has the merge alone in either dtype.
Reference: `combine_splits_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H_COMBINE = 4  # heads per program of the loop kernel
COMBINE_TILE = 16384  # split x value-dim elements per program of the all-splits kernel
COMBINE_LOOP_MAX_SPLITS = 8


@triton.jit
def _combine_few_splits_kernel(ws_o_ptr, ws_lse_ptr, out_ptr, H: tl.constexpr, DV: tl.constexpr,
                               NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr):
    """Split after split (in a fixed order), on tiles of BLOCK_H heads x all value dims."""
    query = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    real_head = heads < H
    dv = tl.arange(0, DV)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    weights = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    for split in tl.static_range(NUM_SPLITS):
        part = (query * NUM_SPLITS + split) * H + heads
        lse = tl.load(ws_lse_ptr + part, mask=real_head, other=0.0)
        o = tl.load(ws_o_ptr + part[:, None] * DV + dv[None, :], mask=real_head[:, None], other=0.0).to(tl.float32)
        m_new = tl.maximum(m, lse)  # split 0 always holds keys, so m_new is finite
        alpha = tl.exp2(m - m_new)
        beta = tl.exp2(lse - m_new)
        weights = weights * alpha + beta
        acc = acc * alpha[:, None] + o * beta[:, None]
        m = m_new
    out = acc / tl.where(real_head, weights, 1.0)[:, None]
    tl.store(out_ptr + (query * H + heads)[:, None] * DV + dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=real_head[:, None])


@triton.jit
def _combine_many_splits_kernel(ws_o_ptr, ws_lse_ptr, out_ptr, H: tl.constexpr, DV: tl.constexpr,
                                NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK_DV: tl.constexpr):
    """All splits of one head's BLOCK_DV value dims at once: weigh each against the largest lse, sum."""
    pid = tl.program_id(0)
    head = pid % H
    dv = (pid // H) % (DV // BLOCK_DV) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    query = (pid // (H * (DV // BLOCK_DV))).to(tl.int64)
    splits = tl.arange(0, SPLITS_PAD)
    part = (query * NUM_SPLITS + splits) * H + head
    lse = tl.load(ws_lse_ptr + part, mask=splits < NUM_SPLITS, other=float("-inf"))
    o = tl.load(ws_o_ptr + part[:, None] * DV + dv[None, :], mask=(splits < NUM_SPLITS)[:, None], other=0.0)
    weight = tl.exp2(lse - tl.max(lse, 0))  # split 0 always holds keys, so the max is finite
    out = tl.sum(o.to(tl.float32) * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out_ptr + (query * H + head) * DV + dv, out.to(out_ptr.dtype.element_ty))


def combine_splits(ws_o: torch.Tensor, ws_lse: torch.Tensor, out: torch.Tensor, queries: int, splits: int,
                   heads: int, v_dim: int) -> None:
    """Write out[query, head, :] from contiguous partials laid out [query, split, head] (ws_o:
    [..., v_dim], v_dim a power of two, in any float dtype; ws_lse float32); `out` may be any float
    dtype. Same result as `combine_splits_reference`."""
    if splits <= COMBINE_LOOP_MAX_SPLITS:
        _combine_few_splits_kernel[(queries, triton.cdiv(heads, BLOCK_H_COMBINE))](
            ws_o, ws_lse, out, H=heads, DV=v_dim, NUM_SPLITS=splits, BLOCK_H=BLOCK_H_COMBINE, num_warps=4,
            enable_fp_fusion=False)
        return
    splits_pad = triton.next_power_of_2(splits)
    block_dv = min(v_dim, max(16, COMBINE_TILE // splits_pad))
    _combine_many_splits_kernel[(queries * heads * (v_dim // block_dv),)](
        ws_o, ws_lse, out, H=heads, DV=v_dim, NUM_SPLITS=splits, SPLITS_PAD=splits_pad,
        BLOCK_DV=block_dv, num_warps=4, enable_fp_fusion=False)


def combine_splits_reference(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """o [queries, splits, heads, v_dim], lse [queries, splits, heads] -> [queries, heads, v_dim]."""
    weight = torch.exp2(lse - lse.amax(dim=1, keepdim=True))
    return (o * weight[..., None]).sum(1) / weight.sum(1)[..., None]
