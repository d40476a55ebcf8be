"""Step timeline: a few consecutive steps as a Gantt chart, so a reader sees where the GPU idles.

Host lanes: the steps, the prefills between them (admitting new requests) and each stage's
ranges on the decoding thread. GPU lane: every kernel, memcpy, memset (and whole-graph record) of
that process running in the window, coloured by the stage that launched it (ddprof.attribution's
`stage`; an op launched outside every stage range is `other`, as on the critical path), its hover
naming the launching step. When the host runs ahead (CUDA graphs), a step's GPU work runs after
its ranges: the window reaches on to the end of the work its steps launched, and the ops of an
earlier step running at its start are drawn too, as that step's. One run at a time; a menu
switches runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import polars as pl

from ddprof.dashboards import DEFAULT_WINDOW_STEPS
from ddprof.attribution import OTHER
from ddprof.dashboards.palette import PREFILL_COLOUR, STAGE_COLOURS, STEP_COLOUR
from ddprof.dashboards.runs import Run
from ddprof.intervals import union
from engine.stages import PREFILL, STAGES, STEP

GPU_LANE = "GPU"
LANES = (STEP, PREFILL, *STAGES, GPU_LANE)  # top to bottom


@dataclass(frozen=True)
class Window:
    """Consecutive steps of one thread: the steps, stage ranges, prefills and GPU ops in them, times in ns."""

    start: int
    end: int
    steps: pl.DataFrame
    stage_ranges: pl.DataFrame
    prefills: pl.DataFrame
    gpu_ops: pl.DataFrame

    @property
    def gpu_busy_share(self) -> float:
        """Fraction of the window during which some GPU op of the process runs."""
        starts, ends = union(np.clip(self.gpu_ops["start"].to_numpy(), self.start, self.end),
                             np.clip(self.gpu_ops["end"].to_numpy(), self.start, self.end))
        return float((ends - starts).sum()) / (self.end - self.start) if self.end > self.start else 0.0


def window(run: Run, steps: int = DEFAULT_WINDOW_STEPS) -> Window:
    """`steps` consecutive steps from the middle of the run, on the thread that ran the most steps,
    until the last GPU op they launched ends."""
    attribution = run.attribution
    counts = attribution.steps.group_by("pid", "tid").len().sort("len", "pid", "tid", descending=[True, False, False])
    pid, tid = counts.row(0)[:2]
    mine = attribution.steps.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("start")
    steps = min(steps, mine.height)
    first = (mine.height - steps) // 2
    chosen = mine.slice(first, steps)
    chosen_ids = chosen["step_id"].to_list()
    launched_end = attribution.gpu_ops.filter(pl.col("step_id").is_in(chosen_ids))["end"].max()
    start, end = int(chosen["start"].min()), max(int(chosen["end"].max()), launched_end or 0)
    ranges = attribution.stage_ranges.filter(pl.col("step_id").is_in(chosen_ids)).sort("start")
    ops = attribution.gpu_ops.filter((pl.col("pid") == pid) & (pl.col("end") > start) & (pl.col("start") < end))
    prefills = run.prefills.filter((pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("end") > start)
                                   & (pl.col("start") < end))
    return Window(start, end, chosen, ranges, prefills.sort("start"), ops.sort("start"))


def _bars(lane: list[str], start: np.ndarray, end: np.ndarray, origin: int, name: str, colour: str,
          hover: list[str], visible: bool, show_legend: bool) -> go.Bar:
    return go.Bar(y=lane, base=(start - origin) / 1e6, x=(end - start) / 1e6, orientation="h", name=name,
                  legendgroup=name, marker_color=colour, hovertext=hover, hoverinfo="text", visible=visible,
                  showlegend=show_legend)


def _run_traces(shown: Window, visible: bool, gpu_traced: bool) -> list[go.Bar | go.Scatter]:
    """The window's bars; `gpu_traced`: whether the trace recorded GPU work at all (else a host
    range's wait on the GPU is unknown, not zero)."""
    origin = shown.start
    steps = shown.steps
    traces = [_bars([STEP] * steps.height, steps["start"].to_numpy(), steps["end"].to_numpy(), origin, STEP,
                    STEP_COLOUR, [f"step {row['step_id']}: {(row['end'] - row['start']) / 1e6:.3f} ms, "
                                  f"{'n/a' if row['tokens'] is None else row['tokens']} tokens"
                                  for row in steps.iter_rows(named=True)],
                    visible, True)]
    if shown.prefills.height:
        prefills = shown.prefills
        traces.append(_bars([PREFILL] * prefills.height, prefills["start"].to_numpy(), prefills["end"].to_numpy(),
                            origin, PREFILL, PREFILL_COLOUR,
                            [f"prefill: {(e - s) / 1e6:.3f} ms" for s, e in prefills.select("start", "end").iter_rows()],
                            visible, True))
    ops = shown.gpu_ops.with_columns(pl.col("stage").fill_null(OTHER))
    for stage in (*STAGES, OTHER):
        host = shown.stage_ranges.filter(pl.col("stage") == stage)
        gpu = ops.filter(pl.col("stage") == stage)
        if host.height + gpu.height == 0:
            continue
        hover = [f"{stage} ({row['name']}) in step {row['step_id']}: {(row['end'] - row['start']) / 1e6:.3f} ms, "
                 + (f"{row['wait_ns'] / 1e6:.3f} ms waiting on the GPU" if gpu_traced else "no GPU traced")
                 for row in host.iter_rows(named=True)]
        hover += [f"{row['kind']} {row['name']}: {(row['end'] - row['start']) / 1e6:.3f} ms, "
                  + (f"launched by {stage} in step {row['step_id']}" if stage != OTHER
                     else "launched outside every stage range")
                  for row in gpu.iter_rows(named=True)]
        traces.append(_bars([stage] * host.height + [GPU_LANE] * gpu.height,
                            np.concatenate([host["start"].to_numpy(), gpu["start"].to_numpy()]),
                            np.concatenate([host["end"].to_numpy(), gpu["end"].to_numpy()]), origin, stage,
                            STAGE_COLOURS[stage], hover, visible, True))
    if ops.height == 0:  # keep the GPU lane on the axis: an empty lane is the finding
        traces.append(go.Scatter(x=[0], y=[GPU_LANE], mode="markers", marker_opacity=0, hoverinfo="skip",
                                 showlegend=False, visible=visible))
    return traces


