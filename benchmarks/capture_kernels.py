"""Which kernels make up a difference in GPU time between two captures of the same serving run.

`ddprof compare A B` says how much GPU time each stage gained or lost per decode step; this names
the kernels. Per stage: each kernel's launches and GPU ms per step in A and B, every kernel in the
result file, largest differences first (`--top` of them printed). A kernel belongs to the stage
ddprof.attribution gives it: the innermost stage range its launch lies in, a graph node's launch
being its cudaGraphLaunch. Kernels only: `ddprof compare`'s GPU time also holds a stage's copies
and memsets. For every prefill range the capture holds (a `benchmarks/gpu_verify.sh` part 5
capture serves once: all of its prefills): host ms, the part inside CUDA runtime calls, the
kernels' GPU ms and the runtime calls by API, per prefill: the host side of an eager prefill; and
the first prefill's host ms apart from the others' median (a cold process's JIT compiles land there). The
numbers are the captures' own; under nsys each CUDA call costs more than without it.

    python benchmarks/capture_kernels.py A.sqlite B.sqlite [--by-grid] [--top 12] [--out benchmarks/results/capture_kernels.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, source_commit, write_result  # noqa: E402
from ddprof.attribution import Attribution, attribute  # noqa: E402
from ddprof.errors import DdprofError  # noqa: E402
from ddprof.export_db import ExportDb, resolve_export  # noqa: E402
from ddprof.load import Trace, load  # noqa: E402
from engine.stages import DOMAIN, PREFILL, STAGES  # noqa: E402

_NS_PER_MS = 1e6


def with_grids(trace: Trace, ops: pl.DataFrame) -> pl.DataFrame:
    """ops with each kernel's name followed by its launch grid, "name [x,y,z]": one Triton kernel
    serves every GEMM shape, and its grid tells them apart. Read from the export's kernel table,
    whose start and correlation id name an op."""
    with ExportDb(resolve_export(trace.source)) as db:
        grids = db.table_frame("CUPTI_ACTIVITY_KIND_KERNEL", {"start": "start", "correlation_id": "correlationId",
                                                               "x": "gridX", "y": "gridY", "z": "gridZ"}).result()
    if grids.select("start", "correlation_id").is_duplicated().any():
        raise DdprofError(f"{trace.source}: two kernels share a start and a correlation id, so their grids "
                          "cannot be told apart: run without --by-grid")
    named = ops.join(grids, on=["start", "correlation_id"], how="left")
    if named["x"].null_count():
        raise DdprofError(f"{trace.source}: {named['x'].null_count()} kernels have no row in the export's kernel "
                          "table to read a grid from: run without --by-grid")
    return named.with_columns(name=pl.format("{} [{},{},{}]", "name", "x", "y", "z")).drop("x", "y", "z")


def stage_kernels(trace: Trace, attribution: Attribution, by_grid: bool = False) -> pl.DataFrame:
    """Per stage and kernel name, or name and grid: launches and GPU ns over all decode steps."""
    kernels = attribution.gpu_ops.filter((pl.col("kind") == "kernel") & pl.col("step_id").is_not_null()
                                         & pl.col("stage").is_in(STAGES))
    kernels = with_grids(trace, kernels) if by_grid else kernels
    return kernels.group_by("stage", "name").agg(count=pl.len(), ns=(pl.col("end") - pl.col("start")).sum())


def prefills(trace: Trace) -> pl.DataFrame:
    """The engine's prefill ranges."""
    return trace.flat_ranges.filter((pl.col("name") == PREFILL) & (pl.col("domain") == DOMAIN))


def inside(ranges: pl.DataFrame, events: pl.DataFrame, at: str, thread: str) -> pl.DataFrame:
    """The events whose time `at` on thread `thread` (same process) falls inside one of `ranges`,
    [start, end) as everywhere in ddprof. Ranges that overlap on a thread are refused (nesting
    would need ddprof.intervals' innermost cover; prefills never nest)."""
    spans = ranges.select("pid", "tid", span_start="start", span_end="end").sort("pid", "tid", "span_start")
    overlapping = spans.filter((pl.col("span_start") < pl.col("span_end").shift(1).over("pid", "tid")))
    if overlapping.height:
        raise DdprofError(f"{overlapping.height} ranges overlap others on their thread: events cannot be "
                          "placed in one of them")
    placed = events.filter(pl.col(at).is_not_null()).sort("pid", thread, at).join_asof(
        spans, left_on=at, right_on="span_start", by_left=["pid", thread], by_right=["pid", "tid"],
        strategy="backward", check_sortedness=False)  # both sorted by (process, thread, time) above
    return placed.filter(pl.col(at) < pl.col("span_end"))


