"""Where a stage's host time goes when the thread is in no CUDA call: the gaps between its runtime
calls inside stage ranges.

A launch-bound stage spends its host time in launch calls; a stage that waits spends it in sync
calls (both in `ddprof breakdown`). What is left is the thread running Python, a library planning or
compiling a kernel, or a lock: the call that ends a gap and the next kernel the thread launches
usually name the culprit. For example, a ~40 ms gap before the cuDNN attention kernel of every
K2-shaped draft step was cuDNN planning each new context length.

Each elementary piece of a thread's time is owned, as on the critical path, by the innermost
stage range covering it (ddprof.attribution); a gap is a maximal run of pieces outside every
runtime call owned by one stage in one step, so a stage's in-call and gap time sum to its
innermost host time.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ddprof.attribution import Attribution
from ddprof.errors import DdprofError
from ddprof.intervals import first_cover, segment_of, union
from ddprof.load import GRAPH, Trace
from engine.stages import STAGES

_NS_PER_MS = 1e6
# What ends a gap that no call ends, by the stage code after it (the last: no stage range).
_HANDOVERS = np.array([f"(into {stage})" for stage in STAGES] + ["(the range ends)"], dtype=object)


def host_gaps(trace: Trace, attribution: Attribution, *, min_ms: float = 1.0, top: int = 10) -> dict:
    """Per stage: innermost host ms, the part inside runtime calls, the gaps of at least `min_ms`
    (count, ms); and the `top` longest gaps with their step, offset in the step, and what followed."""
    if trace.runtime.height == 0:
        raise DdprofError(f"{trace.source}: no CUDA runtime calls in this trace (a host-only capture: on a machine "
                          "without CUDA ddprof capture traces NVTX alone), so there are no calls to find gaps between; "
                          "capture on a CUDA machine for gaps, or read this trace's host time per stage with "
                          "ddprof breakdown")
    per_thread, in_calls = [], np.zeros(len(STAGES), np.int64)
    for (pid, tid), ranges in attribution.stage_ranges.group_by("pid", "tid", maintain_order=True):
        calls = trace.runtime.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("start")
        # A graph replay names its first node (or its whole-graph record): what the launch ran first.
        launches = (trace.gpu_ops.filter((pl.col("pid") == pid) & (pl.col("launch_tid") == tid)
                                         & pl.col("kind").is_in(("kernel", GRAPH)))
                    .sort("launch_start", "start").select("launch_start", "name"))
        gaps, thread_in_calls = _thread_gaps(ranges, calls, launches)
        per_thread.append(gaps)
        in_calls += thread_in_calls
    gaps = pl.concat(per_thread)
    long = gaps.filter(pl.col("ns") >= min_ms * _NS_PER_MS)

    def per_stage(frame: pl.DataFrame, weights: str | None = None) -> np.ndarray:
        return np.bincount(frame["stage"].to_numpy(), weights=frame[weights].to_numpy() if weights else None,
                           minlength=len(STAGES))

    outside, long_count, long_ns = per_stage(gaps, "ns"), per_stage(long), per_stage(long, "ns")
    stages = [{"stage": stage, "host_ms": float(in_calls[code] + outside[code]) / _NS_PER_MS,
               "in_calls_ms": float(in_calls[code]) / _NS_PER_MS, "outside_calls_ms": float(outside[code]) / _NS_PER_MS,
               "gaps": int(long_count[code]), "gaps_ms": float(long_ns[code]) / _NS_PER_MS}
              for code, stage in enumerate(STAGES)]
    step_start = dict(zip(attribution.steps["step_id"].to_list(), attribution.steps["start"].to_list()))
    return {
        "source": str(attribution.source),
        "min_ms": min_ms,
        "dropped_ranges": attribution.dropped,
        "stages": stages,
        "longest": [_describe(row, step_start)
                    for row in long.sort("ns", "start", descending=[True, False]).head(top).iter_rows(named=True)],
    }


def _thread_gaps(ranges: pl.DataFrame, calls: pl.DataFrame, launches: pl.DataFrame
                 ) -> tuple[pl.DataFrame, np.ndarray]:
    """One thread's gaps (start, end, ns, stage code, step_id, the call that ends the gap, the next
    kernel the thread launches) and per stage its innermost time inside runtime calls."""
    r_start, r_end = ranges["start"].to_numpy(), ranges["end"].to_numpy()
    r_stage = ranges["stage"].replace_strict({s: i for i, s in enumerate(STAGES)}, return_dtype=pl.Int64).to_numpy()
    r_step = ranges["step_id"].to_numpy()
    c_start, c_end = calls["start"].to_numpy(), calls["end"].to_numpy()
    covered_start, covered_end = union(c_start, c_end)
    bounds = np.unique(np.concatenate([r_start, r_end, covered_start, covered_end]))
    start, end = bounds[:-1], bounds[1:]
    range_bounds, winner = first_cover(r_start, r_end, np.lexsort((r_end, -r_start)))  # innermost first
    owner = segment_of(range_bounds, winner, start)
    piece = np.searchsorted(covered_start, start, side="right") - 1  # -1: before every call: the sentinel
    in_call = start < np.append(covered_end, np.iinfo(np.int64).min)[piece]
    owned = owner >= 0
    in_calls = np.bincount(r_stage[owner[owned & in_call]], weights=(end - start)[owned & in_call],
                           minlength=len(STAGES)).astype(np.int64)
    outside = np.flatnonzero(owned & ~in_call)
    # Consecutive outside pieces of one stage in one step are one gap (nested ranges of a stage, as
    # a stage map can make, count once, as in the breakdown).
    stage_of, step_of = r_stage[owner[outside]], r_step[owner[outside]]
    new_gap = np.ones(outside.size, bool)
    new_gap[1:] = ((start[outside[1:]] != end[outside[:-1]]) | (stage_of[1:] != stage_of[:-1])
                   | (step_of[1:] != step_of[:-1]))
    first = outside[new_gap]
    last = outside[np.append(np.flatnonzero(new_gap)[1:] - 1, outside.size - 1)] if outside.size else outside
    gap_start, gap_end = start[first], end[last]
    # A gap ends where a call starts, or where its stage's ranges hand over to another stage or end.
    following = np.searchsorted(c_start, gap_end)
    ends_at_call = following < c_start.size
    ends_at_call[ends_at_call] = c_start[following[ends_at_call]] == gap_end[ends_at_call]
    after = segment_of(range_bounds, winner, gap_end)
    handover = _HANDOVERS[np.where(after >= 0, r_stage[after], len(STAGES))]
    next_launch = np.searchsorted(launches["launch_start"].to_numpy(), gap_end)
    gaps = pl.DataFrame({"start": gap_start, "end": gap_end, "ns": gap_end - gap_start,
                         "stage": r_stage[owner[first]], "step_id": r_step[owner[first]],
                         "call": np.where(ends_at_call, following, -1), "launch": next_launch}).cast(pl.Int64)
    gaps = (gaps.with_columns(handover=pl.Series(handover, dtype=pl.String))
            .join(calls.select("api").with_row_index("call").cast({"call": pl.Int64}), on="call", how="left")
            .join(launches.select(next_kernel="name").with_row_index("launch").cast({"launch": pl.Int64}), on="launch",
                  how="left")
            .drop("call", "launch"))
    return gaps, in_calls


def _describe(gap: dict, step_start: dict[int, int]) -> dict:
    """A gap for people: its stage, step, offset in the step, length, and what came next."""
    return {"stage": STAGES[gap["stage"]], "step_id": gap["step_id"],
            "at_ms": (gap["start"] - step_start[gap["step_id"]]) / _NS_PER_MS, "ms": gap["ns"] / _NS_PER_MS,
            "next_call": gap["api"] or gap["handover"], "next_kernel": gap["next_kernel"]}
