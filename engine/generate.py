"""`python -m engine generate`: decode prompts with the embedded engine and report what happened.

    python -m engine generate --model tiny --seed 0 --mode ddtree --builder cpu --budget 8 \\
        --max-new-tokens 32 --prompt "Hello" --json

prints {"tokens": [...], "target_forwards": n, "accept_lengths": [...], "text": "..."}.
`--mode ddtree` prints exactly the tokens of `--mode ar` for any budget: DDTree only changes how
many target forwards they cost. That holds for greedy decoding (the default) and for sampling
(`--temperature T --sample-seed S`; prompt i samples with seed S + i), since a sample depends only
on the seed and the token's position (engine/sampling.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch

from engine import arguments
from engine.config import PRESETS, Preset, default_drafter, preset, with_moe_layers
from engine.drafter import Drafter, build_drafter
from engine.engine import Engine, RequestResult, rows_per_slot
from engine.errors import EngineError
from engine.expert_parallel import ExpertParallel
from engine.model import TargetModel, build_target, set_batch_invariant
from engine.tokenizer import load_tokenizer
from engine.trained import drafter_path as drafter_path_of
from engine.trained import has_pair, has_target, load_drafter, load_target
from engine.weights import from_pretrained, special_tokens


def load_models(model: str, *, seed: int, device: str, weights: str | None = None,
                drafter_path: str | None = None, random_weights: bool = False,
                dtype: torch.dtype | None = None, parallel: ExpertParallel | None = None,
                moe_layers: int | None = None) -> tuple[TargetModel, Drafter]:
    """The target (a preset's trained weights, seeded random ones, or a checkpoint) and its drafter,
    computing in `dtype` (default: the preset's, or the checkpoint's own); under expert parallelism
    (`parallel`) the target holds this rank's routed experts; `moe_layers` sets how many MoE layers
    a preset of random weights has (preset_with_moe_layers).
    A preset with a committed trained pair (engine/trained.py) loads it unless `random_weights`."""
    deepened = (preset_with_moe_layers(model, moe_layers, weights=weights, random_weights=random_weights)
                if moe_layers is not None else None)
    target_there, drafter_there = has_target(model), drafter_path_of(model).is_file()
    if not weights and not random_weights and target_there != drafter_there:  # half a pair: not random weights
        missing = "drafter" if target_there else "target"
        raise EngineError(f"preset {model}: the trained pair under engine/assets/{model}/ lacks its {missing}; "
                          "restore it (git checkout engine/assets) or retrain it (python -m engine train-target, "
                          "train-drafter)")
    if not weights and not random_weights and has_pair(model):
        target = load_target(model, device=device, dtype=dtype, parallel=parallel)
        return target, (_matching_drafter(drafter_path, target) if drafter_path else load_drafter(model, target))
    if weights:
        target = from_pretrained(weights, device=device, dtype=dtype, parallel=parallel)
        drafter_config = default_drafter(target.config, load_tokenizer().mask_id)
    else:
        chosen = deepened or preset(model)
        target = build_target(chosen.model, seed=seed, device=device, dtype=dtype, parallel=parallel)
        drafter_config = chosen.drafter
    if drafter_path:
        return target, _matching_drafter(drafter_path, target)
    return target, build_drafter(drafter_config, target.config, seed=seed + 1, device=device, dtype=target.dtype)


def preset_with_moe_layers(model: str, moe_layers: int, *, weights: str | None = None,
                           random_weights: bool = False) -> Preset:
    """The preset `model`, `moe_layers` MoE layers deep (config.with_moe_layers): for a preset's
    random weights only, as a checkpoint or a trained pair has its own depth."""
    if weights:
        raise EngineError("--moe-layers: only for a preset's random weights, not with --weights (a checkpoint has "
                          "its own layers)")
    if has_pair(model) and not random_weights:
        raise EngineError(f"--moe-layers: preset {model} loads its trained weights, which have their own layers; "
                          "only a preset of random weights (k2-layer) takes another count")
    return with_moe_layers(preset(model), moe_layers)


def _matching_drafter(path: str, target: TargetModel) -> Drafter:
    """The drafter in `path`, refused unless it was trained for this target's shape."""
    drafter = Drafter.load(path, device=target.device, dtype=target.dtype)
    same_dtype = dataclasses.replace(drafter.target_config, torch_dtype=target.config.torch_dtype)
    if same_dtype != target.config:
        raise EngineError(f"{path}: a drafter for another target (hidden size {drafter.target_config.hidden_size}, "
                          f"{drafter.target_config.num_hidden_layers} layers; this target: "
                          f"{target.config.hidden_size}, {target.config.num_hidden_layers})")
    return drafter


def generate(target: TargetModel, drafter: Drafter, prompts: list[list[int]], *, mode: str = "ddtree",
             builder: str = "cpu", budget: int = 8, max_new_tokens: int = 32, eos_id: int | None = None,
             nvtx: bool = True, temperature: float = 0.0, sample_seed: int = 0,
             cuda_graphs: bool = False) -> list[RequestResult]:
    """Decode all prompts together as one batch, each in its own cache slot (prompt i samples
    with seed sample_seed + i)."""
    max_len = rows_per_slot(((len(p), max_new_tokens) for p in prompts), budget)
    engine = Engine(target, drafter, budget=budget, builder=builder, mode=mode, n_slots=len(prompts),
                    max_len=max_len, nvtx=nvtx, temperature=temperature, cuda_graphs=cuda_graphs)
    for i, prompt in enumerate(prompts):
        engine.admit(i, prompt, max_new_tokens, eos_id, seed=sample_seed + i)
    while engine.active:
        engine.step()
    return [engine.result(i) for i in range(len(prompts))]


def register(subcommands) -> None:
    parser = subcommands.add_parser("generate", help="decode prompts (greedy or sampled), AR or DDTree",
                                    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small", choices=list(PRESETS),
                        help="; ".join(f"{name}: {p.description}" for name, p in PRESETS.items()) + " (default small)")
    parser.add_argument("--weights", help="checkpoint directory (config.json + safetensors, bf16/fp32 or FP8 "
                        "block-quantized) instead of a preset; its bos/eos ids (generation_config.json, else "
                        "config.json) start the prompts and stop decoding")
    parser.add_argument("--drafter", help="drafter safetensors file (default: the preset's trained drafter; with "
                        "--weights, a seeded random one)")
    parser.add_argument("--random-weights", action="store_true",
                        help="seeded random weights instead of the preset's trained ones (engine/assets/)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random weights (with --random-weights, or a preset without trained ones)")
    parser.add_argument("--mode", default="ddtree", choices=["ddtree", "ar"])
    parser.add_argument("--builder", choices=["cpu", "gpu"], help="DDTree tree builder (default cpu)")
    parser.add_argument("--budget", type=int, help="draft tree nodes per step (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    parser.add_argument("--sample-seed", type=int, default=0,
                        help="sampling seed of the first prompt (prompt i uses seed + i; default 0)")
    parser.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    arguments.add_batch_invariant(parser)
    arguments.add_cuda_graphs(parser)
    arguments.add_dtype_option(parser)
    parser.add_argument("--no-nvtx", action="store_true", help="emit no NVTX ranges")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    arguments.at_least_one(args, "budget", "max_new_tokens")
    _tree_options(args)
    arguments.temperature(args.temperature)
    args.device = arguments.device(args.device)
    args.cuda_graphs = arguments.cuda_graphs(args.cuda_graphs, args.device, args.mode)
    if args.weights and args.random_weights:
        raise EngineError("--weights and --random-weights: choose one (a checkpoint, or seeded random weights)")
    set_batch_invariant(args.batch_invariant)
    tokenizer = load_tokenizer()
    texts = args.prompt or ["The quick brown fox"]
    bos, eos = special_tokens(args.weights) if args.weights else (tokenizer.bos_id, tokenizer.eos_id)
    target, drafter = load_models(args.model, seed=args.seed, device=args.device, weights=args.weights,
                                  drafter_path=args.drafter, random_weights=args.random_weights,
                                  dtype=arguments.dtype(args.dtype))
    prompts = [[bos] * (bos is not None) + tokenizer.encode(t) for t in texts]
    results = generate(target, drafter, prompts, mode=args.mode, builder=args.builder, budget=args.budget,
                       max_new_tokens=args.max_new_tokens, eos_id=None if args.ignore_eos else eos,
                       nvtx=not args.no_nvtx, temperature=args.temperature, sample_seed=args.sample_seed,
                       cuda_graphs=args.cuda_graphs)
    rows = [{"tokens": r.tokens, "target_forwards": r.target_forwards, "accept_lengths": r.accept_lengths,
             "text": tokenizer.decode(r.tokens)} for r in results]
    if args.json:
        print(json.dumps(rows[0] if len(rows) == 1 else rows))
    else:
        _print_table(texts, rows, args)
    return 0


def _tree_options(args: argparse.Namespace) -> None:
    """--builder and --budget shape DDTree's draft tree; autoregressive decoding drafts none, so
    giving them with --mode ar is a mistake worth saying rather than ignoring."""
    if args.mode == "ar":
        given = [flag for flag, value in (("--builder", args.builder), ("--budget", args.budget)) if value is not None]
        if given:
            raise EngineError(f"{' and '.join(given)}: only for --mode ddtree (--mode ar drafts no tree)")
    args.builder = args.builder or "cpu"
    args.budget = args.budget or 8


def _print_table(texts: list[str], rows: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.model} · {args.mode}" + (f" · budget {args.budget} · {args.builder} builder"
                                                          if args.mode == "ddtree" else "")
                  + (f" · temperature {args.temperature:g}, seed {args.sample_seed}" if args.temperature else ""))
    for column in ("prompt", "generated", "tokens", "target forwards", "tokens / forward"):
        table.add_column(column, justify="right" if column != "prompt" and column != "generated" else "left")
    for text, row in zip(texts, rows):
        table.add_row(repr(text), repr(row["text"]), str(len(row["tokens"])), str(row["target_forwards"]),
                      f"{len(row['tokens']) / row['target_forwards']:.2f}")
    Console().print(table)
