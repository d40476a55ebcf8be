"""Checkpoints that transformers' own DeepseekV3ForCausalLM saved (when transformers is installed;
the suite does not need it): the engine loads them and computes the logits transformers computes."""

import pytest
import torch

from engine.weights import from_pretrained, special_tokens

transformers = pytest.importorskip("transformers")

SHAPES = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
              kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, intermediate_size=128,
              moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
              first_k_dense_replace=1, max_position_embeddings=256)
# max_position_embeddings / original_max_position_embeddings = factor, as in the published configs
# (transformers takes that ratio for YaRN's factor; DeepSeek-V3's own code takes `factor`).
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
VARIANTS = {
    # Kimi-K2 / DeepSeek-V3 style, at rms_norm_eps 1e-5: the latent norms must still use 1e-6.
    "deepseek-v3": dict(q_lora_rank=32, rope_interleave=True, rms_norm_eps=1e-5, rope_parameters=YARN),
    # DeepSeek-V2-Lite style: no query compression, rotate-half RoPE, tied head, plain RoPE.
    "v2-lite-style": dict(q_lora_rank=None, rope_interleave=False, tie_word_embeddings=True,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_engine_logits_match_transformers(tmp_path, variant):
    config = transformers.DeepseekV3Config(**SHAPES, **VARIANTS[variant], bos_token_id=3, eos_token_id=4)
    torch.manual_seed(0)
    reference = transformers.DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # norms and routing biases away from their initial ones and zeros
        for name, tensor in reference.named_parameters():
            if name.endswith("norm.weight"):
                tensor.uniform_(0.5, 1.5)
        for name, tensor in reference.named_buffers():
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.1)
    reference.save_pretrained(tmp_path)
    model = from_pretrained(tmp_path)
    assert model.config.rope_interleave == config.rope_interleave and special_tokens(tmp_path) == (3, 4)
    tokens = torch.randint(0, SHAPES["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(tokens).logits[0].double()
        got, _ = model.forward_causal(tokens)
    # float noise is ~3e-7; the latent norms at rms_norm_eps instead of 1e-6 would be ~7e-5 off
    assert ((got[0].double() - want).abs().max() / want.abs().max()).item() < 5e-6
    assert torch.equal(got[0].argmax(-1), want.argmax(-1))
    # The last token decoded over the latent cache (the absorbed form decode and verify use).
    n = tokens.shape[1] - 1
    kv = torch.zeros(SHAPES["num_hidden_layers"], 1, 64, model.config.latent_dim)
    with torch.no_grad():
        model.prefill(tokens[0, :n], kv, 0)
        step, _ = model.forward_block(tokens[:, n:], torch.tensor([[n]]), kv, torch.tensor([0]), torch.tensor([n]),
                                      torch.ones(1, 1, 1, dtype=torch.bool))
    assert ((step[0, 0].double() - want[n]).abs().max() / want.abs().max()).item() < 5e-6
