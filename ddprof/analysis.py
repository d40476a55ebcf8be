"""The breakdown: per-stage totals, shares, per-step distributions and what-if projections.

Turns an Attribution into the `ddprof breakdown --json` object (keys and meaning fixed by issue 4)
and the frames `--parquet` writes. Projections assume the freed time comes off the critical path
one for one: a stage that cost nothing saves its crit time; one that cost only its GPU time saves
its host-owned crit time. When steps of several threads overlap in time, the saving is scaled by
wall time / summed step time (a serial decode loop saves exactly its crit time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from ddprof.attribution import OTHER, OWNERS, PER_STEP_COLUMNS, Attribution
from ddprof.atomic import atomic_paths
from ddprof.errors import DdprofError
from ddprof.intervals import covered_length, union
from ddprof.load import Trace
from ddprof.stage_map import StageMap
from engine.stages import STAGES, STEP

PERCENTILES = (50, 90, 99)
# Columns that only GPU tracing can fill: unknown (null), not 0, in a host-only trace.
GPU_SIDE_COLUMNS = ("wait_ns", "gpu_ns", "crit_gpu_ns", "gpu_ops", "graph_launches", "sync_calls")
NS_PER_MS = 1e6


def _ms(ns) -> float:
    return float(ns) / NS_PER_MS


def _distribution(values_ns: np.ndarray) -> dict[str, float]:
    points = np.percentile(values_ns, PERCENTILES) if values_ns.size else [0.0] * len(PERCENTILES)
    return {f"p{p}": _ms(v) for p, v in zip(PERCENTILES, points)}


def _tok_per_s(tokens: int | None, wall_ns: float) -> float | None:
    return tokens / (wall_ns / 1e9) if tokens is not None and wall_ns > 0 else None


def _gpu_busy_ns(attribution: Attribution) -> int:
    """Step time during which some GPU op of the step's process runs, whoever launched it. (Not the
    critical path's GPU time: an op launched in a step outside every stage range, as the graphed
    engine's copy and kernel before draft are, owns no critical-path time, yet the GPU is busy.)"""
    busy = 0
    for (pid,), steps in attribution.steps.group_by("pid"):
        ops = attribution.gpu_ops.filter(pl.col("pid") == pid)
        pieces = union(ops["start"].to_numpy(), ops["end"].to_numpy())
        busy += int(covered_length(*pieces, steps["start"].to_numpy(), steps["end"].to_numpy()).sum())
    return busy


def require_stage_ranges(attribution: Attribution, stage_map: StageMap | None = None) -> None:
    """Refuse a trace whose steps hold no stage range: every ns would be `other`, and naming a stage
    that bounds tok/s (the breakdown's headline) would be a wrong answer, not an empty one."""
    if attribution.stage_ranges.height:
        return
    stage_map = stage_map or StageMap.default()
    stage_names = sorted(name for name, target in stage_map.ranges.items() if target != STEP)
    raise DdprofError(f"{attribution.source}: {attribution.steps.height} step ranges but no stage range "
                      f"({', '.join(map(repr, stage_names))}) inside one in {stage_map.describe()}; "
                      "for another engine's ranges pass --stage-map FILE")


