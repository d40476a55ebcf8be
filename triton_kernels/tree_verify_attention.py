"""Absorbed-MLA attention for DDTree verify (and plain decode, T = 1) over the latent KV cache.

Reference: `engine.attention.tree_attention` (same contract). One program serves one query token
of one request: all its H heads are the rows of the tile (MLA is multi-query: every head reads
the same 576-wide latent row), so each key row fetched is used H times and the two products per
key chunk (q.k over the 512 latent + 64 rope dims, then p.v over the 512 latent dims) run on the
tensor cores.

Like the reference, a query visits its visible rows in *position order* in fixed chunks of
`BLOCK_N` keys: the prefix rows 0..P-1, then its visible tree-block rows (its ancestors and
itself) gathered into consecutive virtual positions. A node's output therefore depends only on
the rows it sees and where they would sit in plain decoding, not on the shape of its tree or on
the batch: verify and plain decode of the same path do the same arithmetic. Kernels are compiled
without multiply-add contraction so that arithmetic cannot differ between compilations either
(e.g. for T = 1 and T = 1 + budget).

Long prefixes: the key range of every query is cut into `num_splits` equal parts (rounded to
whole chunks), each a program that leaves a normalised partial output and its log-sum-exp; a
second kernel merges them (combine_splits).
The split count is an argument: the same count gives the same bits whatever the batch.
"""

from __future__ import annotations

import functools
import heapq
import math

import torch
import triton
import triton.language as tl

from triton_kernels import tree_verify_attention_hopper as hopper
from triton_kernels.combine_splits import combine_splits

# Default tile per element size: (keys per chunk, warps, pipeline stages). 16-bit rows use the
# tensor cores; float32 rows (tests, CPU interpreter) need smaller tiles to fit shared memory.
DEFAULT_CONFIG = {2: (64, 8, 2), 4: (16, 8, 1)}


@triton.jit
def _attend_chunk(q_nope, q_rope, row_ptrs, valid, m_i, l_i, acc, qk_scale,
                  DV: tl.constexpr, DR: tl.constexpr, PRECISION: tl.constexpr):
    """One chunk of online softmax (base 2) for all heads of one query."""
    k_nope = tl.load(row_ptrs[:, None] + tl.arange(0, DV)[None, :], mask=valid[:, None], other=0.0)
    k_rope = tl.load(row_ptrs[:, None] + DV + tl.arange(0, DR)[None, :], mask=valid[:, None], other=0.0)
    s = tl.dot(q_nope, tl.trans(k_nope), input_precision=PRECISION)
    s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision=PRECISION)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(k_nope.dtype), k_nope, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _tree_verify_kernel(q_ptr, kv_ptr, slots_ptr, prefix_ptr, mask_ptr, o_ptr, lse_ptr, max_len, qk_scale,
                        T: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr, DV: tl.constexpr,
                        DR: tl.constexpr, T_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                        NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr):
    query = tl.program_id(0).to(tl.int64)  # b * T + t
    split = tl.program_id(1)
    b = query // T
    D: tl.constexpr = DV + DR
    heads = tl.arange(0, BLOCK_H)
    real_head = heads < H

    q_rows = q_ptr + (query * H + heads)[:, None] * D
    q_nope = tl.load(q_rows + tl.arange(0, DV)[None, :], mask=real_head[:, None], other=0.0)
    q_rope = tl.load(q_rows + DV + tl.arange(0, DR)[None, :], mask=real_head[:, None], other=0.0)
    q_nope = q_nope.to(kv_ptr.dtype.element_ty)
    q_rope = q_rope.to(kv_ptr.dtype.element_ty)

    # Keys this query sees: the prefix, then its visible block columns (ancestors and itself).
    cols = tl.arange(0, T_PAD)
    mask_row = mask_ptr + query * T
    n_visible = tl.sum(tl.load(mask_row + cols, mask=cols < T, other=0).to(tl.int32), 0)
    prefix = tl.load(prefix_ptr + b).to(tl.int32)
    n_keys = prefix + n_visible
    span = tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * span
    hi = tl.minimum(lo + span, n_keys)
    tail_start = (prefix // BLOCK_N) * BLOCK_N  # first chunk that may hold tree-block rows

    rows_base = kv_ptr + tl.load(slots_ptr + b) * max_len * D
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DV], tl.float32)
    offs = tl.arange(0, BLOCK_N)
    for start in range(lo, tl.minimum(hi, tail_start), BLOCK_N):
        pos = start + offs
        m_i, l_i, acc = _attend_chunk(q_nope, q_rope, rows_base + pos.to(tl.int64) * D, pos < hi,
                                      m_i, l_i, acc, qk_scale, DV, DR, PRECISION)
    for start in range(tl.maximum(lo, tail_start), hi, BLOCK_N):
        pos = start + offs
        # Virtual position prefix + k holds the (k+1)-th visible block column: gather its row.
        nth = pos - prefix + 1
        col = tl.zeros([BLOCK_N], tl.int32)
        seen = tl.zeros([], tl.int32)
        for j in range(T):
            is_visible = tl.load(mask_row + j).to(tl.int32)
            seen += is_visible
            col = tl.where((is_visible != 0) & (nth == seen), j, col)
        rows = tl.where(pos < prefix, pos, prefix + col)
        m_i, l_i, acc = _attend_chunk(q_nope, q_rope, rows_base + rows.to(tl.int64) * D, pos < hi,
                                      m_i, l_i, acc, qk_scale, DV, DR, PRECISION)

    # Normalised output; an empty split (no keys: l = 0) leaves o = 0 and lse = -inf (combine_splits).
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    part = (query * NUM_SPLITS + split) * H + heads  # = query * H + heads without splits
    tl.store(o_ptr + part[:, None] * DV + tl.arange(0, DV)[None, :], o.to(o_ptr.dtype.element_ty),
             mask=real_head[:, None])
    if NUM_SPLITS > 1:
        tl.store(lse_ptr + part, m_i + tl.log2(l_i), mask=real_head)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# What a (query, split) program costs on the H200: a fixed part (launch, query load, the first chunk's
