"""Load and save the target in the DeepSeek-V3 / Kimi-K2 checkpoint format.

A checkpoint directory holds `config.json` and safetensors shards (listed by
`model.safetensors.index.json` when there are several). Parameter names are the checkpoint's own
(`model.layers.0.self_attn.kv_a_proj_with_mqa.weight`, `model.layers.1.mlp.experts.7.up_proj.weight`,
...): `TargetModel` is laid out so its `state_dict()` uses exactly those keys.

Layers past `num_hidden_layers` in the files (DeepSeek-V3's multi-token-prediction layer, or the
rest of a full model whose config was cut down) are skipped, their shards never opened; anything
else unexpected is an error. FP8 block-quantized checkpoints (the published DeepSeek-V3 and Kimi-K2)
load as they are (engine/fp8.py); a tied checkpoint (tie_word_embeddings) has no lm_head of its own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engine import fp8
from engine.config import ModelConfig
from engine.errors import EngineError
from engine.expert_parallel import ExpertParallel
from engine.model import TargetModel, allocate_target

INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_EXPERT = re.compile(r"^model\.layers\.\d+\.mlp\.experts\.(\d+)\.")


def _shard_of_each_tensor(directory: Path) -> dict[str, Path]:
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise EngineError(f"{index}: not a readable safetensors index ({e!r})") from None
        return {name: directory / file for name, file in weight_map.items()}
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise EngineError(f"{directory}: no *.safetensors files")
    where = {}
    for shard in shards:
        with open_safetensors(shard) as f:
            where.update({name: shard for name in f.keys()})
    return where


def open_safetensors(path: Path):
    """safe_open, with a missing, truncated or foreign file as one EngineError naming it."""
    try:
        return safe_open(path, framework="pt")
    except (OSError, SafetensorError) as e:
        raise EngineError(f"{path}: not a readable safetensors file ({e})") from None


def require_finite(model: torch.nn.Module, path: Path | str) -> None:
    """Refuse weights holding NaN or Inf (a diverged training run): they decode garbage silently."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise EngineError(f"{path}: weight {name} holds NaN or Inf")


def _is_skipped(name: str, config: ModelConfig, held_experts: range) -> bool:
    """Tensors the checkpoint may hold that this model does not read: past its layers, or another
    rank's routed experts (expert parallelism)."""
    layer, expert = _LAYER.match(name), _EXPERT.match(name)
    return (name.endswith("rotary_emb.inv_freq") or (layer is not None and int(layer.group(1)) >= config.num_hidden_layers)
            or (expert is not None and int(expert.group(1)) in range(config.n_routed_experts)
                and int(expert.group(1)) not in held_experts))


def read_json(path: Path) -> dict:
    """A JSON object from `path`, or one EngineError naming the file."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EngineError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise EngineError(f"{path}: must be a JSON object")
    return raw


def _config_json(directory: Path) -> tuple[Path, dict]:
    path = directory / "config.json"
    if not path.is_file():
        raise EngineError(f"{path}: not found (a checkpoint directory needs config.json)")
    return path, read_json(path)


def _model_config(path: Path, raw: dict) -> ModelConfig:
    try:
        return ModelConfig.from_dict(raw)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


def read_config(directory: str | Path) -> ModelConfig:
    return _model_config(*_config_json(Path(directory)))


# transformers' defaults (PretrainedConfig / DeepseekV3Config) for a checkpoint that names neither.
DEFAULT_SPECIAL_TOKENS = {"bos_token_id": 0, "eos_token_id": 1}


def special_tokens(directory: str | Path) -> tuple[int | None, int | None]:
    """(bos, eos) of a checkpoint: generation_config.json's when it names them, else config.json's,
    else transformers' defaults; null means none (no bos prepended, no stop token)."""
    directory = Path(directory)
    path, raw = _config_json(directory)
    generation = directory / "generation_config.json"
    sources = [(path, raw)] + ([(generation, read_json(generation))] if generation.is_file() else [])
    vocab = _model_config(path, raw).vocab_size
    ids = []
    for key, default in DEFAULT_SPECIAL_TOKENS.items():
        where, value = next(((p, r[key]) for p, r in reversed(sources) if key in r), (path, default))
        if isinstance(value, list) and len(set(value)) == 1:  # generation_config.json's list of stop tokens
            value = value[0]
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab):
            several = " (the engine stops at one token, not several)" if isinstance(value, list) else ""
            raise EngineError(f"{where}: {key} {value!r} is not a token id below vocab_size {vocab}{several}")
        ids.append(value)
    return ids[0], ids[1]


