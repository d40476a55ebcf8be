"""The DFlash-style block drafter: one non-causal forward proposes all L future tokens at once.

Input: the target's own embeddings of `[bonus, MASK x L]`. Conditioning: the target's hidden
states at the committed positions (several target layers, concatenated), projected by `fc` to the
hidden size and RMS-normed: the *context*. In every drafter layer the block's queries attend,
without a causal mask, to keys/values from [context ; block]. The block's last L hidden states go
through the target's final norm and lm_head: logits for depths 1..L, whose top-K (minus logsumexp)
are the per-depth log-probs the DDTree builder needs.

The context's keys/values are cached per slot (`DrafterCache`), one row per committed position,
so each step only projects the few tokens committed since the last one. The forward itself is plain
differentiable PyTorch (context keys/values in, hidden states out), so training can call
`context_kv` on whole sequences and then `forward`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.config import DrafterConfig, ModelConfig
from engine.errors import EngineError
from engine.model import MLP, RMSNorm, Rotary, init_random, linear


NO_PLANNING_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class DrafterAttention(nn.Module):
    def __init__(self, hidden: int, config: DrafterConfig):
        super().__init__()
        inner = config.num_attention_heads * config.head_dim
        self.q_proj = nn.Linear(hidden, inner, bias=False)
        self.k_proj = nn.Linear(hidden, inner, bias=False)
        self.v_proj = nn.Linear(hidden, inner, bias=False)
        self.o_proj = nn.Linear(inner, hidden, bias=False)
        self.heads = config.num_attention_heads

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor, rotary: Rotary) -> torch.Tensor:
        """x [bs, n, hidden] -> [bs, n, 2 * inner]: roped keys, then values (one cacheable row per token)."""
        k = rotary(linear(x, self.k_proj.weight).unflatten(-1, (self.heads, -1)), positions).flatten(-2)
        return torch.cat([k, linear(x, self.v_proj.weight)], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, context: torch.Tensor, context_valid: torch.Tensor,
                rotary: Rotary, visible: torch.Tensor | None = None) -> torch.Tensor:
        """Block x [bs, S, hidden] attends to [context [bs, n, 2*inner] ; block], all of the block visible
        (or what `visible` [bs, S, n + S] allows, see `Drafter.forward`)."""
        bs, block = x.shape[:2]
        q = rotary(linear(x, self.q_proj.weight).unflatten(-1, (self.heads, -1)), positions)
        keys_values = torch.cat([context.to(x.dtype), self.keys_values(x, positions, rotary)], dim=1)
        k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in keys_values.chunk(2, dim=-1))
        if visible is None:
            visible = torch.cat([context_valid, context_valid.new_ones(bs, block)], dim=1)[:, None, :]
        # Not cuDNN's attention: it plans each new (batch, context) shape, 49-81 ms of host time per plan on
        # the H200 (17 of 31 k2-layer draft steps paid one in gpu_captures_h200_k2_fused_moe.json).
        with sdpa_kernel(NO_PLANNING_BACKENDS):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=visible[:, None])
        return linear(out.transpose(1, 2).flatten(-2), self.o_proj.weight)


class DrafterLayer(nn.Module):
    def __init__(self, hidden: int, config: DrafterConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.self_attn = DrafterAttention(hidden, config)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.mlp = MLP(hidden, config.intermediate_size)


class Drafter(nn.Module):
    def __init__(self, config: DrafterConfig, target_config: ModelConfig):
        super().__init__()
        hidden = target_config.hidden_size
        self.config = config
        self.target_config = target_config
        self.fc = nn.Linear(hidden * len(config.target_layer_ids), hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(hidden, config) for _ in range(config.num_hidden_layers))
        self.rotary = Rotary(config.head_dim, config.rope_theta, None, target_config.max_position_embeddings)

    @property
    def kv_width(self) -> int:
        return 2 * self.config.num_attention_heads * self.config.head_dim

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Target features [bs, n, hidden * len(target_layer_ids)] at positions [bs, n]
        -> every layer's context keys/values [num_layers, bs, n, kv_width]."""
        context = self.hidden_norm(linear(features, self.fc.weight))
        return torch.stack([layer.self_attn.keys_values(context, positions, self.rotary) for layer in self.layers])

    def forward(self, block_embeds: torch.Tensor, positions: torch.Tensor, context: torch.Tensor,
                context_valid: torch.Tensor | None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """block_embeds [bs, S, hidden] (target embeddings of [bonus, MASK...]) at positions [bs, S];
        context [num_layers, bs, n, kv_width] with context_valid [bs, n] bool -> hidden [bs, S, hidden].

        `visible` [bs, S, n + S] bool, if given, replaces that mask: training packs many blocks of one
        sequence into one row, each seeing only its own context prefix and its own block."""
        x = block_embeds
        for layer, layer_context in zip(self.layers, context):
            x = x + layer.self_attn(layer.input_layernorm(x), positions, layer_context, context_valid, self.rotary,
                                    visible)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x

    def save(self, path: str) -> None:
        """Weights as safetensors, with both configs in the metadata so `load` needs nothing else.
        One metadata entry: safetensors writes several in hash order, so the same drafter saved twice
        gave different bytes."""
        configs = json.dumps({"drafter": self.config.to_dict(), "target": self.target_config.to_dict()})
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, path, metadata={"configs": configs})

    @classmethod
    def load(cls, path: str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Drafter:
        from engine.weights import open_safetensors, require_finite

        with open_safetensors(Path(path)) as f:
            meta = f.metadata() or {}
        try:
            configs = json.loads(meta["configs"])
            drafter = build_drafter(DrafterConfig.from_dict(configs["drafter"]),
                                    ModelConfig.from_dict(configs["target"]), device=device, dtype=dtype)
            drafter.load_state_dict(load_file(path, device=str(device)))
        except KeyError as e:  # no configs (drafters saved before they were one entry had two), or partial ones
            raise EngineError(f"{path}: not a drafter this engine can load (no {e} in its metadata)") from None
        except (EngineError, TypeError, ValueError, RuntimeError) as e:  # foreign configs, other shapes
            raise EngineError(f"{path}: not a drafter this engine can load ({str(e).splitlines()[0]})") from None
        require_finite(drafter, path)
        return drafter


def build_drafter(config: DrafterConfig, target_config: ModelConfig, *, seed: int = 1,
                  device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> Drafter:
    """A drafter with seeded random weights, on `device`, in the target's dtype."""
    with torch.device(device):
        drafter = Drafter(config, target_config)
    drafter.to(dtype or getattr(torch, target_config.torch_dtype))
    drafter.rotary.float()
    init_random(drafter, seed)
    return drafter.eval().requires_grad_(False)


CONTEXT_BUCKET = 256  # context rows the drafter attends over come in multiples of this (see DrafterCache.context)


class DrafterCache:
    """Context keys/values per slot: kv [num_layers, n_slots, rows, kv_width]; row p holds the
    context of committed position p."""

    def __init__(self, drafter: Drafter, n_slots: int, rows: int):
        self.kv = torch.zeros(len(drafter.layers), n_slots, rows, drafter.kv_width,
                              dtype=drafter.fc.weight.dtype, device=drafter.fc.weight.device)

    def append(self, drafter: Drafter, slots: torch.Tensor, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Project features [bs, n, F] of the tokens at positions [bs, n] and store their rows."""
        self.kv[:, slots[:, None], positions] = drafter.context_kv(features, positions).to(self.kv.dtype)

    @property
    def rows(self) -> int:
        return self.kv.shape[2]

    def context(self, slots: torch.Tensor, lengths: torch.Tensor, rows: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [0, n) of each slot and which of them are valid ([bs, n] bool). n is `rows` when given
        (the static-shape step passes the capacity: no host read, one shape), else the longest length
        rounded up to CONTEXT_BUCKET rows, read from the device: on the H200 the attention ran through
        cuDNN, which plans each new shape (~38 ms, longer than the rest of a K2-shaped draft) and
        would meet a new length every step."""
        n = rows if rows is not None else min(-(-int(lengths.max()) // CONTEXT_BUCKET) * CONTEXT_BUCKET, self.rows)
        valid = torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]
        return self.kv[:, slots, :n], valid


def propose(drafter: Drafter, target, cache: DrafterCache, slots: torch.Tensor, context_lens: torch.Tensor,
            bonus: torch.Tensor, top_k: int, context_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafter forward per request over [bonus, MASK x L]: top_log_probs and top_token_ids [bs, L, K]
    (over `context_rows` context rows when given, see `DrafterCache.context`)."""
    depth = drafter.config.depth
    block = torch.cat([bonus[:, None], bonus.new_full((bonus.shape[0], depth), drafter.config.mask_token_id)], dim=1)
    positions = context_lens[:, None] + torch.arange(depth + 1, device=bonus.device)
    context, valid = cache.context(slots, context_lens, context_rows)
    hidden = drafter(target.embed(block), positions, context, valid)
    logits = target.logits(hidden[:, 1:])  # [bs, L, vocab] float32
    top = logits.topk(top_k, dim=-1)
    return top.values - logits.logsumexp(-1, keepdim=True), top.indices
