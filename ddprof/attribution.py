"""Steps, stages and GPU ops tied together, and the critical path: who owns each ns of each step.

The definitions (issue 4), per step on its thread:
- a stage range is a mapped stage range on the step's thread, inside the step;
- a GPU op belongs to a stage when its launching runtime call (same correlationId, same process)
  starts inside one of that stage's ranges on the same thread;
- every nanosecond of a step has exactly one owner: the stage of the earliest-launched GPU op
  executing then (ops of the step's process attributed to some stage), else the innermost stage
  range of the step's thread covering it, else `other`.
"Innermost" is the covering range that started last (the deepest, for nested push/pop ranges).
Everything is computed per elementary segment with ddprof.intervals, one thread or process at a
time: no Python loop over ranges, ops or nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ddprof.errors import DdprofError
from ddprof.intervals import covered_length, first_cover, ranked, segment_of, union, winner_of
from ddprof.load import DTOH, Trace
from ddprof.stage_map import StageMap
from engine.stages import STAGES, STEP

OTHER = "other"
OWNERS = (*STAGES, OTHER)  # who can own a nanosecond of a step; index = owner code
_OTHER = len(STAGES)
_THREAD_SPAN = 1 << 24  # tids are 24-bit: pid * span + tid orders threads as (pid, tid) does

# Runtime calls during which the host thread waits for the GPU.
SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
# Copies that block the host until they finish when they go device -> host.
BLOCKING_COPY_APIS = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol")


@dataclass(frozen=True)
class Attribution:
    """steps:        step_id, pid, tid, start, end, tokens (payloads of the marks that follow it)
    stage_ranges: stage, name, step_id, pid, tid, start, end, wait_ns (inside sync calls)
    gpu_ops:      the trace's GPU ops plus stage and step_id of the innermost stage range at launch
    per_step:     one row per (step, owner): step_id, owner, count, cpu_ns, wait_ns, gpu_ns,
                  crit_ns, crit_gpu_ns (the part of crit_ns owned through a running GPU op)
    tokens:       sum of all token mark payloads (also those outside steps)
    dropped:      incomplete mapped ranges left out: {'unclosed': n, 'cross_thread': n}
    """

    source: Path
    steps: pl.DataFrame
    stage_ranges: pl.DataFrame
    gpu_ops: pl.DataFrame
    per_step: pl.DataFrame
    tokens: int
    dropped: dict[str, int]
    has_gpu_activity: bool

    def matrix(self, column: str) -> np.ndarray:
        """A per_step column as an (steps, owners) array; per_step rows come in (step, owner) order."""
        return self.per_step[column].to_numpy().reshape(self.steps.height, len(OWNERS))


def attribute(trace: Trace, stage_map: StageMap | None = None, *, drop_incomplete: bool = False) -> Attribution:
    """Tie a trace's ranges, marks and GPU ops to steps and stages, and walk the critical path."""
    stage_map = stage_map or StageMap.default()
    dropped = _check_incomplete(trace, stage_map, drop_incomplete)
    mapped = _in_map(trace.flat_ranges, stage_map).with_columns(
        target=pl.col("name").replace_strict(stage_map.ranges, return_dtype=pl.String))
    steps = _steps(trace, stage_map, mapped)
    stage_ranges = _stage_ranges(mapped, steps)
    tokens, steps = _tokens(trace, stage_map, steps)
    per_step, op_stage, op_step, wait_ns = _walk(trace, steps, stage_ranges)
    attributed = pl.Series(op_step) >= 0
    gpu_ops = trace.gpu_ops.with_columns(
        stage=pl.when(attributed).then(pl.Series(op_stage).replace_strict(dict(enumerate(OWNERS)), default=None)),
        step_id=pl.when(attributed).then(pl.Series(op_step)))
    return Attribution(trace.source, steps, stage_ranges.with_columns(wait_ns=pl.Series(wait_ns)), gpu_ops, per_step,
                       tokens, dropped, trace.has_gpu_activity)


def _in_map(frame: pl.DataFrame, stage_map: StageMap) -> pl.DataFrame:
    """Rows of the map's domain whose name the map knows: other domains never leak into stages."""
    if stage_map.domain is not None:
        frame = frame.filter(pl.col("domain") == stage_map.domain)
    return frame.filter(pl.col("name").is_in(list(stage_map.ranges)))


def _check_incomplete(trace: Trace, stage_map: StageMap, drop: bool) -> dict[str, int]:
    bad = _in_map(trace.incomplete, stage_map)
    counts = {"unclosed": int((bad["problem"] == "unclosed").sum()),
              "cross_thread": int((bad["problem"] == "cross-thread").sum())}
    if bad.height and not drop:
        first = bad.row(0, named=True)
        raise DdprofError(
            f"{trace.source}: {counts['unclosed']} unclosed and {counts['cross_thread']} cross-thread "
            f"step/stage ranges in {stage_map.describe()} (first: {first['name']!r} {first['problem']} on "
            f"tid {first['tid']} at {first['start'] / 1e6:.3f} ms); pass --drop-incomplete to analyse the rest")
    return counts


