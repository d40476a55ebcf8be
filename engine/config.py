"""Model configurations and presets, with the field names of DeepSeek-V3 / Kimi-K2 `config.json`.

Keeping the real key names means a user's `config.json` loads as is (`ModelConfig.from_dict`) and
every number here can be checked against the published configs.

Presets:
- `tiny`: a whole DDTree generation in a few seconds on two CPU cores; the tests use it.
- `small`: the CPU demo default (serving captures with dozens of concurrent requests).
- `k2-layer`: Kimi K2's exact per-layer shapes with 1 dense + 2 MoE layers, bf16, for one H200.
tiny and small use the engine's trained tokenizer (engine/tokenizer.py: vocabulary and MASK id) and
have trained weights (engine/trained.py); small's experts are a quarter of the hidden size wide, as
K2's are, and its drafter has two layers (it accepts more). All inner dimensions are multiples of 16 so every row of a [rows, dim] tensor starts
equally aligned (see `model.linear`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.errors import EngineError
from engine.tokenizer import load_tokenizer


# What config.json may hold for each ModelConfig field, by its annotation (a string: annotations are
# postponed); bool is an int in Python, so numbers also refuse it.
_JSON_KINDS = {"int": int, "int | None": (int, type(None)), "float": (int, float), "bool": bool, "str": str,
               "dict | None": (dict, type(None))}
DTYPES = ("float32", "bfloat16", "float16")
MODEL_TYPES = ("deepseek_v3", "kimi_k2")
# Fields that change the computation but are not ModelConfig fields: the engine implements one value
# (DeepSeek-V3's, also the default when absent) and refuses any other.
_ONLY = {"hidden_act": "silu", "topk_method": "noaux_tc", "attention_bias": False, "moe_layer_freq": 1,
         "partial_rotary_factor": 1.0}
# YaRN's keys (DeepSeek-V3's, plus transformers' truncate and attention_factor) and what each may hold.
_YARN_KINDS = {"type": str, "factor": (int, float), "original_max_position_embeddings": int,
               "beta_fast": (int, float), "beta_slow": (int, float), "mscale": (int, float),
               "mscale_all_dim": (int, float), "truncate": bool, "attention_factor": (int, float)}


@dataclass(frozen=True)
class ModelConfig:
    """The target model. Fields are `config.json` keys, defaulting (when a file lacks them) to
    transformers' DeepseekV3Config (so to DeepSeek-V3 itself), and to DeepSeek-V3's own values for
    the keys that class lacks (scoring_func). Other keys that change the computation are refused
    unless they hold what the engine computes (`_ONLY`, num_key_value_heads, model_type); keys
    that do not (initializer_range, aux_loss_alpha, ep_size, use_cache, ...) are ignored.
    Layers past num_hidden_layers (num_nextn_predict_layers' MTP layer) are not part of the target.
    """

    vocab_size: int = 129280
    hidden_size: int = 7168
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    q_lora_rank: int | None = 1536  # null or 0: a plain q_proj, no query compression (DeepSeek-V2-Lite)
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 256
    num_experts_per_tok: int = 8
    n_shared_experts: int = 1
    first_k_dense_replace: int = 3
    routed_scaling_factor: float = 2.5
    n_group: int = 8
    topk_group: int = 4
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    torch_dtype: str = "float32"  # the checkpoint's dtype: what the engine computes in unless told otherwise
    rope_interleave: bool = True  # False: the rotate-half layout (dims i and i + rope/2 form a pair)
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.scoring_func != "sigmoid":
            raise EngineError(f"scoring_func {self.scoring_func!r} is not supported (only 'sigmoid', as in DeepSeek-V3/Kimi-K2)")
        if self.n_routed_experts % self.n_group or self.topk_group > self.n_group:
            raise EngineError(f"n_group={self.n_group} must divide n_routed_experts={self.n_routed_experts} "
                              f"and be >= topk_group={self.topk_group}")
        if self.qk_rope_head_dim % 2:
            raise EngineError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even (RoPE rotates pairs)")
        if self.torch_dtype not in DTYPES:
            raise EngineError(f"torch_dtype {self.torch_dtype!r} is not supported (choose one of {', '.join(DTYPES)})")
        if self.rope_scaling is not None:
            _check_yarn(self.rope_scaling)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached row: the normalised latent c_KV, then the roped shared key k_rope."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        """Either layout: transformers 4's (rope_theta, rope_scaling, torch_dtype) or 5's
        (rope_parameters with rope_theta inside, dtype)."""
        _refuse_unimplemented(raw)
        raw = _legacy_layout(raw)
        for field in dataclasses.fields(cls):
            if field.name not in raw:
                continue
            value = raw[field.name]
            number = field.type in ("int", "float", "int | None")
            right_kind = isinstance(value, _JSON_KINDS[field.type])
            if not right_kind or (number and value is not None and (isinstance(value, bool) or not value >= 0)):
                raise EngineError(f"{field.name} must be a {'non-negative ' if number else ''}{field.type}, "
                                  f"not {value!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _refuse_unimplemented(raw: dict) -> None:
    """One line naming the first key whose value the engine would otherwise compute differently."""
    for key, implemented in _ONLY.items():
        if key in raw and raw[key] != implemented:
            raise EngineError(f"{key} {raw[key]!r} is not supported (only {implemented!r}, as in DeepSeek-V3/Kimi-K2)")
    heads = raw.get("num_attention_heads", ModelConfig.num_attention_heads)
    kv_heads = raw.get("num_key_value_heads", heads)
    if kv_heads != heads:
        raise EngineError(f"num_key_value_heads {kv_heads!r} differs from num_attention_heads {heads!r} "
                          "(MLA decompresses one key and value per head)")
    if raw.get("model_type", MODEL_TYPES[0]) not in MODEL_TYPES:
        raise EngineError(f"model_type {raw['model_type']!r} is not supported (only {', '.join(MODEL_TYPES)})")


def _legacy_layout(raw: dict) -> dict:
    """transformers 5's keys moved to the legacy ones the fields use (refusing a file whose two
    layouts disagree); YaRN's original length filled in as transformers does."""
    raw = dict(raw)
    if "dtype" in raw:
        dtype = raw.pop("dtype")
        if raw.setdefault("torch_dtype", dtype) != dtype:
            raise EngineError(f"dtype {dtype!r} and torch_dtype {raw['torch_dtype']!r} disagree")
    if "rope_parameters" in raw:
        parameters = raw.pop("rope_parameters")
        if not isinstance(parameters, dict):
            raise EngineError(f"rope_parameters must be a dict, not {parameters!r}")
        moved = {"rope_scaling": _rope_scaling(parameters)}
        if "rope_theta" in parameters:
            moved["rope_theta"] = parameters["rope_theta"]
        for key, value in moved.items():
            given = _rope_scaling(raw[key]) if key == "rope_scaling" and key in raw else raw.get(key, value)
            if given != value:
                raise EngineError(f"{key} {raw[key]!r} and rope_parameters {parameters!r} disagree")
            raw[key] = value
    scaling = raw["rope_scaling"] = _rope_scaling(raw.get("rope_scaling"))
    if isinstance(scaling, dict) and "original_max_position_embeddings" not in scaling:
        raw["rope_scaling"] = {**scaling, "original_max_position_embeddings":
                               raw.get("max_position_embeddings", ModelConfig.max_position_embeddings)}
    return raw


