"""The sentence on top of the page: which stage bounds tok/s in each run, from the breakdown numbers."""

from __future__ import annotations

from collections.abc import Sequence

from ddprof.analysis import stage_row
from ddprof.dashboards.runs import Run
from ddprof.projection import crit_ms_per_step


def bound_share(run: Run) -> float:
    """The crit_share of the stage that bounds the run (its `bound_by`)."""
    return stage_row(run.summary, run.summary["bound_by"])["crit_share"]


def _share(value: float) -> str:
    return f"{value * 100:.0f}%"


def headline(runs: Sequence[Run]) -> str:
    """E.g. "verify bounds tok/s in CPU heapq · c=2 (48% of step time) and GPU builder · c=2 (44%)."

    Runs are grouped by the stage that bounds them, the most common stage first.
    """
    if len(runs) == 1:
        run = runs[0]
        summary = run.summary
        ms_per_step = summary["step_ms"]["total"] / summary["steps"]
        crit = crit_ms_per_step(summary, summary["bound_by"])
        rate = "unknown tok/s" if summary["tok_per_s"] is None else f"{summary['tok_per_s']:.2f} tok/s"
        return (f"{summary['bound_by']} bounds tok/s in {run.label}: {_share(bound_share(run))} of step time "
                f"({crit:.3g} of {ms_per_step:.3g} ms per step on the critical path), at {rate}.")
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.summary["bound_by"], []).append(run)
    clauses = []
    for stage, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        shares = [f"{run.label} ({_share(bound_share(run))}{' of step time' if i == 0 else ''})"
                  for i, run in enumerate(members)]
        listed = shares[0] if len(shares) == 1 else ", ".join(shares[:-1]) + " and " + shares[-1]
        every = "every run: " if len(members) == len(runs) else ""
        clauses.append(f"{stage} bounds tok/s in {every}{listed}")
    return "; ".join(clauses) + "."