# latency, the output write), a part per chunk of keys (compute-bound, unless the distinct key streams
# of the running programs outrun the bandwidth they reached at bs 8 decode), and the merge's second
# kernel. Fitted on benchmarks/results/verify_fixed_cost.json as of commit bbb00a2 (the current file
# agrees within 0.3 us, but for a faster merge at few splits).
PROGRAM_US, CHUNK_US, MERGE_US = 7.5, 2.2, 4.5
KEY_BYTES_PER_US = 3.3e6
CHUNK_KEYS, CHUNK_BYTES = 64, 64 * 576 * 2  # the default chunk of K2 rows (16-bit, 512 + 64 wide)


def _predicted_us(chunks_per_split: list[int], queries: int, T: int, sms: int) -> float:
    """Time of one call: programs start in grid order (split after split, every query of a split) on
    the first free SM, one per SM at a time; a chunk takes CHUNK_US or the bandwidth share of the key
    streams running at once (T queries of a request read the same keys)."""
    programs = [chunks for chunks in chunks_per_split if chunks for _ in range(queries)]
    chunk_us = max(CHUNK_US, min(len(programs), sms) / T * CHUNK_BYTES / KEY_BYTES_PER_US)
    free_at = [0.0] * sms
    end = 0.0
    for chunks in programs:
        done = heapq.heappop(free_at) + PROGRAM_US + chunks * chunk_us
        end = max(end, done)
        heapq.heappush(free_at, done)
    return end + (MERGE_US if len(chunks_per_split) > 1 else 0.0)


