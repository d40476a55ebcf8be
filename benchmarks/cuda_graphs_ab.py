"""Eager vs CUDA-graphed decoding, A/B in one process: tok/s of the same workload served by an
eager engine and by one replaying its static-shape step as CUDA graphs (engine/cuda_graphs.py).
Both must decode the same tokens, every round: graphs are a faster way to the same greedy result.
The method: benchmarks/serving_ab.py.

    python benchmarks/cuda_graphs_ab.py [--model small] [--concurrency 64] [--builder gpu] [--rounds 3]

Prints one row per run and writes JSON (default benchmarks/results/cuda_graphs_ab.json), with the
buckets the graphed engine recorded and how long recording took.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.serving_ab import Workload, paired_rounds, workload_arguments, write_result  # noqa: E402
from engine import arguments  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.model import set_batch_invariant  # noqa: E402

EAGER, GRAPHS = "eager", "graphs"


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "cuda_graphs_ab.json")
    parser.add_argument("--builder", default="gpu" if torch.cuda.is_available() else "cpu")
    arguments.add_batch_invariant(parser)
    args = parser.parse_args()
    set_batch_invariant(args.batch_invariant)
    workload = Workload(args)
    engines = {variant: workload.engine(args.builder, cuda_graphs=variant == GRAPHS) for variant in (EAGER, GRAPHS)}
    rows, verdict = paired_rounds(lambda variant: workload.serve(engines[variant]), (EAGER, GRAPHS), args.rounds,
                                  "execution")
    recording = engines[GRAPHS].graphs
    print(f"graphs: buckets {list(recording.buckets)}, recorded in {recording.record_s:.1f} s, "
          f"pool {recording.pool_bytes / 2**20:.0f} MiB")
    write_result("cuda_graphs_ab", workload, rows, verdict | {"graph_recording": asdict(recording)})


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:  # e.g. on a machine without CUDA: graphs need it
        sys.exit(f"cuda_graphs_ab: {error}")
