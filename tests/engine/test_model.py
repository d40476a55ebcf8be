"""The target's parts against independent references: MLA forms, MoE routing, RoPE/YaRN, configs."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from engine.config import preset
from engine.model import MoE, Rotary, build_target, linear, rope_frequencies, yarn_mscale

TINY = preset("tiny").model


def relative_error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.fixture(scope="module")
def target64():
    return build_target(TINY, seed=3, dtype=torch.float64)


def test_absorbed_attention_matches_decompressed_float64(target64):
    """Weight absorption is exact algebra: one token at a time, or a causal block as a tree."""
    attn = target64.model.layers[0].self_attn
    n = 70  # crosses an attention key chunk
    x = torch.randn(n, TINY.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(n)
    kv = torch.zeros(2, 128, TINY.latent_dim, dtype=torch.float64)
    want = attn.decompressed(x, positions, kv, slot=0)  # float64 reference
    slots = torch.tensor([1])
    for t in (0, 1, 40, n - 1):
        kv[1, :t] = kv[0, :t]
        got = attn.absorbed(x[None, t:t + 1], positions[None, t:t + 1], kv, slots, torch.tensor([t]),
                            torch.ones(1, 1, 1, dtype=torch.bool))
        assert relative_error(got[0, 0], want[t]) < 1e-5
    # The last 12 tokens as one block whose tree is a chain (causal): the verify path.
    start = n - 12
    chain = torch.ones(12, 12, dtype=torch.bool).tril()[None]
    got = attn.absorbed(x[None, start:], positions[None, start:], kv, slots, torch.tensor([start]), chain)
    assert relative_error(got[0], want[start:]) < 1e-5


def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3 routing written out per token, with torch's own sigmoid/silu/linear."""
    c = moe.gate.config
    out = []
    for token in x:
        scores = torch.sigmoid(moe.gate.weight.double() @ token)
        choice = scores + moe.gate.e_score_correction_bias.double()
        per_group = c.n_routed_experts // c.n_group
        group_score = [sorted(choice[g * per_group:(g + 1) * per_group].tolist())[-2:] for g in range(c.n_group)]
        best_groups = sorted(range(c.n_group), key=lambda g: -sum(group_score[g]))[:c.topk_group]
        allowed = [e for e in range(c.n_routed_experts) if e // per_group in best_groups]
        chosen = sorted(allowed, key=lambda e: -choice[e].item())[:c.num_experts_per_tok]
        weights = scores[chosen] / scores[chosen].sum() * c.routed_scaling_factor
        y = sum(w * expert_mlp(moe.experts[e], token) for w, e in zip(weights, chosen))
        out.append(y + expert_mlp(moe.shared_experts, token))
    return torch.stack(out)


def expert_mlp(mlp, x):
    return F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight), mlp.down_proj.weight)


