"""In-order vs overlapped steps, A/B in one process: tok/s of the same workload served by the
static-shape step run in order (launch, wait for the tokens, commit) and overlapped (launch step
N+1, then commit step N: engine/engine.py), for one builder. With the GPU builder the whole step can
run ahead of the host; with the CPU builder only draft can (tree_build waits for the same step's
top-k). Both must decode the same tokens, every round: overlap is a reordering of the same work.
The method: benchmarks/serving_ab.py.

    python benchmarks/overlap_ab.py [--model small] [--concurrency 64] [--builder gpu] [--rounds 3] [--no-cuda-graphs]

Prints one row per run and writes JSON (default benchmarks/results/overlap_ab.json). CUDA graphs are
on by default with CUDA (both variants replay them); on the CPU both run the static step eagerly.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks.serving_ab import Workload, checked_arguments, paired_rounds, run_ab, workload_arguments, write_result  # noqa: E402
from engine import arguments  # noqa: E402

IN_ORDER, OVERLAP = "in-order", "overlap"


def main() -> None:
    args = checked_arguments(workload_arguments(__doc__.splitlines()[0], "overlap_ab.json"))
    workload = Workload(args)
    engines = {variant: workload.engine(args.builder, cuda_graphs=args.cuda_graphs, static_shapes=True,
                                        overlap=variant == OVERLAP) for variant in (IN_ORDER, OVERLAP)}
    rows, verdict = paired_rounds(lambda variant: workload.serve(engines[variant]), (IN_ORDER, OVERLAP), args.rounds,
                                  "scheduling")
    scope = arguments.overlap_scope(True, args.builder)
    print(f"overlap with the {args.builder} builder hides: {scope}")
    write_result("overlap_ab", workload, rows, verdict | {"overlap_scope": scope})


if __name__ == "__main__":
    run_ab("overlap_ab", main)  # e.g. --cuda-graphs without CUDA
