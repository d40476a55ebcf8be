"""rms_norm vs engine.model.RMSNorm's formula in float64, and a row's bits alone vs in a batch.

On the CPU (Triton interpreter) float32 and bfloat16 rows (no `tl.dot`, so bf16 runs here too); the
`gpu` test runs K2's widths (7168 hidden, 1536 q latent, 512 kv latent) in bf16 over 1 to 1,088 rows.
"""

import pytest
import torch

from triton_kernels.rms_norm import rms_norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = [1, 2, int(torch.randint(2**31, ()))]


def float64_rms_norm(x, weight, eps):
    xd = x.double()
    return weight.double() * (xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("rows, dim", [(1, 48), (9, 200), (33, 512)])
def test_matches_float64(seed, dtype, tolerance, rows, dim):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, dim, generator=gen) * 3).to(dtype).to(DEVICE)
    weight = (1 + torch.randn(dim, generator=gen) / 4).to(dtype).to(DEVICE)
    got = rms_norm(x, weight, 1e-6)
    want = float64_rms_norm(x, weight, 1e-6)
    assert got.dtype == dtype and ((got.double() - want).norm() / want.norm()).item() < tolerance


def test_rows_of_a_strided_view_and_no_rows():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, 6, 64, generator=gen).to(DEVICE)[:, ::2]  # rows not evenly spaced in memory
    weight = torch.rand(64, generator=gen).to(DEVICE)
    assert torch.allclose(rms_norm(x, weight, 1e-5).double(), float64_rms_norm(x, weight, 1e-5), rtol=1e-5)
    assert rms_norm(x[:0], weight, 1e-5).shape == (0, 3, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [7168, 1536, 512])
def test_k2_widths_are_batch_invariant_on_gpu(dim):
    gen = torch.Generator().manual_seed(dim)
    x = torch.randn(1088, dim, generator=gen).to(torch.bfloat16).cuda()
    weight = (1 + torch.randn(dim, generator=gen) / 4).to(torch.bfloat16).cuda()
    full = rms_norm(x, weight, 1e-6)
    want = float64_rms_norm(x, weight, 1e-6)
    assert ((full.double() - want).norm() / want.norm()).item() < 1e-2
    for m in (1, 8, 17, 64, 136, 544):
        assert torch.equal(rms_norm(x[:m], weight, 1e-6)[0], full[0]), m
