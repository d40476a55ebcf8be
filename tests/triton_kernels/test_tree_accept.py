"""tree_accept vs `engine.accept.accept_greedy`: integer outputs must be exactly equal.

Unmarked tests run the kernel in the Triton interpreter on the CPU; the `gpu` test runs it
compiled on CUDA at the engine's sizes (bs 64, L 15, budgets 8..64). No floats are involved.
"""

import pytest
import torch

from engine.accept import accept_greedy
from engine.tree import TreeBatch, build_tree_cpu
from triton_kernels.tree_accept import tree_accept

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tree_and_argmax(bs, depth, k, budget, agree, generator):
    """Random drafter trees, and target argmaxes that follow some child with probability `agree`."""
    lq = torch.log_softmax(torch.randn(bs, depth, k, generator=generator), -1).sort(-1, descending=True).values
    ids = torch.stack([torch.randperm(4 * k, generator=generator)[:k] for _ in range(bs * depth)])
    tree = build_tree_cpu(lq, ids.reshape(bs, depth, k), budget)
    argmax = torch.randint(0, 4 * k, (bs, budget + 1), generator=generator)
    for b in range(bs):
        for node in range(-1, budget):
            kids = (tree.parents[b] == node).nonzero().flatten()
            if len(kids) and torch.rand(1, generator=generator).item() < agree:
                pick = kids[torch.randint(len(kids), (1,), generator=generator)]
                argmax[b, node + 1] = tree.token_ids[b, pick]
    return tree, argmax


def assert_same(tree, argmax, depth):
    want = accept_greedy(tree, argmax, depth)
    got = tree_accept(tree.to(DEVICE), argmax.to(DEVICE), depth)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and torch.equal(g.cpu(), w)
    return want[1]


@pytest.mark.parametrize("depth,k,budget", [(4, 3, 10), (6, 5, 16), (3, 2, 1)])
def test_matches_reference_walk(depth, k, budget):
    gen = torch.Generator().manual_seed(depth * 100 + budget)
    tree, argmax = tree_and_argmax(8, depth, k, budget, 0.8, gen)
    assert_same(tree, argmax, depth)


def test_by_hand_and_no_match():
    # root -> a(0) -> c(2) ; root -> b(1) -> d(3) ; tokens a=5 b=6 c=7 d=7
    tree = TreeBatch(torch.tensor([[5, 6, 7, 7]]), torch.tensor([[1, 1, 2, 2]]), torch.tensor([[-1, -1, 0, 1]]),
                     torch.zeros(1, 4, 4, dtype=torch.bool))
    accepted, accept_len, bonus = tree_accept(tree.to(DEVICE), torch.tensor([[6, 9, 7, 1, 4]], device=DEVICE), 2)
    assert accepted.tolist() == [[1, 3]] and accept_len.tolist() == [2] and bonus.tolist() == [4]
    assert_same(tree, torch.tensor([[8, 0, 0, 0, 0]]), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", [8, 16, 32, 64])
def test_matches_reference_engine_sizes_on_gpu(budget):
    gen = torch.Generator().manual_seed(budget)
    lengths = set()
    for agree in (0.5, 0.9, 1.0):
        tree, argmax = tree_and_argmax(64, 15, budget, budget, agree, gen)
        lengths |= set(assert_same(tree, argmax, 15).tolist())
    assert len(lengths) >= 3
