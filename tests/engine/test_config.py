"""ModelConfig.from_dict on config.json as transformers 4 and 5 write it, and as DeepSeek-V3 and Kimi-K2
publish it: absent fields take DeepSeek-V3's values, and every value the engine would compute
differently is refused in one line naming the field."""

import dataclasses

import pytest

from engine.config import ModelConfig, preset
from engine.errors import EngineError

TINY = preset("tiny").model
# What DeepSeek-V3's published config.json holds beyond the fields (none changes the computation).
DEEPSEEK_V3_EXTRAS = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "hidden_act": "silu", "initializer_range": 0.02, "moe_layer_freq": 1, "num_key_value_heads": 4,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "seq_aux": True, "topk_method": "noaux_tc",
    "use_cache": True, "transformers_version": "4.33.1",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}


def transformers5(config: ModelConfig) -> dict:
    """The layout transformers 5 writes: rope_parameters with rope_theta inside, dtype."""
    raw = config.to_dict()
    theta, scaling, dtype = raw.pop("rope_theta"), raw.pop("rope_scaling"), raw.pop("torch_dtype")
    kind = {"rope_type": scaling.pop("type")} if scaling else {"rope_type": "default"}
    return {**raw, "rope_parameters": {**kind, **(scaling or {}), "rope_theta": theta}, "dtype": dtype}


def test_both_layouts_give_the_same_config():
    for config in (TINY, dataclasses.replace(TINY, rope_scaling=None, torch_dtype="bfloat16")):
        assert ModelConfig.from_dict(config.to_dict()) == config
        assert ModelConfig.from_dict(transformers5(config)) == config
    published = ModelConfig.from_dict({**TINY.to_dict(), **DEEPSEEK_V3_EXTRAS})
    assert published == TINY


def test_absent_fields_take_deepseek_v3_values():
    """transformers' DeepseekV3Config defaults; scoring_func (not one of its fields) as DeepSeek-V3 has it."""
    absent = ModelConfig.from_dict({})
    assert (absent.hidden_size, absent.num_hidden_layers, absent.num_attention_heads, absent.vocab_size) == \
        (7168, 61, 128, 129280)
    assert (absent.q_lora_rank, absent.kv_lora_rank, absent.n_routed_experts, absent.first_k_dense_replace) == \
        (1536, 512, 256, 3)
    assert absent.scoring_func == "sigmoid" and absent.rope_interleave and not absent.tie_word_embeddings
    assert absent.rms_norm_eps == 1e-6 and absent.torch_dtype == "float32" and absent.rope_scaling is None
    trimmed = {k: v for k, v in TINY.to_dict().items() if k not in ("scoring_func", "torch_dtype")}
    assert ModelConfig.from_dict(trimmed) == dataclasses.replace(TINY, torch_dtype="float32")


def test_yarn_without_its_original_length_uses_max_position_embeddings():
    scaling = {k: v for k, v in TINY.rope_scaling.items() if k != "original_max_position_embeddings"}
    loaded = ModelConfig.from_dict({**TINY.to_dict(), "rope_scaling": scaling})
    assert loaded.rope_scaling["original_max_position_embeddings"] == TINY.max_position_embeddings


def test_variants_the_engine_implements_load():
    raw = {**TINY.to_dict(), "q_lora_rank": None, "rope_interleave": False, "tie_word_embeddings": True,
           "rope_scaling": {**TINY.rope_scaling, "truncate": False, "attention_factor": 1.1}}
    config = ModelConfig.from_dict(raw)
    assert config.q_lora_rank is None and not config.rope_interleave and config.tie_word_embeddings
    assert config.rope_scaling["truncate"] is False


def with_yarn(**changes):
    return {**TINY.to_dict(), "rope_scaling": {**TINY.rope_scaling, **changes}}


@pytest.mark.parametrize("raw,message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (only 'silu'"),
    ({"topk_method": "greedy"}, "topk_method 'greedy' is not supported (only 'noaux_tc'"),
    ({"topk_method": "group_limited_greedy"}, "topk_method 'group_limited_greedy' is not supported"),
    ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported (only 'sigmoid'"),
    ({"attention_bias": True}, "attention_bias True is not supported (only False"),
    ({"moe_layer_freq": 2}, "moe_layer_freq 2 is not supported (only 1"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5 is not supported (only 1.0"),
    ({"num_attention_heads": 4, "num_key_value_heads": 1}, "num_key_value_heads 1 differs from num_attention_heads 4"),
    ({"model_type": "qwen2"}, "model_type 'qwen2' is not supported (only deepseek_v3, kimi_k2)"),
    ({"torch_dtype": "float8_e4m3fn"}, "torch_dtype 'float8_e4m3fn' is not supported"),
    ({"dtype": "bfloat16", "torch_dtype": "float32"}, "dtype 'bfloat16' and torch_dtype 'float32' disagree"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling type 'linear' is not supported"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic' is not supported"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}},
     "rope_scaling type 'llama3' is not supported"),
    (with_yarn(low_freq_factor=1.0), "rope_scaling 'low_freq_factor' is not supported"),
    (with_yarn(truncate="no"), "rope_scaling truncate must be a bool"),
    (with_yarn(factor=0), "rope_scaling (yarn) needs a positive factor"),
    ({"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e4}},
     "rope_theta 10000.0 and rope_parameters {'rope_type': 'default', 'rope_theta': 50000.0} disagree"),
    ({"rope_parameters": "yarn"}, "rope_parameters must be a dict"),
    ({"q_lora_rank": -1}, "q_lora_rank must be a non-negative int | None"),
    ({"rope_interleave": "false"}, "rope_interleave must be a bool"),
])
def test_what_the_engine_does_not_compute_is_refused_by_name(raw, message):
    base = transformers5(TINY) if "rope_parameters" in raw else TINY.to_dict()
    with pytest.raises(EngineError) as error:
        ModelConfig.from_dict({**base, **raw})
    assert message in str(error.value) and "\n" not in str(error.value)
