"""The fused MoE under expert parallelism: one rank's stacked experts, ids relative to its first."""

import pytest
import torch

from tests.engine.expert_parallel_ranks import moe_layer
from tests.engine.test_expert_parallel import shard
from triton_kernels.fused_moe import combine_pairs, routed_pairs


@pytest.mark.parametrize("world", [2, 4])
def test_fused_path_takes_the_ranks_slice(world):
    """The fused kernels (on the GPU, or Triton's interpreter on the CPU) given one rank's stacked
    experts and the ids relative to its first: other ranks' pairs stay zero; the ranks' outputs sum to
    the whole layer's."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    whole = moe_layer().to(device)
    whole.stack_experts(device)
    x = torch.randn(23, whole.gate.weight.shape[1], device=device)
    weights, experts = whole.gate(x)
    full = routed_pairs(x, weights, experts, *whole.stacked())
    total = torch.zeros_like(full)
    for rank in range(world):
        part = moe_layer(shard(rank, world)).to(device)
        part.stack_experts(device)
        mine = routed_pairs(x, weights, experts - part.experts.ids[0], *part.stacked())
        held = (experts >= part.experts.ids[0]) & (experts <= part.experts.ids[-1])
        assert torch.all(mine[~held] == 0)
        total = total + mine
    assert torch.equal(total, full)
    shared = whole.shared_experts(x)
    assert torch.equal(combine_pairs(total, shared), combine_pairs(full, shared))
