"""combine_splits (both of its kernels) vs its float64 reference on random partial states.

Unmarked tests run in the Triton interpreter on the CPU and compiled on CUDA alike: float32 outputs
must match float64 to ~1e-5. Split counts straddle COMBINE_LOOP_MAX_SPLITS so that each kernel runs;
head counts that are not a multiple of a tile and empty splits (-inf, 0, 0) are included.
"""

import pytest
import torch

from triton_kernels.combine_splits import COMBINE_LOOP_MAX_SPLITS, combine_splits, combine_splits_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def partial_states(queries, splits, heads, v_dim, seed):
    """Partial states as attention leaves them: l > 0 and |acc| <= l * max|v| where a split saw keys."""
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(queries, splits, heads, generator=gen) * 8
    l = torch.rand(queries, splits, heads, generator=gen) * 30 + 1
    acc = (torch.rand(queries, splits, heads, v_dim, generator=gen) * 2 - 1) * l[..., None]
    empty = torch.rand(queries, splits, generator=gen) < 0.3
    empty[:, 0] = False  # split 0 always holds keys
    m[empty], l[empty], acc[empty] = float("-inf"), 0.0, 0.0
    return acc, m, l


@pytest.mark.parametrize("splits", [2, 3, COMBINE_LOOP_MAX_SPLITS, COMBINE_LOOP_MAX_SPLITS + 1, 16, 33])
@pytest.mark.parametrize("heads,v_dim", [(5, 16), (20, 32)])
def test_float32_matches_float64_reference(splits, heads, v_dim):
    acc, m, l = partial_states(3, splits, heads, v_dim, seed=splits * 100 + heads)
    out = torch.empty(3, heads, v_dim, device=DEVICE)
    combine_splits(acc.to(DEVICE), m.to(DEVICE), l.to(DEVICE), out, 3, splits, heads, v_dim)
    want = combine_splits_reference(acc.double(), m.double(), l.double())
    assert ((out.cpu().double() - want).norm() / want.norm()).item() < 1e-5


def test_one_split_with_keys_among_empty_ones_is_returned_as_is():
    acc, m, l = partial_states(1, 12, 4, 16, seed=1)
    m[:, 1:], l[:, 1:], acc[:, 1:] = float("-inf"), 0.0, 0.0
    out = torch.empty(1, 4, 16, device=DEVICE)
    combine_splits(acc.to(DEVICE), m.to(DEVICE), l.to(DEVICE), out, 1, 12, 4, 16)
    torch.testing.assert_close(out.cpu(), acc[:, 0] / l[:, 0, :, None], rtol=1e-6, atol=0)
