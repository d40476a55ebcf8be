"""DDTree draft trees and the CPU reference builder (the paper's best-first search with heapq).

The drafter gives per-depth top-K log-probs `lq[d, r]` (rank r sorted best first). Treating the
depths as independent, a prefix's probability is the product of its tokens' marginals, so the tree
of `budget` nodes that maximises expected acceptance is the set of top-`budget` prefixes by
cumulative log-prob. Best-first search finds them in O(B log B): pop the best prefix, push its
next sibling and its first child.

`build_tree_cpu` is the honest CPU baseline the project measures GPU builders against: one
request at a time with Python `heapq`, including the device-to-host copy of the top-k that the
engine really pays (the host-to-device copy of the finished tree is `TreeBatch.to`).

Scores are Python floats (float64) computed as in the paper's code (a sibling's score is the
popped node's score minus its log-prob plus the sibling's). Heap entries are
`(-score, rank_path, ...)`, so equal scores pop in lexicographic order of the path of top-k ranks
from the root: that makes the tree deterministic, and lets a GPU builder match it bit for bit.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TreeBatch:
    """A batch of draft trees, `budget` nodes each, in pop order (every parent before its children).

    The root (the bonus token) is implicit: it is not a node here, every node sees it, and a parent
    index of -1 means "child of the root".
    """

    token_ids: torch.Tensor  # [bs, B] int64
    depths: torch.Tensor  # [bs, B] int64, 1..L
    parents: torch.Tensor  # [bs, B] int64, -1 = root, else an index < the node's own
    visibility: torch.Tensor  # [bs, B, B] bool, [b, i, j] = node j is node i or one of its ancestors

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.token_ids, self.depths, self.parents, self.visibility

    def to(self, device: torch.device | str) -> TreeBatch:
        return TreeBatch(*(t.to(device, non_blocking=True) for t in self.tensors()))


def max_tree_size(depth: int, k: int) -> int:
    """How many distinct prefixes of length 1..depth exist with k choices per position."""
    return sum(k ** d for d in range(1, depth + 1))


def _check_budget(depth: int, k: int, budget: int) -> None:
    if budget < 1 or budget > max_tree_size(depth, k):
        raise ValueError(f"budget {budget} must be in 1..{max_tree_size(depth, k)} for L={depth}, K={k}")


def _build_one(lq: list[list[float]], ids: list[list[int]], budget: int):
    """Best-first search over one request's [L][K] log-probs.

    Returns (tokens, depths, parents, ancestors): ancestors[i] is an int bit set of node i and its
    ancestors (bit j = node j), built for free as nodes pop, from which the visibility mask follows.
    """
    depth_limit, k = len(lq), len(lq[0])
    tokens, depths, parents, ancestors = [], [], [], []
    # (-score, rank path, depth, rank, parent index, score)
    heap = [(-lq[0][0], (0,), 1, 0, -1, lq[0][0])]
    while heap and len(tokens) < budget:
        _, path, depth, rank, parent, score = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[depth - 1][rank])
        depths.append(depth)
        parents.append(parent)
        ancestors.append((ancestors[parent] if parent >= 0 else 0) | (1 << node))
        if rank + 1 < k:
            sibling = score - lq[depth - 1][rank] + lq[depth - 1][rank + 1]
            heapq.heappush(heap, (-sibling, path[:-1] + (rank + 1,), depth, rank + 1, parent, sibling))
        if depth < depth_limit:
            child = score + lq[depth][0]
            heapq.heappush(heap, (-child, path + (0,), depth + 1, 0, node, child))
    return tokens, depths, parents, ancestors


def visibility_from_ancestors(ancestors: list[list[int]], budget: int) -> torch.Tensor:
    """[bs][B] ancestor bit sets -> [bs, B, B] bool mask, 64 columns per vectorised pass."""
    words = []
    for low in range(0, budget, 64):
        word = np.array([[(a >> low) & 0xFFFFFFFFFFFFFFFF for a in row] for row in ancestors], dtype=np.uint64)
        bits = np.arange(min(64, budget - low), dtype=np.uint64)
        words.append((word[..., None] >> bits) & np.uint64(1))
    return torch.from_numpy(np.concatenate(words, axis=-1).astype(bool))


def build_tree_cpu(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int) -> TreeBatch:
    """Build each request's tree on the CPU with heapq. Inputs [bs, L, K] (any device) or [L, K].

    The returned tensors live on the CPU; the caller moves them to the device (`TreeBatch.to`).
    """
    if top_log_probs.dim() == 2:
        top_log_probs, top_token_ids = top_log_probs[None], top_token_ids[None]
    bs, depth_limit, k = top_log_probs.shape
    _check_budget(depth_limit, k, budget)
    if bs == 0:  # no request: empty trees (as the GPU builder returns them)
        none = torch.zeros(0, budget, dtype=torch.int64)
        return TreeBatch(none, none.clone(), none.clone(), torch.zeros(0, budget, budget, dtype=torch.bool))
    # One device-to-host copy for the whole batch, as the engine pays it; then plain Python lists.
    lq_all = top_log_probs.to("cpu", torch.float32).tolist()
    ids_all = top_token_ids.to("cpu").tolist()
    tokens, depths, parents, ancestors = zip(*(_build_one(lq, ids, budget) for lq, ids in zip(lq_all, ids_all)))
    return TreeBatch(torch.tensor(tokens, dtype=torch.int64), torch.tensor(depths, dtype=torch.int64),
                     torch.tensor(parents, dtype=torch.int64), visibility_from_ancestors(ancestors, budget))
