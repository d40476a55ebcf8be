"""The dashboard's section for a report of several ranks: the critical path over the ranks with
its communication column, and the stragglers (the numbers of ddprof.ranks, as `breakdown` prints
them)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ddprof.dashboards.runs import Run


def _ms(value: float) -> str:
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def _table(css_id: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="runs" id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def ranks_section(runs: Sequence[Run]) -> str:
    """One block per report holding several ranks; empty when there is none."""
    reports = {id(run.ranked): run for run in runs if run.ranked is not None}
    blocks = []
    for index, run in enumerate(reports.values()):
        s = run.ranked.summary
        crit, steps = s["critical_path"], s["matched_steps"]
        path_rows = [(row["stage"], _ms(row["crit_ms"] / steps), f"{row['crit_share'] * 100:.1f}%",
                      _ms(row["comm_ms"] / steps)) for row in crit["stages"]]
        straggler_rows = [(f"rank {row['rank']}", str(row["slowest_steps"]), f"{row['share'] * 100:.1f}%",
                           _ms(row["behind_ms_mean"]), _ms(row["step_ms_mean"])) for row in s["stragglers"]]
        rate = "n/a" if crit["tok_per_s"] is None else f"{crit['tok_per_s']:,.1f} tok/s"
        blocks.append(
            f"<h2>{html.escape(run.source.name)}: {len(s['ranks'])} ranks, {steps} steps matched by index</h2>"
            f"<p>Each step's critical path is its slowest rank's: {html.escape(rate)}, bound by "
            f"{html.escape(crit['bound_by'])}; communication is the {html.escape(s['communication'])}.</p>"
            + _table(f"ranks-critical-path-{index}", ("stage", "crit ms / step", "crit %", "comm ms / step"),
                     path_rows)
            + _table(f"ranks-stragglers-{index}", ("rank", "slowest in steps", "share", "by ms (mean)",
                                                    "step ms (mean)"), straggler_rows))
    return f'<section id="section-ranks">{"".join(blocks)}</section>' if blocks else ""