def _steps(trace: Trace, stage_map: StageMap, mapped: pl.DataFrame) -> pl.DataFrame:
    steps = (mapped.filter(pl.col("target") == STEP).sort("pid", "tid", "start")
             .select(pl.int_range(pl.len(), dtype=pl.Int64).alias("step_id"), "pid", "tid", "start", "end"))
    if steps.height == 0:
        raise DdprofError(_no_steps_message(trace, stage_map))
    overlap = steps.filter(pl.col("start") < pl.col("end").shift(1).over("pid", "tid"))
    if overlap.height:
        row = overlap.row(0, named=True)
        raise DdprofError(f"{trace.source}: {overlap.height} step ranges start before the previous step on "
                          f"their thread ends (first on tid {row['tid']} at {row['start'] / 1e6:.3f} ms); "
                          "steps must not nest or overlap")
    return steps


def _no_steps_message(trace: Trace, stage_map: StageMap) -> str:
    step_names = sorted(name for name, target in stage_map.ranges.items() if target == STEP)
    domains = sorted({d if d is not None else "<default>" for d in trace.flat_ranges["domain"].unique().to_list()})
    found = f"domains with ranges: {', '.join(domains)}" if domains else "the trace has no closed NVTX ranges"
    return (f"{trace.source}: no step ranges ({' or '.join(map(repr, step_names))}) in {stage_map.describe()} "
            f"({found}); for another engine's ranges pass --stage-map FILE")


