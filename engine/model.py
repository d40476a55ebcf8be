"""The target model: a Kimi-K2 / DeepSeek-V3 style transformer (MLA attention + MoE), in one file.

Read top to bottom: `linear` (why the CPU multiplies rows one at a time), RMSNorm, RoPE with
YaRN, MLA (decompressed for prefill, weight-absorbed over the latent cache for decode and tree
verify), the SwiGLU MLP and the routed MoE, the decoder layer, the model. Module and parameter
names follow the DeepSeek-V3 / Kimi-K2 checkpoints (`model.layers.N.self_attn.q_a_proj.weight`,
...), so `state_dict()` keys are the checkpoint's keys.
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import tree_attention
from engine.config import ModelConfig
from engine.expert_parallel import ExpertParallel
from engine.host_to_device import int64_on

# --- Numerics that do not depend on batch composition -------------------------------------------

_batch_invariant = True  # see `set_batch_invariant`; False inside `plain_matmuls()`


def set_batch_invariant(on: bool) -> None:
    """Whether later forwards compute each row exactly as they would alone (the default, and what
    makes greedy DDTree equal AR token for token). Off, GEMMs and norms are the vendor's (cuBLAS,
    MKL, PyTorch's reductions), which pick their kernels by row count: faster, no longer exact."""
    global _batch_invariant
    _batch_invariant = on


@contextmanager
def batch_invariance(on: bool):
    """`set_batch_invariant(on)` inside the block only."""
    global _batch_invariant
    before, _batch_invariant = _batch_invariant, on
    try:
        yield
    finally:
        _batch_invariant = before


def plain_matmuls():
    """Vendor GEMMs and norms inside the block (training; `--no-batch-invariant`): several times
    faster on the CPU, but a row's result then depends on how many rows share the call, so greedy
    DDTree decoded inside it is no longer exactly AR's."""
    return batch_invariance(False)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] times weight [out, in]^T, each row's result independent of the others.

    On the CPU every row is its own [1, in] x [in, out] product (one bmm over the rows): MKL's GEMM
    picks different kernels for different row counts. On the GPU cuBLAS does the same, so the GEMM is
    triton_kernels/batch_invariant_matmul.py, tiled by the weight's shape alone. Either way a token's
    numbers are identical whether it is decoded alone, in a batch, or inside a verified tree, which
    makes greedy DDTree exactly lossless against autoregressive decoding.
    """
    if not _batch_invariant:
        return F.linear(x, weight)
    if x.is_cuda:
        from triton_kernels.batch_invariant_matmul import batch_invariant_linear
        return batch_invariant_linear(x, weight)
    rows = x.reshape(-1, 1, x.shape[-1]).contiguous()
    out = torch.bmm(rows, weight.t().expand(rows.shape[0], -1, -1))
    return out.reshape(*x.shape[:-1], weight.shape[0])


def compile_linears(modules, max_rows: int) -> int:
    """On the GPU with batch invariance on, compile the batch-invariant GEMM's kernels for every M
    up to max_rows that `linear` may meet with these modules' 2-D weights, one weight per shape
    (batch_invariant_matmul.compile_blockings): before a measured run, not in its first prefill.
    Returns the products run (0 on the CPU or with vendor numerics)."""
    weights = {(tuple(p.shape), p.dtype, p.device): p for module in modules for p in module.parameters()
               if p.ndim == 2 and p.is_cuda}
    if not _batch_invariant or not weights:
        return 0
    from triton_kernels.batch_invariant_matmul import compile_blockings
    with torch.no_grad():
        return sum(compile_blockings(w, max_rows) for w in weights.values())


def per_head(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., H, a] times each head's own matrix weight [H, b, a] -> [..., H, b]."""
    if not _batch_invariant:
        return torch.einsum("...ha,hba->...hb", x, weight)
    if x.is_cuda:
        from triton_kernels.batch_invariant_matmul import batch_invariant_per_head
        return batch_invariant_per_head(x, weight)
    return torch.stack([linear(x[..., h, :], weight[h]) for h in range(weight.shape[0])], dim=-2)


def ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """x summed over its last (short) axis left to right: a fixed order, where a reduction kernel's
    order may change with the number of rows."""
    total = x[..., 0]
    for j in range(1, x.shape[-1]):
        total = total + x[..., j]
    return total


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    # Written out: torch's vectorised sigmoid and its scalar tail loop differ in the last bit,
    # so the built-in result depends on where an element sits in the tensor.
    return 1.0 / (1.0 + torch.exp(-x))


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * sigmoid(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and _batch_invariant:  # PyTorch's row reduction splits a row by the row count
            from triton_kernels.rms_norm import rms_norm
            return rms_norm(x, self.weight, self.eps)
        xf = x.float()
        # Division by sqrt, not rsqrt: sqrt and division are exactly rounded everywhere.
        xf = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


# --- Rotary position embedding with YaRN ---------------------------------------------------------


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature m = 0.1 * mscale * ln(factor) + 1 (1 without scaling)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_frequencies(dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """[dim/2] rotation frequencies; YaRN keeps the fast ones, divides the slow ones by `factor`,
    and blends in between by a linear ramp over the correction range (DeepSeek-V3; the range's
    ends rounded outwards unless `truncate` is false, as transformers reads that key)."""
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if not scaling:
        return freqs

    def correction_dim(rotations: float) -> float:
        original = scaling["original_max_position_embeddings"]
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(scaling.get("beta_fast", 32)), correction_dim(scaling.get("beta_slow", 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    return freqs / scaling["factor"] * ramp + freqs * (1 - ramp)


def yarn_magnitude(scaling: dict | None) -> float:
    """How much YaRN scales cos and sin: `attention_factor` when the config names one (transformers'
    key), else mscale(factor) / mscale_all_dim(factor) as DeepSeek-V3's own code computes it."""
    if not scaling:
        return 1.0
    if "attention_factor" in scaling:
        return scaling["attention_factor"]
    factor = scaling["factor"]
    return yarn_mscale(factor, scaling.get("mscale", 1)) / yarn_mscale(factor, scaling.get("mscale_all_dim", 0))


class Rotary(nn.Module):
    """cos/sin tables for every position, computed once (so a position's values never vary).

    The pairs rotated together: adjacent dims (2i, 2i + 1) when `interleaved` (DeepSeek-V3's and
    Kimi-K2's checkpoints, config `rope_interleave: true`), else dims i and i + dim/2 (the rotate-half
    layout of Llama-style checkpoints, `rope_interleave: false`)."""

    def __init__(self, dim: int, theta: float, scaling: dict | None, max_positions: int, interleaved: bool = True):
        super().__init__()
        self.dim, self.theta, self.scaling, self.interleaved = dim, theta, scaling, interleaved
        self.register_buffer("cos", torch.empty(max_positions, dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, dim // 2), persistent=False)
        self.fill_tables()

    def fill_tables(self) -> None:
        """Compute the tables where they live (again after `to_empty` moved a meta model to a device)."""
        if self.cos.is_meta:
            return
        positions = torch.arange(self.cos.shape[0], dtype=torch.float64, device=self.cos.device)
        angles = torch.outer(positions, rope_frequencies(self.dim, self.theta, self.scaling).to(self.cos.device))
        magnitude = yarn_magnitude(self.scaling)
        with torch.no_grad():
            self.cos.copy_(angles.cos() * magnitude)
            self.sin.copy_(angles.sin() * magnitude)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate the pairs of x [..., P, (heads,) dim] by their positions [..., P]."""
        cos, sin = self.cos[positions], self.sin[positions]
        if x.dim() == positions.dim() + 2:  # a heads axis
            cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        pairs = x.float().unflatten(-1, (-1, 2) if self.interleaved else (2, -1))
        axis = -1 if self.interleaved else -2
        real, imag = pairs.select(axis, 0), pairs.select(axis, 1)
        rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=axis)
        return rotated.flatten(-2).to(x.dtype)


# --- Multi-head latent attention -----------------------------------------------------------------


LATENT_NORM_EPS = 1e-6


class MLA(nn.Module):
    """DeepSeek-V3 multi-head latent attention.

    Each token is compressed to a latent c_KV (kv_lora_rank) plus one roped key k_rope shared by
    all heads; only those (576 values at K2 dims) are cached. Per head, keys and values are
    W_UK c_KV and W_UV c_KV (the two halves of kv_b_proj). Prefill decompresses them; decode and
    verify instead absorb W_UK into the query and apply W_UV after attending over the latent rows.
    """

    def __init__(self, config: ModelConfig, rotary: Rotary):
        super().__init__()
        c = config
        self.config = c
        self.rotary = [rotary]  # shared with the model; a list keeps it out of this module's state
        heads = c.num_attention_heads
        # The two latent norms are built at eps 1e-6 whatever rms_norm_eps says, as DeepSeek-V3's
        # reference model.py and transformers' DeepseekV3Attention build them (vLLM and SGLang use
        # rms_norm_eps; the published configs and the presets say 1e-6, so all agree on them).
        if c.q_lora_rank:
            self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(c.q_lora_rank, heads * c.qk_head_dim, bias=False)
        else:  # no query compression (q_lora_rank null): DeepSeek-V2-Lite's plain q_proj
            self.q_proj = nn.Linear(c.hidden_size, heads * c.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, heads * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(heads * c.v_head_dim, c.hidden_size, bias=False)
        scaling = c.rope_scaling or {}
        mscale = yarn_mscale(scaling.get("factor", 1.0), scaling.get("mscale_all_dim", 0))
        self.softmax_scale = c.qk_head_dim ** -0.5 * mscale * mscale

    def queries(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> q_nope [..., H, nope], q_rope [..., H, rope] (roped)."""
        c = self.config
        if c.q_lora_rank:
            q = linear(self.q_a_layernorm(linear(x, self.q_a_proj.weight)), self.q_b_proj.weight)
        else:
            q = linear(x, self.q_proj.weight)
        q = q.unflatten(-1, (c.num_attention_heads, c.qk_head_dim))
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        return q_nope, self.rotary[0](q_rope, positions)

    def latent_rows(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> the cache rows [..., kv_lora_rank + rope]: normalised c_KV, roped k_rope."""
        c = self.config
        compressed, k_rope = linear(x, self.kv_a_proj_with_mqa.weight).split([c.kv_lora_rank, c.qk_rope_head_dim], -1)
        return torch.cat([self.kv_a_layernorm(compressed), self.rotary[0](k_rope, positions)], dim=-1)

    def _up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, nope, kv_lora_rank] and W_UV [H, v, kv_lora_rank], views of kv_b_proj."""
        c = self.config
        w = self.kv_b_proj.weight.view(c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        return w[:, :c.qk_nope_head_dim], w[:, c.qk_nope_head_dim:]

    def decompressed(self, x: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor, slot: int) -> torch.Tensor:
        """Causal attention over one sequence x [n, hidden] at positions [n] (prefill).

        Writes the n latent rows to kv [n_slots, max_len, D] at those positions of `slot`.
        """
        slot_of_row = torch.full_like(positions, slot)
        return self.decompressed_many(x, positions, kv, slot_of_row, [x.shape[0]])

    def decompressed_many(self, x: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor, slot_of_row: torch.Tensor,
                          lengths: list[int]) -> torch.Tensor:
        """`decompressed` for several sequences at once: x [sum(lengths), hidden] their rows
        concatenated, positions [sum(lengths)] each one's own, each row written to its slot
        (slot_of_row [sum(lengths)]). The row-wise projections and norms launch once for all rows
        (per sequence, a batched prefill of P prompts would launch each of them P times: an eager
        prefill's host time is its launches); only the attention itself, each sequence over itself,
        runs per sequence. A row's numbers are its sequence's alone wherever `linear` is
        batch-invariant (the default)."""
        rows = self.latent_rows(x, positions)
        kv[slot_of_row, positions] = rows.to(kv.dtype)
        q, k, v = self._decompress(x, positions, rows)
        outs = [self._causal_attention(*parts) for parts in zip(q.split(lengths), k.split(lengths), v.split(lengths))]
        return linear(torch.cat(outs).to(x.dtype).flatten(-2), self.o_proj.weight)

    def _causal_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One sequence's q, k, v [n, H, d] (float32) -> [n, H, v_head_dim], each row over itself
        and the rows before it."""
        scores = torch.einsum("qhd,khd->hqk", q, k) * self.softmax_scale
        n = q.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, v)

    def causal(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Causal attention over sequences x [bs, n, hidden] without a cache, for training: the
        decompressed form through PyTorch's fused attention (fast forward and backward)."""
        q, k, v = (t.transpose(1, 2) for t in self._decompress(x, positions, self.latent_rows(x, positions)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return linear(out.transpose(1, 2).to(x.dtype).flatten(-2), self.o_proj.weight)

    def _decompress(self, x: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head queries, keys and values [..., n, H, d] in float32 from x and its cache rows."""
        c = self.config
        latent, k_rope = rows.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        k_nope, v = linear(latent, self.kv_b_proj.weight).unflatten(-1, (c.num_attention_heads, -1)).split(
            [c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        q_nope, q_rope = self.queries(x, positions)
        q = torch.cat([q_nope, q_rope], dim=-1).float()
        k = torch.cat([k_nope, k_rope.unsqueeze(-2).expand_as(q_rope)], dim=-1).float()
        return q, k, v.float()

    def absorbed(self, x: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor,
                 prefix_lens: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
        """A block x [bs, T, hidden] per request attends over its slot's latent rows (decode, verify).

        The block's rows are written at [prefix_len, prefix_len + T); positions [bs, T] are the
        RoPE positions (prefix_len + depth in a tree); tree_mask [bs, T, T] as in `tree_attention`.
        """
        c = self.config
        rows = self.latent_rows(x, positions)
        block_rows = prefix_lens[:, None] + torch.arange(x.shape[1], device=x.device)
        kv[slots[:, None], block_rows] = rows.to(kv.dtype)
        w_uk, w_uv = self._up_projections()
        q_nope, q_rope = self.queries(x, positions)
        q = torch.cat([per_head(q_nope, w_uk.transpose(1, 2)), q_rope], dim=-1)  # [bs, T, H, kv_lora + rope]
        if q.is_cuda:  # the Triton kernel; splits fixed by the cache size keep a request's bits batch-independent
            from triton_kernels.tree_verify_attention import cache_num_splits, tree_verify_attention
            latent_out = tree_verify_attention(q, kv, slots, prefix_lens, tree_mask, self.softmax_scale,
                                               c.kv_lora_rank, num_splits=cache_num_splits(kv.shape[1]))
        else:
            latent_out = tree_attention(q, kv, slots, prefix_lens, tree_mask, self.softmax_scale, c.kv_lora_rank)
        return linear(per_head(latent_out, w_uv).flatten(-2), self.o_proj.weight)


# --- Feed-forward: SwiGLU MLP and the routed mixture of experts ----------------------------------


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(silu(linear(x, self.gate_proj.weight)) * linear(x, self.up_proj.weight), self.down_proj.weight)


class Router(nn.Module):
    """DeepSeek-V3 `noaux_tc` routing: sigmoid scores; a per-expert bias steers only *which*
    experts are chosen (load balancing), never how much they weigh."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (weights [N, k] float32, experts [N, k] int64)."""
        c = self.config
        scores = sigmoid(linear(x.float(), self.weight.float()))
        choice = scores + self.e_score_correction_bias
        if c.n_group > 1:  # keep the topk_group groups whose two best experts score highest
            groups = choice.unflatten(-1, (c.n_group, -1))
            group_score = ordered_sum(groups.topk(min(2, groups.shape[-1]), dim=-1).values)
            kept = torch.zeros_like(group_score, dtype=torch.bool)
            kept.scatter_(1, group_score.topk(c.topk_group, dim=-1).indices, True)
            choice = groups.masked_fill(~kept[..., None], float("-inf")).flatten(-2)
        experts = choice.topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, experts)
        if c.norm_topk_prob:
            weights = weights / (ordered_sum(weights)[:, None] + 1e-20)
        return weights * c.routed_scaling_factor, experts


class Experts(nn.ModuleDict):
    """The routed experts this process holds, by their index in the layer: all of them, or one
    rank's slice under expert parallelism; `experts[e]` is expert e, and the checkpoint names
    (`mlp.experts.<e>.up_proj.weight`) are the layer's own either way."""

    def __init__(self, hidden: int, intermediate: int, ids: range):
        super().__init__({str(e): MLP(hidden, intermediate) for e in ids})
        self.ids = ids

    def __getitem__(self, e: int) -> MLP:
        return super().__getitem__(str(e))


class MoE(nn.Module):
    """Routed experts plus shared experts. On CUDA the routed experts run fused
    (triton_kernels/fused_moe.py: two grouped GEMMs, no wait for the GPU); elsewhere, and as the
    reference, `per_expert` runs each expert on its rows. Under expert parallelism (`parallel`,
    engine/expert_parallel.py) the layer holds one rank's experts, computes the pairs routed to
    them and sums every pair's output over the ranks before the combine."""

    fused_on_cuda = True  # benchmarks/moe_dispatch_ab.py turns it off for its baseline

    def __init__(self, config: ModelConfig, parallel: ExpertParallel | None = None):
        super().__init__()
        c = config
        self.gate = Router(c)
        ids = parallel.shard.experts(c.n_routed_experts) if parallel else range(c.n_routed_experts)
        self.experts = Experts(c.hidden_size, c.moe_intermediate_size, ids)
        self.parallel = parallel
        self.shared_experts = MLP(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts)
        self.w13: torch.Tensor | None = None  # [E, 2I, H] gate+up, once `stack_experts` made them
        self.w2: torch.Tensor | None = None   # [E, H, I] down

    def stack_experts(self, device: torch.device | str) -> None:
        """Place the experts' weights on `device` as views of two stacked tensors, the layout the
        fused kernels read (copying the values they hold, unless they are still on meta). The
        per-expert parameters (and so the checkpoint names) stay, as views: loading a checkpoint
        fills the stacks, and memory is not doubled (K2: 34 GB per layer)."""
        held = list(self.experts.values())
        inter, hidden = held[0].gate_proj.weight.shape
        dtype = held[0].gate_proj.weight.dtype
        self.w13 = torch.empty(len(held), 2 * inter, hidden, dtype=dtype, device=device)
        self.w2 = torch.empty(len(held), hidden, inter, dtype=dtype, device=device)
        holds_values = not held[0].gate_proj.weight.is_meta  # a model already holding weights (moved to the GPU)
        for e, expert in enumerate(held):
            if holds_values:
                self.w13[e].copy_(torch.cat([expert.gate_proj.weight, expert.up_proj.weight]))
                self.w2[e].copy_(expert.down_proj.weight)
            expert.gate_proj.weight = nn.Parameter(self.w13[e, :inter], requires_grad=False)
            expert.up_proj.weight = nn.Parameter(self.w13[e, inter:], requires_grad=False)
            expert.down_proj.weight = nn.Parameter(self.w2[e], requires_grad=False)

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13, w2), refused unless the experts' parameters are still views of them (a `.to()` of
        the model would copy each parameter on its own and leave the stacks stale)."""
        first, last = self.experts[self.experts.ids[0]], self.experts[self.experts.ids[-1]]
        if (self.w13 is None or self.w2 is None
                or first.gate_proj.weight.data_ptr() != self.w13.data_ptr()
                or last.down_proj.weight.data_ptr() != self.w2[-1].data_ptr()):
            raise RuntimeError("MoE: the experts' weights are not views of their stacks; allocate the model "
                               "on the GPU with engine.model.allocate_target (or call stack_experts)")
        return self.w13, self.w2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, experts = self.gate(flat)
        shared = self.shared_experts(flat)
        if flat.is_cuda and self.fused_on_cuda:
            from triton_kernels.fused_moe import combine_pairs, routed_pairs
            pairs = routed_pairs(flat, weights, experts - self.experts.ids[0], *self.stacked())
            out = combine_pairs(self.summed_over_ranks(pairs), shared)
        else:
            out = self.per_expert(flat, weights, experts, shared)
        return out.reshape(x.shape)

    def per_expert(self, flat: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor, shared: torch.Tensor
                   ) -> torch.Tensor:
        """Each held expert runs once on all the (token, choice) pairs routed to it: pairs sorted by
        expert, so each expert's rows are one slice (other ranks' pairs sort last and stay zero).
        Reading the slice sizes is the layer's one wait for the GPU (a mask and a nonzero per expert
        waited once per expert in use: 250 waits per k2-layer verify step,
        benchmarks/results/gpu_captures_h200*.json). Counted with scatter_add: on CUDA, bincount
        waits twice more itself (it reads the min and max back to size its output)."""
        ids = self.experts.ids
        local = experts.flatten() - ids[0]
        pairs = torch.where((local >= 0) & (local < len(ids)), local, len(ids))  # len(ids): another rank's
        order = pairs.argsort(stable=True)
        sizes = pairs.new_zeros(len(ids) + 1).scatter_add_(0, pairs, torch.ones_like(pairs)).tolist()[:-1]
        held = order[:sum(sizes)]
        grouped = flat[held // experts.shape[1]]
        outs = [self.experts[ids[e]](rows) for e, rows in enumerate(grouped.split(sizes)) if sizes[e]]
        expert_out = flat.new_zeros(pairs.shape[0], flat.shape[-1])
        if outs:  # none for an empty batch, or when no pair chose this rank's experts
            expert_out[held] = torch.cat(outs)
        expert_out = self.summed_over_ranks(expert_out.view(*experts.shape, flat.shape[-1]))
        return self.combine(weights, expert_out, shared)

    def summed_over_ranks(self, pairs: torch.Tensor) -> torch.Tensor:
        """Every pair's output from the rank holding its expert (exact: the other ranks add zeros)."""
        return pairs if self.parallel is None else self.parallel.all_reduce(pairs)

    @staticmethod
    def combine(weights: torch.Tensor, expert_out: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
        """The shared experts' output plus each token's routed outputs [N, k, hidden], weighted."""
        # Combine in a fixed order (choice 0, 1, ...), so a token's sum never depends on the batch.
        routed = expert_out[:, 0] * weights[:, :1].to(shared.dtype)
        for j in range(1, expert_out.shape[1]):
            routed = routed + expert_out[:, j] * weights[:, j:j + 1].to(shared.dtype)
        return shared + routed


# --- The decoder ---------------------------------------------------------------------------------


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, rotary: Rotary, parallel: ExpertParallel | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = MLA(config, rotary)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(config, parallel) if config.is_moe_layer(layer) else MLP(config.hidden_size, config.intermediate_size)

    def forward(self, x: torch.Tensor, attend) -> torch.Tensor:
        """`attend(self_attn, normed x)` is the absorbed (decode/verify) or decompressed (prefill) attention."""
        x = x + attend(self.self_attn, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """The checkpoint's `model.` prefix: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig, parallel: ExpertParallel | None = None):
        super().__init__()
        self.rotary = Rotary(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling,
                             config.max_position_embeddings, interleaved=config.rope_interleave)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, self.rotary, parallel) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TargetModel(nn.Module):
    """The verified model. Besides logits it returns the hidden states of `feature_layers`
    (concatenated): the context features the DFlash drafter is conditioned on. Under expert
    parallelism (`parallel`) it holds one rank's routed experts of each MoE layer."""

    def __init__(self, config: ModelConfig, parallel: ExpertParallel | None = None):
        super().__init__()
        self.config, self.parallel = config, parallel
        self.model = Backbone(config, parallel)
        # Tied (tie_word_embeddings): the output head is the embedding itself, no lm_head tensor.
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size,
                                                                         bias=False)

    @property
    def head_weight(self) -> torch.Tensor:
        return (self.model.embed_tokens if self.lm_head is None else self.lm_head).weight

    @property
    def device(self) -> torch.device:
        return self.head_weight.device

    def cast(self, dtype: torch.dtype) -> TargetModel:
        """Weights in `dtype`; position tables and routers stay float32, as the reference code keeps them."""
        self.to(dtype)
        self.model.rotary.float()
        for layer in self.model.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.gate.float()
        return self

    def stack_experts(self, device: torch.device | str) -> TargetModel:
        """Every MoE layer's experts stacked on `device` (what the fused kernels read on CUDA; a
        model moved with `.to("cuda")` needs this once)."""
        for layer in self.model.layers:
            if isinstance(layer.mlp, MoE):
                layer.mlp.stack_experts(device)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.head_weight.dtype

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head, in float32 (the drafter reuses this head on its own hidden states)."""
        return linear(self.model.norm(hidden), self.head_weight).float()

    def _run_layers(self, x: torch.Tensor, attend_layer, feature_layers) -> tuple[torch.Tensor, torch.Tensor | None]:
        features = []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, lambda attn, h, i=i: attend_layer(i, attn, h))
            if i in feature_layers:
                features.append(x)
        return x, (torch.cat(features, dim=-1) if features else None)

    def forward_block(self, tokens: torch.Tensor, positions: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor,
                      prefix_lens: torch.Tensor, tree_mask: torch.Tensor, feature_layers: tuple[int, ...] = ()
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One block of T tokens per request over the latent cache kv [layers, n_slots, max_len, D]
        (a plain decode step has T = 1; a DDTree verify T = 1 + budget).

        Returns logits [bs, T, vocab] float32 and features [bs, T, hidden * len(feature_layers)].
        """
        x, features = self._run_layers(
            self.embed(tokens),
            lambda i, attn, h: attn.absorbed(h, positions, kv[i], slots, prefix_lens, tree_mask),
            feature_layers)
        return self.logits(x), features

    def forward_causal(self, tokens: torch.Tensor, feature_layers: tuple[int, ...] = ()
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Whole sequences tokens [bs, n] from position 0, no cache (training and distillation).

        Returns logits [bs, n, vocab] float32 and features [bs, n, hidden * len(feature_layers)].
        """
        positions = torch.arange(tokens.shape[-1], device=tokens.device).expand_as(tokens)
        x, features = self._run_layers(self.embed(tokens), lambda i, attn, h: attn.causal(h, positions),
                                       feature_layers)
        return self.logits(x), features

    def prefill(self, tokens: torch.Tensor, kv: torch.Tensor, slot: int, feature_layers: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A whole prompt tokens [n] into rows [0, n) of `slot` (decompressed attention).

        Returns the logits after the last token [vocab] and the features [n, ...] of every token.
        """
        logits, features = self.prefill_many([tokens], kv, [slot], feature_layers)
        return logits[0], None if features is None else features[0]

    def prefill_many(self, prompts: list[torch.Tensor], kv: torch.Tensor, slots: list[int],
                     feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Several prompts [n_i] into rows [0, n_i) of their slots in one forward: the prompts'
        rows concatenated, so every row-wise op (embedding, norms, projections, MoE, lm_head)
        launches once for all of them, while each prompt attends only over itself. A row computes
        exactly as in its prompt's own prefill wherever `linear` and the MoE are batch-invariant
        (the default; not promised under `plain_matmuls`).

        Returns the logits after each prompt's last token [P, vocab] and each prompt's features.
        """
        lengths = [p.shape[0] for p in prompts]
        positions = int64_on([position for n in lengths for position in range(n)], prompts[0].device)
        slot_of_row = int64_on([slot for slot, n in zip(slots, lengths) for _ in range(n)], prompts[0].device)

        def attend(i, attn, h):
            return attn.decompressed_many(h, positions, kv[i], slot_of_row, lengths)

        x, features = self._run_layers(self.embed(torch.cat(prompts)), attend, feature_layers)
        last_rows = int64_on([end - 1 for end in itertools.accumulate(lengths)], x.device)
        return self.logits(x[last_rows]), None if features is None else list(features.split(lengths))


def init_random(module: nn.Module, seed: int, std: float = 0.02, *, whole: nn.Module | None = None) -> None:
    """Seeded random weights (norms at 1, router biases small), identical on every run. `whole`
    (on meta) is the model `module` is one rank's part of: the tensors only other ranks hold are
    drawn and dropped, so every rank's part holds the 1-rank model's values."""
    generator = torch.Generator(device=next(module.parameters()).device).manual_seed(seed)
    held = dict(module.named_parameters()) | dict(module.named_buffers())
    every = (dict((whole or module).named_parameters()) | dict((whole or module).named_buffers())).items()
    with torch.no_grad():
        for name, tensor in every:
            tensor = held[name] if name in held else torch.empty_like(tensor, device=generator.device)
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            elif name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.1, generator=generator)
            elif tensor.is_floating_point() and not name.endswith(("cos", "sin")):
                tensor.normal_(0.0, std, generator=generator)


def _meta_target(config: ModelConfig, dtype: torch.dtype | None, parallel: ExpertParallel | None) -> TargetModel:
    with torch.device("meta"):
        return TargetModel(config, parallel).cast(dtype or getattr(torch, config.torch_dtype))


def allocate_target(config: ModelConfig, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, parallel: ExpertParallel | None = None,
                    stacked: bool | None = None) -> TargetModel:
    """A target with uninitialised weights, allocated once, on `device`, in its final dtype (K2
    shapes would not fit one GPU in float32 even for a moment); only the RoPE tables are filled.
    With `stacked` (default: on CUDA) the MoE experts are allocated stacked (`MoE.stack_experts`),
    the layout the fused kernels read. Under expert parallelism only this rank's experts are allocated."""
    model = _meta_target(config, dtype, parallel)
    if torch.device(device).type == "cuda" if stacked is None else stacked:
        model.stack_experts(device)
    materialize(model, device)
    model.model.rotary.fill_tables()
    return model


def materialize(module: nn.Module, device: str | torch.device) -> None:
    """Every parameter and buffer still on the meta device as empty memory on `device`: `to_empty`,
    except that tensors already allocated (the stacked experts' views) stay where they are."""
    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None and param.is_meta:
                sub._parameters[name] = nn.Parameter(torch.empty_like(param, device=device),
                                                     requires_grad=param.requires_grad)
        for name, buffer in sub._buffers.items():
            if buffer is not None and buffer.is_meta:
                sub._buffers[name] = torch.empty_like(buffer, device=device)


def build_target(config: ModelConfig, *, seed: int = 0, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, parallel: ExpertParallel | None = None) -> TargetModel:
    """A target with seeded random weights, built directly on `device` in the config's dtype
    (under expert parallelism, this rank's part of the same model)."""
    model = allocate_target(config, device=device, dtype=dtype, parallel=parallel)
    init_random(model, seed, whole=_meta_target(config, dtype, None) if parallel else None)
    return model.eval().requires_grad_(False)
