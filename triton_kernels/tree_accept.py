"""Greedy acceptance on the device: each request walks its draft tree along the target's argmax.

Reference: `engine.accept.accept_greedy` (same outputs, exactly). One program (one warp) per
request holds the tree's parents and tokens one node per lane; each step of the walk is one
vector compare and one min-reduction, so the whole batch is one launch with no host round trip.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.tree import TreeBatch


@triton.jit
def _tree_accept_kernel(tokens_ptr, parents_ptr, argmax_ptr, accepted_ptr, accept_len_ptr, bonus_ptr,
                        BUDGET: tl.constexpr, L: tl.constexpr, LANES: tl.constexpr, L_LANES: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    node = tl.arange(0, LANES)
    in_tree = node < BUDGET
    tokens = tl.load(tokens_ptr + b * BUDGET + node, mask=in_tree, other=-1)
    parents = tl.load(parents_ptr + b * BUDGET + node, mask=in_tree, other=-2)
    argmax = argmax_ptr + b * (BUDGET + 1)
    step = tl.arange(0, L_LANES)
    accepted = tl.full([L_LANES], -1, tl.int64)
    current = tl.full([], -1, tl.int64)  # -1 = the root
    alive = tl.full([], 1, tl.int1)
    length = tl.zeros([], tl.int64)
    for depth in range(L):
        wanted = tl.load(argmax + current + 1)
        match = (parents == current) & (tokens == wanted) & in_tree
        child = tl.min(tl.where(match, node, LANES), 0).to(tl.int64)  # first match, as argmax picks
        found = alive & (child < LANES)
        accepted = tl.where((step == depth) & found, child, accepted)
        length += found.to(tl.int64)
        current = tl.where(found, child, current)
        alive = found
    tl.store(accepted_ptr + b * L + step, accepted, mask=step < L)
    tl.store(accept_len_ptr + b, length)
    tl.store(bonus_ptr + b, tl.load(argmax + current + 1))


def tree_accept(tree: TreeBatch, target_argmax: torch.Tensor, depth_limit: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as `engine.accept.accept_greedy`: (accepted [bs, L], accept_len [bs], next_bonus [bs])."""
    bs, budget = tree.token_ids.shape
    if target_argmax.shape != (bs, budget + 1):
        raise ValueError(f"tree_accept: target_argmax {tuple(target_argmax.shape)} must be [{bs}, {budget + 1}]")
    device = tree.token_ids.device
    accepted = torch.empty(bs, depth_limit, dtype=torch.int64, device=device)
    accept_len = torch.empty(bs, dtype=torch.int64, device=device)
    next_bonus = torch.empty(bs, dtype=torch.int64, device=device)
    if bs and depth_limit:
        _tree_accept_kernel[(bs,)](
            tree.token_ids.contiguous(), tree.parents.contiguous(), target_argmax.to(torch.int64).contiguous(),
            accepted, accept_len, next_bonus, BUDGET=budget, L=depth_limit,
            LANES=max(2, triton.next_power_of_2(budget)), L_LANES=max(2, triton.next_power_of_2(depth_limit)),
            num_warps=1)
    elif bs:
        accept_len.zero_()
        next_bonus.copy_(target_argmax[:, 0])
    return accepted, accept_len, next_bonus
