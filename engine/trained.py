"""The trained target/drafter pairs committed for the `tiny` and `small` presets.

    engine/assets/<preset>/target/             config.json + model.safetensors (the checkpoint format
                                               of engine/weights.py), written by `train-target`
    engine/assets/<preset>/drafter.safetensors written by `train-drafter` against that target
    engine/assets/<preset>/train-target.json   each run's exact command, seed, corpus, losses, time
    engine/assets/<preset>/train-drafter.json

Weights are stored in bfloat16 to keep the repository small; the presets compute in float32 (the
cast is exact), so what the benchmark measured is what loads. `generate`, `serve` (and so
`ddprof capture`) use these by default; random weights only when asked for or when a preset has
no trained pair.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from engine.config import preset
from engine.drafter import Drafter
from engine.errors import EngineError
from engine.expert_parallel import ExpertParallel
from engine.model import TargetModel
from engine.weights import from_pretrained

ASSETS = Path(__file__).parent / "assets"
STORAGE_DTYPE = torch.bfloat16


def asset_dir(name: str) -> Path:
    return ASSETS / name


def target_dir(name: str) -> Path:
    return asset_dir(name) / "target"


def drafter_path(name: str) -> Path:
    return asset_dir(name) / "drafter.safetensors"


def has_target(name: str) -> bool:
    return (target_dir(name) / "config.json").is_file()


def has_pair(name: str) -> bool:
    return has_target(name) and drafter_path(name).is_file()


def load_target(name: str, *, device: str | torch.device = "cpu", directory: Path | None = None,
                dtype: torch.dtype | None = None, parallel: ExpertParallel | None = None) -> TargetModel:
    """The trained target of preset `name` (from `directory` if given), computing in `dtype`
    (default: the preset's); under expert parallelism, this rank's part of it."""
    wanted = preset(name).model
    directory = directory or target_dir(name)
    target = from_pretrained(directory, device=device, dtype=dtype or getattr(torch, wanted.torch_dtype),
                             parallel=parallel)
    stored = dataclasses.replace(target.config, torch_dtype=wanted.torch_dtype)
    if stored != wanted:
        raise EngineError(f"{directory}: trained for a different {name!r} preset than engine/config.py defines; "
                          f"retrain with python -m engine train-target --model {name}")
    return target


def load_drafter(name: str, target: TargetModel) -> Drafter:
    path = drafter_path(name)
    drafter = Drafter.load(str(path), device=target.device, dtype=target.dtype)
    if drafter.config != preset(name).drafter or drafter.target_config.vocab_size != target.config.vocab_size:
        raise EngineError(f"{path}: trained for a different {name!r} preset than engine/config.py defines; "
                          f"retrain with python -m engine train-drafter --model {name}")
    return drafter


def describe(name: str, *, seed: int = 0) -> str:
    """What `engine.generate.load_models` loads for preset `name`, in words (for run summaries)."""
    if has_pair(name):
        return f"trained ({asset_dir(name).relative_to(ASSETS.parents[1])})"
    return f"random (seed {seed})"


def load_pair(name: str, *, device: str | torch.device = "cpu") -> tuple[TargetModel, Drafter]:
    if not has_pair(name):
        raise EngineError(f"preset {name!r} has no trained pair under {asset_dir(name)}")
    target = load_target(name, device=device)
    return target, load_drafter(name, target)
