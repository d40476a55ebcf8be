"""Tree-verify MLA attention for Hopper (sm_90) in Gluon: the same contract and arithmetic order as
`tree_verify_attention`'s portable Triton kernel, without its duplicated q.k.

Why a second kernel: `tl.dot` places every warp of a chained-dot kernel along M, so with 64 heads
(one 64-row tile) and 8 warps both warpgroups compute the same 64 x BLOCK_N scores, and a third of
the tensor-core work is wasted (q.k is 576 deep, p.v 512 wide). Gluon makes the layouts explicit:
each warpgroup computes the scores of half the keys of a chunk (64 x BLOCK_N/2) and the output of
half the value dims (64 x DV/2); P goes through shared memory so both see every key. Key rows are
copied into a two-deep shared-memory ring with cp.async while the previous chunk computes (the
query's rows with the first chunk).

Arithmetic order is the portable kernel's (keys in position order, chunks of BLOCK_N, splits merged
by combine_splits), so a tree node still gets the same bits as plain decoding of its path. The
Triton interpreter cannot run Gluon: on the CPU the portable kernel is tested, and this one is held
to the same reference by the `gpu` tests (tests/triton_kernels/test_tree_verify_attention.py).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, warpgroup_mma,
                                                               warpgroup_mma_wait)

ROWS = 64  # one warpgroup MMA tile of heads; fewer heads are padded
NUM_WARPS = 8  # two warpgroups
NUM_BUF = 2  # key chunks in shared memory: the kernel's two-deep ring
SMEM_BYTES = 232448  # shared memory per block on sm_90


def fits(q: torch.Tensor, kv: torch.Tensor, v_dim: int, block_n: int) -> bool:
    """Whether this kernel serves these inputs: a Hopper GPU, 16-bit rows, at most 64 heads, value
    halves and rope dims the warpgroup MMA shapes allow, and tiles that fit in shared memory."""
    heads, dim = q.shape[2], q.shape[3]
    rope = dim - v_dim
    smem = 2 * (ROWS * dim + NUM_BUF * block_n * dim + ROWS * block_n)
    return (kv.is_cuda and torch.cuda.get_device_capability(kv.device) == (9, 0)
            and kv.dtype in (torch.bfloat16, torch.float16) and heads <= ROWS and 16 <= v_dim <= 512
            and rope >= 16 and rope & (rope - 1) == 0 and block_n >= 16
            and smem <= SMEM_BYTES - 1024)  # its reductions use a little more than the tiles


@gluon.jit
def _chunk_rows(start, prefix, hi, mask_row, T: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    """Cache rows of key positions start.. start + BLOCK_N - 1, and which are real keys: virtual
    position prefix + k holds the (k+1)-th visible block column (the portable kernel's gather)."""
    pos = start + gl.arange(0, BLOCK_N, layout=layout)
    rows = pos
    if start + BLOCK_N > prefix:
        nth = pos - prefix + 1
        col = gl.zeros([BLOCK_N], gl.int32, layout=layout)
        seen = 0
        for j in range(T):
            is_visible = gl.load(mask_row + j).to(gl.int32)
            seen += is_visible
            col = gl.where((is_visible != 0) & (nth == seen), j, col)
        rows = gl.where(pos < prefix, pos, prefix + col)
    return rows, pos < hi


@gluon.jit
def _copy_rows(smem, rows_base, start, first_dim, prefix, hi, mask_row, T: gl.constexpr, BLOCK_N: gl.constexpr,
               WIDTH: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """Start copying dims first_dim.. first_dim + WIDTH - 1 of one chunk's key rows into `smem`."""
    rows, valid = _chunk_rows(start, prefix, hi, mask_row, T, BLOCK_N, gl.SliceLayout(1, layout))
    dims = first_dim + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(
        smem, rows_base + gl.expand_dims(rows.to(gl.int64) * D, 1) + gl.expand_dims(dims, 0),
        mask=gl.expand_dims(valid, 1))


@gluon.jit
def _copy_chunk(nope_smem, rope_smem, rows_base, start, prefix, hi, mask_row, T: gl.constexpr,
                BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, wide: gl.constexpr, narrow: gl.constexpr):
    _copy_rows(nope_smem, rows_base, start, 0, prefix, hi, mask_row, T, BLOCK_N, DV, DV + DR, wide)
    _copy_rows(rope_smem, rows_base, start, DV, prefix, hi, mask_row, T, BLOCK_N, DR, DV + DR, narrow)
    async_copy.commit_group()


@triton.constexpr_function
def _row_layout(width, num_warps):
    """A blocked layout for [rows, width] 16-bit tiles: 16-byte pieces, a warp along a row."""
    lanes = min(32, width // 8)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.jit
def _tree_verify_hopper_kernel(q_ptr, kv_ptr, slots_ptr, prefix_ptr, mask_ptr, out_ptr, ws_acc_ptr, ws_m_ptr,
                               ws_l_ptr, max_len, qk_scale,
                               T: gl.constexpr, H: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
                               T_PAD: gl.constexpr, BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr):
    D: gl.constexpr = DV + DR
    M: gl.constexpr = 64  # ROWS
    query = gl.program_id(0).to(gl.int64)  # b * T + t
    split = gl.program_id(1)
    b = query // T
    dtype: gl.constexpr = kv_ptr.dtype.element_ty

    wide: gl.constexpr = _row_layout(DV, 8)
    narrow: gl.constexpr = _row_layout(DR, 8)
    # Warpgroups side by side: scores split by keys, the output by value dims.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, DV // 2, 16])
    q_nope_smem = gl.allocate_shared_memory(dtype, [M, DV], gl.NVMMASharedLayout.get_default_for([M, DV], dtype))
    q_rope_smem = gl.allocate_shared_memory(dtype, [M, DR], gl.NVMMASharedLayout.get_default_for([M, DR], dtype))
    k_nope_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DV],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, DV], dtype))
    k_rope_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DR],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, DR], dtype))
    p_smem = gl.allocate_shared_memory(dtype, [M, BLOCK_N], gl.NVMMASharedLayout.get_default_for([M, BLOCK_N], dtype))

    # Keys this query sees: the prefix, then its visible block columns (ancestors and itself); the
    # portable kernel's split arithmetic, restated (a Gluon kernel cannot call a Triton function).
    cols = gl.arange(0, T_PAD, layout=gl.SliceLayout(0, narrow))
    mask_row = mask_ptr + query * T
    n_visible = gl.sum(gl.load(mask_row + cols, mask=cols < T, other=0).to(gl.int32), 0)
    prefix = gl.load(prefix_ptr + b).to(gl.int32)
    n_keys = prefix + n_visible
    span = gl.cdiv(gl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * span
    hi = gl.minimum(lo + span, n_keys)
    rows_base = kv_ptr + gl.load(slots_ptr + b) * max_len * D

    m_i = gl.full([M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([M, DV], gl.float32, layout=o_layout)
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    # The query's rows (padded heads are never stored) travel with the first chunk: one commit group.
    heads_w = gl.arange(0, M, layout=gl.SliceLayout(1, wide))
    heads_n = gl.arange(0, M, layout=gl.SliceLayout(1, narrow))
    async_copy.async_copy_global_to_shared(
        q_nope_smem, q_ptr + gl.expand_dims((query * H + heads_w) * D, 1)
        + gl.expand_dims(gl.arange(0, DV, layout=gl.SliceLayout(0, wide)), 0), mask=gl.expand_dims(heads_w < H, 1))
    async_copy.async_copy_global_to_shared(
        q_rope_smem, q_ptr + gl.expand_dims((query * H + heads_n) * D + DV, 1)
        + gl.expand_dims(gl.arange(0, DR, layout=gl.SliceLayout(0, narrow)), 0), mask=gl.expand_dims(heads_n < H, 1))
    _copy_chunk(k_nope_smem.index(0), k_rope_smem.index(0), rows_base, lo, prefix, hi, mask_row, T, BLOCK_N, DV, DR,
                wide, narrow)
    for start in range(lo, hi, BLOCK_N):
        n = (start - lo) // BLOCK_N
        # The next chunk goes into the other buffer, freed at the end of the previous iteration.
        _copy_chunk(k_nope_smem.index((n + 1) % 2), k_rope_smem.index((n + 1) % 2), rows_base, start + BLOCK_N,
                    prefix, hi, mask_row, T, BLOCK_N, DV, DR, wide, narrow)
        async_copy.wait_group(1)  # this thread's copies of this chunk have landed
        fence_async_shared()
        gl.thread_barrier()  # ... and every thread's
        k_nope = k_nope_smem.index(n % 2)
        k_rope = k_rope_smem.index(n % 2)
        s = gl.zeros([M, BLOCK_N], gl.float32, layout=s_layout)
        s = warpgroup_mma(q_nope_smem, k_nope.permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma(q_rope_smem, k_rope.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))

        # Online softmax (base 2), as in the portable kernel.
        s = gl.where(gl.expand_dims(start + keys < hi, 0), s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        p_smem.store(p.to(dtype))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        fence_async_shared()
        gl.thread_barrier()  # all of P is in shared memory
        acc = warpgroup_mma(p_smem, k_nope, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()  # both warpgroups are done with this chunk's buffer and with P
    async_copy.wait_group(0)

    heads_o = gl.arange(0, M, layout=gl.SliceLayout(1, o_layout))
    dv_o = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    real = gl.expand_dims(heads_o < H, 1)
    if NUM_SPLITS == 1:
        l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
        out = acc / gl.expand_dims(l_o, 1)
        gl.store(out_ptr + gl.expand_dims((query * H + heads_o) * DV, 1) + gl.expand_dims(dv_o, 0),
                 out.to(out_ptr.dtype.element_ty), mask=real)
    else:
        part = (query * NUM_SPLITS + split) * H
        gl.store(ws_acc_ptr + gl.expand_dims((part + heads_o) * DV, 1) + gl.expand_dims(dv_o, 0), acc, mask=real)
        heads_s = gl.arange(0, M, layout=gl.SliceLayout(1, s_layout))
        gl.store(ws_m_ptr + part + heads_s, m_i, mask=heads_s < H)
        gl.store(ws_l_ptr + part + heads_s, l_i, mask=heads_s < H)


def launch(q, kv, slots, prefix_lens, tree_mask, out, ws_acc, ws_m, ws_l, scale: float, v_dim: int, splits: int,
           block_n: int) -> None:
    """Run the kernel over the (query, split) grid; `tree_verify_attention` prepares and merges."""
    bs, T, H, D = q.shape
    _tree_verify_hopper_kernel[(bs * T, splits)](
        q.to(kv.dtype), kv, slots, prefix_lens, tree_mask, out, ws_acc, ws_m, ws_l, kv.shape[1], scale * math.log2(math.e),
        T=T, H=H, DV=v_dim, DR=D - v_dim, T_PAD=max(2, triton.next_power_of_2(T)), BLOCK_N=block_n,
        NUM_SPLITS=splits, num_warps=NUM_WARPS, enable_fp_fusion=False)
