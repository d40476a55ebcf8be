"""The CPU heapq tree builder against brute-force enumeration of the top-B prefixes."""

import itertools

import pytest
import torch

from engine.tree import build_tree_cpu, max_tree_size


def brute_force_tree(lq, ids, budget):
    """All prefixes, scored by their cumulative log-prob, sorted by (-score, rank path): the top B."""
    depth_limit, k = len(lq), len(lq[0])
    paths = [p for d in range(1, depth_limit + 1) for p in itertools.product(range(k), repeat=d)]
    score = {p: sum(lq[d][r] for d, r in enumerate(p)) for p in paths}
    chosen = sorted(paths, key=lambda p: (-score[p], p))[:budget]
    index = {p: i for i, p in enumerate(chosen)}
    tokens = [ids[len(p) - 1][p[-1]] for p in chosen]
    depths = [len(p) for p in chosen]
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in chosen]
    return tokens, depths, parents


def visibility_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """[bs, B] parent indices -> [bs, B, B] ancestor-or-self mask: the slow, obvious definition."""
    bs, budget = parents.shape
    vis = torch.zeros(bs, budget, budget, dtype=torch.bool)
    for b in range(bs):
        for i in range(budget):
            vis[b, i, i] = True
            if parents[b, i] >= 0:
                vis[b, i] |= vis[b, parents[b, i]]
    return vis


def random_topk(bs, depth, k, *, ties, generator):
    """Drafter-like [bs, L, K] top-k log-probs (sorted, <= 0) and token ids."""
    if ties:  # few distinct, exactly representable values: many equal cumulative scores
        lq = -torch.randint(0, 4, (bs, depth, k), generator=generator).float() / 2
        lq = lq.sort(dim=-1, descending=True).values
    else:
        logits = torch.randn(bs, depth, 50, generator=generator) * 2
        lq = torch.log_softmax(logits, dim=-1).topk(k, dim=-1).values
    ids = torch.randint(0, 1000, (bs, depth, k), generator=generator)
    return lq, ids


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("depth,k,budget", [(1, 4, 3), (3, 3, 8), (4, 2, 16), (4, 4, 30), (5, 3, 7)])
def test_matches_brute_force_top_prefixes(depth, k, budget, ties):
    gen = torch.Generator().manual_seed(depth * 100 + k * 10 + budget + ties)
    lq, ids = random_topk(6, depth, k, ties=ties, generator=gen)
    tree = build_tree_cpu(lq, ids, budget)
    for b in range(lq.shape[0]):
        tokens, depths, parents = brute_force_tree(lq[b].tolist(), ids[b].tolist(), budget)
        assert tree.token_ids[b].tolist() == tokens
        assert tree.depths[b].tolist() == depths
        assert tree.parents[b].tolist() == parents


def test_all_equal_scores_order_by_rank_path():
    lq = torch.zeros(1, 2, 3)
    ids = torch.arange(6).reshape(1, 2, 3)
    tree = build_tree_cpu(lq, ids, 12)
    # Paths in lexicographic order: (0) (0,0) (0,1) (0,2) (1) (1,0) ... each parent before children.
    assert tree.depths[0].tolist() == [1, 2, 2, 2, 1, 2, 2, 2, 1, 2, 2, 2]
    assert tree.parents[0].tolist() == [-1, 0, 0, 0, -1, 4, 4, 4, -1, 8, 8, 8]
    assert tree.token_ids[0].tolist() == [0, 3, 4, 5, 1, 3, 4, 5, 2, 3, 4, 5]


def test_visibility_is_ancestor_or_self():
    gen = torch.Generator().manual_seed(7)
    lq, ids = random_topk(4, 5, 4, ties=False, generator=gen)
    tree = build_tree_cpu(lq, ids, 20)
    for b in range(4):
        parents = tree.parents[b].tolist()
        for i in range(20):
            ancestors, node = {i}, parents[i]
            while node >= 0:
                assert node < i
                ancestors.add(node)
                node = parents[node]
            assert set(torch.nonzero(tree.visibility[b, i]).flatten().tolist()) == ancestors


def test_single_request_shape():
    lq, ids = random_topk(1, 3, 3, ties=False, generator=torch.Generator().manual_seed(1))
    tree = build_tree_cpu(lq[0], ids[0], 5)
    assert tree.token_ids.shape == (1, 5) and tree.visibility.shape == (1, 5, 5)


@pytest.mark.parametrize("budget", [1, 63, 64, 65, 130])
def test_bit_set_visibility_equals_the_parent_walk_across_word_boundaries(budget):
    lq, ids = random_topk(3, 40, 4, ties=True, generator=torch.Generator().manual_seed(budget))
    tree = build_tree_cpu(lq, ids, budget)
    assert torch.equal(tree.visibility, visibility_from_parents(tree.parents))


@pytest.mark.parametrize("budget", [0, max_tree_size(2, 2) + 1])
def test_impossible_budget_is_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        build_tree_cpu(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64), budget)