def breakdown(attribution: Attribution, stage_map: StageMap | None = None) -> dict:
    """The `--json` object: steps, tokens, wall_s, tok_per_s, bound_by, other_crit_ms, stages, extras
    (`cuda_graphs`: how the trace recorded graph replays, ddprof.graphs; null without GPU tracing)."""
    stage_map = stage_map or StageMap.default()
    steps, n_steps = attribution.steps, attribution.steps.height
    step_ns = (steps["end"] - steps["start"]).to_numpy()
    total_step_ns = int(step_ns.sum())
    wall_ns = int(steps["end"].max() - steps["start"].min())
    tokens = attribution.tokens
    gpu_known = attribution.has_gpu_activity
    # Saving x ns of step time saves x * scale ns of wall time (see module docstring).
    scale = min(1.0, wall_ns / total_step_ns) if total_step_ns else 0.0

    matrices = {c: attribution.matrix(c) for c in PER_STEP_COLUMNS}
    totals = {c: m.sum(axis=0) for c, m in matrices.items()}

    def share(ns) -> float:
        return float(ns) / total_step_ns if total_step_ns else 0.0

    stages = []
    for code, stage in enumerate(STAGES):
        crit, crit_gpu = totals["crit_ns"][code], totals["crit_gpu_ns"][code]
        cpu, wait = totals["cpu_ns"][code], totals["wait_ns"][code]
        stages.append({
            "stage": stage,
            "count": int(totals["count"][code]),
            "cpu_ms": _ms(cpu),
            "cpu_share": share(cpu),
            "gpu_ms": _ms(totals["gpu_ns"][code]) if gpu_known else None,
            "crit_ms": _ms(crit),
            "crit_share": share(crit),
            "crit_gpu_ms": _ms(crit_gpu) if gpu_known else None,
            "crit_host_ms": _ms(crit - crit_gpu),
            "wait_ms": _ms(wait) if gpu_known else None,
            "busy_ms": _ms(cpu - wait) if gpu_known else None,
            "gpu_ops": int(totals["gpu_ops"][code]) if gpu_known else None,
            "graph_launches": int(totals["graph_launches"][code]) if gpu_known else None,
            "sync_calls": int(totals["sync_calls"][code]) if gpu_known else None,
            "per_step": {
                "cpu_ms": _distribution(matrices["cpu_ns"][:, code]),
                "gpu_ms": _distribution(matrices["gpu_ns"][:, code]) if gpu_known else None,
                "crit_ms": _distribution(matrices["crit_ns"][:, code]),
            },
            "what_if": {
                "tok_per_s_if_free": _tok_per_s(tokens, wall_ns - crit * scale),
                "tok_per_s_if_gpu_only": _tok_per_s(tokens, wall_ns - (crit - crit_gpu) * scale) if gpu_known else None,
            },
        })
    other = OWNERS.index(OTHER)
    bound_by = STAGES[int(np.argmax(totals["crit_ns"][:len(STAGES)]))]
    return {
        "source": str(attribution.source),
        "steps": n_steps,
        "tokens": tokens,
        "wall_s": wall_ns / 1e9,
        "tok_per_s": _tok_per_s(tokens, wall_ns),
        "bound_by": bound_by,
        "other_crit_ms": _ms(totals["crit_ns"][other]),
        "stages": stages,
        "other_crit_share": share(totals["crit_ns"][other]),
        "gpu_busy_share": share(_gpu_busy_ns(attribution)) if gpu_known else None,
        "step_ms": {"total": _ms(total_step_ns), **_distribution(step_ns)},
        "gpu_activity": gpu_known,
        "cuda_graphs": attribution.graphs.as_dict() if gpu_known else None,
        "domain": stage_map.domain,
        "stage_map": str(stage_map.source) if stage_map.source else None,
        "dropped_ranges": attribution.dropped,
    }


def stage_row(summary: dict, stage: str) -> dict:
    """The row of `stage` in a breakdown summary's `stages`."""
    return next(row for row in summary["stages"] if row["stage"] == stage)


def breakdown_frames(trace: Trace, attribution: Attribution, summary: dict) -> dict[str, pl.DataFrame]:
    """The frames behind a breakdown, by file stem, for `--parquet DIR`."""
    rows = [{k: v for k, v in row.items() if k not in ("per_step", "what_if")} for row in summary["stages"]]
    # Unknown GPU columns (a host-only trace) stay typed nulls, so runs' frames concatenate.
    types = {key: pl.Float64 for key in rows[0] if key.endswith(("_ms", "_share"))} | {
        "gpu_ops": pl.Int64, "graph_launches": pl.Int64, "sync_calls": pl.Int64}
    stages = pl.DataFrame(rows, schema_overrides=types)
    return {
        "ranges": trace.ranges,
        "marks": trace.marks,
        "incomplete_ranges": trace.incomplete,
        "runtime_calls": trace.runtime,
        "gpu_ops": attribution.gpu_ops,
        "steps": attribution.steps,
        "stage_ranges": attribution.stage_ranges,
        "step_owners": _unknown_gpu_columns_null(attribution),
        "stages": stages,
    }


def _unknown_gpu_columns_null(attribution: Attribution) -> pl.DataFrame:
    """Per-step owners, with the GPU-side columns null (as in the summary) when no GPU work was traced:
    a 0 there would read as "measured, and none"."""
    if attribution.has_gpu_activity:
        return attribution.per_step
    return attribution.per_step.with_columns(pl.lit(None, pl.Int64).alias(c) for c in GPU_SIDE_COLUMNS)


def require_parquet_folder(folder: Path) -> None:
    """Refuse a --parquet path that cannot be a folder, before any analysis is spent on it."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise DdprofError(f"{folder}: --parquet needs a folder, and this is a file")


def write_parquet(frames: dict[str, pl.DataFrame], folder: Path) -> list[Path]:
    """Write each frame as FOLDER/<name>.parquet (creating FOLDER); all of them or, on a failure,
    none (the ones already written are removed: a partial set would read as a whole one)."""
    folder = Path(folder)
    require_parquet_folder(folder)
    paths = [folder / f"{stem}.parquet" for stem in frames]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_paths(paths) as partials:
            for frame, partial in zip(frames.values(), partials):
                frame.write_parquet(partial)
    except (OSError, pl.exceptions.PolarsError) as exc:  # polars reports a full disk as its own error
        raise DdprofError(f"{folder}: cannot write the parquet files ({getattr(exc, 'strerror', None) or exc})") from None
    return paths
