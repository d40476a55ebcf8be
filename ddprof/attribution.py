"""Steps, stages and GPU ops tied together, and the critical path: who owns each ns of each step.

The definitions (issue 4), per step on its thread:
- a stage range is a mapped stage range on the step's thread, inside the step;
- a GPU op belongs to a stage when its launching runtime call (same correlationId, same process)
  starts inside one of that stage's ranges on the same thread; a CUDA graph's nodes (and its
  whole-graph record) are launched by its cudaGraphLaunch call (ddprof.graphs), wherever and
  whenever they run;
- every nanosecond of a step has exactly one owner: the stage of the earliest-launched GPU op
  executing then (ops of the step's process attributed to some stage), else the innermost stage
  range of the step's thread covering it, else `other`.
"Innermost" is the covering range that started last (the deepest, for nested push/pop ranges).
Everything is computed per elementary segment with ddprof.intervals, over windows of a thread's
consecutive steps walked in parallel: no Python loop over ranges, ops or nanoseconds.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ddprof import validate
from ddprof.errors import DdprofError
from ddprof.graphs import GraphTrace, graph_trace, op_counts
from ddprof.intervals import covered_length, first_cover, ranked, segment_of, union, winner_of
from ddprof.load import DTOH, Trace
from ddprof.stage_map import StageMap
from engine.stages import STAGES, STEP

OTHER = "other"
# What per_step holds for each (step, owner) cell (see Attribution).
PER_STEP_COLUMNS = ("count", "cpu_ns", "wait_ns", "gpu_ns", "crit_ns", "crit_gpu_ns", "gpu_ops", "graph_launches",
                    "sync_calls")
OWNERS = (*STAGES, OTHER)  # who can own a nanosecond of a step; index = owner code
_OTHER = len(STAGES)
_THREAD_SPAN = 1 << 24  # tids are 24-bit: pid * span + tid orders threads as (pid, tid) does
_WINDOW_RANGES = 1 << 16  # stage ranges per window of `_walk`

# Runtime calls during which the host thread waits for the GPU.
SYNC_APIS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
# Copies that block the host until they finish when they go device -> host.
BLOCKING_COPY_APIS = ("cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyFromSymbol")
# Asynchronous copies that block all the same when they go device -> pageable host memory (the
# driver stages them; on the H200 every such call returned after its copy ended).
ASYNC_COPY_APIS = ("cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync", "cudaMemcpyFromSymbolAsync")


@dataclass(frozen=True)
class Attribution:
    """steps:        step_id, pid, tid, start, end, tokens (payloads of the marks that follow it; null
                  when the trace has no token marks)
    stage_ranges: stage, name, step_id, pid, tid, start, end, wait_ns (inside sync calls)
    gpu_ops:      the trace's GPU ops plus stage and step_id of the innermost stage range at launch
    per_step:     one row per (step, owner): step_id, owner, count, cpu_ns, wait_ns, gpu_ns,
                  crit_ns, crit_gpu_ns (the part of crit_ns owned through a running GPU op),
                  gpu_ops (ops launched: kernels, memcpys, memsets, a graph's nodes one by one),
                  graph_launches (graph replays with a GPU record) and sync_calls (calls that wait
                  for the GPU) made inside the owner's innermost range; a stage's overlapping
                  ranges count their overlap once in cpu_ns, wait_ns, gpu_ns
    tokens:       sum of all token mark payloads (also those outside steps); None without token marks
                  (tok/s is then unknown, not 0, and so is each step's `tokens`)
    dropped:      mapped ranges left out (--drop-incomplete): {'unclosed': n, 'cross_thread': n,
                  'outside_step': n (stage ranges that cross their step's start or end)}
    graphs:       how the trace recorded CUDA graph replays (ddprof.graphs.GraphTrace)
    """

    source: Path
    steps: pl.DataFrame
    stage_ranges: pl.DataFrame
    gpu_ops: pl.DataFrame
    per_step: pl.DataFrame
    tokens: int | None
    dropped: dict[str, int]
    has_gpu_activity: bool
    graphs: GraphTrace

    def matrix(self, column: str) -> np.ndarray:
        """A per_step column as an (steps, owners) array; per_step rows come in (step, owner) order."""
        return self.per_step[column].to_numpy().reshape(self.steps.height, len(OWNERS))


def attribute(trace: Trace, stage_map: StageMap | None = None, *, drop_incomplete: bool = False) -> Attribution:
    """Tie a trace's ranges, marks and GPU ops to steps and stages, and walk the critical path."""
    stage_map = stage_map or StageMap.default()
    dropped = _check_incomplete(trace, stage_map, drop_incomplete)
    graphs = graph_trace(trace)
    steps, stage_ranges, dropped["outside_step"] = _steps_and_stage_ranges(trace, stage_map, drop_incomplete)
    tokens, steps = _tokens(trace, stage_map, steps)
    per_step, op_stage, op_step, wait_ns = _walk(trace, steps, stage_ranges)
    attributed = pl.Series(op_step) >= 0
    gpu_ops = trace.gpu_ops.with_columns(
        stage=pl.when(attributed).then(pl.Series(op_stage).replace_strict(dict(enumerate(OWNERS)), default=None)),
        step_id=pl.when(attributed).then(pl.Series(op_step)))
    return Attribution(trace.source, steps, stage_ranges.with_columns(wait_ns=pl.Series(wait_ns)), gpu_ops, per_step,
                       tokens, dropped, trace.has_gpu_activity, graphs)


def _steps_and_stage_ranges(trace: Trace, stage_map: StageMap, drop: bool) -> tuple[pl.DataFrame, pl.DataFrame, int]:
    """The mapped ranges split into steps and the stage ranges inside them, and how many stage
    ranges crossed a step's bounds (the mapped frame, a copy of most of the trace's ranges, is
    freed before the walk needs the memory)."""
    mapped = _in_map(trace.flat_ranges, stage_map).with_columns(
        target=pl.col("name").replace_strict(stage_map.ranges, return_dtype=pl.String))
    steps = _steps(trace, stage_map, mapped)
    stage_ranges, crossed = validate.stage_containment(trace.source, _stage_ranges(mapped, steps), steps, drop=drop,
                                                       describe=stage_map.describe())
    return steps, stage_ranges.select("stage", "name", "step_id", "pid", "tid", "start", "end"), crossed


def _in_map(frame: pl.DataFrame, stage_map: StageMap) -> pl.DataFrame:
    """Rows of the map's domain whose name the map knows: other domains never leak into stages."""
    known = pl.col("name").is_in(list(stage_map.ranges))
    return frame.filter(known if stage_map.domain is None else known & (pl.col("domain") == stage_map.domain))


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
    """Stage ranges with the step of their own thread that starts last at or before them, and the
    start of the next one (ddprof.validate keeps those inside the step), in (pid, tid, start)
    order: the as-of joins need each thread's rows in time order, no more, so one sort serves all."""
    owners = steps.select("pid", "tid", "step_id", step_start="start", step_end="end")  # (pid, tid, start) order
    following = steps.select("pid", "tid", next_start="start")
    return (mapped.filter(pl.col("target") != STEP).sort("pid", "tid", "start")
            .join_asof(owners, left_on="start", right_on="step_start", by=["pid", "tid"], strategy="backward",
                       check_sortedness=False)
            .join_asof(following, left_on="start", right_on="next_start", by=["pid", "tid"], strategy="forward",
                       allow_exact_matches=False, check_sortedness=False)
            .rename({"target": "stage"}))


def _tokens(trace: Trace, stage_map: StageMap, steps: pl.DataFrame) -> tuple[int | None, pl.DataFrame]:
    """All token payloads, and each step's: the marks on its thread after it starts, before the next."""
    marks = _in_map_marks(trace.marks, stage_map)
    validate.token_counts(trace.source, marks["payload"], f"{stage_map.tokens!r} marks in {stage_map.describe()}")
    per_step = (marks.sort("time")
                .join_asof(steps.select("pid", "tid", "step_id", step_start="start").sort("step_start"),
                           left_on="time", right_on="step_start", by=["pid", "tid"], strategy="backward",
                           check_sortedness=False)
                .group_by("step_id").agg(tokens=pl.col("payload").sum()))
    steps = steps.join(per_step, on="step_id", how="left").sort("step_id")
    if marks.height:  # a step without marks generated no token; without any mark, every count is unknown
        steps = steps.with_columns(pl.col("tokens").fill_null(0))
    return (int(marks["payload"].sum()) if marks.height else None), steps


def _in_map_marks(marks: pl.DataFrame, stage_map: StageMap) -> pl.DataFrame:
    if stage_map.domain is not None:
        marks = marks.filter(pl.col("domain") == stage_map.domain)
    return marks.filter(pl.col("name") == stage_map.tokens)


def _sync_calls(trace: Trace) -> pl.DataFrame:
    """Runtime calls during which the host waits: synchronize calls and blocking D2H copies."""
    dtoh = trace.gpu_ops.filter((pl.col("kind") == "memcpy") & (pl.col("copy_kind") == DTOH))
    blocking = (pl.col("api").is_in(BLOCKING_COPY_APIS)
                | pl.col("api").is_in(ASYNC_COPY_APIS) & pl.col("to_pageable").fill_null(False))
    blocking_copy = (trace.runtime.join(dtoh.select("pid", "correlation_id", "to_pageable"),
                                        on=["pid", "correlation_id"], how="inner")
                     .filter(blocking).drop("to_pageable")
                     .unique(["pid", "correlation_id"], keep="first", maintain_order=True))  # a call, once
    return pl.concat([trace.runtime.filter(pl.col("api").is_in(SYNC_APIS)), blocking_copy])


class _Timeline:
    """The numpy columns the passes of `_walk` share: steps, stage ranges, GPU ops, sync calls."""

    def __init__(self, trace: Trace, steps: pl.DataFrame, stage_ranges: pl.DataFrame):
        code = {name: i for i, name in enumerate(OWNERS)}
        self.n_steps = steps.height
        self.step_start, self.step_end = steps["start"].to_numpy(), steps["end"].to_numpy()
        self.r_start, self.r_end = stage_ranges["start"].to_numpy(), stage_ranges["end"].to_numpy()
        self.r_stage = stage_ranges["stage"].replace_strict(code, return_dtype=pl.Int64).to_numpy()
        self.stage_or_other = np.append(self.r_stage, _OTHER)  # a range row's stage; row -1: `other`
        self.r_step = stage_ranges["step_id"].to_numpy()
        ops = trace.gpu_ops
        self.o_start, self.o_end = ops["start"].to_numpy(), ops["end"].to_numpy()
        self.o_pid, self.o_corr = ops["pid"].to_numpy(), ops["correlation_id"].to_numpy()
        self.o_launch = ops["launch_start"].fill_null(-1).to_numpy()
        self.o_is_op, self.o_opens_graph = op_counts(ops)
        self._o_thread = ops["pid"].to_numpy() * _THREAD_SPAN + ops["launch_tid"].fill_null(-1).to_numpy()
        sync = _sync_calls(trace)
        self._sync = sync.select("start", "end", thread=pl.col("pid") * _THREAD_SPAN + pl.col("tid"))
        self.threads = steps.group_by("pid", "tid", maintain_order=True).agg(
            first=pl.col("step_id").min(), last=pl.col("step_id").max()).rows()
        # Stage ranges come sorted by (pid, tid, start), steps by (pid, tid, start) too.
        self._r_thread = stage_ranges["pid"].to_numpy() * _THREAD_SPAN + stage_ranges["tid"].to_numpy()

    def windows(self) -> list[_Window]:
        """Every thread's steps cut into windows of about _WINDOW_RANGES stage ranges each."""
        windows = []
        for pid, tid, first, last in self.threads:
            key = pid * _THREAD_SPAN + tid
            mine = slice(int(np.searchsorted(self._r_thread, key)), int(np.searchsorted(self._r_thread, key, "right")))
            launched = np.flatnonzero(self._o_thread == key)
            launched = launched[np.argsort(self.o_launch[launched], kind="stable")]
            sync = self._sync.filter(pl.col("thread") == key)
            waits = union(sync["start"].to_numpy(), sync["end"].to_numpy())
            sync_starts = np.sort(sync["start"].to_numpy())
            cuts = np.unique(np.concatenate([[first], self.r_step[mine][::_WINDOW_RANGES][1:], [last + 1]]))
            for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
                start, end = int(self.step_start[a]), int(self.step_end[a:b].max())
                at = np.searchsorted(self.r_step[mine], [a, b]) + mine.start
                lo, hi = np.searchsorted(self.o_launch[launched], [start, end])
                first_sync, after_sync = np.searchsorted(sync_starts, [start, end])
                windows.append(_Window(pid, slice(a, b), slice(int(at[0]), int(at[1])), launched[lo:hi], start, end,
                                       waits, sync_starts[first_sync:after_sync]))
        return windows


@dataclass(frozen=True)
class _Window:
    """A run of one thread's consecutive steps: the unit of work of `_walk`'s passes.

    Nothing in a window depends on the stage ranges or launches of another (ranges lie inside
    their step, ops belong to the range around their launch), and the GPU ops running during it
    are found by time; so windows are walked in parallel, each over arrays small enough to reuse
    memory (fresh pages cost more than the arithmetic on them here) and to stay in cache.
    """

    pid: int
    steps: slice  # step ids (a thread's steps are numbered consecutively in time order)
    ranges: slice  # rows of the stage-range columns
    launched: np.ndarray  # rows of the ops launched on the thread during the window, in launch order
    start: int
    end: int
    waits: tuple[np.ndarray, np.ndarray]  # the thread's synchronising calls, as a union of pieces
    sync_starts: np.ndarray  # when each of the thread's synchronising calls in the window starts, sorted

    def cells(self) -> slice:
        """The window's (step, owner) cells in the flattened step-major per-cell arrays."""
        return slice(self.steps.start * len(OWNERS), self.steps.stop * len(OWNERS))

    def per_cell(self, step: np.ndarray, owner: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Sums (or counts) over the window's cells; `step` counts from the window's first step."""
        n = (self.steps.stop - self.steps.start) * len(OWNERS)
        return np.bincount(step * len(OWNERS) + owner, weights=weights, minlength=n).astype(np.int64)


def _walk(trace: Trace, steps: pl.DataFrame, stage_ranges: pl.DataFrame):
    """Per-step totals per owner, each op's stage and step, and each stage range's wait time.

    Two passes over the windows, each run on all cores: first the host side (the innermost range
    at every instant, which attributes each op, the waits and the GPU time per stage); then, once
    every op is attributed, the device side and the critical path.
    """
    t = _Timeline(trace, steps, stage_ranges)
    windows = t.windows()
    op_stage = np.full(t.o_start.size, -1, np.int64)
    op_step = np.full(t.o_start.size, -1, np.int64)
    wait = np.zeros(t.r_start.size, np.int64)
    cells = {column: np.zeros(t.n_steps * len(OWNERS), np.int64) for column in PER_STEP_COLUMNS}
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        host_covers = list(pool.map(lambda w: _host_side(t, w, op_stage, op_step, wait, cells), windows))
        ops_by_pid = {pid: _DeviceOps(t, pid, op_stage) for pid in {w.pid for w in windows}}
        list(pool.map(lambda w, host: _critical_path(t, w, host, ops_by_pid[w.pid], op_stage, cells),
                      windows, host_covers))
    owner_codes = pl.Series(np.tile(np.arange(len(OWNERS)), t.n_steps))
    per_step = pl.DataFrame({
        "step_id": np.repeat(np.arange(t.n_steps, dtype=np.int64), len(OWNERS)),
        "owner": owner_codes.replace_strict(dict(enumerate(OWNERS)), return_dtype=pl.String),
        **cells,
    })
    return per_step, op_stage, op_step, wait


def _host_side(t: _Timeline, w: _Window, op_stage, op_step, wait, cells) -> tuple[np.ndarray, np.ndarray]:
    """The window's host cover (the innermost stage range of each elementary segment, as a row),
    and into the shared arrays (rows and cells of this window only): the stage and step of each
    op launched in a stage range, every range's wait, and per cell the ranges' count, cpu, wait
    and GPU time, and the ops launched and synchronising calls made in the cell's innermost ranges."""
    starts, ends = t.r_start[w.ranges], t.r_end[w.ranges]
    bounds, winner = first_cover(starts, ends, np.lexsort((ends, -starts)))
    winner = np.where(winner >= 0, winner + w.ranges.start, -1)  # latest-started covering range, as a row
    wait[w.ranges] = covered_length(*w.waits, starts, ends)
    at_launch = segment_of(bounds, winner, t.o_launch[w.launched])
    hit = at_launch >= 0
    launched, launch_range = w.launched[hit], at_launch[hit]
    launch_stage, launch_step = t.r_stage[launch_range], t.r_step[launch_range]
    op_stage[launched], op_step[launched] = launch_stage, launch_step
    at_sync = segment_of(bounds, winner, w.sync_starts)
    at_sync = at_sync[at_sync >= 0]

    mine = w.cells()
    cells["count"][mine] += w.per_cell(t.r_step[w.ranges] - w.steps.start, t.r_stage[w.ranges])
    cells["gpu_ops"][mine] += w.per_cell(launch_step - w.steps.start, launch_stage, t.o_is_op[launched])
    cells["graph_launches"][mine] += w.per_cell(launch_step - w.steps.start, launch_stage, t.o_opens_graph[launched])
    cells["sync_calls"][mine] += w.per_cell(t.r_step[at_sync] - w.steps.start, t.r_stage[at_sync])
    # Time, waits and GPU work are counted over each stage's merged ranges: a stage mapped onto two
    # nested ranges (another engine's, through a stage map) owns their overlap once, not twice.
    pieces = _stage_pieces(t, w.ranges)
    stage, step, piece_start, piece_end = pieces
    cells["cpu_ns"][mine] += w.per_cell(step - w.steps.start, stage, piece_end - piece_start)
    cells["wait_ns"][mine] += w.per_cell(step - w.steps.start, stage, covered_length(*w.waits, piece_start, piece_end))
    gpu_cells, ns = _gpu_ns_per_stage(t, pieces, w.launched)
    np.add.at(cells["gpu_ns"], gpu_cells, ns)
    return bounds, winner


def _stage_pieces(t: _Timeline, mine: slice) -> tuple[np.ndarray, ...]:
    """Each stage's ranges among `mine` (one thread's, in start order) with overlapping ones merged:
    (stage, step, start, end) per merged piece. A piece never spans two steps (ranges lie inside
    their step, and touching ranges are not merged), so it counts for the step of its ranges."""
    stages = t.r_stage[mine]
    by_stage = np.argsort(stages, kind="stable")  # start order kept within a stage
    first_of_stage = np.searchsorted(stages[by_stage], np.arange(len(STAGES) + 1))
    pieces = []
    for stage in range(len(STAGES)):
        rows = by_stage[first_of_stage[stage]:first_of_stage[stage + 1]]
        if rows.size == 0:
            continue
        starts, ends = t.r_start[mine][rows], t.r_end[mine][rows]
        reach = np.maximum.accumulate(ends)
        first = np.flatnonzero(np.concatenate([[True], starts[1:] >= reach[:-1]]))
        last = np.append(first[1:], rows.size) - 1
        pieces.append((np.full(first.size, stage), t.r_step[mine][rows[first]], starts[first], reach[last]))
    if not pieces:
        return tuple(np.empty(0, np.int64) for _ in range(4))
    return tuple(np.concatenate(column) for column in zip(*pieces))


def _gpu_ns_per_stage(t: _Timeline, pieces: tuple[np.ndarray, ...], launched: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(cell, ns): the GPU time of the ops launched inside each merged stage piece (`_stage_pieces`
    of one thread), where `launched` are that thread's ops in launch order; an op counts once for
    every stage with a range around its launch. Each piece sums the durations of the ops launched
    in it as a difference of running sums over the ops in launch order."""
    stage, step, start, end = pieces
    launch = t.o_launch[launched]  # in launch order
    ns_before = np.concatenate([[0], np.cumsum(t.o_end[launched] - t.o_start[launched])])
    return step * len(OWNERS) + stage, ns_before[np.searchsorted(launch, end)] - ns_before[np.searchsorted(launch, start)]


class _DeviceOps:
    """One process's attributed ops in start order: the windows' device covers are cut from them."""

    def __init__(self, t: _Timeline, pid: int, op_stage: np.ndarray):
        attributed = np.flatnonzero((t.o_pid == pid) & (op_stage >= 0))
        self.by_start = attributed[np.argsort(t.o_start[attributed], kind="stable")]  # loaded in start order: cheap
        self.starts = t.o_start[self.by_start]
        self.longest = int((t.o_end[attributed] - t.o_start[attributed]).max(initial=0))

    def running(self, t: _Timeline, start: int, end: int) -> np.ndarray:
        """Rows of the ops that run at some instant of [start, end)."""
        lo, hi = np.searchsorted(self.starts, [start - self.longest, end])
        rows = self.by_start[lo:hi]
        return rows[t.o_end[rows] > start]


def _critical_path(t: _Timeline, w: _Window, host_cover: tuple[np.ndarray, np.ndarray], device: _DeviceOps,
                   op_stage: np.ndarray, cells: dict[str, np.ndarray]) -> None:
    """Cut the window's steps at every host and device boundary and give each piece to its owner:
    the stage of the earliest-launched attributed op running then (the device cover, ties: lower
    correlationId, then earlier start), else the host cover's stage, else `other`. Adds each cell's
    crit time, and the part of it owned through a running GPU op, into the window's cells."""
    running = device.running(t, w.start, w.end)
    earliest_first = np.lexsort((t.o_start[running], t.o_corr[running], t.o_launch[running]))
    device_bounds, winner = first_cover(t.o_start[running], t.o_end[running], earliest_first)
    device_stage = np.where(winner >= 0, op_stage[running[winner]], -1)
    host_bounds, host_winner = host_cover
    step_bounds = np.column_stack([t.step_start[w.steps], t.step_end[w.steps]]).ravel()  # sorted, disjoint
    cuts, positions = ranked(step_bounds, host_bounds, device_bounds)
    # How many bounds of each kind lie at or before each cut: which step, host segment and device
    # segment the piece [cut, next cut) lies in.
    step_seen, host_seen, device_seen = (np.cumsum(np.bincount(at, minlength=cuts.size))[:-1] for at in positions)
    in_step = (step_seen & 1).astype(bool)  # after a step's start, not yet past its end
    length = np.diff(cuts)[in_step]
    step = step_seen[in_step] >> 1  # counted from the window's first step
    on_device = winner_of(device_seen[in_step] - 1, device_stage)
    on_host = t.stage_or_other[winner_of(host_seen[in_step] - 1, host_winner)]  # -1 picks the trailing `other`
    owner = np.where(on_device >= 0, on_device, on_host)
    mine = w.cells()
    cells["crit_ns"][mine] += w.per_cell(step, owner, length)
    cells["crit_gpu_ns"][mine] += w.per_cell(step, owner, np.where(on_device >= 0, length, 0))