def _rope_scaling(scaling):
    """The scaling part of rope_scaling / rope_parameters: None for plain RoPE (transformers 4 writes
    it as null, 5 as {"rope_type": "default", "rope_theta": ...})."""
    if not isinstance(scaling, dict):
        return scaling
    scaling = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if "rope_type" in scaling:  # transformers' name for DeepSeek-V3's "type"
        kind = scaling.pop("rope_type")
        if scaling.setdefault("type", kind) != kind:
            raise EngineError(f"rope_scaling type {scaling['type']!r} and rope_type {kind!r} disagree")
    return None if scaling == {"type": "default"} else scaling


def _check_yarn(scaling: dict) -> None:
    kind = scaling.get("type")
    if kind != "yarn":
        raise EngineError(f"rope_scaling type {kind!r} is not supported "
                          "(only 'yarn' or none, as in DeepSeek-V3/Kimi-K2)")
    for key, value in scaling.items():
        if key not in _YARN_KINDS:
            raise EngineError(f"rope_scaling {key!r} is not supported (YaRN takes {', '.join(_YARN_KINDS)})")
        if not isinstance(value, _YARN_KINDS[key]) or (isinstance(value, bool) and _YARN_KINDS[key] is not bool):
            raise EngineError(f"rope_scaling {key} must be a {getattr(_YARN_KINDS[key], '__name__', 'number')}, "
                              f"not {value!r}")
    for key in ("factor", "original_max_position_embeddings"):
        if not scaling.get(key, 0) > 0:
            raise EngineError(f"rope_scaling (yarn) needs a positive {key}")


@dataclass(frozen=True)
class DrafterConfig:
    """The DFlash-style block drafter. It works at the target's hidden size and shares the target's
    token embedding and lm_head; only these layers are its own."""

    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    block_size: int  # bonus token + (block_size - 1) masked positions = the tree's depth limit L
    target_layer_ids: tuple[int, ...]  # target layers whose outputs condition the drafter
    mask_token_id: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6

    @property
    def depth(self) -> int:
        return self.block_size - 1

    @classmethod
    def from_dict(cls, raw: dict) -> DrafterConfig:
        return cls(**{**raw, "target_layer_ids": tuple(raw["target_layer_ids"])})

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "target_layer_ids": list(self.target_layer_ids)}


