"""Builder pairs: a CPU-heapq run and the GPU-builder run with exactly its settings, and what the
CPU-heapq run would do with its partner's tree_build cost (ddprof.projection). The tok/s plot and
the headline both read these, so they always pair the same runs."""

from __future__ import annotations

from collections.abc import Sequence

from ddprof.dashboards.runs import BUILDER_NAMES, Run
from ddprof.projection import tok_per_s_with_stage_cost_of

STAGE = "tree_build"
CPU, GPU = BUILDER_NAMES["cpu"], BUILDER_NAMES["gpu"]


def partner(run: Run, runs: Sequence[Run]) -> Run | None:
    """The first GPU-builder run with exactly the same settings as `run`."""
    return next((other for other in runs if other.builder == GPU and other.settings == run.settings), None)


def builder_pairs(candidates: Sequence[Run], runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """(CPU-heapq run of `candidates`, its GPU-builder partner in `runs`), for every CPU-heapq run that has one."""
    pairs = [(run, partner(run, runs)) for run in candidates if run.builder == CPU]
    return [(run, donor) for run, donor in pairs if donor is not None]


def projected_pairs(candidates: Sequence[Run], runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    """The builder pairs whose projection means something: the partner's kernel ran on a GPU, not in
    Triton's interpreter (whose tree_build time says nothing about a GPU)."""
    return [(run, donor) for run, donor in builder_pairs(candidates, runs) if not donor.interpreted_gpu_builder]


def projection(run: Run, donor: Run) -> float | None:
    """tok/s of a CPU-heapq run had its tree_build cost what it costs in its GPU-builder partner."""
    return tok_per_s_with_stage_cost_of(run.summary, donor.summary, STAGE)
