"""Merge split-KV partial softmax states into attention outputs.

`tree_verify_attention` cuts a long key range into splits, one program each, and each leaves a
partial state per (query, split, head), in float32: m, the largest base-2 logit it saw; l, the sum of
exp2(s - m); acc, the sum of exp2(s - m) * v. The output is sum_s 2^(m_s - M) acc_s / sum_s
2^(m_s - M) l_s, with M the largest m_s. A split that saw no key holds (-inf, 0, 0) and weighs 0;
split 0 always holds keys, so M is finite.

Two kernels, chosen by the split count alone (never by the batch, so a tree node and plain decoding
of its path still get the same bits): up to COMBINE_LOOP_MAX_SPLITS, a loop over the splits with
wide tiles (few programs per query suffice); beyond, all splits of a smaller tile at once, since
the loop loads one split after another: a batch-1 decode call over 32k keys took 89 us with the
loop and 64 splits, 30 us with this kernel and 119 (H200, benchmarks/results/verify_attention.json
before and after). Reference: `combine_splits_reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H_COMBINE = 16  # heads per program of the loop kernel
COMBINE_LOOP_MAX_SPLITS = 8


@triton.jit
def _combine_few_splits_kernel(ws_acc_ptr, ws_m_ptr, ws_l_ptr, out_ptr, H: tl.constexpr, DV: tl.constexpr,
                               NUM_SPLITS: tl.constexpr, BLOCK_H: tl.constexpr):
    """One split after another, on tiles of BLOCK_H heads x all value dims."""
    query = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    real_head = heads < H
    dv = tl.arange(0, DV)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    for split in range(NUM_SPLITS):
        part = (query * NUM_SPLITS + split) * H + heads
        m_s = tl.load(ws_m_ptr + part, mask=real_head, other=0.0)
        l_s = tl.load(ws_l_ptr + part, mask=real_head, other=0.0)
        acc_s = tl.load(ws_acc_ptr + part[:, None] * DV + dv[None, :], mask=real_head[:, None], other=0.0)
        m_new = tl.maximum(m, m_s)  # split 0 always holds keys, so m_new is finite
        alpha = tl.exp2(m - m_new)
        beta = tl.exp2(m_s - m_new)
        l = l * alpha + l_s * beta
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        m = m_new
    out = acc / tl.where(real_head, l, 1.0)[:, None]
    tl.store(out_ptr + (query * H + heads)[:, None] * DV + dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=real_head[:, None])


@triton.jit
def _combine_many_splits_kernel(ws_acc_ptr, ws_m_ptr, ws_l_ptr, out_ptr, H: tl.constexpr, DV: tl.constexpr,
                                NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
                                BLOCK_DV: tl.constexpr):
    """All splits of a smaller tile at once: rescale every split to the largest max, then sum."""
    query = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    real_head = heads < H
    splits = tl.arange(0, SPLITS_PAD)
    real = (splits[:, None] < NUM_SPLITS) & real_head[None, :]
    part = (query * NUM_SPLITS + splits)[:, None] * H + heads[None, :]  # [splits, heads]
    m_s = tl.load(ws_m_ptr + part, mask=real, other=float("-inf"))
    l_s = tl.load(ws_l_ptr + part, mask=real, other=0.0)
    acc_s = tl.load(ws_acc_ptr + part[:, :, None] * DV + dv[None, None, :], mask=real[:, :, None], other=0.0)
    m = tl.where(real_head, tl.max(m_s, 0), 0.0)  # split 0 always holds keys, so m is finite
    weight = tl.exp2(m_s - m[None, :])
    out = tl.sum(acc_s * weight[:, :, None], 0) / tl.where(real_head, tl.sum(l_s * weight, 0), 1.0)[:, None]
    tl.store(out_ptr + (query * H + heads)[:, None] * DV + dv[None, :], out.to(out_ptr.dtype.element_ty),
             mask=real_head[:, None])


def combine_splits(ws_acc: torch.Tensor, ws_m: torch.Tensor, ws_l: torch.Tensor, out: torch.Tensor, queries: int,
                   splits: int, heads: int, v_dim: int) -> None:
    """Write out[query, head, :] from contiguous float32 partial states laid out [query, split, head]
    (ws_acc: [..., v_dim], v_dim a power of two); `out` may be any float dtype. Same result as
    `combine_splits_reference`."""
    if splits <= COMBINE_LOOP_MAX_SPLITS:
        _combine_few_splits_kernel[(queries, triton.cdiv(heads, BLOCK_H_COMBINE))](
            ws_acc, ws_m, ws_l, out, H=heads, DV=v_dim, NUM_SPLITS=splits, BLOCK_H=BLOCK_H_COMBINE, num_warps=4,
            enable_fp_fusion=False)
        return
    splits_pad = triton.next_power_of_2(splits)  # a tile of about 8k partial values
    block_dv = min(v_dim, max(16, 8192 // splits_pad), 128)
    block_h = max(1, min(triton.next_power_of_2(heads), 8192 // (splits_pad * block_dv)))
    _combine_many_splits_kernel[(queries, triton.cdiv(heads, block_h), triton.cdiv(v_dim, block_dv))](
        ws_acc, ws_m, ws_l, out, H=heads, DV=v_dim, NUM_SPLITS=splits, SPLITS_PAD=splits_pad, BLOCK_H=block_h,
        BLOCK_DV=block_dv, num_warps=4, enable_fp_fusion=False)


def combine_splits_reference(acc: torch.Tensor, m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """acc [queries, splits, heads, v_dim], m and l [queries, splits, heads] -> [queries, heads, v_dim]."""
    weight = torch.exp2(m - m.amax(dim=1, keepdim=True))
    return (acc * weight[..., None]).sum(1) / (l * weight).sum(1)[..., None]
