"""Step share: where each run's step time goes, one stacked bar per run.

Each bar stacks the critical-path shares (crit_share) of the six stages and `other`, so it sums
to 1. Runs whose settings differ only in the builder stand side by side; a sweep is faceted by
budget (rows) and concurrency (columns).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ddprof.attribution import OTHER, OWNERS
from ddprof.dashboards.palette import STAGE_COLOURS
from ddprof.dashboards.runs import UNKNOWN, Run, varying_settings

FACETS = ("budget", "concurrency")  # rows, columns


def owner_rows(summary: dict) -> list[dict]:
    """Per owner of step time (six stages, then other): its share, crit/cpu/gpu ms, GPU ops launched
    and waiting calls, from the breakdown."""
    rows = [{key: stage[key] for key in ("stage", "crit_share", "crit_ms", "cpu_ms", "gpu_ms", "gpu_ops", "sync_calls")}
            for stage in summary["stages"]]
    rows.append({"stage": OTHER, "crit_share": summary["other_crit_share"], "crit_ms": summary["other_crit_ms"],
                 "cpu_ms": None, "gpu_ms": None, "gpu_ops": None, "sync_calls": None})
    return rows


def _values(runs: Sequence[Run], key: str) -> list:
    """Distinct values of a setting, sorted, unknown (None) last."""
    found = {run.setting(key) for run in runs}
    return sorted(found - {None}) + ([None] if None in found else [])


def _unknown(value) -> str:
    return UNKNOWN if value is None else str(value)


def facets(runs: Sequence[Run]) -> list[tuple[int, int, str, list[Run]]]:
    """(row, column, title, runs) per facet: budget rows x concurrency columns when the runs with
    metadata form a sweep, plus a column for runs without metadata; a single facet otherwise."""
    known = [run for run in runs if run.meta is not None]
    budgets, concurrencies = _values(known, "budget"), _values(known, "concurrency")
    if len(budgets) * len(concurrencies) <= 1:
        return [(1, 1, "", list(runs))]
    cells = [(row, col, f"budget={_unknown(b)} · concurrency={_unknown(c)}",
              [run for run in known if (run.setting("budget"), run.setting("concurrency")) == (b, c)])
             for row, b in enumerate(budgets, 1) for col, c in enumerate(concurrencies, 1)]
    unknown = [run for run in runs if run.meta is None]
    if unknown:
        cells.append((1, len(concurrencies) + 1, "no metadata", unknown))
    return cells


def _position(run: Run, runs: Sequence[Run]) -> tuple[str, str]:
    """The bar's (group, bar) on the two-level x axis: the settings it shares with its pair, then the builder."""
    if run.meta is None:
        return "no metadata", run.source.stem
    shown = varying_settings(runs, leave_out=FACETS) or list(FACETS)
    return " · ".join(f"{key}={run.setting(key)}" for key in shown), run.builder


def _positions(runs: Sequence[Run]) -> dict[int, tuple[str, str]]:
    """Each run's (group, bar) by id(run), made unique: repeats of the same settings show the run's
    label instead (unique, see runs.labelled)."""
    placed = {id(run): _position(run, runs) for run in runs}
    seen = Counter((run.setting("budget"), run.setting("concurrency"), *placed[id(run)]) for run in runs)
    for run in runs:
        group, bar = placed[id(run)]
        if seen[run.setting("budget"), run.setting("concurrency"), group, bar] > 1:
            placed[id(run)] = group, run.label
    return placed


def step_share_figure(runs: Sequence[Run]) -> go.Figure:
    """Stacked crit_share bars per run; hover shows ms per step, cpu_ms and gpu_ms of the stage."""
    cells = facets(runs)
    rows, cols = max(cell[0] for cell in cells), max(cell[1] for cell in cells)
    titles = {(row, col): title for row, col, title, _ in cells}
    figure = make_subplots(rows=rows, cols=cols, shared_yaxes=True, horizontal_spacing=0.04,
                           vertical_spacing=0.5 / rows,
                           subplot_titles=[titles.get((r, c), "") for r in range(1, rows + 1) for c in range(1, cols + 1)]
                           if len(cells) > 1 else None)
    positions = _positions(runs)
    legend_shown = set()
    for row, col, _, members in cells:
        if not members:
            continue
        members = sorted(members, key=lambda run: (run.sort_key, positions[id(run)][1]))
        groups = [positions[id(run)][0] for run in members]
        bars = [positions[id(run)][1] for run in members]
        # A second axis level only when it tells runs apart; else the facet's title (or the figure's) names it.
        x = [groups, bars] if len(set(groups)) > 1 else bars
        per_run = [owner_rows(run.summary) for run in members]
        for code, owner in enumerate(OWNERS):
            cells_of_owner = [rows_of_run[code] for rows_of_run in per_run]
            figure.add_trace(go.Bar(
                x=x, y=[cell["crit_share"] for cell in cells_of_owner], name=owner, legendgroup=owner,
                showlegend=owner not in legend_shown, marker_color=STAGE_COLOURS[owner],
                customdata=[[cell["crit_ms"] / run.summary["steps"], _ms(cell["cpu_ms"]), _ms(cell["gpu_ms"]),
                             run.label, _per_step(cell["gpu_ops"], run), _per_step(cell["sync_calls"], run)]
                            for cell, run in zip(cells_of_owner, members)],
                hovertemplate=(f"<b>%{{customdata[3]}}</b><br>{owner}: %{{y:.1%}} of step time<br>"
                               "per step (mean): %{customdata[0]:.3f} ms on the critical path, "
                               "%{customdata[4]} GPU ops launched, %{customdata[5]} waits for the GPU<br>"
                               "whole run: %{customdata[1]} ms on the host (cpu_ms), %{customdata[2]} ms on the GPU "
                               "(gpu_ms)<extra></extra>")),
                row=row, col=col)
            legend_shown.add(owner)
    figure.update_yaxes(range=[0, 1], tickformat=".0%")
    figure.update_yaxes(title_text="share of step time (critical path)", col=1)
    figure.update_layout(barmode="stack", height=120 + 360 * rows, legend_title_text="stage",
                         margin=dict(t=60, b=40), title="Step share per stage (crit_share)" + (
                             f" · {groups[0]}" if len(cells) == 1 and len(set(groups)) == 1 else ""))
    return figure


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}"


def _per_step(count: int | None, run: Run) -> str:
    """A count's mean per step: whole numbers without a decimal ("6", not "6.0"), else one decimal."""
    if count is None:
        return "n/a"
    mean = count / run.summary["steps"]
    return f"{mean:,.0f}" if mean == round(mean) else f"{mean:,.1f}"
