"""Tree-verify MLA attention for Hopper (sm_90) in Gluon: the same contract and arithmetic order as
`tree_verify_attention`'s portable Triton kernel, warp-specialised.

Why a second kernel: `tl.dot` places every warp of a chained-dot kernel along M, so with 64 heads
(one 64-row tile) and 8 warps both warpgroups compute the same 64 x BLOCK_N scores, and a third of
the tensor-core work is wasted (q.k is 576 deep, p.v 512 wide). Gluon lets the two warpgroups do
different work at the same time:
- the scores warpgroup (the default partition) computes all 64 x BLOCK_N scores of a chunk in one
  MMA chain, its online softmax, and the left half of the output (64 x DV/2, float32 registers);
- the loader warpgroup (the worker) copies key chunks into a two-deep shared-memory ring with
  cp.async and computes the right half of the output from the P the other one left in shared
  memory, so its p.v overlaps the scores warpgroup's q.k of the next chunk.
Mbarriers hand chunks, P and the rescale factors between them. The version before split the scores
by keys between the warpgroups (two N = 32 MMAs, each reading the whole query from shared memory,
then both p.v halves in lockstep); at bs 64, budget 32 (one split, no merge) this one takes 2.48
instead of 3.13 ms at 4k keys and 18.6 instead of 23.3 ms at 32k on the H200
(benchmarks/results/verify_attention.json before and after the change).

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
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier,
                                                               warpgroup_mma, warpgroup_mma_wait)

ROWS = gl.constexpr(64)  # one warpgroup MMA tile of heads; fewer heads are padded
WARPS = gl.constexpr(4)  # per partition: one warpgroup each
LOADER_REGS = gl.constexpr(232)  # registers per thread of the loader warpgroup (its half of the output is 128)
NUM_BUF = gl.constexpr(2)  # key chunks in shared memory: the two-deep ring
SMEM_BYTES = 232448  # shared memory per block on sm_90


def fits(q: torch.Tensor, kv: torch.Tensor, v_dim: int, block_n: int) -> bool:
    """Whether this kernel serves these inputs: a Hopper GPU, 16-bit rows, at most 64 heads, value
    halves and rope dims the warpgroup MMA shapes allow, tiles that fit in shared memory, and a key
    ring that holds a float32 output half (the loader stages its half of the output there)."""
    heads, dim = q.shape[2], q.shape[3]
    rope = dim - v_dim
    rows, bufs = ROWS.value, NUM_BUF.value
    smem = 2 * (rows * dim + bufs * block_n * dim + rows * block_n)
    return (kv.is_cuda and torch.cuda.get_device_capability(kv.device) == (9, 0)
            and kv.dtype in (torch.bfloat16, torch.float16) and heads <= rows and 32 <= v_dim <= 512
            and rope >= 16 and rope & (rope - 1) == 0 and rows <= bufs * block_n and block_n <= 256
            and smem <= SMEM_BYTES - 1024)  # rescale factors, barriers and reductions use a little more


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
def _copy_chunk(nope_smem, rope_smem, ready, rows_base, start, prefix, hi, mask_row, T: gl.constexpr,
                BLOCK_N: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr, wide: gl.constexpr, narrow: gl.constexpr):
    """Start copying one chunk's key rows; each thread arrives on `ready` when its copies have landed."""
    _copy_rows(nope_smem, rows_base, start, 0, prefix, hi, mask_row, T, BLOCK_N, DV, DV + DR, wide)
    _copy_rows(rope_smem, rows_base, start, DV, prefix, hi, mask_row, T, BLOCK_N, DR, DV + DR, narrow)
    async_copy.mbarrier_arrive(ready, increment_count=False)
    async_copy.commit_group()


