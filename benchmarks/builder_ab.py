"""CPU heapq vs GPU tree builder, A/B in one process: tok/s of the same workload, alternating
builders for several rounds (no profiler), so machine noise shows up as spread, not as a verdict
(the method: benchmarks/serving_ab.py).

    python benchmarks/builder_ab.py [--model small] [--concurrency 64] [--rounds 3] [--no-cuda-graphs] [--no-overlap] [--prefill-tokens N] [--out FILE]

Overlapped by default where the steps are graphed (as the engine is; --no-overlap: in order): the
GPU builder's whole step then runs ahead of the host, the CPU builder's only its draft, so the A/B
measures what the CPU builder costs an overlapped engine. --prefill-tokens 0 prefills one request
at a time (the engine's default before batched prefill).

Prints one row per run and writes JSON (default benchmarks/results/builder_ab.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving_ab import Workload, checked_arguments, paired_rounds, run_ab, workload_arguments, write_result  # noqa: E402


def main() -> None:
    args = checked_arguments(workload_arguments(__doc__.splitlines()[0], "builder_ab.json", builder=False,
                                                overlap=True))
    workload = Workload(args)
    engines = {builder: workload.engine(builder, cuda_graphs=args.cuda_graphs, overlap=args.overlap)
               for builder in ("cpu", "gpu")}
    rows, verdict = paired_rounds(lambda builder: workload.serve(engines[builder]), ("cpu", "gpu"), args.rounds,
                                  "builder")
    write_result("builder_ab", workload, rows, verdict)


if __name__ == "__main__":
    run_ab("builder_ab", main)  # e.g. the GPU builder without CUDA (or TRITON_INTERPRET=1)
