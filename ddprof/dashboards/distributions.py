"""Per-step distributions: each stage's critical-path ms per step, a box per run and stage.

The boxes are drawn from statistics computed here over every step (quartiles, min, max, mean of
ddprof.attribution's per-step matrix) rather than from the raw values, so a million-step trace
makes a page of the same size as a ten-step one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ddprof.dashboards.runs import Run
from engine.stages import STAGES

QUANTILES = {"lowerfence": 0, "q1": 25, "median": 50, "q3": 75, "upperfence": 100}


def box_statistics(run: Run) -> dict[str, list[float]]:
    """Per stage (in STAGES order): min, quartiles, max and mean of the per-step critical-path time, in ms."""
    per_step = run.attribution.matrix("crit_ns")[:, :len(STAGES)] / 1e6
    stats = {name: np.percentile(per_step, q, axis=0).tolist() for name, q in QUANTILES.items()}
    stats["mean"] = per_step.mean(axis=0).tolist()
    return stats


def distributions_figure(runs: Sequence[Run]) -> go.Figure:
    figure = go.Figure()
    for run in runs:
        figure.add_trace(go.Box(x=list(STAGES), name=run.label, **box_statistics(run)))
    figure.update_layout(boxmode="group", height=480, legend=dict(orientation="h", y=-0.2),
                         title="Per-step critical-path ms of each stage (box: quartiles; whiskers: min and max)",
                         yaxis_title="ms per step", xaxis_title="stage")
    return figure