@triton.constexpr_function
def _row_layout(width, num_warps):
    """A blocked layout for [rows, width] 16-bit tiles: 16-byte pieces, a warp along a row."""
    lanes = min(32, width // 8)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@triton.constexpr_function
def _half_out_layout(dv):
    """Register layout of one warpgroup's 64 x DV/2 float32 output half."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, dv // 2, 16])


@triton.constexpr_function
def _store_layouts(width, bits):
    """For storing a [rows, width] output tile: a blocked register layout with 16 bytes per thread and
    a warp along a row, and a swizzled shared layout of 16-byte pieces to stage the tile in."""
    vec = 128 // bits
    lanes = min(32, width // vec)
    return (gl.BlockedLayout([1, vec], [32 // lanes, lanes], [WARPS.value, 1], [1, 0]),
            gl.SwizzledSharedLayout(vec, 1, min(8, width // vec), [1, 0]))


@gluon.jit
def _store_half(acc, l_i, staging, o_ptr, query, split, first_dim, H: gl.constexpr, DV: gl.constexpr,
                NUM_SPLITS: gl.constexpr):
    """Store dims first_dim.. + DV/2 of the normalised output (a split's partial when NUM_SPLITS > 1;
    an empty split, l = 0, stores 0). The tile goes through `staging`, shared memory this warpgroup
    no longer reads, so that each thread stores 16 contiguous bytes: straight from the MMA layout a
    thread stores 2 values at a time, and bf16 partials were slower to write than float32 ones."""
    dtype: gl.constexpr = o_ptr.dtype.element_ty
    layouts: gl.constexpr = _store_layouts(DV // 2, dtype.primitive_bitwidth)
    o = acc / gl.expand_dims(gl.where(l_i > 0, l_i, 1.0), 1)
    tile = staging._reinterpret(dtype, [ROWS, DV // 2], layouts[1])
    tile.store(o.to(dtype))
    gl.thread_barrier()
    heads = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layouts[0]))
    dims = first_dim + gl.arange(0, DV // 2, layout=gl.SliceLayout(0, layouts[0]))
    part = (query * NUM_SPLITS + split) * H  # = query * H without splits
    gl.store(o_ptr + gl.expand_dims((part + heads) * DV, 1) + gl.expand_dims(dims, 0), tile.load(layouts[0]),
             mask=gl.expand_dims(heads < H, 1))


@gluon.jit
def _scores_partition(q_nope_smem, q_rope_smem, k_nope_smem, k_rope_smem, p_smem, alpha_smem, l_smem,
                      k_ready, k_free, p_ready, p_free, l_ready, o_ptr, lse_ptr, query, split, lo, hi, qk_scale,
                      H: gl.constexpr, DV: gl.constexpr, BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr):
    """Scores, online softmax (base 2, as in the portable kernel) and the left output half."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = _half_out_layout(DV)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([ROWS, DV // 2], gl.float32, layout=o_layout)
    keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    async_copy.wait_group(0)  # the query's rows
    fence_async_shared()
    gl.thread_barrier()
    for start in range(lo, hi, BLOCK_N):
        n = (start - lo) // BLOCK_N
        buf = n % NUM_BUF
        mbarrier.wait(k_ready.index(buf), (n // NUM_BUF) & 1)
        fence_async_shared()  # the loader's cp.async writes, before the MMAs read them
        k_nope = k_nope_smem.index(buf)
        s = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
        s = warpgroup_mma(q_nope_smem, k_nope.permute((1, 0)), s, use_acc=False, is_async=True)
        s = warpgroup_mma(q_rope_smem, k_rope_smem.index(buf).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s = gl.where(gl.expand_dims(start + keys < hi, 0), s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        mbarrier.wait(p_free, (n & 1) ^ 1)  # the loader is done with the previous P and alpha
        p_smem.store(p.to(p_smem.dtype))
        alpha_smem.store(alpha)
        fence_async_shared()
        gl.thread_barrier()  # this warpgroup's stores, before one thread signals
        mbarrier.arrive(p_ready)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        acc = warpgroup_mma(p_smem, k_nope.slice(0, DV // 2, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(k_free.index(buf))

    l_smem.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(l_ready)
    # Staged in the query's shared memory: only this warpgroup's MMAs read it, and they are done.
    _store_half(acc, gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), q_nope_smem, o_ptr, query, split, 0, H, DV,
                NUM_SPLITS)
    if NUM_SPLITS > 1:
        heads = gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
        gl.store(lse_ptr + (query * NUM_SPLITS + split) * H + heads, m_i + gl.log2(l_i), mask=heads < H)


@gluon.jit
def _loader_partition(k_nope_smem, k_rope_smem, p_smem, alpha_smem, l_smem, k_ready, k_free, p_ready, p_free,
                      l_ready, o_ptr, query, split, lo, hi, rows_base, prefix, mask_row,
                      T: gl.constexpr, H: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
                      BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr):
    """Key chunks into the ring (one ahead), and the right output half from the scores' P."""
    o_layout: gl.constexpr = _half_out_layout(DV)
    wide: gl.constexpr = _row_layout(DV, WARPS)
    narrow: gl.constexpr = _row_layout(DR, WARPS)
    acc = gl.zeros([ROWS, DV // 2], gl.float32, layout=o_layout)
    _copy_chunk(k_nope_smem.index(0), k_rope_smem.index(0), k_ready.index(0), rows_base, lo, prefix, hi, mask_row,
                T, BLOCK_N, DV, DR, wide, narrow)
    for start in range(lo, hi, BLOCK_N):
        n = (start - lo) // BLOCK_N
        nxt = (n + 1) % NUM_BUF
        mbarrier.wait(k_free.index(nxt), (((n + 1) // NUM_BUF) & 1) ^ 1)  # chunk n - 1 is done with it
        _copy_chunk(k_nope_smem.index(nxt), k_rope_smem.index(nxt), k_ready.index(nxt), rows_base, start + BLOCK_N,
                    prefix, hi, mask_row, T, BLOCK_N, DV, DR, wide, narrow)
        mbarrier.wait(p_ready, n & 1)
        fence_async_shared()  # this warpgroup's cp.async writes of chunk n, before its MMA reads them
        acc = acc * gl.expand_dims(alpha_smem.load(gl.SliceLayout(1, o_layout)), 1)
        acc = warpgroup_mma(p_smem, k_nope_smem.index(n % NUM_BUF).slice(DV // 2, DV // 2, dim=1), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(p_free)
        mbarrier.arrive(k_free.index(n % NUM_BUF))
    async_copy.wait_group(0)
    mbarrier.wait(l_ready, 0)
    # Staged in the key ring: after l_ready the scores warpgroup reads no key, and this one's copies have landed.
    _store_half(acc, l_smem.load(gl.SliceLayout(1, o_layout)), k_nope_smem, o_ptr, query, split, DV // 2, H, DV,
                NUM_SPLITS)


@gluon.jit
def _tree_verify_hopper_kernel(q_ptr, kv_ptr, slots_ptr, prefix_ptr, mask_ptr, o_ptr, lse_ptr, max_len, qk_scale,
                               T: gl.constexpr, H: gl.constexpr, DV: gl.constexpr, DR: gl.constexpr,
                               T_PAD: gl.constexpr, BLOCK_N: gl.constexpr, NUM_SPLITS: gl.constexpr):
    D: gl.constexpr = DV + DR
    query = gl.program_id(0).to(gl.int64)  # b * T + t
    split = gl.program_id(1)
    b = query // T
    dtype: gl.constexpr = kv_ptr.dtype.element_ty
    wide: gl.constexpr = _row_layout(DV, WARPS)
    narrow: gl.constexpr = _row_layout(DR, WARPS)
    q_nope_smem = gl.allocate_shared_memory(dtype, [ROWS, DV], gl.NVMMASharedLayout.get_default_for([ROWS, DV], dtype))
    q_rope_smem = gl.allocate_shared_memory(dtype, [ROWS, DR], gl.NVMMASharedLayout.get_default_for([ROWS, DR], dtype))
    k_nope_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, DV],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, DV], dtype))
    k_rope_smem = gl.allocate_shared_memory(dtype, [NUM_BUF, BLOCK_N, DR],
                                            gl.NVMMASharedLayout.get_default_for([BLOCK_N, DR], dtype))
    p_smem = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], dtype))
    rows_vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    alpha_smem = gl.allocate_shared_memory(gl.float32, [ROWS], rows_vec)  # rescale factors of the chunk's P
    l_smem = gl.allocate_shared_memory(gl.float32, [ROWS], rows_vec)  # final softmax sums
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    l_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(k_ready.index(i), count=32 * WARPS)  # every loader thread, when its copies land
        mbarrier.init(k_free.index(i), count=2)  # both warpgroups, after their p.v
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(l_ready, count=1)

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

    # The query's rows (padded heads are never stored), copied by the threads of the scores partition.
    heads_w = gl.arange(0, ROWS, layout=gl.SliceLayout(1, wide))
    heads_n = gl.arange(0, ROWS, layout=gl.SliceLayout(1, narrow))
    async_copy.async_copy_global_to_shared(
        q_nope_smem, q_ptr + gl.expand_dims((query * H + heads_w) * D, 1)
        + gl.expand_dims(gl.arange(0, DV, layout=gl.SliceLayout(0, wide)), 0), mask=gl.expand_dims(heads_w < H, 1))
    async_copy.async_copy_global_to_shared(
        q_rope_smem, q_ptr + gl.expand_dims((query * H + heads_n) * D + DV, 1)
        + gl.expand_dims(gl.arange(0, DR, layout=gl.SliceLayout(0, narrow)), 0), mask=gl.expand_dims(heads_n < H, 1))
    async_copy.commit_group()  # waited for by the scores partition (these threads), while the loader starts

    gl.warp_specialize([
        (_scores_partition, (q_nope_smem, q_rope_smem, k_nope_smem, k_rope_smem, p_smem, alpha_smem, l_smem,
                             k_ready, k_free, p_ready, p_free, l_ready, o_ptr, lse_ptr, query, split, lo, hi,
                             qk_scale, H, DV, BLOCK_N, NUM_SPLITS)),
        (_loader_partition, (k_nope_smem, k_rope_smem, p_smem, alpha_smem, l_smem, k_ready, k_free, p_ready, p_free,
                             l_ready, o_ptr, query, split, lo, hi, rows_base, prefix, mask_row,
                             T, H, DV, DR, BLOCK_N, NUM_SPLITS)),
    ], [WARPS], [LOADER_REGS])


def launch(q, kv, slots, prefix_lens, tree_mask, o, lse, scale: float, v_dim: int, splits: int, block_n: int) -> None:
    """Run the kernel over the (query, split) grid: o (and lse) are the output itself without splits, else
    the partials that `tree_verify_attention` merges with combine_splits."""
    bs, T, H, D = q.shape
    _tree_verify_hopper_kernel[(bs * T, splits)](
        q.to(kv.dtype), kv, slots, prefix_lens, tree_mask, o, lse, kv.shape[1], scale * math.log2(math.e),
        T=T, H=H, DV=v_dim, DR=D - v_dim, T_PAD=max(2, triton.next_power_of_2(T)), BLOCK_N=block_n,
        NUM_SPLITS=splits, num_warps=WARPS.value, enable_fp_fusion=False)