@functools.lru_cache(maxsize=1024)
def default_num_splits(bs: int, T: int, max_len: int, device: torch.device) -> int:
    """The split count with the shortest predicted call (`_predicted_us`), fewest splits on a tie.

    More splits mean more programs to fill the SMs and fewer chunks each, but each program pays a
    fixed cost and the last wave may run nearly empty; a split's keys are whole chunks, so the last
    split is shorter (its programs fill the tail). The prediction uses the cache length, not the
    requests' own (those live on the device).
    """
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 4
    queries = bs * T
    # Candidates: up to one split per SM and per chunk, and at most 16 waves of programs (beyond,
    # more splits only add fixed costs; the cap keeps the prediction cheap for large batches).
    most = max(1, min(sms, triton.cdiv(max_len, CHUNK_KEYS), 16 * sms // queries))

    def chunks_per_split(splits: int) -> list[int]:
        span = triton.cdiv(triton.cdiv(max_len, splits), CHUNK_KEYS) * CHUNK_KEYS
        return [triton.cdiv(max(0, min(span, max_len - i * span)), CHUNK_KEYS) for i in range(splits)]

    return min(range(1, most + 1), key=lambda s: (_predicted_us(chunks_per_split(s), queries, T, sms), s))


def cache_num_splits(max_len: int) -> int:
    """A split count that depends on the cache size alone (one split per 4096 rows, at most 16): with it,
    a query's output depends only on its own visible rows, whatever the batch (the engine's contract)."""
    return max(1, min(16, max_len // 4096))


def tree_verify_attention(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, prefix_lens: torch.Tensor,
                          tree_mask: torch.Tensor, scale: float, v_dim: int, *,
                          num_splits: int | None = None, block_n: int | None = None,
                          num_warps: int | None = None, num_stages: int | None = None,
                          kernel: str = "auto") -> torch.Tensor:
    """Same contract as `engine.attention.tree_attention`; returns o [bs, T, H, v_dim] in q's dtype.

    q is cast to kv's dtype for the tensor-core products (accumulation is float32). `num_splits`
    defaults to `default_num_splits`; fix it to make results independent of the batch shape.
    `kernel`: "auto" runs the Hopper kernel (tree_verify_attention_hopper) where it fits and the
    portable Triton kernel elsewhere; "triton" or "hopper" asks for one (`num_warps` and
    `num_stages` tune the portable one only).
    """
    bs, T, H, D = q.shape
    rope = D - v_dim
    if kv.dim() != 3 or kv.shape[-1] != D:
        raise ValueError(f"tree_verify_attention: kv {tuple(kv.shape)} must be [n_slots, max_len, {D}]")
    if tree_mask.shape != (bs, T, T):
        raise ValueError(f"tree_verify_attention: tree_mask {tuple(tree_mask.shape)} must be [{bs}, {T}, {T}]")
    for name, dim in (("v_dim", v_dim), ("rope dim", rope)):
        if dim < 16 or dim & (dim - 1):
            raise ValueError(f"tree_verify_attention: {name} {dim} must be a power of two >= 16")
    default_n, default_warps, default_stages = DEFAULT_CONFIG[kv.element_size()]
    block_n, num_warps, num_stages = block_n or default_n, num_warps or default_warps, num_stages or default_stages
    if kernel not in ("auto", "triton", "hopper"):
        raise ValueError(f"tree_verify_attention: kernel {kernel!r} must be auto, triton or hopper")
    on_hopper = kernel != "triton" and hopper.fits(q, kv, v_dim, block_n)
    if kernel == "hopper" and not on_hopper:
        raise ValueError("tree_verify_attention: the Hopper kernel needs an sm_90 GPU, 16-bit rows, <= 64 heads, "
                         "32 <= block_n <= 256 and tiles that fit in shared memory")
    out = torch.empty(bs, T, H, v_dim, dtype=q.dtype, device=q.device)
    if bs == 0:
        return out
    splits = num_splits or default_num_splits(bs, T, kv.shape[1], q.device)
    if splits > 1:  # per (query, split, head): a normalised output and its log-sum-exp (combine_splits)
        ws_o = torch.empty(bs * T * splits * H * v_dim, dtype=out.dtype, device=q.device)
        ws_lse = torch.empty(bs * T * splits * H, dtype=torch.float32, device=q.device)
    else:  # the kernel writes the output itself (and no lse)
        ws_o = ws_lse = out
    inputs = (q.contiguous(), kv.contiguous(), slots.contiguous(), prefix_lens.contiguous(), tree_mask.contiguous())
    if on_hopper:
        hopper.launch(*inputs, ws_o, ws_lse, scale, v_dim, splits, block_n)
    else:
        _tree_verify_kernel[(bs * T, splits)](
            *inputs, ws_o, ws_lse, kv.shape[1], scale * math.log2(math.e),
            T=T, H=H, BLOCK_H=max(16, triton.next_power_of_2(H)), DV=v_dim, DR=rope,
            T_PAD=max(2, triton.next_power_of_2(T)), BLOCK_N=block_n, NUM_SPLITS=splits,
            PRECISION="ieee" if kv.dtype == torch.float32 else "tf32",
            num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=False)
    if splits > 1:
        combine_splits(ws_o, ws_lse, out, bs * T, splits, H, v_dim)
    return out
