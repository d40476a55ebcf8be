"""Tok/s vs concurrency, one line per builder, and what the CPU-heapq runs would do with the GPU builder's tree_build.

Builders are told apart by marker and dash (palette.BUILDER_STYLES), never by colour: colours are
the stages'. A projection whose GPU-builder partner ran in Triton's interpreter (a CPU capture) is
not drawn: its tree_build time says nothing about a GPU. Tok/s here is the breakdown's: decode
tokens (the `tokens` marks) over the wall time of the steps, the same basis as the projection. The capture's serving tok/s (which also counts each
request's prefill token) is in the hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from ddprof.dashboards.palette import (BUILDER_INK, BUILDER_STYLES, OTHER_BUILDER_STYLE, PROJECTION_INK,
                                       PROJECTION_STYLE)
from ddprof.dashboards.pairs import CPU, GPU, STAGE, projected_pairs, projection
from ddprof.dashboards.runs import Run, varying_settings
from ddprof.projection import crit_ms_per_step

PROJECTION_NAME = f"{CPU}, {STAGE} at its {GPU} cost (projected)"


def plotted(runs: Sequence[Run]) -> list[Run]:
    """The runs this figure can place: concurrency known (from metadata) and tok/s defined."""
    return [run for run in runs if run.setting("concurrency") is not None and run.summary["tok_per_s"] is not None]


def _line_name(run: Run, runs: Sequence[Run]) -> str:
    varying = varying_settings(runs, leave_out=("concurrency",))
    return " · ".join([run.builder, *(f"{key}={run.setting(key)}" for key in varying)])


def throughput_figure(runs: Sequence[Run]) -> go.Figure:
    shown = sorted(plotted(runs), key=lambda run: run.sort_key)
    lines: dict[str, list[Run]] = {}
    for run in shown:
        lines.setdefault(_line_name(run, shown), []).append(run)
    figure = go.Figure()
    for name, members in lines.items():
        members.sort(key=lambda run: run.setting("concurrency"))
        style = BUILDER_STYLES.get(members[0].builder, OTHER_BUILDER_STYLE)
        figure.add_trace(go.Scatter(
            x=[run.setting("concurrency") for run in members], y=[run.summary["tok_per_s"] for run in members],
            mode="lines+markers", name=name, line=dict(color=BUILDER_INK, width=2.5, dash=style["dash"]),
            marker=dict(size=9, symbol=style["symbol"], color=BUILDER_INK),
            customdata=[[run.label, _serving(run), run.summary["bound_by"]] for run in members],
            hovertemplate=("<b>%{customdata[0]}</b><br>%{y:.2f} decode tok/s at concurrency %{x}<br>"
                           "serving tok/s (capture, incl. prefill): %{customdata[1]}<br>"
                           "bound by %{customdata[2]}<extra></extra>")))
        pairs = projected_pairs(members, shown)
        if pairs:
            figure.add_trace(go.Scatter(
                x=[run.setting("concurrency") for run, _ in pairs], y=[projection(run, donor) for run, donor in pairs],
                mode="lines+markers", name=PROJECTION_NAME + name.removeprefix(CPU),
                line=dict(color=PROJECTION_INK, dash=PROJECTION_STYLE["dash"], width=2),
                marker=dict(symbol=PROJECTION_STYLE["symbol"], size=10, color=PROJECTION_INK),
                customdata=[[run.label, crit_ms_per_step(run.summary, STAGE), crit_ms_per_step(donor.summary, STAGE),
                             run.summary["tok_per_s"], donor.summary["tok_per_s"]] for run, donor in pairs],
                hovertemplate=(f"<b>%{{customdata[0]}}</b> with {STAGE} at %{{customdata[2]:.3f}} ms per step "
                               f"(its {GPU} partner's) instead of %{{customdata[1]:.3f}}<br>"
                               f"projected %{{y:.2f}} tok/s; measured: {CPU} %{{customdata[3]:.2f}}, "
                               f"{GPU} %{{customdata[4]:.2f}}<extra></extra>")))
    concurrencies = sorted({run.setting("concurrency") for run in shown})
    log_axis = bool(concurrencies) and concurrencies[-1] >= 8 * concurrencies[0]
    figure.update_xaxes(title_text="concurrency (requests in flight)" + (", log scale" if log_axis else ""),
                        tickvals=concurrencies, type="log" if log_axis else "linear")
    rates = [y for trace in figure.data for y in trace.y if y]
    wide = bool(rates) and max(rates) >= 10 * min(rates)  # builders an order of magnitude apart: log scale
    ticks = log_ticks(min(rates), max(rates)) if wide else None
    figure.update_yaxes(title_text="decode tok/s (tokens / wall time of the steps)" + (", log scale" if wide else ""),
                        type="log" if wide else "linear", rangemode="normal" if wide else "tozero",
                        tickvals=ticks, ticktext=[f"{tick:g}" for tick in ticks] if ticks else None)
    interpreted = [run for run in shown if run.interpreted_gpu_builder]
    if interpreted:
        figure.add_annotation(text=f"no projection: the {GPU} ran in Triton's interpreter (a CPU capture)",
                              showarrow=False, xref="paper", yref="paper", x=0, y=1.02, xanchor="left",
                              yanchor="bottom", font=dict(size=12, color=PROJECTION_INK))
    figure.update_layout(title=f"Tok/s vs concurrency, and {CPU} with its {STAGE} at the {GPU}'s cost",
                         height=460, hovermode="closest", legend=dict(orientation="h", y=-0.25))
    if not shown:
        figure.add_annotation(text="no run records its concurrency (no capture metadata) and tok/s",
                               showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return figure


def log_ticks(low: float, high: float) -> list[float]:
    """The 1-2-5 values from the last at or below `low` to the first at or above `high` (1, 2, 5,
    10, 20, ...): a log axis labelled in plain numbers, one label per tick."""
    ticks = [mantissa * 10.0 ** exponent for exponent in range(math.floor(math.log10(low)),
                                                                math.floor(math.log10(high)) + 2)
             for mantissa in (1, 2, 5)]
    first = max(i for i, tick in enumerate(ticks) if tick <= low)
    last = min(i for i, tick in enumerate(ticks) if tick >= high)
    return ticks[first:last + 1]


def _serving(run: Run) -> str:
    value = run.setting("tok_per_s")
    return "unknown" if value is None else f"{value:.2f}"
