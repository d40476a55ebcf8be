"""The MoE, A/B in one process: tok/s of the same workload with the fused routed experts
(triton_kernels/fused_moe.py: two grouped GEMMs, no wait for the GPU) against the per-expert loop
(engine/model.py `MoE.per_expert`: pairs sorted by expert, one wait per layer to read the group
sizes, three GEMMs per expert in use). Both are batch-invariant and their numbers differ only in
rounding, so a variant may decode other tokens than the other's; each must repeat its own tokens in
every round (the harness stops otherwise).
The method: benchmarks/serving_ab.py.

    python benchmarks/moe_dispatch_ab.py [--model k2-layer] [--concurrency 32] [--builder gpu] [--rounds 3]

Prints one row per run and writes JSON (default benchmarks/results/moe_dispatch_ab.json). Results
of the earlier A/B (per-expert masks against the sorted loop) are in the files of commit 550c4fc.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving_ab import run_ab, switch_ab  # noqa: E402
from engine.model import MoE  # noqa: E402

SORTED, FUSED = "sorted", "fused"


@contextmanager
def dispatch(variant: str):
    """MoE layers on CUDA run `variant` inside the block."""
    before = MoE.fused_on_cuda
    MoE.fused_on_cuda = variant == FUSED
    try:
        yield
    finally:
        MoE.fused_on_cuda = before


if __name__ == "__main__":
    # Eager: the per-expert loop waits for the GPU once per layer, which a CUDA graph cannot hold.
    run_ab("moe_dispatch_ab", lambda: switch_ab("moe_dispatch_ab", __doc__.splitlines()[0], "dispatch", (SORTED, FUSED), dispatch,
                                      same_numerics=False, graphs=False))