def test_routed_moe_matches_per_token_loop(target64):
    moe = target64.model.layers[1].mlp
    assert isinstance(moe, MoE) and TINY.n_group > 1  # group-limited routing is exercised
    x = torch.randn(40, TINY.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = moe(x)
    want = naive_moe(moe, x)
    assert relative_error(got, want) < 1e-6  # routing weights are float32 (as in the reference code)
    # Group limiting changed some token's experts (else the test would not exercise it).
    weights, experts = moe.gate(x)
    plain = (torch.sigmoid(x @ moe.gate.weight.double().T) + moe.gate.e_score_correction_bias).topk(2).indices
    assert (experts.sort().values != plain.sort().values).any()


def test_correction_bias_selects_but_does_not_weigh(target64):
    moe = target64.model.layers[1].mlp
    x = torch.randn(8, TINY.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    saved = moe.gate.e_score_correction_bias.clone()
    try:
        moe.gate.e_score_correction_bias.zero_()
        moe.gate.e_score_correction_bias[[0, 1]] = 100.0  # both in group 0: always chosen
        weights, experts = moe.gate(x)
        assert experts.sort(-1).values.tolist() == [[0, 1]] * 8
        scores = torch.sigmoid(x @ moe.gate.weight.double().T)[:, [0, 1]]
        want = scores / scores.sum(-1, keepdim=True) * TINY.routed_scaling_factor
        torch.testing.assert_close(weights.double().sort(-1).values, want.sort(-1).values)
    finally:
        moe.gate.e_score_correction_bias.copy_(saved)


def test_linear_rows_do_not_depend_on_the_batch():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(96, 64, generator=gen), torch.randn(37, 64, generator=gen)
    full = linear(x, w)
    assert all(torch.equal(linear(x[i:i + 1], w)[0], full[i]) for i in range(37))
    torch.testing.assert_close(full, x @ w.T)


def test_yarn_keeps_fast_frequencies_and_stretches_slow_ones():
    scaling = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
               "beta_slow": 1.0}
    plain, yarn = rope_frequencies(64, 10000.0, None), rope_frequencies(64, 10000.0, scaling)
    assert torch.equal(yarn[:4], plain[:4])  # wavelengths far below the original context: untouched
    torch.testing.assert_close(yarn[-4:], plain[-4:] / 32)  # longer than the context: interpolated
    assert (yarn <= plain).all() and (yarn >= plain / 32 - 1e-15).all()
    assert yarn_mscale(32.0, 1.0) == pytest.approx(0.1 * math.log(32) + 1)


def test_rope_scores_depend_only_on_relative_position():
    rotary = Rotary(16, 10000.0, None, 64)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(16, generator=gen), torch.randn(16, generator=gen)

    def score(p, r):
        return (rotary(q[None], torch.tensor([p]))[0] @ rotary(k[None], torch.tensor([r]))[0]).item()

    assert score(7, 3) == pytest.approx(score(30, 26), rel=1e-5)
    assert rotary(q[None], torch.tensor([5])).norm().item() == pytest.approx(q.norm().item(), rel=1e-6)


def test_k2_layer_preset_has_kimi_k2_shapes():
    c = preset("k2-layer").model  # config only: the model itself needs a GPU
    assert (c.hidden_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank) == (7168, 64, 1536, 512)
    assert (c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.latent_dim) == (128, 64, 128, 576)
    assert (c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts) == (384, 8, 1)
    assert (c.moe_intermediate_size, c.intermediate_size, c.first_k_dense_replace) == (2048, 18432, 1)
    assert (c.n_group, c.topk_group, c.routed_scaling_factor, c.vocab_size) == (1, 1, 2.827, 163840)
    assert c.rope_theta == 50000.0 and c.rope_scaling["type"] == "yarn" and c.torch_dtype == "bfloat16"
    assert [c.is_moe_layer(i) for i in range(c.num_hidden_layers)] == [False, True, True]


def test_config_rejects_what_the_model_cannot_run():
    from engine.errors import EngineError

    with pytest.raises(EngineError, match="scoring_func"):
        dataclasses.replace(TINY, scoring_func="softmax")
    with pytest.raises(EngineError, match="n_group"):
        dataclasses.replace(TINY, n_group=3)


def test_k2_layer_fits_one_h200_in_bf16():
    """Allocated on the meta device (no memory): every weight is created directly in bf16."""
    from engine.model import allocate_target

    model = allocate_target(preset("k2-layer").model, device="meta")
    sizes = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        sizes[tensor.dtype] = sizes.get(tensor.dtype, 0) + tensor.numel() * tensor.element_size()
    assert set(sizes) == {torch.bfloat16, torch.float32}
    assert sizes[torch.float32] < 2**30  # routers and RoPE tables only
    assert 60e9 < sizes[torch.bfloat16] < 80e9  # about 73 GB of weights, leaving room for the caches


def test_moe_of_no_tokens_is_empty(target64):
    moe = target64.model.layers[1].mlp
    assert moe(torch.zeros(0, TINY.hidden_size, dtype=torch.float64)).shape == (0, TINY.hidden_size)


def test_the_moe_ab_switches_the_cuda_path_and_restores_it():
    """benchmarks/moe_dispatch_ab.py times the per-expert loop against the fused kernels on CUDA."""
    from benchmarks.moe_dispatch_ab import FUSED, SORTED, dispatch

    assert MoE.fused_on_cuda
    with dispatch(SORTED):
        assert not MoE.fused_on_cuda
        with dispatch(FUSED):
            assert MoE.fused_on_cuda
        assert not MoE.fused_on_cuda
    assert MoE.fused_on_cuda


def rotate_half_reference(x, positions, freqs):
    """transformers' apply_rotary_pos_emb (rope_interleave false): dims i and i + d/2 rotate together."""
    angles = torch.outer(positions.double(), freqs)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = x.shape[-1] // 2
    rotated_half = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated_half * sin


def test_rope_layouts_rotate_the_pairs_their_checkpoints_use():
    x = torch.randn(5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    positions = torch.tensor([0, 3, 17, 200, 511])
    freqs = rope_frequencies(16, 10000.0, None)
    half = Rotary(16, 10000.0, None, 512, interleaved=False)
    torch.testing.assert_close(half(x, positions).double(), rotate_half_reference(x, positions, freqs),
                               rtol=1e-6, atol=1e-6)
    # Interleaved (DeepSeek-V3's own layout) is the same rotation of the dims taken as (0, 2, 4, ..., 1, 3, ...).
    order = torch.cat([torch.arange(0, 16, 2), torch.arange(1, 16, 2)])
    interleaved = Rotary(16, 10000.0, None, 512)(x, positions)
    torch.testing.assert_close(interleaved[:, order].double(), rotate_half_reference(x[:, order], positions, freqs),
                               rtol=1e-6, atol=1e-6)
    assert not torch.allclose(interleaved, half(x, positions))


def test_yarn_truncate_and_attention_factor():
    """transformers' YaRN keys: truncate false keeps the correction range's ends fractional;
    attention_factor replaces mscale / mscale_all_dim as the tables' magnitude."""
    scaling = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 32.0,
               "beta_slow": 1.0}
    rounded = rope_frequencies(32, 10000.0, scaling)
    exact = rope_frequencies(32, 10000.0, {**scaling, "truncate": False})
    assert torch.equal(rounded, rope_frequencies(32, 10000.0, {**scaling, "truncate": True}))
    assert not torch.equal(rounded, exact) and torch.equal(rounded[:2], exact[:2])  # fast ones kept either way
    plain = Rotary(32, 10000.0, {**scaling, "mscale": 2.0}, 8)
    forced = Rotary(32, 10000.0, {**scaling, "mscale": 2.0, "attention_factor": 1.25}, 8)
    torch.testing.assert_close(plain.cos.square() + plain.sin.square(), torch.full((8, 16), yarn_mscale(8.0, 2.0) ** 2))
    torch.testing.assert_close(forced.cos.square() + forced.sin.square(), torch.full((8, 16), 1.25 ** 2))


def test_latent_norms_use_eps_1e6_whatever_rms_norm_eps_says():
    """As DeepSeek-V3's reference model.py and transformers build q_a_layernorm and kv_a_layernorm."""
    model = build_target(dataclasses.replace(TINY, rms_norm_eps=1e-5), seed=0)
    attn, layer = model.model.layers[0].self_attn, model.model.layers[0]
    assert attn.q_a_layernorm.eps == attn.kv_a_layernorm.eps == 1e-6
    assert layer.input_layernorm.eps == model.model.norm.eps == 1e-5


def test_without_query_compression_the_query_is_one_projection():
    """q_lora_rank null (DeepSeek-V2-Lite style): the queries are q_proj x, split into the nope part
    and the roped part, with no low-rank path or its norm."""
    plain = build_target(dataclasses.replace(TINY, q_lora_rank=None), seed=3, dtype=torch.float64)
    attn = plain.model.layers[0].self_attn
    assert not hasattr(attn, "q_a_proj") and attn.q_proj.weight.shape == (4 * TINY.qk_head_dim, TINY.hidden_size)
    x = torch.randn(6, TINY.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    positions = torch.arange(6)
    q_nope, q_rope = attn.queries(x, positions)
    want = F.linear(x, attn.q_proj.weight).unflatten(-1, (4, TINY.qk_head_dim))
    torch.testing.assert_close(q_nope, want[..., :TINY.qk_nope_head_dim])
    torch.testing.assert_close(q_rope, attn.rotary[0](want[..., TINY.qk_nope_head_dim:], positions))
