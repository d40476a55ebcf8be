"""from_pretrained on a sharded DeepSeek-V3/Kimi-K2-named checkpoint that the test writes itself."""

import dataclasses
import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.config import preset
from engine.errors import EngineError
from engine.model import build_target
from engine.weights import from_pretrained, save_pretrained, special_tokens
from tests.engine.test_config import transformers5

TINY = preset("tiny").model
# Names as they appear in DeepSeek-V3 / Kimi-K2 checkpoints (layer 0 dense, layer 1 MoE).
CHECKPOINT_NAMES = [
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_a_layernorm.weight",
    "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.0.self_attn.kv_a_layernorm.weight", "model.layers.0.self_attn.kv_b_proj.weight",
    "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
    "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
    "model.layers.1.mlp.experts.7.gate_proj.weight", "model.layers.1.mlp.experts.0.up_proj.weight",
    "model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.shared_experts.gate_proj.weight",
    "model.layers.1.mlp.shared_experts.up_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight",
]


def write_checkpoint(directory, tensors, config):
    """Two shards plus an index, the way large checkpoints are laid out; plus an MTP layer to skip."""
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    extra = {"model.layers.2.self_attn.q_a_proj.weight": torch.zeros(2, 2)}  # beyond num_hidden_layers
    for file, part in shards.items():
        save_file({n: tensors[n] for n in part} | (extra if file.startswith("model-00002") else {}), directory / file)
    weight_map = {n: f for f, part in shards.items() for n in part} | {n: "model-00002-of-00002.safetensors" for n in extra}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "kimi_k2", "architectures": ["X"]}))


def logits_of(model):
    kv = torch.zeros(TINY.num_hidden_layers, 1, 32, TINY.latent_dim)
    return model.prefill(torch.tensor([256, 72, 105, 33]), kv, 0)[0]


def test_loads_sharded_checkpoint_with_checkpoint_names(tmp_path):
    source = build_target(TINY, seed=7)
    tensors = {k: v.clone() for k, v in source.state_dict().items()}
    assert set(CHECKPOINT_NAMES) <= set(tensors)
    write_checkpoint(tmp_path, tensors, TINY.to_dict())
    loaded = from_pretrained(tmp_path)
    assert loaded.config == TINY
    assert torch.equal(logits_of(loaded), logits_of(source))
    assert not torch.equal(logits_of(build_target(TINY, seed=8)), logits_of(source))


def test_save_pretrained_round_trip(tmp_path):
    source = build_target(TINY, seed=5)
    save_pretrained(source, tmp_path)
    assert torch.equal(logits_of(from_pretrained(tmp_path)), logits_of(source))


@pytest.mark.parametrize("damage,message", [
    (lambda t: t.pop("model.layers.1.mlp.experts.5.up_proj.weight"), "lacks model.layers.1.mlp.experts.5.up_proj"),
    (lambda t: t.update({"model.layers.0.self_attn.q_proj.weight": torch.zeros(1)}), "unexpected tensor"),
    (lambda t: t.update({"lm_head.weight": torch.zeros(3, 3)}), "lm_head.weight has shape"),
    (lambda t: t.update({"model.layers.0.self_attn.o_proj.weight_scale_inv": torch.zeros(1)}), "FP8"),
])
def test_bad_checkpoints_give_one_line_errors(tmp_path, damage, message):
    tensors = {k: v.clone() for k, v in build_target(TINY, seed=0).state_dict().items()}
    damage(tensors)
    write_checkpoint(tmp_path, tensors, TINY.to_dict())
    with pytest.raises(EngineError, match=message) as error:
        from_pretrained(tmp_path)
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_absent_config_fields_are_deepseek_v3s_and_the_files_say_where_they_differ(tmp_path):
    """{"hidden_size": 8} is DeepSeek-V3 at hidden size 8 (transformers reads it so too); names are
    checked against the files before any weight memory is allocated."""
    source = build_target(TINY, seed=0)
    write_checkpoint(tmp_path, dict(source.state_dict()), TINY.to_dict())
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(EngineError, match="unexpected tensor model.layers.1.mlp.experts"):
        from_pretrained(tmp_path)


