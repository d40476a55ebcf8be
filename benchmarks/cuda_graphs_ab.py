"""Eager vs CUDA-graphed decoding, A/B in one process: tok/s of the same workload served by an
eager engine and by one replaying its static-shape step as CUDA graphs (engine/cuda_graphs.py).
Both must decode the same tokens, every round: graphs are a faster way to the same greedy result.
Both run their steps in order (an eager step cannot overlap: overlap_ab.py measures that on the
graphed one). The method: benchmarks/serving_ab.py.

    python benchmarks/cuda_graphs_ab.py [--model small] [--concurrency 64] [--builder gpu] [--rounds 3]

Prints one row per run and writes JSON (default benchmarks/results/cuda_graphs_ab.json), with the
buckets the graphed engine recorded and how long recording took.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from benchmarks.serving_ab import (Workload, checked_arguments, device, paired_rounds, run_ab,  # noqa: E402
                                  workload_arguments, write_result)
from engine import arguments  # noqa: E402

EAGER, GRAPHS = "eager", "graphs"


def main() -> None:
    args = checked_arguments(workload_arguments(__doc__.splitlines()[0], "cuda_graphs_ab.json", graphs=False))
    arguments.cuda_graphs(True, device())  # the graphs variant needs CUDA: refused before any model loads
    workload = Workload(args)
    engines = {variant: workload.engine(args.builder, cuda_graphs=variant == GRAPHS) for variant in (EAGER, GRAPHS)}
    rows, verdict = paired_rounds(lambda variant: workload.serve(engines[variant]), (EAGER, GRAPHS), args.rounds,
                                  "execution")
    recording = engines[GRAPHS].graphs
    print(f"graphs: buckets {list(recording.buckets)}, recorded in {recording.record_s:.1f} s, "
          f"pool {recording.pool_bytes / 2**20:.0f} MiB")
    write_result("cuda_graphs_ab", workload, rows, verdict | {"graph_recording": asdict(recording)})


if __name__ == "__main__":
    run_ab("cuda_graphs_ab", main)
