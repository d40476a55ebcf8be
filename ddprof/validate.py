"""The checks an export's values pass before anything adds them up: one line naming the file, never
a silently wrong number.

SQLite hands back whatever a file holds, and int64 arithmetic wraps without a word: a timestamp
near 2^63 made `gpu_ms` negative, a token payload near 2^62 made tok/s -1.4e18, an op that ends
before it starts subtracted its "duration". So every time ddprof reads lies in a range whose
differences and sums stay far from the int64 limits, every interval runs forward, every NVTX event
ddprof places has a thread, token counts are counts, and stage ranges lie inside their step.
(NULLs in the columns nsys always fills are refused where they are read, ddprof.export_db.)
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ddprof.errors import DdprofError

# |time| below 2^62 ns and a trace shorter than 2^53 ns (104 days): a difference of two times never
# wraps, nor a sum of a million of them.
MAX_TIME_NS = 1 << 62
MAX_SPAN_NS = 1 << 53
# More tokens than this in one mark is no count an engine emits; a million such marks still sum in int64.
MAX_TOKENS_PER_MARK = 1 << 32


def string_ids(source: Path, strings: pl.DataFrame) -> pl.DataFrame:
    """StringIds as read (string_id, value), refused when an id is missing or names two strings."""
    if strings["string_id"].null_count() or strings["string_id"].n_unique() != strings.height:
        raise DdprofError(f"{source}: StringIds has missing or repeated ids: a damaged export")
    return strings


def nvtx_threads(source: Path, events: pl.DataFrame, placed_types: tuple[int, ...]) -> None:
    """Refuse NVTX events of `placed_types` without a thread (NULL globalTid): a range on no thread
    cannot be put on a timeline, and read as thread 0 it moved its time to `other`."""
    lost = events.filter(pl.col("event_type").is_in(placed_types) & pl.col("global_tid").is_null())
    if lost.height:
        raise DdprofError(f"{source}: {lost.height:,} NVTX events have no thread (NULL globalTid; first at "
                          f"{lost['start'][0] / 1e6:.3f} ms): a damaged export")


def trace_values(source: Path, ranges: pl.DataFrame, incomplete: pl.DataFrame, marks: pl.DataFrame,
                 gpu_ops: pl.DataFrame, runtime: pl.DataFrame) -> None:
    """Refuse times outside the safe range and intervals that end before they start."""
    bounds = [bound for frame, columns in ((ranges, ("start", "end")), (incomplete, ("start", "end")),
                                           (marks, ("time",)), (gpu_ops, ("start", "end", "launch_start")),
                                           (runtime, ("start", "end")))
              for bound in frame.select(*(pl.col(c).min().alias(f"{c}_min") for c in columns),
                                        *(pl.col(c).max().alias(f"{c}_max") for c in columns)).row(0)
              if bound is not None]
    if bounds:
        low, high = min(bounds), max(bounds)
        extreme = low if -low >= high else high
        if abs(extreme) >= MAX_TIME_NS:
            raise DdprofError(f"{source}: a time of {extreme:,} ns, beyond ±2^62 ns (146 years): a damaged export")
        if high - low >= MAX_SPAN_NS:
            raise DdprofError(f"{source}: events span {(high - low) / 8.64e13:,.0f} days (from {low:,} to {high:,} "
                              "ns): no capture is that long; a damaged export")
    for what, frame, label in (("NVTX ranges", ranges, "name"), ("GPU ops", gpu_ops, "name"),
                               ("CUDA runtime calls", runtime, "api")):
        backwards = frame.filter(pl.col("end") < pl.col("start"))
        if backwards.height:
            first = backwards.row(0, named=True)
            raise DdprofError(f"{source}: {backwards.height:,} {what} end before they start (first: "
                              f"{first[label]!r} in pid {first['pid']} at {first['start'] / 1e6:.3f} ms): "
                              "a damaged export")


def token_counts(source: Path, payloads: pl.Series, marks: str) -> None:
    """Refuse token marks (`marks` says which) that carry no count, or one no engine emits."""
    missing = int(payloads.is_null().sum())
    if missing:
        raise DdprofError(f"{source}: {missing} {marks} carry no integer payload; tokens cannot be counted")
    negative = int((payloads < 0).sum())
    if negative:
        raise DdprofError(f"{source}: {negative} {marks} carry a negative token count (lowest: {payloads.min()}); "
                          "tokens cannot be counted")
    huge = int((payloads > MAX_TOKENS_PER_MARK).sum())
    if huge:
        raise DdprofError(f"{source}: {huge} {marks} carry more than {MAX_TOKENS_PER_MARK:,} tokens (highest: "
                          f"{payloads.max():,}): a damaged export; tokens cannot be counted")


def stage_containment(source: Path, candidates: pl.DataFrame, steps: pl.DataFrame, *, drop: bool,
                      describe: str) -> tuple[pl.DataFrame, int]:
    """The stage ranges inside a step, and how many crossed a step's start or end (left out with
    `drop`, else refused). `candidates` are the mapped stage ranges in (pid, tid, start) order with
    the step that starts last at or before each (step_id, step_start, step_end; null before the
    first) and next_start, the start of the thread's next step. A range wholly between steps
    belongs to no step (the definition) and is not counted."""
    after_step = pl.col("step_id").is_null() | (pl.col("start") >= pl.col("step_end"))
    crossing = (pl.when(after_step).then(pl.col("end") > pl.col("next_start"))
                .otherwise(pl.col("end") > pl.col("step_end"))).fill_null(False)
    crossed = candidates.filter(crossing)
    if crossed.height and not drop:
        first = crossed.row(0, named=True)
        raise DdprofError(f"{source}: {crossed.height:,} stage ranges in {describe} start before their step or run "
                          f"past its end (first: {first['name']!r} on tid {first['tid']} at {first['start'] / 1e6:.3f} "
                          "ms); pass --drop-incomplete to analyse the rest")
    inside = candidates.filter(~after_step & ~crossing)
    empty = steps.join(inside.select("step_id").unique(), on="step_id", how="anti")
    if empty.height and inside.height:  # none at all: ddprof.analysis says the map names no range here
        first = empty.sort("step_id").row(0, named=True)
        raise DdprofError(f"{source}: {empty.height:,} of {steps.height:,} steps hold no stage range of {describe} "
                          f"(first on tid {first['tid']} at {first['start'] / 1e6:.3f} ms): an incomplete trace")
    return inside, crossed.height
