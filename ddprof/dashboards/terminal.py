"""What `ddprof dashboard` and `ddprof sweep` print once the page is written: a table, or `--json`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ddprof.ab_results import ABResult
from ddprof.dashboards.headline import bound_share, headline


def describe(runs: Sequence, dashboard: Path, evidence: Sequence[ABResult] = (), *, replaced: bool = False) -> dict:
    """The `--json` object: the page, its headline, the A/B files it read and each run's headline numbers."""
    return {
        "dashboard": str(dashboard),
        "replaced": replaced,
        "headline": headline(runs, evidence),
        "ab_results": [{"source": str(ab.source), "benchmark": ab.benchmark, "b_over_a": f"{ab.b}/{ab.a}",
                        "execution": ab.execution, "rounds": ab.serving.rounds, "median_ratio": ab.serving.median,
                        "ci95": list(ab.serving.ci),
                        "decode_median_ratio": None if ab.decode is None else ab.decode.median,
                        "decode_ci95": None if ab.decode is None else list(ab.decode.ci)} for ab in evidence],
        "runs": [{"label": run.label, "source": str(run.source), "builder": run.builder,
                  "execution": run.setting("execution"), "concurrency": run.setting("concurrency"),
                  "budget": run.setting("budget"),
                  "steps": run.summary["steps"], "tok_per_s": run.summary["tok_per_s"],
                  "bound_by": run.summary["bound_by"], "bound_by_crit_share": bound_share(run)} for run in runs],
    }


def view(runs: Sequence, dashboard: Path, evidence: Sequence[ABResult] = (), *, replaced: bool = False) -> Group:
    """The headline and a table of the runs; labels wrap rather than be cut (at 80 columns a sweep's
    trace names would all read as the same prefix), and the trace column is left to --json."""
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("run", "steps", "decode tok/s", "bound by", "its share"):
        table.add_column(column, justify="left" if column in ("run", "bound by") else "right",
                         overflow="fold", no_wrap=column != "run")
    for run in runs:
        rate = run.summary["tok_per_s"]
        table.add_row(run.label, str(run.summary["steps"]), "n/a" if rate is None else f"{rate:.2f}",
                      run.summary["bound_by"], f"{bound_share(run) * 100:.1f}%")
    where = f"dashboard: {dashboard}" + (" (replaced the page that was there; --out names another)" if replaced else "")
    return Group(Text(headline(runs, evidence), style="bold"), table, Text(where))