def prefill_side(trace: Trace, ranges: pl.DataFrame) -> dict:
    """Per prefill: host ms, GPU ms of the kernels it launched, and its runtime calls by API."""
    count = max(ranges.height, 1)
    kernels = inside(ranges, trace.gpu_ops.filter(pl.col("kind") == "kernel"), "launch_start", "launch_tid")
    calls = inside(ranges, trace.runtime, "start", "tid")
    by_api = (calls.group_by("api").agg(count=pl.len(), ns=(pl.col("end") - pl.col("start")).sum())
              .sort("ns", descending=True))
    host_ms = ((ranges.sort("start")["end"] - ranges.sort("start")["start"]) / _NS_PER_MS).to_list()
    return {"prefills": ranges.height,
            "host_ms_per_prefill": sum(host_ms) / count,
            # A cold process's first prefill holds what the warm-up never compiled (README
            # "Batch-invariant numerics"): apart from the others.
            "first_host_ms": host_ms[0] if host_ms else None,
            "others_median_host_ms": statistics.median(host_ms[1:]) if len(host_ms) > 1 else None,
            "in_calls_ms_per_prefill": float((calls["end"] - calls["start"]).sum()) / count / _NS_PER_MS,
            "kernel_gpu_ms_per_prefill": float((kernels["end"] - kernels["start"]).sum()) / count / _NS_PER_MS,
            "kernels_per_prefill": kernels.height / count,
            "runtime_calls": [{"api": row["api"], "per_prefill": row["count"] / count,
                               "ms_per_prefill": row["ns"] / count / _NS_PER_MS} for row in by_api.iter_rows(named=True)]}


def side_by_side(a: tuple[int, pl.DataFrame], b: tuple[int, pl.DataFrame]) -> pl.DataFrame:
    """a, b: (decode steps, stage_kernels' table)."""
    """Per stage and kernel: launches and GPU ms per step in A and B, and B - A."""
    def per_step(side: tuple[int, pl.DataFrame], tag: str) -> pl.DataFrame:
        steps, table = side
        return table.select("stage", "name", (pl.col("count") / steps).alias(f"{tag}_per_step"),
                            (pl.col("ns") / steps / _NS_PER_MS).alias(f"{tag}_ms_per_step"))

    joined = per_step(a, "a").join(per_step(b, "b"), on=["stage", "name"], how="full", coalesce=True).fill_null(0.0)
    return joined.with_columns(delta_ms_per_step=pl.col("b_ms_per_step") - pl.col("a_ms_per_step"))


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="the baseline capture (.sqlite export)")
    parser.add_argument("b", type=Path, help="the capture compared with it")
    parser.add_argument("--top", type=at_least_one, default=12, help="kernels printed per stage, largest |difference| first")
    parser.add_argument("--by-grid", action="store_true", help="tell a kernel's launches apart by their grid")
    parser.add_argument("--out", type=Path, default=RESULTS / "capture_kernels.json")
    args = parser.parse_args()
    try:
        traces = [load(path) for path in (args.a, args.b)]
        attributions = [attribute(trace) for trace in traces]
        kernels = [(attribution.steps.height, stage_kernels(trace, attribution, args.by_grid))
                   for trace, attribution in zip(traces, attributions)]
        sides = [prefill_side(trace, prefills(trace)) for trace in traces]
    except DdprofError as error:
        print(f"benchmarks/capture_kernels.py: {error}", file=sys.stderr)
        sys.exit(2)
    table = side_by_side(*kernels)
    stages = {}
    for stage in STAGES:
        rows = table.filter(pl.col("stage") == stage).sort(pl.col("delta_ms_per_step").abs(), "name",
                                                           descending=[True, False])  # ties by name: the same file each run
        if rows.height == 0:
            continue
        stages[stage] = {"a_ms_per_step": rows["a_ms_per_step"].sum(), "b_ms_per_step": rows["b_ms_per_step"].sum(),
                         "kernels": rows.drop("stage").to_dicts()}
        print(f"{stage}: GPU ms per step {stages[stage]['a_ms_per_step']:.3f} -> {stages[stage]['b_ms_per_step']:.3f}"
              f" ({rows.height} kernels, the {min(args.top, rows.height)} that moved most:)")
        for row in stages[stage]["kernels"][:args.top]:
            print(f"  {row['name'][:56]:56} {row['a_per_step']:7.2f} {row['b_per_step']:7.2f} launches/step "
                  f"{row['a_ms_per_step']:8.3f} {row['b_ms_per_step']:8.3f} ms/step ({row['delta_ms_per_step']:+.3f})")
    for tag, side in zip("ab", sides):
        first = f", the first {side['first_host_ms']:.1f}" if side["first_host_ms"] is not None else ""
        print(f"prefills, {tag}: {side['prefills']}{first}, host {side['host_ms_per_prefill']:.2f} ms "
              f"({side['in_calls_ms_per_prefill']:.2f} in CUDA calls) and kernels "
              f"{side['kernel_gpu_ms_per_prefill']:.2f} GPU ms each, {side['kernels_per_prefill']:.0f} kernels; "
              "calls: " + ", ".join(f"{c['api']} {c['per_prefill']:.0f} ({c['ms_per_prefill']:.2f} ms)"
                                   for c in side["runtime_calls"][:4]))
    write_result(args.out, {"benchmark": "capture_kernels", "analysed_at_commit": source_commit(), "by_grid": args.by_grid,
                            "command": sys.argv[1:],
                            "a": {"source": str(args.a), "steps": kernels[0][0], "prefill": sides[0]},
                            "b": {"source": str(args.b), "steps": kernels[1][0], "prefill": sides[1]},
                            "stages": stages})


if __name__ == "__main__":
    main()
