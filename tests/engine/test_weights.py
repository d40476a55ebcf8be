"""from_pretrained on a sharded DeepSeek-V3/Kimi-K2-named checkpoint that the test writes itself."""

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.config import preset
from engine.errors import EngineError
from engine.model import build_target
from engine.weights import from_pretrained, save_pretrained

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


def test_missing_config_fields_are_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(EngineError, match="config.json: lacks .*kv_lora_rank"):
        from_pretrained(tmp_path)
