"""RMSNorm with one program per row: a row's sum of squares is always reduced the same way.

PyTorch's reduction kernels choose how to split a row's sum from the number of rows (few rows get
a row spread over more threads and blocks), so `x.pow(2).mean(-1)` on the GPU gives a token's norm
different last bits alone than inside a verify block: one of the ops that broke greedy DDTree ==
AR in bf16 (issue 29). Here the whole row is one block, reduced by one `tl.sum`, whatever the batch.

Reference: `engine.model.RMSNorm` on the CPU (the same formula: float32, division by the square
root, then the weight times the result cast back to the input dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, stride_x, stride_out, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    normed = x / tl.sqrt_rn(tl.sum(x * x, axis=0) / D + eps)
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    # As the reference: the normalised row is rounded to x's dtype first, then scaled. The product of
    # two 16-bit floats is exact in float32, so rounding it once equals PyTorch's 16-bit multiply.
    out = weight * normed.to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=inside)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] normalised over D and scaled by weight [D]; the result in x's and weight's promoted dtype."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, rows.stride(0), out.stride(0), d, eps,
                                           BLOCK=triton.next_power_of_2(d), num_warps=4 if d <= 2048 else 8)
    return out.reshape(*x.shape[:-1], d)