def _allocate(config: ModelConfig, path: Path, device, dtype, parallel: ExpertParallel | None) -> TargetModel:
    try:
        return allocate_target(config, device=device, dtype=dtype, parallel=parallel)
    except (TypeError, ValueError, RuntimeError) as e:  # sizes of the wrong type or sign, or too big to allocate
        raise EngineError(f"{path}: describes no model this engine can build here "
                          f"({str(e).splitlines()[0]})") from None


@torch.no_grad()
def from_pretrained(directory: str | Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None, parallel: ExpertParallel | None = None) -> TargetModel:
    """The target described by `directory/config.json`, with the shards' weights, computing in
    `dtype` (default: the checkpoint's own, config.json's torch_dtype or dtype).

    Only the tensors the target needs are read, shard by shard; FP8 weights are dequantized to
    the compute dtype one tensor at a time as they are read (engine/fp8.py), so memory peaks at the
    model plus one tensor in float32. Names are checked before any weight memory is allocated."""
    directory = Path(directory)
    path, raw = _config_json(directory)
    config = _model_config(path, raw)
    try:
        block = fp8.block_size(raw.get("quantization_config"))
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None
    held_experts = parallel.shard.experts(config.n_routed_experts) if parallel else range(config.n_routed_experts)
    wanted = set(_allocate(config, path, "meta", dtype, parallel).state_dict())
    where = _shard_of_each_tensor(directory)
    scales = {name: name + fp8.SCALE_SUFFIX for name in wanted if name + fp8.SCALE_SUFFIX in where}
    if scales and block is None:
        raise EngineError(f"{directory}: {next(iter(scales.values()))} is an FP8 block scale, but config.json "
                          "has no quantization_config")
    tied_head = {"lm_head.weight"} & set(where) if config.tie_word_embeddings else set()
    expected = wanted | set(scales.values()) | tied_head
    unexpected = sorted(n for n in where if n not in expected and not _is_skipped(n, config, held_experts))
    if unexpected:
        raise EngineError(f"{directory}: unexpected tensor {unexpected[0]} ({len(unexpected)} unexpected in all)")
    missing = sorted(n for n in wanted if n not in where)
    if missing:
        raise EngineError(f"{directory}: checkpoint lacks {missing[0]} ({len(missing)} missing in all)")
    model = _allocate(config, path, device, dtype, parallel)
    params = model.state_dict()
    by_shard: dict[Path, list[str]] = {}
    for name in sorted(wanted | tied_head):
        by_shard.setdefault(where[name], []).append(name)
    stored_head = None
    for shard, names in by_shard.items():
        with open_safetensors(shard) as f:
            for name in names:
                tensor = _read(f, shard, name)
                if name in scales:
                    scale_shard = where[scales[name]]
                    scale = (_read(f, shard, scales[name]) if scale_shard == shard
                             else _read_one(scale_shard, scales[name]))
                    try:
                        tensor = fp8.dequantize(tensor.to(model.device), scale.to(model.device), block,
                                                params[name].dtype, name)
                    except EngineError as e:  # about the weight and its scale, perhaps in two shards
                        raise EngineError(f"{directory}: {e}") from None
                elif tensor.dtype == torch.float8_e4m3fn:
                    raise EngineError(f"{shard}: {name} is float8_e4m3fn but has no {name}{fp8.SCALE_SUFFIX}")
                if name in tied_head:
                    stored_head = tensor
                    continue
                if tensor.shape != params[name].shape:
                    raise EngineError(f"{shard}: {name} has shape {tuple(tensor.shape)}, "
                                      f"config.json implies {tuple(params[name].shape)}")
                params[name].copy_(tensor)
    embedding = model.model.embed_tokens.weight
    if stored_head is not None and not torch.equal(stored_head.to(embedding), embedding):
        # transformers would ignore it silently; a checkpoint whose two differ is not one model
        raise EngineError(f"{where['lm_head.weight']}: lm_head.weight differs from model.embed_tokens.weight, "
                          "but config.json ties them (tie_word_embeddings: true)")
    require_finite(model, directory)
    return model.eval().requires_grad_(False)


def _read(f, shard: Path, name: str) -> torch.Tensor:
    try:
        return f.get_tensor(name)
    except SafetensorError as e:
        raise EngineError(f"{shard}: cannot read {name} ({e})") from None


def _read_one(shard: Path, name: str) -> torch.Tensor:
    with open_safetensors(shard) as f:
        return _read(f, shard, name)


def save_pretrained(model: TargetModel, directory: str | Path, *,
                    special: tuple[int | None, int | None] | None = None) -> None:
    """config.json (with `special` = (bos, eos) ids when given) and one model.safetensors shard,
    readable by `from_pretrained`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_dict(), "torch_dtype": str(model.dtype).removeprefix("torch.")}
    if special is not None:
        config.update(zip(DEFAULT_SPECIAL_TOKENS, special))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, directory / "model.safetensors")
