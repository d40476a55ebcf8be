"""CPU heapq vs GPU tree builder, A/B in one process: tok/s of the same workload, alternating
builders for several rounds (no profiler), so machine noise shows up as spread, not as a verdict.

    python benchmarks/builder_ab.py [--model small] [--concurrency 64] [--rounds 3] [--out FILE]

Prints one row per run and writes JSON (default benchmarks/results/builder_ab.json).
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
    runs = []
    print(f"{'round':>5} {'builder':>7} {'tokens':>7} {'steps':>6} {'wall s':>8} {'tok/s':>8}")
    for round_ in range(args.rounds):
        for builder, engine in engines.items():
            start = time.perf_counter()
            result = serve(engine, requests, args.concurrency, eos_id=tokenizer.eos_id)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            runs.append({"round": round_, "builder": builder, "tokens": result.generated_tokens,
                         "steps": result.steps, "wall_s": wall, "tok_per_s": result.generated_tokens / wall})
            print(f"{round_:5} {builder:>7} {result.generated_tokens:7} {result.steps:6} {wall:8.3f} "
                  f"{runs[-1]['tok_per_s']:8.1f}")
    median = {b: statistics.median(r["tok_per_s"] for r in runs if r["builder"] == b) for b in engines}
    print(f"median tok/s: cpu {median['cpu']:.1f}, gpu {median['gpu']:.1f}, gpu/cpu {median['gpu'] / median['cpu']:.3f}")
    args.out.write_text(json.dumps({"benchmark": "builder_ab", "machine": describe(), "settings": vars(args) | {
        "out": str(args.out), "device": device}, "runs": runs, "median_tok_per_s": median}, indent=1) + "\n")


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:  # e.g. the GPU builder without CUDA (or TRITON_INTERPRET=1)
        sys.exit(f"builder_ab: {error}")
