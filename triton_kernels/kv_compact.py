"""KV compaction on the device: move each request's accepted rows right behind its bonus row.

Reference: `engine.kv_cache.compact_accepted` (same result, exactly: rows are copied, not computed).
Why the moves can run in place without a staging copy: accepted node indices increase along the
path and accepted[j] >= j, so in ascending j every move reads a row no earlier move has written.
Each program owns one (request, layer, column block) and walks j in order; every column is read
and written by the same thread, so program order alone keeps the reads ahead of the writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_D = 128


@triton.jit
def _kv_compact_kernel(kv_ptr, slots_ptr, prefix_ptr, accepted_ptr, accept_len_ptr,
                       n_slots, max_len, D, L: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    layer = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_row = cols < D
    base = tl.load(prefix_ptr + b) + 1
    length = tl.load(accept_len_ptr + b)
    slot_rows = kv_ptr + ((layer * n_slots + tl.load(slots_ptr + b)) * max_len) * D + cols
    for j in range(L):
        source = tl.load(accepted_ptr + b * L + j)
        moves = (j < length) & (source != j)
        row = tl.load(slot_rows + (base + source) * D, mask=in_row & moves)
        tl.store(slot_rows + (base + j) * D, row, mask=in_row & moves)


def kv_compact(kv: torch.Tensor, slots: torch.Tensor, prefix_lens: torch.Tensor, accepted: torch.Tensor,
               accept_len: torch.Tensor) -> None:
    """Same contract as `engine.kv_cache.compact_accepted` (in place, every layer)."""
    if not kv.is_contiguous():
        raise ValueError("kv_compact: the cache tensor must be contiguous [num_layers, n_slots, max_len, D]")
    num_layers, n_slots, max_len, dim = kv.shape
    bs, depth_limit = accepted.shape
    if bs and depth_limit:
        grid = (bs, num_layers, triton.cdiv(dim, BLOCK_D))
        _kv_compact_kernel[grid](kv, slots.contiguous(), prefix_lens.contiguous(), accepted.contiguous(),
                                 accept_len.contiguous(), n_slots, max_len, dim, L=depth_limit,
                                 BLOCK_D=BLOCK_D, num_warps=4)
