"""FP8 block-quantized weights, as DeepSeek-V3 and Kimi-K2 are published.

Such a checkpoint's config.json holds `quantization_config` = {"quant_method": "fp8", "fmt": "e4m3",
"weight_block_size": [128, 128], "activation_scheme": "dynamic"}; a quantized weight W [out, in] is
stored as float8_e4m3fn next to `W_scale_inv` [ceil(out/128), ceil(in/128)] float32, one scale per
128 x 128 block (the original is W8 * scale_inv). The engine dequantizes each weight to its compute
dtype as it reads it, as DeepSeek's own fp8_cast_bf16.py does to the whole checkpoint, and computes
in that dtype (activations are not quantized).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.errors import EngineError

SCALE_SUFFIX = "_scale_inv"  # model.layers.0.self_attn.q_a_proj.weight -> ...q_a_proj.weight_scale_inv


def block_size(quantization_config) -> tuple[int, int] | None:
    """The [rows, cols] of one scale block, or None for an unquantized checkpoint; anything but
    dynamic FP8 e4m3 with block scales is refused in one line."""
    if quantization_config is None:
        return None
    q = quantization_config
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise EngineError(f"quantization_config quant_method {method!r} is not supported (only 'fp8', block-scaled)")
    if q.get("fmt", "e4m3") != "e4m3":
        raise EngineError(f"quantization_config fmt {q['fmt']!r} is not supported (only 'e4m3')")
    if q.get("activation_scheme", "dynamic") != "dynamic":
        raise EngineError(f"quantization_config activation_scheme {q['activation_scheme']!r} is not supported "
                          "(only 'dynamic': no activation scales are read)")
    block = q.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)):
        raise EngineError(f"quantization_config weight_block_size {block!r} must be two positive ints "
                          "(per-tensor FP8 is not supported)")
    return block[0], block[1]


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype,
               name: str) -> torch.Tensor:
    """weight [out, in] float8_e4m3fn times its block's scale, computed in float32, returned in `dtype`."""
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise EngineError(f"{name} has a {SCALE_SUFFIX.lstrip('_')} but is {weight.dtype} {tuple(weight.shape)}, "
                          "not a float8_e4m3fn matrix")
    rows, cols = weight.shape
    blocks = (-(-rows // block[0]), -(-cols // block[1]))
    if tuple(scale_inv.shape) != blocks:
        raise EngineError(f"{name}{SCALE_SUFFIX} has shape {tuple(scale_inv.shape)}; {block[0]}x{block[1]} blocks "
                          f"of {name} {tuple(weight.shape)} need {blocks}")
    padded = F.pad(weight.float(), (0, blocks[1] * block[1] - cols, 0, blocks[0] * block[0] - rows))
    scaled = padded.view(blocks[0], block[0], blocks[1], block[1]) * scale_inv.float()[:, None, :, None]
    return scaled.view(blocks[0] * block[0], blocks[1] * block[1])[:rows, :cols].to(dtype)
