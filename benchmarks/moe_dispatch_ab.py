"""The MoE's dispatch, A/B in one process: tok/s of the same workload with the engine's dispatch
(pairs sorted by expert, one wait for the GPU per layer: engine/model.py `MoE.forward`) against the
dispatch it replaced (a mask and a `nonzero` per expert, each a wait for the GPU). Same experts, same
rows in the same order per expert, so both decode the same tokens. The method: benchmarks/serving_ab.py.

    python benchmarks/moe_dispatch_ab.py [--model small] [--concurrency 64] [--builder gpu] [--rounds 3]

Prints one row per run and writes JSON (default benchmarks/results/moe_dispatch_ab.json).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serving_ab import Workload, paired_rounds, workload_arguments, write_result  # noqa: E402
from engine.errors import EngineError  # noqa: E402
from engine.model import MoE  # noqa: E402

SORTED, PER_EXPERT = "sorted", "per-expert"


def per_expert_forward(self: MoE, x: torch.Tensor) -> torch.Tensor:
    """The replaced dispatch, kept here as the baseline: each expert finds its rows with a mask and
    a nonzero (the host waits for the GPU once per expert)."""
    flat = x.reshape(-1, x.shape[-1])
    weights, experts = self.gate(flat)
    expert_out = flat.new_zeros(*experts.shape, flat.shape[-1])
    for e in experts.unique().tolist():
        token, choice = (experts == e).nonzero(as_tuple=True)
        expert_out[token, choice] = self.experts[e](flat[token])
    return self.combine(flat, weights, expert_out).reshape(x.shape)


@contextmanager
def dispatch(variant: str):
    """MoE layers use `variant`'s dispatch inside the block."""
    sorted_forward = MoE.forward
    if variant == PER_EXPERT:
        MoE.forward = per_expert_forward
    try:
        yield
    finally:
        MoE.forward = sorted_forward


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "moe_dispatch_ab.json")
    parser.add_argument("--builder", default="gpu" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    workload = Workload(args)
    engine = workload.engine(args.builder)

    def run(variant: str) -> dict:
        with dispatch(variant):
            return workload.serve(engine)

    rows, verdict = paired_rounds(run, (PER_EXPERT, SORTED), args.rounds, "dispatch")
    write_result("moe_dispatch_ab", workload, rows, verdict)


if __name__ == "__main__":
    try:
        main()
    except EngineError as error:
        sys.exit(f"moe_dispatch_ab: {error}")
