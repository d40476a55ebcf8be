"""CPU heapq vs GPU tree builder, A/B in one process: tok/s of the same workload, alternating
builders for several rounds (no profiler), so machine noise shows up as spread, not as a verdict
(the method: benchmarks/serving_ab.py).

    python benchmarks/builder_ab.py [--model small] [--concurrency 64] [--rounds 3] [--no-cuda-graphs] [--out FILE]

Prints one row per run and writes JSON (default benchmarks/results/builder_ab.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving_ab import Workload, paired_rounds, workload_arguments, write_result  # noqa: E402
from engine import arguments  # noqa: E402
from engine.errors import EngineError  # noqa: E402


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "builder_ab.json")
    arguments.add_cuda_graphs(parser)
    args = parser.parse_args()
    workload = Workload(args)
    args.cuda_graphs = arguments.cuda_graphs(args.cuda_graphs, workload.device)  # default: on with CUDA
    engines = {builder: workload.engine(builder, cuda_graphs=args.cuda_graphs) for builder in ("cpu", "gpu")}
    rows, verdict = paired_rounds(lambda builder: workload.serve(engines[builder]), ("cpu", "gpu"), args.rounds,
                                  "builder")
    write_result("builder_ab", workload, rows, verdict)


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:  # e.g. the GPU builder without CUDA (or TRITON_INTERPRET=1)
        sys.exit(f"builder_ab: {error}")