def default_drafter(config: ModelConfig, mask_token_id: int) -> DrafterConfig:
    """A one-layer drafter for any target (e.g. one loaded with from_pretrained), conditioned as
    DFlash does on target layers spread evenly from layer 1 to the fourth-from-last."""
    last = config.num_hidden_layers - 1
    first, final = min(1, last), max(min(1, last), last - 3)
    ids = tuple(sorted({round(first + i * (final - first) / 2) for i in range(3)}))
    heads = max(1, config.hidden_size // 128)
    return DrafterConfig(num_hidden_layers=1, num_attention_heads=heads, head_dim=config.hidden_size // heads,
                         intermediate_size=config.intermediate_size, block_size=16, target_layer_ids=ids,
                         mask_token_id=mask_token_id, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps)


def yarn(factor: float, original: int, beta_fast: float, beta_slow: float) -> dict:
    return {"type": "yarn", "factor": factor, "original_max_position_embeddings": original,
            "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": 1.0, "mscale_all_dim": 1.0}


@dataclass(frozen=True)
class Preset:
    model: ModelConfig
    drafter: DrafterConfig
    description: str


def _preset(description: str, drafter: dict, **model) -> Preset:
    return Preset(ModelConfig(**model), DrafterConfig(**drafter), description)


TOKENIZER = load_tokenizer()

PRESETS: dict[str, Preset] = {
    "tiny": _preset(
        "2 layers (1 dense + 1 MoE with group-limited routing), hidden 64: for tests",
        dict(num_hidden_layers=1, num_attention_heads=4, head_dim=16, intermediate_size=128, block_size=5,
             target_layer_ids=(0, 1), mask_token_id=TOKENIZER.mask_id),
        vocab_size=TOKENIZER.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, n_group=4, topk_group=2, norm_topk_prob=True,
        scoring_func="sigmoid", rope_theta=10000.0, rope_scaling=yarn(4.0, 64, 32.0, 1.0), rms_norm_eps=1e-6,
        max_position_embeddings=1024),
    "small": _preset(
        "4 layers (1 dense + 3 MoE), hidden 256, 8 experts: the CPU demo",
        dict(num_hidden_layers=2, num_attention_heads=4, head_dim=64, intermediate_size=512, block_size=8,
             target_layer_ids=(1, 3), mask_token_id=TOKENIZER.mask_id),
        vocab_size=TOKENIZER.vocab_size, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, q_lora_rank=128,
        kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32, intermediate_size=512,
        moe_intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.827, n_group=1, topk_group=1, norm_topk_prob=True,
        scoring_func="sigmoid", rope_theta=50000.0, rope_scaling=yarn(8.0, 512, 1.0, 1.0), rms_norm_eps=1e-6,
        max_position_embeddings=4096),
    "k2-layer": _preset(
        "Kimi K2 per-layer shapes, 1 dense + 2 MoE layers, bf16: for one H200",
        dict(num_hidden_layers=1, num_attention_heads=32, head_dim=128, intermediate_size=18432, block_size=16,
             target_layer_ids=(1, 2), mask_token_id=TOKENIZER.mask_id),
        vocab_size=163840, hidden_size=7168, num_hidden_layers=3, num_attention_heads=64, q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=384, num_experts_per_tok=8, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.827, n_group=1, topk_group=1, norm_topk_prob=True,
        scoring_func="sigmoid", rope_theta=50000.0, rope_scaling=yarn(32.0, 4096, 1.0, 1.0), rms_norm_eps=1e-6,
        max_position_embeddings=131072, torch_dtype="bfloat16"),
}


def preset(name: str) -> Preset:
    if name not in PRESETS:
        raise EngineError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def with_moe_layers(chosen: Preset, moe_layers: int) -> Preset:
    """`chosen` with `moe_layers` MoE layers after its dense ones (`--moe-layers`): how deep an
    expert-parallel run can go once each rank holds 1/N of every layer's experts. The drafter keeps
    its target layers, which must still exist."""
    dense = chosen.model.first_k_dense_replace
    if moe_layers < 1:
        raise EngineError(f"--moe-layers must be at least 1 (got {moe_layers})")
    layers = dense + moe_layers
    if max(chosen.drafter.target_layer_ids) >= layers:
        raise EngineError(f"--moe-layers {moe_layers}: the drafter reads target layer "
                          f"{max(chosen.drafter.target_layer_ids)}, so it needs at least "
                          f"{max(chosen.drafter.target_layer_ids) + 1 - dense} MoE layers after the {dense} dense")
    return dataclasses.replace(chosen, model=dataclasses.replace(chosen.model, num_hidden_layers=layers))