def _stage_ranges(mapped: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Stage ranges inside a step of their own thread (the step that starts last before them), in
    (pid, tid, start) order: the as-of join needs each thread's rows in time order, no more, so one
    sort serves both."""
    owners = steps.select("pid", "tid", "step_id", step_start="start", step_end="end")  # (pid, tid, start) order
    return (mapped.filter(pl.col("target") != STEP).sort("pid", "tid", "start")
            .join_asof(owners, left_on="start", right_on="step_start", by=["pid", "tid"], strategy="backward",
                       check_sortedness=False)
            .filter(pl.col("step_id").is_not_null() & (pl.col("end") <= pl.col("step_end")))
            .select(stage="target", name="name", step_id="step_id", pid="pid", tid="tid", start="start", end="end"))


def _tokens(trace: Trace, stage_map: StageMap, steps: pl.DataFrame) -> tuple[int, pl.DataFrame]:
    """All token payloads, and each step's: the marks on its thread after it starts, before the next."""
    marks = _in_map_marks(trace.marks, stage_map)
    missing = int(marks["payload"].is_null().sum())
    if missing:
        raise DdprofError(f"{trace.source}: {missing} {stage_map.tokens!r} marks in {stage_map.describe()} "
                          "carry no integer payload; tokens cannot be counted")
    per_step = (marks.sort("time")
                .join_asof(steps.select("pid", "tid", "step_id", step_start="start").sort("step_start"),
                           left_on="time", right_on="step_start", by=["pid", "tid"], strategy="backward",
                           check_sortedness=False)
                .group_by("step_id").agg(tokens=pl.col("payload").sum()))
    steps = (steps.join(per_step, on="step_id", how="left")
             .with_columns(pl.col("tokens").fill_null(0)).sort("step_id"))
    return int(marks["payload"].sum() or 0), steps


def _in_map_marks(marks: pl.DataFrame, stage_map: StageMap) -> pl.DataFrame:
    if stage_map.domain is not None:
        marks = marks.filter(pl.col("domain") == stage_map.domain)
    return marks.filter(pl.col("name") == stage_map.tokens)


def _sync_calls(trace: Trace) -> pl.DataFrame:
    """Runtime calls during which the host waits: synchronize calls and blocking D2H copies."""
    dtoh = trace.gpu_ops.filter((pl.col("kind") == "memcpy") & (pl.col("copy_kind") == DTOH))
    blocking_copy = (trace.runtime.filter(pl.col("api").is_in(BLOCKING_COPY_APIS))
                     .join(dtoh.select("pid", "correlation_id"), on=["pid", "correlation_id"], how="semi"))
    return pl.concat([trace.runtime.filter(pl.col("api").is_in(SYNC_APIS)), blocking_copy])


class _Timeline:
    """The numpy columns the three passes of `_walk` share: stage ranges, GPU ops, sync calls."""

    def __init__(self, trace: Trace, steps: pl.DataFrame, stage_ranges: pl.DataFrame):
        code = {name: i for i, name in enumerate(OWNERS)}
        self.n_steps = steps.height
        self.step_pid, self.step_tid = steps["pid"].to_numpy(), steps["tid"].to_numpy()
        self.step_start, self.step_end = steps["start"].to_numpy(), steps["end"].to_numpy()
        self.r_start, self.r_end = stage_ranges["start"].to_numpy(), stage_ranges["end"].to_numpy()
        self.r_pid, self.r_tid = stage_ranges["pid"].to_numpy(), stage_ranges["tid"].to_numpy()
        self.r_stage = stage_ranges["stage"].replace_strict(code, return_dtype=pl.Int64).to_numpy()
        self.r_step = stage_ranges["step_id"].to_numpy()
        ops = trace.gpu_ops
        self.o_start, self.o_end = ops["start"].to_numpy(), ops["end"].to_numpy()
        self.o_pid, self.o_corr = ops["pid"].to_numpy(), ops["correlation_id"].to_numpy()
        self.o_tid = ops["launch_tid"].fill_null(-1).to_numpy()
        self.o_launch = ops["launch_start"].fill_null(-1).to_numpy()
        sync = _sync_calls(trace)
        self.s_start, self.s_end = sync["start"].to_numpy(), sync["end"].to_numpy()
        self.s_pid, self.s_tid = sync["pid"].to_numpy(), sync["tid"].to_numpy()
        self.threads = steps.select("pid", "tid").unique(maintain_order=True).rows()
        # Stage ranges come sorted by (pid, tid, start): each thread's are one slice.
        self._r_thread = self.r_pid * _THREAD_SPAN + self.r_tid

    def ranges_of(self, pid: int, tid: int) -> slice:
        """The stage ranges of one thread, as a slice of the r_* columns."""
        key = pid * _THREAD_SPAN + tid
        return slice(int(np.searchsorted(self._r_thread, key)), int(np.searchsorted(self._r_thread, key, "right")))

    def per_cell(self, step: np.ndarray, owner: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Sums (or counts) over (step, owner) cells, flattened step-major."""
        return np.bincount(step * len(OWNERS) + owner, weights=weights, minlength=self.n_steps * len(OWNERS))


def _walk(trace: Trace, steps: pl.DataFrame, stage_ranges: pl.DataFrame):
    """Per-step totals per owner, each op's stage and step, and each stage range's wait time."""
    t = _Timeline(trace, steps, stage_ranges)
    host_cover, op_stage, op_step, wait, gpu = _launches_and_waits(t)
    device_cover = _device_covers(t, op_stage)
    crit, crit_gpu = _critical_path(t, host_cover, device_cover)
    owner_codes = pl.Series(np.tile(np.arange(len(OWNERS)), t.n_steps))
    per_step = pl.DataFrame({
        "step_id": np.repeat(np.arange(t.n_steps, dtype=np.int64), len(OWNERS)),
        "owner": owner_codes.replace_strict(dict(enumerate(OWNERS)), return_dtype=pl.String),
        "count": t.per_cell(t.r_step, t.r_stage).astype(np.int64),
        "cpu_ns": t.per_cell(t.r_step, t.r_stage, t.r_end - t.r_start).astype(np.int64),
        "wait_ns": t.per_cell(t.r_step, t.r_stage, wait).astype(np.int64),
        "gpu_ns": gpu.astype(np.int64),
        "crit_ns": crit.astype(np.int64),
        "crit_gpu_ns": crit_gpu.astype(np.int64),
    })
    return per_step, op_stage, op_step, wait


def _launches_and_waits(t: _Timeline):
    """Per thread with steps: the innermost stage range of each elementary segment (the host
    cover), the stage and step of each op launched there, every stage's gpu time, range waits."""
    op_stage = np.full(t.o_start.size, -1, np.int64)
    op_step = np.full(t.o_start.size, -1, np.int64)
    wait = np.zeros(t.r_start.size, np.int64)
    gpu = np.zeros(t.n_steps * len(OWNERS), np.int64)
    host_cover = {}
    for pid, tid in t.threads:
        mine = t.ranges_of(pid, tid)
        starts, ends = t.r_start[mine], t.r_end[mine]
        bounds, winner = first_cover(starts, ends, np.lexsort((ends, -starts)))
        winner = np.where(winner >= 0, winner + mine.start, -1)  # latest-started covering range, as a row
        host_cover[pid, tid] = (bounds, winner)
        here = (t.s_pid == pid) & (t.s_tid == tid)
        wait[mine] = covered_length(*union(t.s_start[here], t.s_end[here]), starts, ends)

        launched = np.flatnonzero((t.o_pid == pid) & (t.o_tid == tid))
        at_launch = segment_of(bounds, winner, t.o_launch[launched])
        hit = at_launch >= 0
        op_stage[launched[hit]] = t.r_stage[at_launch[hit]]
        op_step[launched[hit]] = t.r_step[at_launch[hit]]
        cells, ns = _gpu_ns_per_stage(t, mine, launched)
        np.add.at(gpu, cells, ns)
    return host_cover, op_stage, op_step, wait, gpu


def _gpu_ns_per_stage(t: _Timeline, mine: slice, launched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cell, ns): the GPU time of the ops launched inside each stage's ranges on one thread,
    where an op counts once for every stage with a range around its launch.

    A stage's overlapping ranges are merged first (an op inside two nested ranges of one stage
    counts once); each merged piece sums the durations of the ops launched in it as a difference
    of running sums over the ops in launch order. A piece never spans two steps (ranges lie inside
    their step, and touching ranges are not merged), so it counts for the step of its ranges.
    """
    launch = t.o_launch[launched]
    by_launch = np.argsort(launch, kind="stable")
    launch = launch[by_launch]
    ns_before = np.concatenate([[0], np.cumsum((t.o_end[launched] - t.o_start[launched])[by_launch])])
    stages = t.r_stage[mine]
    by_stage = np.argsort(stages, kind="stable")  # start order kept within a stage
    first_of_stage = np.searchsorted(stages[by_stage], np.arange(len(STAGES) + 1))
    cells, ns = [], []
    for stage in range(len(STAGES)):
        rows = by_stage[first_of_stage[stage]:first_of_stage[stage + 1]]
        if rows.size == 0:
            continue
        starts, ends = t.r_start[mine][rows], t.r_end[mine][rows]
        reach = np.maximum.accumulate(ends)
        first = np.flatnonzero(np.concatenate([[True], starts[1:] >= reach[:-1]]))
        last = np.append(first[1:], rows.size) - 1
        lo = np.searchsorted(launch, starts[first])
        hi = np.searchsorted(launch, reach[last])
        cells.append(t.r_step[mine][rows[first]] * len(OWNERS) + stage)
        ns.append(ns_before[hi] - ns_before[lo])
    if not cells:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(cells), np.concatenate(ns)


def _device_covers(t: _Timeline, op_stage: np.ndarray) -> dict:
    """Per process with steps: the stage of the earliest-launched attributed op running in each
    elementary segment (ties: lower correlationId, then earlier start)."""
    covers = {}
    for pid in {pid for pid, _ in t.threads}:
        attributed = np.flatnonzero((t.o_pid == pid) & (op_stage >= 0))
        earliest_first = np.lexsort((t.o_start[attributed], t.o_corr[attributed], t.o_launch[attributed]))
        bounds, winner = first_cover(t.o_start[attributed], t.o_end[attributed], earliest_first)
        covers[pid] = (bounds, np.where(winner >= 0, op_stage[attributed[winner]], -1))
    return covers


def _critical_path(t: _Timeline, host_cover: dict, device_cover: dict) -> tuple[np.ndarray, np.ndarray]:
    """Cut each thread's steps at every host and device boundary and give each piece to its owner:
    the device cover's stage, else the host cover's, else `other`. Returns per-cell crit time and
    the part of it owned through a running GPU op."""
    crit = np.zeros(t.n_steps * len(OWNERS))
    crit_gpu = np.zeros(t.n_steps * len(OWNERS))
    stage_or_other = np.append(t.r_stage, _OTHER)
    for pid, tid in t.threads:
        ids = np.flatnonzero((t.step_pid == pid) & (t.step_tid == tid))  # sorted by start, disjoint
        host_bounds, host_winner = host_cover[pid, tid]
        device_bounds, device_stage = device_cover[pid]
        step_bounds = np.column_stack([t.step_start[ids], t.step_end[ids]]).ravel()  # sorted
        cuts, positions = ranked(step_bounds, host_bounds, device_bounds)
        # How many bounds of each kind lie at or before each cut: which step, host segment and
        # device segment the piece [cut, next cut) lies in.
        step_seen, host_seen, device_seen = (np.cumsum(np.bincount(at, minlength=cuts.size))[:-1] for at in positions)
        in_step = (step_seen & 1).astype(bool)  # after a step's start, not yet past its end
        length = np.diff(cuts)[in_step]
        step = ids[step_seen[in_step] >> 1]
        on_device = winner_of(device_seen[in_step] - 1, device_stage)
        on_host = stage_or_other[winner_of(host_seen[in_step] - 1, host_winner)]  # -1 picks the trailing `other`
        owner = np.where(on_device >= 0, on_device, on_host)
        crit += t.per_cell(step, owner, length)
        crit_gpu += t.per_cell(step, owner, np.where(on_device >= 0, length, 0))
    return crit, crit_gpu

