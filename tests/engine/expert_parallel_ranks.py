"""Run a function as N real gloo ranks (spawned processes) and collect what each returns: the
expert-parallel tests' harness (torch.multiprocessing needs the rank function importable)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch.multiprocessing as mp

from engine.ranks import rendezvous

TIMEOUT_S = 60.0


def _rank_main(rank: int, group: dict[str, str], out: str, fn, args) -> None:
    os.environ.update(group, RANK=str(rank))
    from engine.expert_parallel import from_environment

    parallel = from_environment("cpu", TIMEOUT_S)
    try:
        Path(out, f"{rank}.pkl").write_bytes(pickle.dumps(fn(parallel, *args)))
    finally:
        parallel.close()


def run_ranks(world: int, fn, *args, folder: Path) -> list:
    """fn(parallel, *args) on each of `world` ranks; the results in rank order."""
    with rendezvous(world) as group:
        mp.spawn(_rank_main, args=(group, str(folder), fn, args), nprocs=world, join=True)
    return [pickle.loads(Path(folder, f"{rank}.pkl").read_bytes()) for rank in range(world)]


def decode_prompts(parallel, model: str, prompts: list[list[int]], max_new: int, budget: int) -> dict:
    """Greedy AR and DDTree tokens of the prompts, batched, on this rank's part of the model."""
    import torch

    from engine.generate import generate, load_models

    torch.set_num_threads(1)
    target, drafter = load_models(model, seed=0, device="cpu", parallel=parallel)
    held = sorted({int(name.split(".")[5]) for name in target.state_dict() if ".mlp.experts." in name})
    return {"held_experts": held,
            **{mode: [r.tokens for r in generate(target, drafter, prompts, mode=mode, budget=budget,
                                                 max_new_tokens=max_new, nvtx=False)]
               for mode in ("ar", "ddtree")}}
