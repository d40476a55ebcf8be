"""An Nsight Systems export as polars frames: NVTX ranges and marks, GPU ops and their launches.

Works for the nsys 2022.4 schema (CPU captures here) and the 2025.x one (H200 captures): columns
are read by name and absent tables (nsys creates them lazily) are empty frames. What this module
resolves so nothing downstream has to: registered strings (`textId`) vs inline `text`, NVTX domain
names (a domain id means something only within its process), `globalTid` -> pid/tid, the payload
union, and the GPU op -> launching runtime call join (same correlationId, same process).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from ddprof.errors import DdprofError
from ddprof.export_db import ExportDb, resolve_export

# NVTX_EVENTS.eventType values (ENUM_NSYS_EVENT_TYPE).
MARK, PUSH_POP_RANGE, START_END_RANGE, DOMAIN_CREATE = 34, 59, 60, 75
RANGE_TYPES = (PUSH_POP_RANGE, START_END_RANGE)

# CUPTI memcpy copyKind values (ENUM_CUDA_MEMCPY_OPER) that get a readable name.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
DTOH = 2

_ID_SPAN = 1 << 24  # globalTid packs pid and tid in 24-bit fields


@dataclass(frozen=True)
class Trace:
    """Everything ddprof reads from one export. Times are ns on the export's clock.

    ranges:     closed NVTX ranges: range_id, start, end, name, domain (null: default domain),
                pid, tid, depth (ranges of the same thread and domain open when it starts),
                parent (range_id of the innermost of those, null at depth 0), kind (push_pop|start_end)
    marks:      NVTX marks: time, name, domain, pid, tid, payload (integer payload or null),
                payload_float
    incomplete: ranges that cannot be placed on one thread's timeline: start, end, name, domain,
                pid, tid, problem ('unclosed': never ended before the trace did; 'cross-thread':
                ended on another thread)
    gpu_ops:    kernels, memcpys and memsets: start, end, kind, name, pid, correlation_id,
                copy_kind, launch_tid, launch_start, launch_api (launch_* null without a runtime call)
    runtime:    CUDA runtime calls: start, end, pid, tid, correlation_id, api (name without the
                `_v7000`/`_ptsz` suffixes)
    """

    source: Path
    ranges: pl.DataFrame
    marks: pl.DataFrame
    incomplete: pl.DataFrame
    gpu_ops: pl.DataFrame
    runtime: pl.DataFrame

    @property
    def has_gpu_activity(self) -> bool:
        return self.gpu_ops.height > 0


def load(path: Path) -> Trace:
    """Read a `.sqlite` export or a `.nsys-rep` report (exported with the local nsys if needed)."""
    sqlite_path = resolve_export(Path(path))
    with ExportDb(sqlite_path) as db:
        if "NVTX_EVENTS" not in db.tables:
            if "StringIds" not in db.tables:
                raise DdprofError(f"{sqlite_path}: SQLite file without NVTX_EVENTS or StringIds: "
                                  "not an Nsight Systems export")
            raise DdprofError(f"{sqlite_path}: export has no NVTX_EVENTS table: the capture recorded no "
                              "NVTX (profile with --trace=nvtx)")
        ranges, marks, incomplete = _nvtx_frames(db)
        runtime = _runtime_calls(db)
        gpu_ops = _gpu_ops(db, runtime)
    return Trace(sqlite_path, ranges, marks, incomplete, gpu_ops, runtime)


def _pid(column: str) -> pl.Expr:
    return (pl.col(column) // _ID_SPAN) % _ID_SPAN


def _tid(column: str) -> pl.Expr:
    return pl.col(column) % _ID_SPAN


def _nvtx_frames(db: ExportDb) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    table = "NVTX_EVENTS"
    has = db.columns(table)
    name = db.first_col(table, "e", ("text",))
    join = ""
    if "textId" in has and "StringIds" in db.tables:
        name = f"coalesce({name}, s.value)" if "text" in has else "s.value"
        join = "LEFT JOIN StringIds s ON s.id = e.textId"
    payload = db.first_col(table, "e", ("int64Value", "uint64Value", "int32Value", "uint32Value"))
    payload_float = db.first_col(table, "e", ("doubleValue", "floatValue"))
    kinds = ", ".join(str(k) for k in (MARK, *RANGE_TYPES, DOMAIN_CREATE))
    events = db.frame(
        f"SELECT e.start, e.end, e.eventType, {name}, {db.col(table, 'e', 'domainId')}, e.globalTid, "
        f"{db.col(table, 'e', 'endGlobalTid')}, {payload}, {payload_float} "
        f"FROM {table} e {join} WHERE e.eventType IN ({kinds})",
        {"start": pl.Int64, "end": pl.Int64, "event_type": pl.Int32, "name": pl.String,
         "domain_id": pl.Int64, "global_tid": pl.Int64, "end_global_tid": pl.Int64,
         "payload": pl.Int64, "payload_float": pl.Float64},
    ).with_columns(pid=_pid("global_tid"), tid=_tid("global_tid"), domain_id=pl.col("domain_id").fill_null(0))

    # A domain id names a domain only within the process that created it.
    domains = (events.filter(pl.col("event_type") == DOMAIN_CREATE)
               .select("pid", "domain_id", domain="name")
               .unique(["pid", "domain_id"], keep="first"))
    events = (events.filter(pl.col("event_type") != DOMAIN_CREATE)
              .join(domains, on=["pid", "domain_id"], how="left"))

    marks = (events.filter(pl.col("event_type") == MARK)
             .select(time="start", name="name", domain="domain", pid="pid", tid="tid",
                     payload="payload", payload_float="payload_float")
             .sort("time"))

    trace_end = _trace_end(db)
    ranges = events.filter(pl.col("event_type").is_in(RANGE_TYPES))
    unclosed = pl.col("end").is_null()
    if trace_end is not None:  # nsys closes still-open ranges at the end of the trace
        unclosed = unclosed | (pl.col("end") >= trace_end)
    cross_thread = pl.col("end_global_tid").is_not_null() & (pl.col("end_global_tid") != pl.col("global_tid"))
    ranges = ranges.with_columns(
        problem=pl.when(unclosed).then(pl.lit("unclosed"))
        .when(cross_thread).then(pl.lit("cross-thread"))
        .otherwise(pl.lit(None, dtype=pl.String)))
    incomplete = (ranges.filter(pl.col("problem").is_not_null())
                  .select("start", "end", "name", "domain", "pid", "tid", "problem").sort("start"))
    closed = (ranges.filter(pl.col("problem").is_null())
              .with_columns(kind=pl.when(pl.col("event_type") == PUSH_POP_RANGE)
                            .then(pl.lit("push_pop")).otherwise(pl.lit("start_end")))
              .sort(["pid", "tid", "domain_id", "start", "end"], descending=[False, False, False, False, True])
              .with_row_index("range_id"))
    closed = _with_nesting(closed).select(
        pl.col("range_id").cast(pl.Int64), "start", "end", "name", "domain", "pid", "tid", "depth",
        "parent", "kind")
    return closed, marks, incomplete


def _trace_end(db: ExportDb) -> int | None:
    """The trace's end on the event clock: where nsys ends ranges that were never closed."""
    if "duration" not in db.columns("ANALYSIS_DETAILS"):
        return None
    return db.scalar("SELECT max(duration) FROM ANALYSIS_DETAILS")


