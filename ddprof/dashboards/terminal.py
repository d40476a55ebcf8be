"""What `ddprof dashboard` and `ddprof sweep` print once the page is written: a table, or `--json`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ddprof.dashboards.headline import bound_share, headline
from ddprof.dashboards.runs import Run


def describe(runs: Sequence[Run], dashboard: Path) -> dict:
    """The `--json` object: the page, its headline and each run's headline numbers."""
    return {
        "dashboard": str(dashboard),
        "headline": headline(runs),
        "runs": [{"label": run.label, "source": str(run.source), "builder": run.builder,
                  "concurrency": run.setting("concurrency"), "budget": run.setting("budget"),
                  "steps": run.summary["steps"], "tok_per_s": run.summary["tok_per_s"],
                  "bound_by": run.summary["bound_by"], "bound_by_crit_share": bound_share(run)} for run in runs],
    }


def view(runs: Sequence[Run], dashboard: Path) -> Group:
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("run", "trace", "steps", "decode tok/s", "bound by", "its share"):
        table.add_column(column, justify="left" if column in ("run", "trace", "bound by") else "right")
    for run in runs:
        rate = run.summary["tok_per_s"]
        table.add_row(run.label, run.source.name, str(run.summary["steps"]), "n/a" if rate is None else f"{rate:.2f}",
                      run.summary["bound_by"], f"{bound_share(run) * 100:.1f}%")
    return Group(Text(headline(runs), style="bold"), table, Text(f"dashboard: {dashboard}"))
