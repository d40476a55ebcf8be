"""CPU heapq vs GPU tree builder, A/B in one process: tok/s of the same workload, alternating
builders for several rounds (no profiler), so machine noise shows up as spread, not as a verdict.

    python benchmarks/builder_ab.py [--model small] [--concurrency 64] [--rounds 3] [--out FILE]

An untimed pass of the workload per builder comes first (the first round
paid for compiling every batch shape: an outlier in earlier results). Rounds alternate which builder goes first (cpu-gpu, gpu-cpu, ...), so a drift of the machine during
a round does not favour one builder; each round's gpu/cpu ratio is paired (same minute, same
engine state), and their median and range are the verdict. Both builders must produce the same
tokens in the same steps (the decoding is lossless and greedy). Prints one row per run and writes
JSON (default benchmarks/results/builder_ab.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe  # noqa: E402
from engine import corpus  # noqa: E402
from engine.engine import Engine, rows_per_slot  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.generate import load_models  # noqa: E402
from engine.scheduler import serve  # noqa: E402
from engine.serve import PROMPT_SPLIT, WEIGHT_SEED, warm_up  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402
from engine.workloads import generate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "builder_ab.json")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = load_tokenizer()
    requests = generate(args.workload, args.requests, 0, tokenizer, max_new_tokens=args.max_new_tokens,
                        files=corpus.files(PROMPT_SPLIT))
    max_len = rows_per_slot(((len(r.prompt_tokens), r.max_new_tokens) for r in requests), args.budget)
    target, drafter = load_models(args.model, seed=WEIGHT_SEED, device=device)
    engines = {b: Engine(target, drafter, budget=args.budget, builder=b, n_slots=args.concurrency,
                         max_len=max_len, device=device, nvtx=False) for b in ("cpu", "gpu")}
    for engine in engines.values():
        warm_up(engine, requests[0].prompt_tokens, min(8, requests[0].max_new_tokens))

    def run(builder: str, round_: int) -> dict:
        start = time.perf_counter()
        result = serve(engines[builder], requests, args.concurrency, eos_id=tokenizer.eos_id)
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        return {"round": round_, "builder": builder, "tokens": result.generated_tokens, "steps": result.steps,
                "wall_s": wall, "tok_per_s": result.generated_tokens / wall}

    for builder in engines:  # one untimed pass of the whole workload: every batch shape compiled once
        run(builder, -1)
    runs = []
    print(f"{'round':>5} {'builder':>7} {'tokens':>7} {'steps':>6} {'wall s':>8} {'tok/s':>8}")
    for round_ in range(args.rounds):
        for builder in ("cpu", "gpu") if round_ % 2 == 0 else ("gpu", "cpu"):
            runs.append(row := run(builder, round_))
            print(f"{round_:5} {builder:>7} {row['tokens']:7} {row['steps']:6} {row['wall_s']:8.3f} "
                  f"{row['tok_per_s']:8.1f}")
    if len({(r["tokens"], r["steps"]) for r in runs}) != 1:
        sys.exit("builder_ab: the builders decoded differently (tokens or steps differ); see the rows above")
    median = {b: statistics.median(r["tok_per_s"] for r in runs if r["builder"] == b) for b in engines}
    by_round = {(r["round"], r["builder"]): r["tok_per_s"] for r in runs}
    ratios = [by_round[i, "gpu"] / by_round[i, "cpu"] for i in range(args.rounds)]
    paired = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
              "gpu_faster_rounds": sum(ratio > 1 for ratio in ratios), "rounds": args.rounds}
    print(f"median tok/s: cpu {median['cpu']:.1f}, gpu {median['gpu']:.1f}; paired gpu/cpu per round: median "
          f"{paired['median']:.3f} (range {paired['min']:.3f}-{paired['max']:.3f}), gpu faster in "
          f"{paired['gpu_faster_rounds']} of {args.rounds} rounds")
    args.out.write_text(json.dumps({"benchmark": "builder_ab", "machine": describe(), "settings": vars(args) | {
        "out": str(args.out), "device": device}, "runs": runs, "median_tok_per_s": median,
        "paired_gpu_over_cpu": paired}, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:  # e.g. the GPU builder without CUDA (or TRITON_INTERPRET=1)
        sys.exit(f"builder_ab: {error}")
