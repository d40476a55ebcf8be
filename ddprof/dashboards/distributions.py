"""Per-step distributions: each stage's critical-path ms per step, one small plot per stage with a
box per run, each on its own y axis (tree_build's tenths of a ms stay visible beside verify's tens).

The boxes are drawn from statistics computed here over every step (quartiles, min, max, mean of
ddprof.attribution's per-step matrix) rather than from the raw values, so a million-step trace
makes a page of the same size as a ten-step one. A box has its stage's colour, as everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ddprof.dashboards.palette import STAGE_COLOURS
from ddprof.dashboards.runs import Run
from engine.stages import STAGES

QUANTILES = {"lowerfence": 0, "q1": 25, "median": 50, "q3": 75, "upperfence": 100}
COLUMNS = 3  # small multiples per row


def box_statistics(run: Run) -> dict[str, list[float]]:
    """Per stage (in STAGES order): min, quartiles, max and mean of the per-step critical-path time, in ms."""
    per_step = run.attribution.matrix("crit_ns")[:, :len(STAGES)] / 1e6
    stats = {name: np.percentile(per_step, q, axis=0).tolist() for name, q in QUANTILES.items()}
    stats["mean"] = per_step.mean(axis=0).tolist()
    return stats


def distributions_figure(runs: Sequence[Run]) -> go.Figure:
    """One trace per stage (in its own subplot), holding a box per run."""
    rows = -(-len(STAGES) // COLUMNS)
    figure = make_subplots(rows=rows, cols=COLUMNS, subplot_titles=list(STAGES), vertical_spacing=0.16,
                           horizontal_spacing=0.07)
    per_run = [box_statistics(run) for run in runs]
    for code, stage in enumerate(STAGES):
        figure.add_trace(go.Box(x=[run.label for run in runs], name=stage, marker_color=STAGE_COLOURS[stage],
                                showlegend=False,
                                **{key: [stats[key][code] for stats in per_run] for key in (*QUANTILES, "mean")}),
                         row=code // COLUMNS + 1, col=code % COLUMNS + 1)
    figure.update_yaxes(rangemode="tozero")
    figure.update_yaxes(title_text="ms per step", col=1)
    figure.update_layout(height=300 * rows + 120, margin=dict(t=90),
                         title="Per-step critical-path ms of each stage, one plot per stage, each on its own scale "
                               "(box: quartiles; whiskers: min and max)")
    return figure
