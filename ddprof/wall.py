"""Where the wall time that tok/s is computed over goes: decode steps, prefills between them, and
the rest between steps (the scheduler admitting and releasing requests, Python).

tok/s in the breakdown is decode tokens over the wall from the first step's start to the last
step's end. That wall holds more than steps: a serving loop prefills newly admitted requests
between steps (16% of the demo trace's wall), and the step shares say nothing about it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ddprof.analysis import NS_PER_MS
from ddprof.attribution import Attribution
from ddprof.intervals import covered_length, union
from ddprof.load import Trace
from ddprof.stage_map import StageMap
from engine.stages import DOMAIN, PREFILL


def names_prefills(stage_map: StageMap | None) -> bool:
    """Whether the trace's ranges are the engine's, which names its prefills (a --stage-map of
    another domain names none: their time between steps cannot be split)."""
    return stage_map is None or stage_map.domain == DOMAIN


def prefills(trace: Trace, stage_map: StageMap | None) -> pl.DataFrame:
    """The engine's `prefill` ranges (pid, tid, start, end); none for another engine's trace."""
    ranges = trace.flat_ranges.select("pid", "tid", "start", "end")  # no nesting needed: flat is cheaper
    if not names_prefills(stage_map):
        return ranges.clear()
    return trace.flat_ranges.filter((pl.col("domain") == DOMAIN) & (pl.col("name") == PREFILL)).select(ranges.columns)


def wall_split(attribution: Attribution, prefill_ranges: pl.DataFrame | None) -> dict:
    """The `wall` object of a breakdown: wall ms, then the ms and share of wall in steps, in prefills
    outside steps (None when the trace's engine names no prefill), and the rest between steps."""
    steps = attribution.steps
    wall_start, wall_end = int(steps["start"].min()), int(steps["end"].max())
    wall_ns = wall_end - wall_start
    step_starts, step_ends = union(steps["start"].to_numpy(), steps["end"].to_numpy())
    in_steps = int((step_ends - step_starts).sum())
    prefill_ns = None
    if prefill_ranges is not None:
        p_starts, p_ends = union(prefill_ranges["start"].to_numpy(), prefill_ranges["end"].to_numpy())
        in_wall = int(covered_length(p_starts, p_ends, np.array([wall_start]), np.array([wall_end]))[0])
        prefill_ns = in_wall - int(covered_length(p_starts, p_ends, step_starts, step_ends).sum())
    between = wall_ns - in_steps - (prefill_ns or 0)

    def part(ns: int | None) -> dict | None:
        return None if ns is None else {"ms": ns / NS_PER_MS, "share": ns / wall_ns if wall_ns else 0.0}

    return {"ms": wall_ns / NS_PER_MS, "steps": part(in_steps), "prefill": part(prefill_ns),
            "between_steps": part(between)}
