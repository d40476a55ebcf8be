"""Two ways of serving the same workload, timed in one process: the harness behind the A/B
benchmarks (builder_ab.py, moe_dispatch_ab.py, prefill_ab.py, ...). Machine noise on the H200 host moves single runs by
up to 1.5x, so a verdict needs rounds, not one run of each.

An untimed pass of the workload per variant comes first (the first round paid for compiling every
batch shape: an outlier in earlier results). Rounds alternate which variant goes first (A-B, B-A, ...),
so a drift of the machine during a round favours neither; each round's B/A tok/s ratio is paired (same
minute, same engine state), and the ratios' median and range are the verdict. Every run must
decode exactly the first run's tokens: each variant is a faster way to the same greedy result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, ContextManager

import torch

from benchmarks.machine import RESULTS, describe
from engine import arguments, corpus
from engine.engine import Engine, rows_per_slot
from engine.errors import EngineError
from engine.generate import load_models
from engine.model import set_batch_invariant
from engine.scheduler import serve
from engine.serve import PROMPT_SPLIT, WEIGHT_SEED, max_rows, warm_up
from engine.serve_defaults import DEFAULT_PREFILL_TOKENS, PREFILL_TOKENS_HELP
from engine.tokenizer import load_tokenizer
from engine.workloads import Request, generate


def _at_least_one(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (got {text})")
    return int(text)


def device() -> str:
    """Where the A/Bs run: the GPU when there is one."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def workload_arguments(description: str, out_name: str, *, builder: bool = True, graphs: bool = True,
                       overlap: bool = False, prefill: bool = True) -> argparse.ArgumentParser:
    """The options every serving A/B takes: the workload, the engine's shape, rounds and result file,
    the engine's numerics, and unless the A/B varies them itself, the builder (`builder`), CUDA
    graphs (`graphs`) and the prefill budget (`prefill`); `overlap`: --overlap too, for an A/B
    whose engines may overlap their steps. `checked_arguments` parses them."""
    parser = argparse.ArgumentParser(description=description)
    if builder:
        parser.add_argument("--builder", choices=("cpu", "gpu"), default="gpu" if device() == "cuda" else "cpu")
    arguments.add_batch_invariant(parser)
    if graphs:
        arguments.add_cuda_graphs(parser)
    if overlap:
        arguments.add_overlap(parser)
    if prefill:
        parser.add_argument("--prefill-tokens", type=int, default=DEFAULT_PREFILL_TOKENS, help=PREFILL_TOKENS_HELP)
    parser.add_argument("--model", default="small")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--rounds", type=_at_least_one, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / out_name)
    return parser