def test_a_transformers5_config_loads_and_computes_in_its_dtype(tmp_path):
    config = dataclasses.replace(TINY, torch_dtype="bfloat16")
    source = build_target(config, seed=2)
    write_checkpoint(tmp_path, dict(source.state_dict()), transformers5(config))
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = from_pretrained(tmp_path)
    assert loaded.config == config and loaded.dtype == torch.bfloat16
    assert torch.equal(logits_of(loaded), logits_of(source))
    assert from_pretrained(tmp_path, dtype=torch.float32).dtype == torch.float32  # --dtype overrides it


def to_rotate_half_layout(tensors, config):
    """The same model for rope_interleave false: each roped output row moved from interleaved position
    (2i, 2i + 1) to (i, i + rope/2), as conversions of interleaved checkpoints do."""
    rope = config.qk_rope_head_dim
    order = torch.cat([torch.arange(0, rope, 2), torch.arange(1, rope, 2)])
    moved = dict(tensors)
    for layer in range(config.num_hidden_layers):
        attn = f"model.layers.{layer}.self_attn"
        q = moved[f"{attn}.q_b_proj.weight"].unflatten(0, (config.num_attention_heads, config.qk_head_dim))
        q = torch.cat([q[:, :config.qk_nope_head_dim], q[:, config.qk_nope_head_dim:][:, order]], 1)
        moved[f"{attn}.q_b_proj.weight"] = q.flatten(0, 1)
        kv = moved[f"{attn}.kv_a_proj_with_mqa.weight"]
        latent, rope_rows = kv[:config.kv_lora_rank], kv[config.kv_lora_rank:]
        moved[f"{attn}.kv_a_proj_with_mqa.weight"] = torch.cat([latent, rope_rows[order]])
    return moved


def test_a_rope_interleave_false_checkpoint_rotates_its_own_pairs(tmp_path):
    source = build_target(TINY, seed=4)
    half = dataclasses.replace(TINY, rope_interleave=False)
    write_checkpoint(tmp_path, to_rotate_half_layout(source.state_dict(), TINY), half.to_dict())
    loaded = from_pretrained(tmp_path)
    assert not loaded.config.rope_interleave
    torch.testing.assert_close(logits_of(loaded), logits_of(source), rtol=1e-5, atol=1e-5)
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_dict()))  # the same files read as interleaved
    misread = logits_of(from_pretrained(tmp_path))
    assert (misread - logits_of(source)).abs().max() > 100 * (logits_of(loaded) - logits_of(source)).abs().max()


