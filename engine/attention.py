"""Tree attention over the latent MLA cache: the reference the engine runs and Triton kernels match.

One function serves plain decode (T = 1), DDTree verify (T = 1 + budget) and any batch of requests
with different prefix lengths. Query t of request b sees the committed prefix rows
[0, prefix_len) of its slot plus the block rows prefix_len + j its tree mask allows (its ancestors
and itself).

Why the keys are visited in *position order*, in fixed-size chunks: a node's ancestors sit in
the tree block at scattered rows, but in position order they are exactly the rows plain decoding
would have seen at that position. Reading every query's visible rows in that order, with an
online softmax over chunks of `KEY_CHUNK` keys (so every matmul has the same shape whatever the
prefix length, tree or batch), makes each query's output depend only on its own visible rows:
bit-identical between a tree verify and plain decoding, and between a request alone and in a
batch. That is what makes greedy DDTree decoding exactly equal to autoregressive decoding.
"""

from __future__ import annotations

import torch

# Keys per online-softmax chunk. A fully masked chunk changes nothing (exactly), so padding the
# last chunk never perturbs a result.
KEY_CHUNK = 64


def visible_rows(prefix_lens: torch.Tensor, tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query's visible cache rows in position order.

    Returns rows [bs, T, n_max] int64 (padding = row 0) and n_visible [bs, T]: query (b, t) sees
    rows[b, t, :n_visible[b, t]], first the prefix 0..prefix_len-1, then its visible block rows in
    increasing order (ancestors come before descendants in a tree, so this is depth order).
    """
    bs, T, _ = tree_mask.shape
    device = tree_mask.device
    n_visible = prefix_lens[:, None] + tree_mask.sum(-1)
    n_max = int(n_visible.max())
    cols = torch.arange(T, device=device)
    # Visible columns first, each group in increasing order.
    block_order = torch.sort(torch.where(tree_mask, cols, cols + T), dim=-1).values % T
    pos = torch.arange(n_max, device=device)
    prefix = prefix_lens[:, None, None]
    block_k = (pos - prefix).clamp(0, T - 1).expand(bs, T, n_max)
    block_rows = prefix + block_order.gather(-1, block_k)
    rows = torch.where(pos < prefix, pos, block_rows)
    rows = torch.where(pos < n_visible[..., None], rows, torch.zeros_like(rows))
    return rows, n_visible


def tree_attention(q: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, prefix_lens: torch.Tensor,
                   tree_mask: torch.Tensor, scale: float, v_dim: int) -> torch.Tensor:
    """Absorbed-MLA attention of a block of T queries per request against one layer's latent cache.

    q [bs, T, H, D] absorbed queries (D = kv_lora_rank + qk_rope_head_dim), kv [n_slots, max_len, D]
    with the block rows [prefix_len, prefix_len + T) already written, slots / prefix_lens [bs] int64,
    tree_mask [bs, T, T] bool. The value of a row is its first `v_dim` (= kv_lora_rank) entries.
    Returns o [bs, T, H, v_dim] in q's dtype, computed in float32.
    """
    bs, T, H, D = q.shape
    rows, n_visible = visible_rows(prefix_lens, tree_mask)
    n_max = rows.shape[-1]
    n_chunks = -(-n_max // KEY_CHUNK)
    rows = torch.nn.functional.pad(rows, (0, n_chunks * KEY_CHUNK - n_max))
    n_queries = bs * T
    queries = q.float().reshape(n_queries, H, D)
    n_visible = n_visible.reshape(n_queries, 1)
    slot_index = slots[:, None, None]

    running_max = torch.full((n_queries, H), float("-inf"), device=q.device)
    denominator = torch.zeros(n_queries, H, device=q.device)
    out = torch.zeros(n_queries, H, v_dim, device=q.device)
    offsets = torch.arange(KEY_CHUNK, device=q.device)
    for start in range(0, n_chunks * KEY_CHUNK, KEY_CHUNK):
        keys = kv[slot_index, rows[:, :, start:start + KEY_CHUNK]].float().reshape(n_queries, KEY_CHUNK, D)
        scores = torch.bmm(queries, keys.transpose(1, 2)) * scale  # [N, H, C]
        valid = (start + offsets)[None, :] < n_visible  # [N, C]
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        new_max = torch.maximum(running_max, scores.amax(-1))
        # The first chunk always holds position 0, so new_max is finite from the first chunk on.
        rescale = torch.exp(running_max - new_max)
        probs = torch.exp(scores - new_max[..., None])
        denominator = denominator * rescale + probs.sum(-1)
        out = out * rescale[..., None] + torch.bmm(probs, keys[:, :, :v_dim].contiguous())
        running_max = new_max
    return (out / denominator[..., None]).reshape(bs, T, H, v_dim).to(q.dtype)