def _with_nesting(ranges: pl.DataFrame) -> pl.DataFrame:
    """Add depth and parent per (pid, tid, domain) with one sorted sweep over range boundaries.

    `ranges` must be sorted by (pid, tid, domain_id, start, end descending): that is preorder, so
    a range's parent is the last earlier range one level up. At equal times ends come before
    starts (touching ranges are siblings), except the end of a zero-length range, which comes
    after the starts (it sits inside a range that starts at the same instant).
    """
    n = ranges.height
    if n == 0:
        return ranges.with_columns(depth=pl.lit(0, pl.Int32), parent=pl.lit(None, pl.Int64))
    key = ranges.select("pid", "tid", "domain_id")
    group = np.cumsum(key.select(pl.any_horizontal(pl.all() != pl.all().shift(1)).fill_null(True))
                      .to_series().to_numpy())
    start = ranges["start"].to_numpy()
    end = ranges["end"].to_numpy()
    order_in_time = np.concatenate([np.ones(n, np.int8), np.where(end > start, 0, 2).astype(np.int8)])
    times = np.concatenate([start, end])
    preorder = np.concatenate([np.arange(n), np.arange(n)])
    groups = np.concatenate([group, group])
    events = np.lexsort((preorder, order_in_time, times, groups))
    is_start = events < n
    open_after = np.cumsum(np.where(is_start, 1, -1))
    depth = np.empty(n, np.int64)
    depth[events[is_start]] = open_after[is_start] - 1

    parent = np.full(n, -1, np.int64)
    for level in range(1, int(depth.max()) + 1):
        above = np.flatnonzero(depth == level - 1)
        here = np.flatnonzero(depth == level)
        parent[here] = above[np.searchsorted(above, here) - 1]
    return ranges.with_columns(depth=pl.Series(depth, dtype=pl.Int32),
                               parent=pl.Series(parent)).with_columns(
        parent=pl.when(pl.col("parent") >= 0).then(pl.col("parent")))


