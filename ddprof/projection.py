"""What-if across two runs: tok/s of one run had a stage cost what it costs in another run.

The question behind the toolkit is "would the GPU tree builder speed us up?". A CPU-heapq run
answers it best when its tree_build is given the GPU builder's measured cost, and nothing else
changes. This builds on the run's own what-if from ddprof.analysis (tok/s if the stage were
free): that projection says how much wall time the stage's critical-path time is worth; the
substitute cost keeps the fraction of it that the other run still pays per step.
"""

from __future__ import annotations

from ddprof.analysis import stage_row


def crit_ms_per_step(summary: dict, stage: str) -> float:
    """The stage's critical-path ms per step (0 for a run without steps)."""
    return stage_row(summary, stage)["crit_ms"] / summary["steps"] if summary["steps"] else 0.0


def tok_per_s_with_stage_cost_of(run: dict, donor: dict, stage: str) -> float | None:
    """tok/s of breakdown `run` had `stage` cost, per step on the critical path, what it does in `donor`.

    Equal costs give the run's own tok/s; a donor whose stage costs nothing gives the run's
    "if free" projection; a costlier donor projects a slowdown. None when the run's tok/s is unknown.
    """
    measured = run["tok_per_s"]
    if_free = stage_row(run, stage)["what_if"]["tok_per_s_if_free"]
    if measured is None or if_free is None or not run["tokens"]:
        return measured
    own = crit_ms_per_step(run, stage)
    if own == 0:
        return measured
    saved_if_free_s = run["wall_s"] - run["tokens"] / if_free
    kept = crit_ms_per_step(donor, stage) / own  # the fraction of the stage's cost still paid
    return run["tokens"] / (run["wall_s"] - saved_if_free_s * (1 - kept))
