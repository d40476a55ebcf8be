"""DDTree acceptance: follow the target's choices down the draft tree.

The target verified every node in one forward, so `target_argmax` holds its choice after the root
and after each node: its argmax, or at temperature > 0 its seeded sample (engine/sampling.py), which
depends only on the request's seed and the position, never on the node. Starting at the root, step
to the child whose token is the target's choice; stop when no child matches. The path is what
autoregressive decoding would have produced, and the target's choice after the last accepted node
is the next bonus token: lossless.
"""

from __future__ import annotations

import torch

from engine.tree import TreeBatch


def accept_greedy(tree: TreeBatch, target_argmax: torch.Tensor, depth_limit: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk each request's tree along the target's choices (argmax or seeded sample).

    target_argmax [bs, 1 + B]: column 0 is the choice after the root, column 1 + i after node i.
    Returns accepted [bs, depth_limit] int64 node indices along the path (-1 padded),
    accept_len [bs] int64 in 0..depth_limit, next_bonus [bs] int64.
    """
    bs = tree.token_ids.shape[0]
    device = tree.token_ids.device
    batch = torch.arange(bs, device=device)
    accepted = torch.full((bs, depth_limit), -1, dtype=torch.int64, device=device)
    accept_len = torch.zeros(bs, dtype=torch.int64, device=device)
    current = torch.full((bs,), -1, dtype=torch.int64, device=device)  # -1 = the root
    alive = torch.ones(bs, dtype=torch.bool, device=device)
    for depth in range(depth_limit):
        wanted = target_argmax[batch, current + 1]
        # Sibling tokens are distinct (they are different top-k ids), so at most one child matches.
        match = (tree.parents == current[:, None]) & (tree.token_ids == wanted[:, None])
        found = match.any(-1) & alive
        child = match.int().argmax(-1)
        accepted[found, depth] = child[found]
        accept_len += found.long()
        current = torch.where(found, child, current)
        alive = found
    next_bonus = target_argmax[batch, current + 1]
    return accepted, accept_len, next_bonus