def checked_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed options, with what they cannot do here refused before any model loads (one line,
    `run_ab`): --cuda-graphs resolved for this machine (default: on with CUDA), then --overlap
    (default: the engine's, where the graphed step runs), the numerics set."""
    args = parser.parse_args()
    if hasattr(args, "cuda_graphs"):
        args.cuda_graphs = arguments.cuda_graphs(args.cuda_graphs, device())
    if hasattr(args, "overlap"):
        args.overlap = arguments.overlap(args.overlap, getattr(args, "cuda_graphs", False))
    if hasattr(args, "prefill_tokens"):
        arguments.at_least_zero(args, "prefill_tokens")
    set_batch_invariant(args.batch_invariant)
    return args


def run_ab(name: str, main: Callable[[], None]) -> None:
    """An A/B's main, its EngineError (bad options, a builder this machine cannot run) as one line
    naming the benchmark, exit code 2."""
    try:
        main()
    except EngineError as error:
        print(f"{name}: {error}", file=sys.stderr)
        sys.exit(2)


class Workload:
    """The requests of `args`, the trained (or seeded) pair of `args.model`, and the device."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device = device()
        self.tokenizer = load_tokenizer()
        self.requests: list[Request] = generate(args.workload, args.requests, 0, self.tokenizer,
                                                max_new_tokens=args.max_new_tokens, files=corpus.files(PROMPT_SPLIT))
        self.target, self.drafter = load_models(args.model, seed=WEIGHT_SEED, device=self.device)
        self.first_output: dict[str, dict[int, list[int]]] = {}  # by numerics: every later run must decode this

    def engine(self, builder: str, cuda_graphs: bool = False, **options) -> Engine:
        """An engine (NVTX off) sized for the workload, its CUDA graphs recorded if asked, warmed up on
        its first request; `options`: Engine's other switches (static_shapes, overlap)."""
        max_len = rows_per_slot(((len(r.prompt_tokens), r.max_new_tokens) for r in self.requests), self.args.budget)
        engine = Engine(self.target, self.drafter, budget=self.args.budget, builder=builder,
                        n_slots=self.args.concurrency, max_len=max_len, device=self.device, nvtx=False,
                        cuda_graphs=cuda_graphs, **options)
        first = self.requests[0]
        warm_up(engine, first.prompt_tokens, min(8, first.max_new_tokens),
                max_rows(engine, self.requests, getattr(self.args, "prefill_tokens", DEFAULT_PREFILL_TOKENS)))
        return engine

    def serve(self, engine: Engine, numerics: str = "", prefill_tokens: int | None = None) -> dict:
        """Serve every request once (`prefill_tokens`: the scheduler's prefill batches, by default
        --prefill-tokens, or the engine's default where the A/B varies it itself); tokens,
        steps, prefills, wall time and tok/s. Exits if the tokens differ from the first run's: of the
        same `numerics`, when the variants round differently (each then decodes its own greedy tokens,
        the same in every round)."""
        if prefill_tokens is None:
            prefill_tokens = getattr(self.args, "prefill_tokens", DEFAULT_PREFILL_TOKENS)
        allocator = allocator_counts(self.device)
        start = time.perf_counter()
        result = serve(engine, self.requests, self.args.concurrency, eos_id=self.tokenizer.eos_id,
                       prefill_tokens=prefill_tokens)
        if self.device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        allocator = {name: count - allocator[name] for name, count in allocator_counts(self.device).items()}
        first = self.first_output.setdefault(numerics, result.tokens)
        if result.tokens != first:
            sys.exit(f"runs{' of ' + numerics if numerics else ''} decoded different tokens: each must be a "
                     "faster way to the same greedy result")
        return {"tokens": result.generated_tokens, "steps": result.steps, "prefill_token_budget": prefill_tokens,
                "prefills": result.prefills, "wall_s": wall,
                "tok_per_s": result.generated_tokens / wall, "decode_s": result.step_s, "prefill_s": result.prefill_s,
                "decode_tok_per_s": result.step_tokens / result.step_s if result.step_s else None,
                "allocator": allocator}


def allocator_counts(device: str) -> dict[str, int]:
    """The CUDA caching allocator's cudaMalloc and cudaFree calls and its retries (a failed
    allocation that frees the cache and tries again: each a device-wide wait) so far; {} on the
    CPU. A serve that adds to them is paying for memory the cache did not hold."""
    if device != "cuda":
        return {}
    stats = torch.cuda.memory_stats()
    return {name: stats[name] for name in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def paired_rounds(run: Callable[[str], dict], variants: tuple[str, str], rounds: int, field: str
                  ) -> tuple[list[dict], dict]:
    """Run the A/B (see the module docstring); rows name their variant under `field`. Returns the
    rows and the verdict: median tok/s per variant, and the paired B/A ratios' median and range, of
    the serving tok/s (prefills included) and of the decode steps' alone (`decode_`: what a
    decode-step change moves before prefill dilutes it)."""
    a, b = variants
    for variant in variants:
        run(variant)
    rows = []
    print(f"{'round':>5} {field:>12} {'tokens':>7} {'steps':>6} {'wall s':>8} {'prefill s':>9} {'tok/s':>8} "
          f"{'decode tok/s':>12}")
    for round_ in range(rounds):
        for variant in variants if round_ % 2 == 0 else variants[::-1]:
            rows.append(row := {"round": round_, field: variant, **run(variant)})
            print(f"{round_:5} {variant:>12} {row['tokens']:7} {row['steps']:6} {row['wall_s']:8.3f} "
                  f"{row['prefill_s']:9.3f} {row['tok_per_s']:8.1f} {row['decode_tok_per_s'] or 0:12.1f}")
    verdict = {}
    for rate, label in (("tok_per_s", "tok/s"), ("decode_tok_per_s", "decode tok/s")):
        if any(row[rate] is None for row in rows):  # no decode step ran (every answer done at its prefill)
            continue
        prefix = "" if rate == "tok_per_s" else "decode_"
        median = {v: statistics.median(r[rate] for r in rows if r[field] == v) for v in variants}
        by_round = {(r["round"], r[field]): r[rate] for r in rows}
        ratios = [by_round[i, b] / by_round[i, a] for i in range(rounds)]
        paired = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                  f"{b}_faster_rounds": sum(ratio > 1 for ratio in ratios), "rounds": rounds}
        print(f"median {label}: {a} {median[a]:.1f}, {b} {median[b]:.1f}; paired {b}/{a} per round: median "
              f"{paired['median']:.3f} (range {paired['min']:.3f}-{paired['max']:.3f}), {b} faster in "
              f"{paired[f'{b}_faster_rounds']} of {rounds} rounds")
        verdict |= {f"median_{rate}": median, f"paired_{prefix}{b}_over_{a}": paired}
    return rows, verdict


def write_result(benchmark: str, workload: Workload, rows: list[dict], verdict: dict) -> None:
    """The result file; its settings say how the runs prefilled where they all did alike (ddprof
    matches A/B evidence to captures by execution: ddprof.execution)."""
    args = workload.args
    budgets = {row["prefill_token_budget"] for row in rows}
    shared = {"prefill_token_budget": budgets.pop()} if len(budgets) == 1 else {}
    args.out.write_text(json.dumps({"benchmark": benchmark, "machine": describe(), "settings": vars(args) | {
        "out": str(args.out), "device": workload.device} | shared, "runs": rows, **verdict}, indent=1) + "\n")


def switch_ab(benchmark: str, description: str, field: str, variants: tuple[str, str],
              switch: Callable[[str], ContextManager], same_numerics: bool, graphs: bool) -> None:
    """The A/B of two settings of one engine, `switch(variant)` turning each on around its runs (the
    main of moe_dispatch_ab.py and batch_invariant_ab.py). `same_numerics`: both variants must
    decode the same tokens; else each its own, the same in every round. `graphs`: both variants can
    be recorded in CUDA graphs (--cuda-graphs, on by default with CUDA, and then overlapped as the
    engine is by default: --overlap); else both run eagerly, in order."""
    # A switch turns model code on and off around runs, and a recorded graph replays the kernels it
    # was recorded with: graphed, each variant has its own engine, recorded inside its switch;
    # eager, one engine serves both.
    args = checked_arguments(workload_arguments(description, f"{benchmark}.json", graphs=graphs, overlap=graphs))
    workload = Workload(args)
    graphed = getattr(args, "cuda_graphs", False)
    engines = {}
    for variant in variants if graphed else variants[:1]:
        with switch(variant):
            engines[variant] = workload.engine(args.builder, cuda_graphs=graphed, overlap=getattr(args, "overlap", False))

    def run(variant: str) -> dict:
        with switch(variant):
            return workload.serve(engines.get(variant, engines[variants[0]]), "" if same_numerics else variant)

    rows, verdict = paired_rounds(run, variants, args.rounds, field)
    write_result(benchmark, workload, rows, verdict)
