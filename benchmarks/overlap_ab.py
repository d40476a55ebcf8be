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

import torch  # noqa: E402

from benchmarks.serving_ab import Workload, paired_rounds, workload_arguments, write_result  # noqa: E402
from engine import arguments  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.model import set_batch_invariant  # noqa: E402

IN_ORDER, OVERLAP = "in-order", "overlap"


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "overlap_ab.json")
    parser.add_argument("--builder", default="gpu" if torch.cuda.is_available() else "cpu")
    arguments.add_batch_invariant(parser)
    arguments.add_cuda_graphs(parser)
    args = parser.parse_args()
    set_batch_invariant(args.batch_invariant)
    workload = Workload(args)
    args.cuda_graphs = arguments.cuda_graphs(args.cuda_graphs, workload.device)  # default: on with CUDA
    engines = {variant: workload.engine(args.builder, cuda_graphs=args.cuda_graphs, static_shapes=True,
                                        overlap=variant == OVERLAP) for variant in (IN_ORDER, OVERLAP)}
    rows, verdict = paired_rounds(lambda variant: workload.serve(engines[variant]), (IN_ORDER, OVERLAP), args.rounds,
                                  "scheduling")
    scope = arguments.overlap_scope(True, args.builder)
    print(f"overlap with the {args.builder} builder hides: {scope}")
    write_result("overlap_ab", workload, rows, verdict | {"overlap_scope": scope})


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:  # e.g. --cuda-graphs without CUDA
        sys.exit(f"overlap_ab: {error}")
