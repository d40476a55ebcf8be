"""combine_splits (both of its kernels) vs its float64 reference on random partials.

Unmarked tests run in the Triton interpreter on the CPU and compiled on CUDA alike: float32 outputs
must match float64 (of the same partials) to ~1e-5, from float32 or bfloat16 partial outputs. Split
counts straddle COMBINE_LOOP_MAX_SPLITS so that each kernel runs; head counts that are not a
multiple of a tile and empty splits (o = 0, lse = -inf) are included.
"""

import pytest
import torch

from triton_kernels.combine_splits import COMBINE_LOOP_MAX_SPLITS, combine_splits, combine_splits_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def partials(queries, splits, heads, v_dim, seed):
    """Partials as attention leaves them: normalised outputs (|o| <= max|v|) and base-2 log-sum-exps."""
    gen = torch.Generator().manual_seed(seed)
    o = torch.rand(queries, splits, heads, v_dim, generator=gen) * 2 - 1
    lse = torch.randn(queries, splits, heads, generator=gen) * 8
    empty = torch.rand(queries, splits, generator=gen) < 0.3
    empty[:, 0] = False  # split 0 always holds keys
    o[empty], lse[empty] = 0.0, float("-inf")
    return o, lse


@pytest.mark.parametrize("o_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [2, 3, COMBINE_LOOP_MAX_SPLITS, COMBINE_LOOP_MAX_SPLITS + 1, 16, 33])
@pytest.mark.parametrize("heads,v_dim", [(5, 16), (20, 32)])
def test_float32_matches_float64_reference(splits, heads, v_dim, o_dtype):
    o, lse = partials(3, splits, heads, v_dim, seed=splits * 100 + heads)
    o = o.to(o_dtype)
    out = torch.empty(3, heads, v_dim, device=DEVICE)
    combine_splits(o.to(DEVICE), lse.to(DEVICE), out, 3, splits, heads, v_dim)
    want = combine_splits_reference(o.double(), lse.double())
    assert ((out.cpu().double() - want).norm() / want.norm()).item() < 1e-5


def test_one_split_with_keys_among_empty_ones_is_returned_as_is():
    o, lse = partials(1, 12, 4, 16, seed=1)
    o[:, 1:], lse[:, 1:] = 0.0, float("-inf")
    out = torch.empty(1, 4, 16, device=DEVICE)
    combine_splits(o.to(DEVICE), lse.to(DEVICE), out, 1, 12, 4, 16)
    torch.testing.assert_close(out.cpu(), o[:, 0], rtol=1e-6, atol=0)


def test_many_splits_merge_value_slices_of_a_wide_head():
    # 100 splits of 256 value dims: the all-splits kernel takes the dims in slices (COMBINE_TILE)
    o, lse = partials(2, 100, 3, 256, seed=7)
    out = torch.empty(2, 3, 256, device=DEVICE)
    combine_splits(o.to(DEVICE), lse.to(DEVICE), out, 2, 100, 3, 256)
    want = combine_splits_reference(o.double(), lse.double())
    assert ((out.cpu().double() - want).norm() / want.norm()).item() < 1e-5
