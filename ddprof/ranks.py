"""Several ranks as one run: a report holding one process per rank, or one report per rank.

Each rank's process goes through the single-process pipeline on its own (ddprof.pipeline); only
then are the ranks put side by side. The ranks of an expert-parallel engine run the same steps in
lock step (every MoE layer waits for every rank in its all-reduce), so steps are matched across
ranks by their index on each rank; a step lasts as long as its slowest rank's, so the step's
critical path is that rank's (`critical`: an Attribution built from the slowest rank's rows of
each matched step, which breakdown and compare read like any run's). Each rank's clock is taken
from its own first step (per-rank reports of nsys 2022.4 count from their own trace start).

Communication per stage is its own column: on CUDA the GPU time of the collective's kernels
(NCCL's) the stage launched; on the CPU, where gloo runs on the host, the host time of the
engine's nested communication ranges (`moe_all_reduce`, engine/stages.py) inside the stage.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ddprof.analysis import NS_PER_MS, breakdown
from ddprof.attribution import OWNERS, PER_STEP_COLUMNS, Attribution
from ddprof.graphs import GraphTrace
from ddprof.errors import DdprofError
from ddprof.load import Trace, load
from ddprof.pipeline import analyse_trace
from ddprof.stage_map import StageMap
from ddprof.wall import wall_split
from engine.stages import COMMUNICATION, DOMAIN, RANK_MARK, STAGES, STEP

COLLECTIVE_KERNELS = "nccl"  # in the name of every NCCL kernel (ncclDevKernel_AllReduce_Sum_f32_RING_LL, ...)


@dataclass(frozen=True)
class Process:
    """One rank's process: the file it came from, its pid there, and its part of the trace."""

    source: Path
    pid: int
    rank: int
    trace: Trace


@dataclass(frozen=True)
class RankRun:
    """One rank analysed alone, plus its communication ns per (step, stage)."""

    process: Process
    attribution: Attribution
    summary: dict
    communication_ns: np.ndarray  # [steps, stages]


@dataclass(frozen=True)
class Ranked:
    runs: list[RankRun]  # in rank order
    slowest: np.ndarray  # [matched steps]: index into `runs` of each step's slowest rank
    critical: Attribution  # each matched step as its slowest rank ran it
    summary: dict  # the `--json` object


def expand(paths: Sequence[Path]) -> list[Path]:
    """The paths given, a glob pattern that names no file as its matches (`'traces/run.rank*.sqlite'`
    quoted, or where no shell expands it), sorted."""
    found = []
    for path in map(Path, paths):
        if not path.exists() and glob.has_magic(str(path)):
            matches = sorted(glob.glob(str(path)))
            if not matches:
                raise DdprofError(f"{path}: no file matches this pattern")
            found += map(Path, matches)
        else:
            found.append(path)
    return found


def processes(paths: Sequence[Path], stage_map: StageMap | None = None,
              advance: Callable[[str], None] = lambda label: None) -> list[Process]:
    """Every process with step ranges in the given reports, in rank order: by the engine's `rank`
    mark where every process has one, else by file and then pid."""
    stage_map = stage_map or StageMap.default()
    found = []
    for path in expand(paths):
        advance(f"loading {path.name}")
        trace = load(path)
        pids = _step_pids(trace, stage_map)
        if len(pids) <= 1:  # one process: the trace as it is (what the single-process commands read)
            found.append(Process(trace.source, pids[0] if pids else -1, _rank_mark(trace, None), trace))
            continue
        found += [Process(trace.source, pid, _rank_mark(trace, pid), _one_process(trace, pid)) for pid in pids]
    marked = [p.rank for p in found]
    if len(found) > 1 and all(rank is not None for rank in marked):
        twice = next((p for p in found if marked.count(p.rank) > 1), None)
        if twice is not None:
            raise DdprofError(f"{twice.source}: rank {twice.rank} appears in {marked.count(twice.rank)} processes of "
                              "the reports given (reports of different runs?)")
        return sorted(found, key=lambda p: p.rank)
    return [Process(p.source, p.pid, index, p.trace) for index, p in enumerate(found)]


def _step_pids(trace: Trace, stage_map: StageMap) -> list[int]:
    names = [name for name, target in stage_map.ranges.items() if target == STEP]
    steps = trace.flat_ranges.filter(pl.col("name").is_in(names))
    if stage_map.domain is not None:
        steps = steps.filter(pl.col("domain") == stage_map.domain)
    return sorted(steps["pid"].unique().to_list())