def test_checkpoints_without_query_compression_or_with_tied_embeddings(tmp_path):
    config = dataclasses.replace(TINY, q_lora_rank=None, tie_word_embeddings=True)
    source = build_target(config, seed=6)
    assert source.head_weight is source.model.embed_tokens.weight
    save_pretrained(source, tmp_path)
    names = set(safe_open(tmp_path / "model.safetensors", "pt").keys())
    assert "lm_head.weight" not in names and "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("q_a_proj" in n or "q_b_proj" in n for n in names)
    loaded = from_pretrained(tmp_path)
    assert loaded.config == config and torch.equal(logits_of(loaded), logits_of(source))
    # A tied checkpoint that stores lm_head.weight anyway: the embedding, or refused.
    tensors = dict(source.state_dict())
    write_checkpoint(tmp_path, {**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"].clone()},
                     config.to_dict())
    assert torch.equal(logits_of(from_pretrained(tmp_path)), logits_of(source))
    write_checkpoint(tmp_path, {**tensors, "lm_head.weight": torch.zeros(TINY.vocab_size, TINY.hidden_size)},
                     config.to_dict())
    with pytest.raises(EngineError, match="lm_head.weight differs from model.embed_tokens.weight"):
        from_pretrained(tmp_path)


# --- FP8 block-quantized checkpoints, as DeepSeek-V3 and Kimi-K2 are published -------------------

E4M3_MAX = 448.0


def quantize_blockwise(weight, block):
    """weight -> (float8_e4m3fn, one float32 scale per block), block by block as DeepSeek quantized V3."""
    rows, cols = weight.shape
    quantized = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scales = torch.empty(-(-rows // block[0]), -(-cols // block[1]))
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = weight[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]].float()
            scales[i, j] = tile.abs().max() / E4M3_MAX
            quantized[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = \
                (tile / scales[i, j]).to(torch.float8_e4m3fn)
    return quantized, scales


def quantized_names(tensors):
    """The weights DeepSeek-V3 stores in FP8: every projection (not embeddings, head, router or norms)."""
    return [n for n in tensors if n.endswith("proj.weight") or n.endswith("proj_with_mqa.weight")]


def layer0_scales(tensors):
    """What fp8_checkpoint writes to its second shard: layer 0's block scales."""
    return {n: v.contiguous() for n, v in tensors.items()
            if n.startswith("model.layers.0.") and n.endswith("_scale_inv")}


def fp8_checkpoint(directory, source, block):
    """`source` quantized blockwise, in DeepSeek-V3's layout: layer 0's scales in a shard of their own,
    layer 1's beside their weights, and an MTP layer's shard that must never be opened."""
    tensors = dict(source.state_dict())
    for name in quantized_names(tensors):
        tensors[name], tensors[name + "_scale_inv"] = quantize_blockwise(tensors[name], block)
    second = layer0_scales(tensors)
    shards = {"model-00001-of-00003.safetensors": [n for n in tensors if n not in second],
              "model-00002-of-00003.safetensors": list(second)}
    for file, names in shards.items():
        save_file({n: tensors[n].contiguous() for n in names}, directory / file)
    (directory / "model-00003-of-00003.safetensors").write_bytes(b"not even a safetensors file")
    weight_map = {n: f for f, names in shards.items() for n in names}
    weight_map["model.layers.2.self_attn.q_a_proj.weight"] = "model-00003-of-00003.safetensors"  # the MTP layer
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    quantization = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                    "weight_block_size": list(block)}
    (directory / "config.json").write_text(json.dumps({**source.config.to_dict(), "quantization_config": quantization}))
    return tensors


# DeepSeek-V3's 128x128 (one partial block per tiny matrix), and several blocks with partial edges
@pytest.mark.parametrize("block", [(128, 128), (32, 48)])
def test_fp8_checkpoint_loads_within_fp8s_error_of_the_bf16_model(tmp_path, block):
    config = dataclasses.replace(TINY, torch_dtype="bfloat16")
    source = build_target(config, seed=9)
    tensors = fp8_checkpoint(tmp_path, source, block)
    loaded = from_pretrained(tmp_path, dtype=torch.float32)
    weights = loaded.state_dict()
    for name in quantized_names(tensors):
        want, scale = source.state_dict()[name].float(), tensors[name + "_scale_inv"]
        scale = scale.repeat_interleave(block[0], 0)[:want.shape[0]].repeat_interleave(block[1], 1)[:, :want.shape[1]]
        # e4m3 rounds to 3 mantissa bits (half an ulp: 2^-4 relative), subnormals to steps of 2^-9 * scale
        assert ((weights[name] - want).abs() <= want.abs() * 2 ** -4 + scale * 2 ** -10).all(), name
        assert not torch.equal(weights[name], want)
    for name in set(tensors) - set(quantized_names(tensors)) - {n + "_scale_inv" for n in quantized_names(tensors)}:
        assert torch.equal(weights[name], source.state_dict()[name].float()), name  # stored as they were
    reference = logits_of(source.float())
    error = ((logits_of(loaded) - reference).norm() / reference.norm()).item()
    assert 0 < error < 0.08, error  # about 0.04: e4m3's relative rounding (up to 2^-4) averaged over sums
    assert from_pretrained(tmp_path).dtype == torch.bfloat16  # the config's dtype, dequantized to it


@pytest.mark.parametrize("change,message", [
    (lambda d, t: (d / "config.json").write_text(json.dumps({**TINY.to_dict(), "quantization_config": {
        "quant_method": "awq", "bits": 4}})), "quantization_config quant_method 'awq' is not supported"),
    (lambda d, t: (d / "config.json").write_text(json.dumps({**TINY.to_dict(), "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]}})),
     "activation_scheme 'static' is not supported"),
    (lambda d, t: (d / "config.json").write_text(json.dumps({**TINY.to_dict(), "quantization_config": {
        "quant_method": "fp8"}})), "weight_block_size None must be two positive ints"),
    (lambda d, t: save_file(layer0_scales(t) | {"model.layers.0.self_attn.o_proj.weight_scale_inv": torch.ones(3, 3)},
                            d / "model-00002-of-00003.safetensors"),
     "o_proj.weight_scale_inv has shape (3, 3); 128x128 blocks of model.layers.0.self_attn.o_proj.weight (64, 64) "
     "need (1, 1)"),
])
def test_bad_fp8_checkpoints_give_one_line_errors(tmp_path, change, message):
    tensors = fp8_checkpoint(tmp_path, build_target(TINY, seed=0), (128, 128))
    change(tmp_path, tensors)
    with pytest.raises(EngineError) as error:
        from_pretrained(tmp_path)
    assert message in str(error.value) and "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_an_fp8_weight_without_its_scale_is_refused(tmp_path):
    tensors = {k: v.clone() for k, v in build_target(TINY, seed=0).state_dict().items()}
    name = "model.layers.0.self_attn.o_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    write_checkpoint(tmp_path, tensors, TINY.to_dict())
    with pytest.raises(EngineError, match=f"{name} is float8_e4m3fn but has no {name}_scale_inv"):
        from_pretrained(tmp_path)


# --- The stop token a checkpoint names -----------------------------------------------------------

def test_special_tokens_come_from_generation_config_then_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_dict()))
    assert special_tokens(tmp_path) == (0, 1)  # transformers' defaults
    (tmp_path / "config.json").write_text(json.dumps({**TINY.to_dict(), "bos_token_id": 5, "eos_token_id": 6}))
    assert special_tokens(tmp_path) == (5, 6)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7], "temperature": 0.6}))
    assert special_tokens(tmp_path) == (5, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"bos_token_id": None, "eos_token_id": None}))
    assert special_tokens(tmp_path) == (None, None)
    for eos, message in (([7, 8], "stops at one token, not several"), (TINY.vocab_size, "below vocab_size")):
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
        with pytest.raises(EngineError, match=f"generation_config.json: eos_token_id .*{message}"):
            special_tokens(tmp_path)