def _runtime_calls(db: ExportDb) -> pl.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    schema = {"start": pl.Int64, "end": pl.Int64, "global_tid": pl.Int64, "correlation_id": pl.Int64,
              "api": pl.String}
    if table not in db.tables:
        frame = pl.DataFrame(schema=schema)
    else:
        frame = db.frame(f"SELECT r.start, r.end, r.globalTid, r.correlationId, s.value FROM {table} r "
                         "LEFT JOIN StringIds s ON s.id = r.nameId", schema)
    return frame.select(
        "start", "end", pid=_pid("global_tid"), tid=_tid("global_tid"), correlation_id="correlation_id",
        api=pl.col("api").str.replace(r"(_ptsz|_ptds)?(_v\d+)?$", ""))


def _gpu_ops(db: ExportDb, runtime: pl.DataFrame) -> pl.DataFrame:
    schema = {"start": pl.Int64, "end": pl.Int64, "correlation_id": pl.Int64, "global_pid": pl.Int64,
              "name": pl.String, "copy_kind": pl.Int32}
    parts = []
    kernel = "CUPTI_ACTIVITY_KIND_KERNEL"
    if kernel in db.tables:
        names = [c for c in ("shortName", "demangledName") if c in db.columns(kernel)]
        joins = " ".join(f"LEFT JOIN StringIds n{i} ON n{i}.id = k.{c}" for i, c in enumerate(names))
        name = f"coalesce({', '.join(f'n{i}.value' for i in range(len(names)))}, NULL)" if names else "NULL"
        parts.append(db.frame(f"SELECT k.start, k.end, k.correlationId, k.globalPid, {name}, NULL "
                              f"FROM {kernel} k {joins}", schema).with_columns(kind=pl.lit("kernel")))
    memcpy = "CUPTI_ACTIVITY_KIND_MEMCPY"
    if memcpy in db.tables:
        frame = db.frame(f"SELECT m.start, m.end, m.correlationId, m.globalPid, NULL, "
                         f"{db.col(memcpy, 'm', 'copyKind')} FROM {memcpy} m", schema)
        label = pl.col("copy_kind").replace_strict(COPY_KINDS, default=None, return_dtype=pl.String)
        parts.append(frame.with_columns(kind=pl.lit("memcpy"),
                                        name=pl.concat_str(pl.lit("[memcpy "), label.fill_null("?"), pl.lit("]"))))
    memset = "CUPTI_ACTIVITY_KIND_MEMSET"
    if memset in db.tables:
        frame = db.frame(f"SELECT m.start, m.end, m.correlationId, m.globalPid, '[memset]', NULL "
                         f"FROM {memset} m", schema)
        parts.append(frame.with_columns(kind=pl.lit("memset")))
    ops = pl.concat(parts) if parts else pl.DataFrame(schema=schema).with_columns(kind=pl.lit(None, pl.String))
    launches = (runtime.select("pid", "correlation_id", launch_tid="tid", launch_start="start", launch_api="api")
                .unique(["pid", "correlation_id"], keep="first"))
    return (ops.with_columns(pid=_pid("global_pid"))
            .join(launches, on=["pid", "correlation_id"], how="left")
            .select("start", "end", "kind", "name", "pid", "correlation_id", "copy_kind",
                    "launch_tid", "launch_start", "launch_api")
            .sort("start"))
