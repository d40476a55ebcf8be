"""One-by-one vs batched prefill, A/B in one process: tok/s of the same workload served by one
engine whose scheduler prefills each admitted request alone (`prefill_tokens` 0) or the requests
admitted before a step together, up to `--prefill-tokens` prompt tokens per forward
(engine/scheduler.py, TargetModel.prefill_many). Both must decode the same tokens, every round:
a batched prefill computes each row as the request's own prefill does. Decode steps are the same
work either way, so the serving tok/s (prefills included) is the verdict that moves; the rows
count the prefill forwards each variant ran. The method: benchmarks/serving_ab.py.

    python benchmarks/prefill_ab.py [--model small] [--concurrency 64] [--prefill-tokens 4096] [--rounds 3] [--cpu-threads 1] [--no-overlap]

Prints one row per run and writes JSON (default benchmarks/results/prefill_ab.json). CUDA graphs and
overlapped steps are on by default with CUDA, as in the engine (both variants run them); on the CPU
the steps run eagerly and in order.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.serving_ab import (Workload, checked_arguments, device, paired_rounds, run_ab,  # noqa: E402
                                  workload_arguments, write_result)
from engine import arguments  # noqa: E402
from engine.serve_defaults import DEFAULT_PREFILL_TOKENS  # noqa: E402

ONE_BY_ONE, BATCHED = "one-by-one", "batched"


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "prefill_ab.json", overlap=True, prefill=False)
    parser.add_argument("--prefill-tokens", type=int, default=DEFAULT_PREFILL_TOKENS,
                        help=f"prompt tokens per batched prefill (default {DEFAULT_PREFILL_TOKENS}, the engine's)")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch threads on the CPU (default 1, as engine serve: on shared cores more threads "
                             "wait for whichever one was descheduled)")
    args = checked_arguments(parser)
    arguments.at_least_one(args, "prefill_tokens")
    arguments.cpu_threads(args.cpu_threads)
    if device() == "cpu":
        torch.set_num_threads(args.cpu_threads)
    workload = Workload(args)
    engine = workload.engine(args.builder, cuda_graphs=args.cuda_graphs, overlap=args.overlap)
    budgets = {ONE_BY_ONE: 0, BATCHED: args.prefill_tokens}
    rows, verdict = paired_rounds(lambda variant: workload.serve(engine, prefill_tokens=budgets[variant]),
                                  (ONE_BY_ONE, BATCHED), args.rounds, "prefill")
    write_result("prefill_ab", workload, rows, verdict)


if __name__ == "__main__":
    run_ab("prefill_ab", main)  # e.g. --cuda-graphs without CUDA, --prefill-tokens 0
