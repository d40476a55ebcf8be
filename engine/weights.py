"""Load and save the target in the DeepSeek-V3 / Kimi-K2 checkpoint format.

A checkpoint directory holds `config.json` and safetensors shards (listed by
`model.safetensors.index.json` when there are several). Parameter names are the checkpoint's own
(`model.layers.0.self_attn.kv_a_proj_with_mqa.weight`, `model.layers.1.mlp.experts.7.up_proj.weight`,
...): `TargetModel` is laid out so its `state_dict()` uses exactly those keys.

Layers past `num_hidden_layers` in the files (DeepSeek-V3's multi-token-prediction layer, or the
rest of a full model whose config was cut down) are skipped; anything else unexpected is an error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engine.config import ModelConfig
from engine.errors import EngineError
from engine.model import TargetModel, allocate_target

INDEX = "model.safetensors.index.json"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


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


def _is_skipped(name: str, num_layers: int) -> bool:
    layer = _LAYER.match(name)
    return name.endswith("rotary_emb.inv_freq") or (layer is not None and int(layer.group(1)) >= num_layers)


def read_config(directory: str | Path) -> ModelConfig:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise EngineError(f"{path}: not found (a checkpoint directory needs config.json)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EngineError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise EngineError(f"{path}: must be a JSON object")
    try:
        return ModelConfig.from_dict(raw)
    except EngineError as e:
        raise EngineError(f"{path}: {e}") from None


@torch.no_grad()
def from_pretrained(directory: str | Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> TargetModel:
    """The target described by `directory/config.json`, with the shards' weights."""
    directory = Path(directory)
    config = read_config(directory)
    try:
        model = allocate_target(config, device=device, dtype=dtype)
    except (TypeError, ValueError, RuntimeError) as e:  # sizes of the wrong type or sign, or too big to allocate
        raise EngineError(f"{directory / 'config.json'}: describes no model this engine can build here "
                          f"({str(e).splitlines()[0]})") from None
    wanted = model.state_dict()
    where = _shard_of_each_tensor(directory)
    quantized = [n for n in where if n.endswith("weight_scale_inv")]
    if quantized:
        raise EngineError(f"{directory}: FP8 block-quantized weights ({quantized[0]}, ...) are not supported; "
                          "dequantize the checkpoint to bf16 first")
    unexpected = sorted(n for n in where if n not in wanted and not _is_skipped(n, config.num_hidden_layers))
    if unexpected:
        raise EngineError(f"{directory}: unexpected tensor {unexpected[0]} ({len(unexpected)} unexpected in all)")
    missing = sorted(n for n in wanted if n not in where)
    if missing:
        raise EngineError(f"{directory}: checkpoint lacks {missing[0]} ({len(missing)} missing in all)")
    by_shard: dict[Path, list[str]] = {}
    for name in wanted:
        by_shard.setdefault(where[name], []).append(name)
    for shard, names in by_shard.items():
        with open_safetensors(shard) as f:
            for name in names:
                try:
                    tensor = f.get_tensor(name)
                except SafetensorError as e:
                    raise EngineError(f"{shard}: cannot read {name} ({e})") from None
                if tensor.shape != wanted[name].shape:
                    raise EngineError(f"{shard}: {name} has shape {tuple(tensor.shape)}, "
                                      f"config.json implies {tuple(wanted[name].shape)}")
                wanted[name].copy_(tensor)
    require_finite(model, directory)
    return model.eval().requires_grad_(False)


def save_pretrained(model: TargetModel, directory: str | Path) -> None:
    """config.json and one model.safetensors shard, readable by `from_pretrained`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**model.config.to_dict(), "torch_dtype": str(model.dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, directory / "model.safetensors")
