"""Run a function as N real gloo ranks (spawned processes) and collect what each returns: the
expert-parallel tests' harness (torch.multiprocessing needs the rank function importable)."""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.config import preset
from engine.model import MoE, init_random, materialize
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
    # Done, result written, group left: exit without the interpreter's teardown, where a gloo
    # thread still joinable aborts the process now and then under load ("terminate called without
    # an active exception", SIGABRT, seen once in a full-suite run) after its work succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(world: int, fn, *args, folder: Path) -> list:
    """fn(parallel, *args) on each of `world` ranks; the results in rank order."""
    with rendezvous(world) as group:
        mp.spawn(_rank_main, args=(group, str(folder), fn, args), nprocs=world, join=True)
    return [pickle.loads(Path(folder, f"{rank}.pkl").read_bytes()) for rank in range(world)]


def decode_prompts(parallel, model: str, prompts: list[list[int]], max_new: int, budget: int) -> dict:
    """Greedy AR and DDTree tokens of the prompts, batched, on this rank's part of the model."""
    from engine.generate import generate, load_models

    torch.set_num_threads(1)
    target, drafter = load_models(model, seed=0, device="cpu", parallel=parallel)
    held = sorted({int(name.split(".")[5]) for name in target.state_dict() if ".mlp.experts." in name})
    return {"held_experts": held,
            **{mode: [r.tokens for r in generate(target, drafter, prompts, mode=mode, budget=budget,
                                                 max_new_tokens=max_new, nvtx=False)]
               for mode in ("ar", "ddtree")}}


def moe_layer(parallel=None, seed=3):
    """A tiny-preset MoE layer with seeded weights: the whole layer, or one rank's part of the same."""
    config = dataclasses.replace(preset("tiny").model, torch_dtype="float32")
    with torch.device("meta"):
        moe = MoE(config, parallel)
    materialize(moe, "cpu")
    with torch.device("meta"):
        whole = MoE(config)
    init_random(moe, seed, std=0.1, whole=whole)
    return moe.eval().requires_grad_(False)


def moe_outputs(parallel, x):
    """This rank's layer on x at once and token by token (each through the ranks' all-reduce)."""
    moe = moe_layer(parallel)
    return moe(x), torch.cat([moe(x[i:i + 1]) for i in range(x.shape[0])])
