"""GPU tree builder vs `engine.tree.build_tree_cpu`: every output tensor must be bit-identical.

Where each case runs: the unmarked tests run the Triton kernel in the interpreter on the CPU
(`TRITON_INTERPRET=1`, float32 and bfloat16 log-probs; this kernel has no `tl.dot`, so bf16 is fine
there); the `gpu` tests run the compiled kernel on CUDA at the engine's sizes (bs 64, L 15, K = budget
up to 32) in float32 and bfloat16.
"""

import pytest
import torch

from engine.tree import build_tree_cpu, max_tree_size
from triton_kernels.tree_build import build_tree_gpu

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def drafter_topk(bs, depth, k, generator):
    """Drafter-like sorted top-k log-probs of random logits, and token ids."""
    logits = torch.randn(bs, depth, 4 * k + 8, generator=generator) * 3
    lq = torch.log_softmax(logits, dim=-1).topk(k, dim=-1).values
    return lq, torch.randint(0, 163840, (bs, depth, k), generator=generator)


def tied_topk(bs, depth, k, generator):
    """Few distinct, exactly representable values: equal cumulative scores everywhere."""
    lq = (-torch.randint(0, 4, (bs, depth, k), generator=generator).float() / 2).sort(-1, True).values
    return lq, torch.randint(0, 1000, (bs, depth, k), generator=generator)


def rounding_topk(bs, depth, k, generator):
    """Values 1e-9 beside 1 and 2, with repeats: float64 sums round and near-ties abound.

    On such inputs a few percent of trees change if a prefix's score is summed from its parent's
    instead of along the CPU's sibling chain: the builder must follow the CPU's exact float64 order.
    """
    pool = torch.tensor([-2e-9, -1e-9, -1.0, -1.0, -3e-9, -2.0, -4e-9])
    lq = pool[torch.randint(0, len(pool), (bs, depth, k), generator=generator)].sort(-1, True).values
    return lq, torch.randint(0, 1000, (bs, depth, k), generator=generator)


def assert_same_tree(lq, ids, budget):
    want = build_tree_cpu(lq, ids, budget)
    got = build_tree_gpu(lq.to(DEVICE), ids.to(DEVICE), budget)
    for name in ("token_ids", "depths", "parents", "visibility"):
        w, g = getattr(want, name), getattr(got, name)
        assert g.device.type == DEVICE and g.dtype == w.dtype, name
        assert torch.equal(g.cpu(), w), f"{name} differs"


@pytest.mark.parametrize("make", [drafter_topk, tied_topk, rounding_topk])
@pytest.mark.parametrize("depth,k,budget", [(4, 4, 30), (15, 8, 8), (6, 16, 16), (1, 4, 3), (5, 12, 40)])
def test_matches_cpu_heapq_float32(make, depth, k, budget):
    gen = torch.Generator().manual_seed(depth * 1000 + k * 10 + budget)
    lq, ids = make(3, depth, k, gen)
    assert_same_tree(lq, ids, budget)


def test_float64_rounding_case_follows_the_sibling_chain():
    # Scoring each prefix as parent score + own log-prob would pick token 8 as the 10th node here;
    # the CPU's chain (score - lq[r] + lq[r + 1]) rounds differently and picks token 7.
    lq = torch.tensor([[[-4e-9, -1.0, -2.0], [-3e-9, -1.0, -2.0], [-1e-9, -4e-9, -1.0]]])
    ids = torch.arange(9).reshape(1, 3, 3)
    assert build_tree_cpu(lq, ids, 10).token_ids[0].tolist() == [0, 3, 6, 7, 1, 3, 4, 6, 6, 7]
    assert_same_tree(lq, ids, 10)


def test_bfloat16_input_int32_ids_and_single_request():
    gen = torch.Generator().manual_seed(11)
    lq, ids = drafter_topk(2, 5, 6, gen)
    assert_same_tree(lq.bfloat16(), ids.int(), 12)
    assert_same_tree(lq[0], ids[0], 9)  # [L, K] input -> a batch of one


def test_an_empty_batch_builds_empty_trees():
    lq, ids = torch.zeros(0, 4, 3), torch.zeros(0, 4, 3, dtype=torch.int64)
    assert_same_tree(lq, ids, 5)
    assert build_tree_cpu(lq, ids, 5).visibility.shape == (0, 5, 5)


def test_whole_tree_and_k_larger_than_budget():
    gen = torch.Generator().manual_seed(5)
    lq, ids = tied_topk(2, 3, 2, gen)
    assert_same_tree(lq, ids, max_tree_size(3, 2))
    lq, ids = drafter_topk(2, 4, 40, gen)
    assert_same_tree(lq, ids, 10)


@pytest.mark.parametrize("budget", [0, max_tree_size(2, 2) + 1])
def test_impossible_budget_is_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        build_tree_gpu(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.int64), budget)


@pytest.mark.parametrize("depth,budget", [(16, 48), (40, 32), (8, 64)])
def test_budget_above_kernel_limit_is_refused(depth, budget):
    # Rank-path keys are one int64: budget + min(L, budget) must be <= 63 (48 at L = 15 is the most).
    with pytest.raises(ValueError, match=r"budget \+ min\(L, budget\) <= 63"):
        build_tree_gpu(torch.zeros(depth, 16), torch.zeros(depth, 16, dtype=torch.int64), budget)


@pytest.mark.gpu
@pytest.mark.parametrize("make", [drafter_topk, tied_topk, rounding_topk])
@pytest.mark.parametrize("budget", [8, 16, 32, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_cpu_heapq_engine_sizes_on_gpu(make, budget, dtype):
    gen = torch.Generator().manual_seed(budget)
    for _ in range(3):  # fresh inputs each round
        lq, ids = make(64, 15, budget, gen)
        assert_same_tree(lq.to(dtype), ids, budget)