@pytest.mark.gpu
def test_fp8_checkpoint_dequantizes_on_the_gpu_as_on_the_cpu(tmp_path):
    """On CUDA each FP8 weight is moved as FP8 and dequantized there: the same bits as on the CPU."""
    fp8_checkpoint(tmp_path, build_target(dataclasses.replace(TINY, torch_dtype="bfloat16"), seed=9), (32, 48))
    cpu, gpu = from_pretrained(tmp_path), from_pretrained(tmp_path, device="cuda")
    assert gpu.device.type == "cuda" and gpu.dtype == torch.bfloat16
    for name, tensor in cpu.state_dict().items():
        assert torch.equal(gpu.state_dict()[name].cpu(), tensor), name


def test_a_checkpoint_loads_into_stacked_experts(tmp_path, monkeypatch):
    """On CUDA the experts are allocated as views of two stacks (the fused MoE reads the stacks):
    loading must fill the stacks through the per-expert names. Stacked here on the CPU, as on CUDA."""
    import functools

    import engine.model as model
    import engine.weights as weights

    source = build_target(TINY, seed=5)
    save_pretrained(source, tmp_path)
    monkeypatch.setattr(weights, "allocate_target", functools.partial(model.allocate_target, stacked=True))
    loaded = from_pretrained(tmp_path)
    for layer, original in zip(loaded.model.layers, source.model.layers):
        if isinstance(layer.mlp, model.MoE):
            w13, w2 = layer.mlp.stacked()  # still views
            for e, expert in enumerate(original.mlp.experts.values()):
                assert torch.equal(w13[e], torch.cat([expert.gate_proj.weight, expert.up_proj.weight]))
                assert torch.equal(w2[e], expert.down_proj.weight)
    assert torch.equal(logits_of(loaded), logits_of(source))
