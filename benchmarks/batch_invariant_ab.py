"""Batch-invariant numerics, A/B in one process: tok/s of the same workload with the engine's
batch-invariant GEMMs and norms (triton_kernels/batch_invariant_matmul.py, rms_norm.py: a row's bits
never depend on the batch, so greedy DDTree equals AR) against the vendor's (cuBLAS and PyTorch's
reductions, picked by row count: `--no-batch-invariant`). Each decodes its own tokens (rounding
differs), the same in every round. With CUDA both are graphed by default, each its own engine
recorded under its numerics; `--no-cuda-graphs`: one eager engine switched between them. The
method: benchmarks/serving_ab.py.

    python benchmarks/batch_invariant_ab.py [--model k2-layer] [--concurrency 32] [--builder gpu] [--rounds 3] [--no-cuda-graphs]

Prints one row per run and writes JSON (default benchmarks/results/batch_invariant_ab.json).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving_ab import run_ab, switch_ab  # noqa: E402
from engine.model import batch_invariance  # noqa: E402

VENDOR, INVARIANT = "vendor", "invariant"


def numerics(variant: str):
    """Each variant sets its numerics itself, whatever --batch-invariant set for the process."""
    return batch_invariance(variant == INVARIANT)


if __name__ == "__main__":
    run_ab("batch_invariant_ab", lambda: switch_ab("batch_invariant_ab", __doc__.splitlines()[0], "numerics", (VENDOR, INVARIANT), numerics,
                                      same_numerics=False, graphs=True))