def _rank_mark(trace: Trace, pid: int | None) -> int | None:
    marks = trace.marks.filter((pl.col("name") == RANK_MARK) & (pl.col("domain") == DOMAIN))
    if pid is not None:
        marks = marks.filter(pl.col("pid") == pid)
    ranks = marks["payload"].drop_nulls().unique().to_list()
    return ranks[0] if len(ranks) == 1 else None


def _one_process(trace: Trace, pid: int) -> Trace:
    def mine(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.filter(pl.col("pid") == pid)

    return Trace(trace.source, mine(trace.flat_ranges), mine(trace.marks), mine(trace.incomplete),
                 mine(trace.gpu_ops), mine(trace.runtime))


def analyse_ranks(found: Sequence[Process], stage_map: StageMap | None = None, *, drop_incomplete: bool = False,
                  advance: Callable[[str], None] = lambda label: None) -> Ranked:
    """Each rank through the single-process pipeline, then the ranks side by side."""
    return side_by_side([analyse_rank(process, stage_map, drop_incomplete=drop_incomplete, advance=advance)[1]
                         for process in found], stage_map)


def analyse_rank(process: Process, stage_map: StageMap | None = None, *, drop_incomplete: bool = False,
                 advance: Callable[[str], None] = lambda label: None) -> tuple[Trace, RankRun]:
    """One rank's process through ddprof.pipeline, plus its communication per (step, stage)."""
    trace, attribution, summary = analyse_trace(process.trace, stage_map, drop_incomplete=drop_incomplete,
                                                advance=lambda label: advance(f"rank {process.rank}: {label}"))
    return trace, RankRun(process, attribution, summary, communication_ns(trace, attribution))


def side_by_side(runs: Sequence[RankRun], stage_map: StageMap | None = None) -> Ranked:
    """The ranks' steps matched by index: the critical path, the stragglers, the per-rank rows."""
    counts = [run.attribution.steps.height for run in runs]
    matched = min(counts)
    durations = np.stack([_durations(run.attribution)[:matched] for run in runs])  # [ranks, steps]
    slowest = np.argmax(durations, axis=0)  # ties: the lowest rank
    critical = _critical(runs, slowest)
    critical_summary = {**breakdown(critical, stage_map), "wall": wall_split(critical, None)}
    comm = np.stack([run.communication_ns[:matched] for run in runs])
    critical_comm = comm[slowest, np.arange(matched)].sum(axis=0)
    for row, ns in zip(critical_summary["stages"], critical_comm):
        row["comm_ms"] = ns / NS_PER_MS
    summary = {
        "sources": sorted({str(run.process.source) for run in runs}),
        "communication": ("GPU time of NCCL kernels" if critical.has_gpu_activity
                          else f"host time of {', '.join(COMMUNICATION)} ranges"),
        "matched_steps": matched,
        "step_counts": counts,
        "ranks": [_rank_row(run) for run in runs],
        "critical_path": critical_summary,
        "stragglers": _stragglers(runs, durations, slowest),
    }
    return Ranked(list(runs), slowest, critical, summary)


def _durations(attribution: Attribution) -> np.ndarray:
    steps = attribution.steps
    return (steps["end"] - steps["start"]).to_numpy()


def communication_ns(trace: Trace, attribution: Attribution) -> np.ndarray:
    """[steps, stages]: the collective's kernels' GPU time per launching stage (CUDA), else the
    host time of the communication ranges nested in each stage range (gloo on the CPU)."""
    if attribution.has_gpu_activity:
        pieces = (attribution.gpu_ops
                  .filter(pl.col("name").str.to_lowercase().str.contains(COLLECTIVE_KERNELS)
                          & pl.col("stage").is_in(list(STAGES)))
                  .select("step_id", "stage", ns=pl.col("end") - pl.col("start")))
    else:
        comm = (trace.flat_ranges.filter((pl.col("domain") == DOMAIN) & pl.col("name").is_in(list(COMMUNICATION)))
                .sort("pid", "tid", "start").select("pid", "tid", "start", "end"))
        stages = attribution.stage_ranges.select("pid", "tid", "stage", "step_id", stage_start="start",
                                                 stage_end="end")
        pieces = (comm.join_asof(stages, left_on="start", right_on="stage_start", by=["pid", "tid"],
                                 strategy="backward", check_sortedness=False)
                  .filter(pl.col("stage").is_not_null() & (pl.col("end") <= pl.col("stage_end")))
                  .select("step_id", "stage", ns=pl.col("end") - pl.col("start")))
    out = np.zeros((attribution.steps.height, len(STAGES)), np.int64)
    code = pieces["stage"].replace_strict({s: i for i, s in enumerate(STAGES)}, return_dtype=pl.Int64).to_numpy()
    np.add.at(out, (pieces["step_id"].to_numpy(), code), pieces["ns"].to_numpy())
    return out


def _critical(runs: Sequence[RankRun], slowest: np.ndarray) -> Attribution:
    """Each matched step as its slowest rank ran it: that rank's per-owner rows and step times (on
    its clock from its first step); tokens as rank 0 counted them (every rank commits the same)."""
    steps_index = np.arange(slowest.size)
    per_step = {column: np.stack([run.attribution.matrix(column)[:slowest.size] for run in runs])[slowest, steps_index]
                for column in PER_STEP_COLUMNS}
    frames = [run.attribution.steps.head(slowest.size).with_columns(
        start=pl.col("start") - run.attribution.steps["start"].min(),
        end=pl.col("end") - run.attribution.steps["start"].min()) for run in runs]
    stacked = pl.concat([frame.with_columns(rank_index=pl.lit(i)) for i, frame in enumerate(frames)])
    chosen = pl.DataFrame({"step_id": steps_index, "rank_index": slowest}).cast(pl.Int64)
    steps = (chosen.join(stacked.cast({"rank_index": pl.Int64}), on=["step_id", "rank_index"], how="left")
             .drop("rank_index", "tokens").sort("step_id")
             .with_columns(tokens=frames[0]["tokens"]).select(frames[0].columns))
    first = runs[0].attribution
    tokens = None if first.tokens is None else int(steps["tokens"].sum())
    return Attribution(
        first.source, steps, first.stage_ranges.clear(), first.gpu_ops.clear(),
        pl.DataFrame({"step_id": np.repeat(steps_index, len(OWNERS)),
                      "owner": np.tile(np.array(OWNERS), slowest.size),
                      **{column: matrix.ravel() for column, matrix in per_step.items()}}),
        tokens, {key: sum(run.attribution.dropped[key] for run in runs) for key in first.dropped},
        any(run.attribution.has_gpu_activity for run in runs), _graphs_of_all([run.attribution.graphs for run in runs]))


def _graphs_of_all(graphs: Sequence[GraphTrace]) -> GraphTrace:
    """The ranks' graph records together: their counts summed, one mode if they agree."""
    modes = sorted({g.mode for g in graphs})
    return GraphTrace("+".join(modes), sum(g.launches for g in graphs), sum(g.graph_records for g in graphs),
                      sum(g.node_ops for g in graphs))


def _rank_row(run: RankRun) -> dict:
    s = run.summary
    comm = run.communication_ns.sum(axis=0)
    return {"rank": run.process.rank, "pid": run.process.pid, "source": str(run.process.source),
            "steps": s["steps"], "tokens": s["tokens"], "tok_per_s": s["tok_per_s"], "bound_by": s["bound_by"],
            "step_ms": s["step_ms"], "comm_ms": float(comm.sum()) / NS_PER_MS,
            "stages": [{"stage": row["stage"], "cpu_ms": row["cpu_ms"], "crit_ms": row["crit_ms"],
                        "crit_share": row["crit_share"], "comm_ms": float(ns) / NS_PER_MS}
                       for row, ns in zip(s["stages"], comm)]}


def _stragglers(runs: Sequence[RankRun], durations: np.ndarray, slowest: np.ndarray) -> list[dict]:
    """Per rank: in how many matched steps it was the slowest, and by how much it trailed the
    step's fastest rank there (mean and total ms)."""
    behind = durations.max(axis=0) - durations.min(axis=0)
    rows = []
    for index, run in enumerate(runs):
        mine = slowest == index
        rows.append({"rank": run.process.rank, "slowest_steps": int(mine.sum()),
                     "share": float(mine.mean()) if mine.size else 0.0,
                     "behind_ms_mean": float(behind[mine].mean()) / NS_PER_MS if mine.any() else 0.0,
                     "behind_ms_total": float(behind[mine].sum()) / NS_PER_MS,
                     "step_ms_mean": float(durations[index].mean()) / NS_PER_MS if durations.shape[1] else 0.0})
    return rows
