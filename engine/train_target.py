"""`python -m engine train-target`: train a preset's target model on the corpus's train split.

    python -m engine train-target --model tiny
    python -m engine train-target --model small

Next-token cross-entropy on `<bos>` + windows of the train split (engine/corpus.py), AdamW with
warm-up and cosine decay, gradients clipped at norm 1. The MoE routers are balanced as in
DeepSeek-V3, without an auxiliary loss: after every step each expert's selection bias moves by
`BIAS_RATE` towards equal load (the bias steers only which experts are chosen, never their
weights). The bar shows the running loss. At the end the weights are stored in bfloat16 and the
held-out loss of exactly those stored weights is measured on fixed held-out windows. Writes
`<out>/target/` (config.json + model.safetensors) and `<out>/train-target.json`.
"""

from __future__ import annotations

import argparse
import copy
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine import corpus
from engine.config import ModelConfig, preset
from engine.model import MoE, TargetModel, build_target, plain_matmuls
from engine.tokenizer import load_tokenizer
from engine.train import (add_common_arguments, check_common_arguments, learning_rate, progress_bar, run_record,
                          set_learning_rate, write_record)
from engine.trained import STORAGE_DTYPE, asset_dir, load_target
from engine.weights import require_finite, save_pretrained

BIAS_RATE = 1e-3  # DeepSeek-V3's bias update speed
HELD_OUT_SEQUENCES = 16


@dataclass(frozen=True)
class Recipe:
    steps: int
    batch_size: int
    seq_len: int  # tokens per training sequence, <bos> included


RECIPES = {"tiny": Recipe(steps=800, batch_size=16, seq_len=256),
           "small": Recipe(steps=700, batch_size=8, seq_len=512)}


def train_target(config: ModelConfig, tokenizer, recipe: Recipe, *, lr: float, seed: int,
                 on_step=None) -> tuple[TargetModel, list[float]]:
    """A target trained from seeded random weights; returns it (eval mode, float32) and every step's loss."""
    torch.manual_seed(seed)
    data_order = torch.Generator().manual_seed(seed)
    model = build_target(config, seed=seed).train().requires_grad_(True)
    routers = [layer.mlp.gate for layer in model.model.layers if isinstance(layer.mlp, MoE)]
    loads = {id(r): torch.zeros(config.n_routed_experts) for r in routers}

    def count_load(router, _inputs, output) -> None:
        loads[id(router)] += torch.bincount(output[1].flatten(), minlength=config.n_routed_experts)

    for router in routers:
        router.e_score_correction_bias.zero_()
        router.register_forward_hook(count_load)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    stream = corpus.token_stream(tokenizer, "train")
    losses = []
    with plain_matmuls():
        for step in range(recipe.steps):
            set_learning_rate(optimizer, learning_rate(step, recipe.steps, lr, warmup=max(1, recipe.steps // 20)))
            batch = corpus.sample_sequences(stream, recipe.batch_size, recipe.seq_len + 1, tokenizer.bos_id,
                                            data_order)
            logits, _ = model.forward_causal(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            with torch.no_grad():
                for router in routers:
                    load = loads[id(router)]
                    router.e_score_correction_bias.add_(BIAS_RATE * torch.sign(load.mean() - load))
                    load.zero_()
            losses.append(loss.item())
            if on_step:
                on_step(step, losses[-1])
    return model.eval().requires_grad_(False), losses


@torch.no_grad()
def held_out_loss(model: TargetModel, tokenizer, seq_len: int, *, seed: int = 0) -> float:
    """Mean next-token loss on fixed windows of the held-out split (the same windows for every run)."""
    stream = corpus.token_stream(tokenizer, "held-out")
    batch = corpus.sample_sequences(stream, HELD_OUT_SEQUENCES, seq_len + 1, tokenizer.bos_id,
                                    torch.Generator().manual_seed(seed))
    with plain_matmuls():
        logits, _ = model.forward_causal(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()


def save_target(model: TargetModel, directory: Path, tokenizer) -> None:
    """The checkpoint in the storage dtype (routers and position tables stay float32, see TargetModel.cast),
    naming the tokenizer's bos/eos ids as a checkpoint does; a run that diverged (NaN or Inf weights)
    writes nothing over the checkpoint there."""
    require_finite(model, f"train-target (not saved to {directory})")
    save_pretrained(copy.deepcopy(model).cast(STORAGE_DTYPE), directory, special=(tokenizer.bos_id, tokenizer.eos_id))


def register(subcommands) -> None:
    parser = subcommands.add_parser("train-target", help="train a preset's target on the offline corpus",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, steps={k: r.steps for k, r in RECIPES.items()}, lr=3e-3)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    check_common_arguments(args)
    started = time.perf_counter()
    recipe = RECIPES[args.model]
    if args.steps:
        recipe = Recipe(args.steps, recipe.batch_size, recipe.seq_len)
    out = args.out or asset_dir(args.model)
    tokenizer = load_tokenizer()
    config = preset(args.model).model
    with progress_bar(f"train-target {args.model}", recipe.steps) as update:
        recent: list[float] = []

        def on_step(step: int, loss: float) -> None:
            recent[:] = (recent + [loss])[-20:]
            update(info=f"loss {sum(recent) / len(recent):.3f}")

        model, losses = train_target(config, tokenizer, recipe, lr=args.lr, seed=args.seed, on_step=on_step)
    save_target(model, out / "target", tokenizer)
    stale = [path for path in (out / "drafter.safetensors", out / "train-drafter.json") if path.exists()]
    for path in stale:  # distilled from the target just replaced: no longer its pair
        path.unlink()
    stored = load_target(args.model, directory=out / "target")
    record = run_record(
        args, started=started, preset=args.model, steps=recipe.steps, batch_size=recipe.batch_size,
        seq_len=recipe.seq_len, tokens_seen=recipe.steps * recipe.batch_size * recipe.seq_len, peak_lr=args.lr,
        parameters=sum(p.numel() for p in model.parameters()),
        final_train_loss=round(sum(losses[-20:]) / len(losses[-20:]), 4), first_train_loss=round(losses[0], 4),
        held_out_loss=round(held_out_loss(stored, tokenizer, recipe.seq_len), 4),
        storage_dtype=str(STORAGE_DTYPE).removeprefix("torch."), tokenizer="engine/assets/tokenizer.json",
        corpus=corpus.describe("train"))
    write_record(out / "train-target.json", record)
    print(f"train loss {record['final_train_loss']}, held-out loss {record['held_out_loss']} "
          f"({record['wall_s']} s) -> {out}")
    if stale:
        print(f"removed {out / 'drafter.safetensors'}: it was distilled from the previous target; "
              f"run python -m engine train-drafter --model {args.model}" + (f" --out {args.out}" if args.out else ""))
    return 0
