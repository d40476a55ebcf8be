"""The latent KV cache: one row per token per layer, one slot per request, and its compaction.

MLA caches only the normalised latent c_KV and the roped k_rope of each token (576 values at K2
dims), shared by all heads. The whole cache is one tensor kv [num_layers, n_slots, max_len, D]:
a request owns a slot, and its committed prefix occupies rows [0, prefix_len) of it. A DDTree
verify writes the block [bonus, nodes...] at rows [prefix_len, prefix_len + 1 + budget); after
acceptance, `compact_accepted` moves the accepted nodes' rows right behind the bonus row, and
everything past them is simply overwritten by the next step.
"""

from __future__ import annotations

import torch


def compact_accepted(kv: torch.Tensor, slots: torch.Tensor, prefix_lens: torch.Tensor,
                     accepted: torch.Tensor, accept_len: torch.Tensor) -> None:
    """In place, every layer: row prefix_len+1+accepted[b, j] -> row prefix_len+1+j for j < accept_len[b].

    kv [num_layers, n_slots, max_len, D]; slots, prefix_lens, accept_len [bs] int64; accepted
    [bs, L] int64 (-1 padded). Sources are at or after their destinations and a destination can be
    another move's source, so all sources are read (gathered into a copy) before any row is written.
    """
    moving = torch.arange(accepted.shape[1], device=accepted.device)[None, :] < accept_len[:, None]
    batch, step = moving.nonzero(as_tuple=True)
    base = prefix_lens[batch] + 1
    source = base + accepted[batch, step]
    destination = base + step
    slot = slots[batch]
    rows = kv[:, slot, source]  # advanced indexing copies: the read completes before the write
    kv[:, slot, destination] = rows


class LatentKVCache:
    """The cache tensor plus slot bookkeeping: which slots are free, and how many rows fit.

    `scratch_slots` extra slots after the `n_slots` a request can have: the static-shape step
    (engine/static_step.py) points its padding rows at one, so padding never touches a request."""

    def __init__(self, num_layers: int, n_slots: int, max_len: int, dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", scratch_slots: int = 0):
        self.kv = torch.zeros(num_layers, n_slots + scratch_slots, max_len, dim, dtype=dtype, device=device)
        self._n_slots = n_slots
        self._free = list(range(n_slots))

    @property
    def n_slots(self) -> int:
        """Slots a request can be given (the scratch slots are not among them)."""
        return self._n_slots

    @property
    def max_len(self) -> int:
        return self.kv.shape[2]

    @property
    def n_free(self) -> int:
        return len(self._free)

    def can_hold(self, rows: int) -> bool:
        """Is there a free slot with room for `rows` rows?"""
        return self.n_free > 0 and rows <= self.max_len

    def allocate(self) -> int:
        """Take the lowest free slot."""
        if not self._free:
            raise RuntimeError(f"no free KV slot (all {self.n_slots} in use)")
        return self._free.pop(0)

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.n_slots:
            raise RuntimeError(f"slot {slot} is not allocated")
        self._free.append(slot)
        self._free.sort()

    def compact(self, slots: torch.Tensor, prefix_lens: torch.Tensor, accepted: torch.Tensor,
                accept_len: torch.Tensor) -> None:
        if self.kv.is_cuda:  # the Triton kernel (triton_kernels/kv_compact.py), same result
            from triton_kernels.kv_compact import kv_compact
            kv_compact(self.kv, slots, prefix_lens, accepted, accept_len)
        else:
            compact_accepted(self.kv, slots, prefix_lens, accepted, accept_len)