def _caption(run: Run, shown: Window) -> str:
    """E.g. "GPU builder: step 40 (1 of the run's 81 steps) · GPU busy 12% of the window"."""
    first, last = shown.steps["step_id"].min(), shown.steps["step_id"].max()
    gpu = (f"GPU busy {shown.gpu_busy_share:.0%} of the window" if run.attribution.has_gpu_activity
           else "no GPU activity in this trace")
    which = f"step {first}" if first == last else f"steps {first}–{last}"
    return f"{run.label}: {which} ({shown.steps.height} of the run's {run.summary['steps']} steps) · {gpu}"


def timeline_figure(runs: Sequence[Run], steps: int = DEFAULT_WINDOW_STEPS) -> go.Figure:
    """One Gantt chart per run (the first shown; a menu picks another)."""
    figure = go.Figure()
    per_run, captions = [], []
    for index, run in enumerate(runs):
        shown = window(run, steps)
        traces = _run_traces(shown, visible=index == 0, gpu_traced=run.attribution.has_gpu_activity)
        figure.add_traces(traces)
        per_run.append(len(traces))
        captions.append(_caption(run, shown))
    title = "Step timeline: host stage lanes and the GPU lane, coloured by launching stage"
    buttons = []
    for index, run in enumerate(runs):
        mask = [i == index for i, count in enumerate(per_run) for _ in range(count)]
        buttons.append(dict(label=run.label, method="update",
                            args=[{"visible": mask}, {"title.text": f"{title}<br><sub>{captions[index]}</sub>"}]))
    figure.update_layout(
        title=f"{title}<br><sub>{captions[0]}</sub>" if captions else title, barmode="overlay", height=520,
        xaxis_title="ms since the window's first step started",
        yaxis=dict(categoryorder="array", categoryarray=list(LANES), autorange="reversed"),
        updatemenus=[dict(buttons=buttons, direction="down", x=1.0, xanchor="right", y=1.0, yanchor="bottom",
                          pad=dict(b=8))]
        if len(runs) > 1 else [],
        legend_title_text="stage (host range or GPU op)", margin=dict(t=110))
    return figure
