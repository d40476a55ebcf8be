"""accept_greedy against a plain Python walk of the tree."""

import torch

from engine.accept import accept_greedy
from engine.tree import TreeBatch, build_tree_cpu


def python_walk(tokens, parents, argmax, depth_limit):
    current, path = -1, []
    while len(path) < depth_limit:
        children = [c for c in range(len(tokens)) if parents[c] == current and tokens[c] == argmax[current + 1]]
        if not children:
            break
        current = children[0]
        path.append(current)
    return path, argmax[current + 1]


def test_matches_python_walk_on_random_trees():
    gen = torch.Generator().manual_seed(0)
    bs, depth, k, budget = 64, 5, 3, 20
    lq = torch.log_softmax(torch.randn(bs, depth, k, generator=gen), -1).sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(8, generator=gen)[:k] for _ in range(bs * depth)]).reshape(bs, depth, k)
    tree = build_tree_cpu(lq, ids, budget)
    # Targets that mostly agree with some child, so long paths occur as well as early stops.
    argmax = torch.randint(0, 8, (bs, budget + 1), generator=gen)
    agree = torch.rand(bs, budget + 1, generator=gen) < 0.7
    argmax = torch.where(agree, ids[:, 0, 0, None].expand(-1, budget + 1), argmax)
    for b in range(bs):
        for i in range(budget):
            kids = (tree.parents[b] == i).nonzero().flatten()
            if len(kids) and agree[b, i + 1]:
                argmax[b, i + 1] = tree.token_ids[b, kids[torch.randint(len(kids), (1,), generator=gen)]]
    accepted, accept_len, next_bonus = accept_greedy(tree, argmax, depth)
    lengths = set()
    for b in range(bs):
        path, bonus = python_walk(tree.token_ids[b].tolist(), tree.parents[b].tolist(), argmax[b].tolist(), depth)
        assert accepted[b].tolist() == path + [-1] * (depth - len(path))
        assert accept_len[b].item() == len(path)
        assert next_bonus[b].item() == bonus
        lengths.add(len(path))
    assert len(lengths) >= 3  # the test exercised short and long paths


def test_small_tree_by_hand():
    # root -> a(0) -> c(2) ; root -> b(1) -> d(3) ; tokens a=5 b=6 c=7 d=7
    parents = torch.tensor([[-1, -1, 0, 1]])
    tree = TreeBatch(torch.tensor([[5, 6, 7, 7]]), torch.tensor([[1, 1, 2, 2]]), parents,
                     torch.zeros(1, 4, 4, dtype=torch.bool))
    argmax = torch.tensor([[6, 9, 7, 1, 4]])  # after root: 6 -> node 1; after node 1: 7 -> node 3; then 4
    accepted, accept_len, next_bonus = accept_greedy(tree, argmax, 2)
    assert accepted.tolist() == [[1, 3]] and accept_len.tolist() == [2] and next_bonus.tolist() == [4]
    accepted, accept_len, next_bonus = accept_greedy(tree, torch.tensor([[8, 0, 0, 0, 0]]), 2)
    assert accepted.tolist() == [[-1, -1]] and accept_len.tolist() == [0] and next_bonus.tolist() == [8]
