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
_KEY_SPAN = 1 << 32  # correlation ids are 32-bit


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
        strings = _strings(db)
        ranges, marks, incomplete = _nvtx_frames(db, strings)
        runtime = _runtime_calls(db, strings)
        gpu_ops = _gpu_ops(db, runtime, strings)
    return Trace(sqlite_path, ranges, marks, incomplete, gpu_ops, runtime)


def _strings(db: ExportDb) -> pl.DataFrame:
    """StringIds as (string_id, value): names are read as ids and joined here, never as text rows."""
    schema = {"string_id": pl.Int64, "value": pl.String}
    if "StringIds" not in db.tables:
        return pl.DataFrame(schema=schema)
    return db.frame("SELECT id, value FROM StringIds", schema)


def _named(frame: pl.DataFrame, strings: pl.DataFrame, id_column: str, name: str) -> pl.DataFrame:
    """Replace the string-id column `id_column` by its text, as column `name`."""
    return (frame.join(strings.rename({"string_id": id_column, "value": name}), on=id_column, how="left")
            .drop(id_column))


def _thread_of(column: str) -> dict[str, str]:
    """SQL for pid and tid from a serialized globalTid/globalPid (short numbers print faster)."""
    return {"pid": f"((e.{column} >> 24) & {_ID_SPAN - 1})", "tid": f"(e.{column} & {_ID_SPAN - 1})"}


def _nvtx_frames(db: ExportDb, strings: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    table = "NVTX_EVENTS"
    has = db.columns(table)
    range_kinds = ", ".join(map(str, RANGE_TYPES))
    # Rare columns come by row id, and the row id only when one of them is there: inline
    # (unregistered) names, float payloads, ends on another thread.
    inline = _by_row(db, db.col(table, "e", "text"), f"{MARK}, {range_kinds}", pl.String)
    floats = _by_row(db, db.first_col(table, "e", ("doubleValue", "floatValue")), str(MARK), pl.Float64)
    ended_elsewhere = _by_row(db, db.col(table, "e", "endGlobalTid"), range_kinds, pl.Int64,
                              "e.endGlobalTid != e.globalTid")
    row = {"row": "e.rowid"} if inline.height or floats.height or ended_elsewhere.height else {}
    ids = {"text_id": db.col(table, "e", "textId"), "domain_id": db.col(table, "e", "domainId"),
           **_thread_of("globalTid")}
    nullable = {"end", "text_id", "domain_id", "payload"}
    ranges = db.int_frame(table, {**row, "start": "e.start", "end": db.col(table, "e", "end"),
                                  "event_type": "e.eventType", **ids},
                          where=f"e.eventType IN ({range_kinds})", nullable=nullable)
    marks = db.int_frame(table, {**row, "start": "e.start", **ids, "payload": db.first_col(
        table, "e", ("int64Value", "uint64Value", "int32Value", "uint32Value"))},
                         where=f"e.eventType = {MARK}", nullable=nullable)
    domains = _domains(db)
    ranges, marks = (_resolve_names(frame, strings, inline, domains) for frame in (ranges, marks))

    marks = (marks.join(floats.rename({"value": "payload_float"}), on="row", how="left") if row
             else marks.with_columns(payload_float=pl.lit(None, pl.Float64)))
    marks = marks.select(time="start", name="name", domain="domain", pid="pid", tid="tid", payload="payload",
                         payload_float="payload_float").sort("time")

    trace_end = _trace_end(db)
    unclosed = pl.col("end").is_null()
    if trace_end is not None:  # nsys closes still-open ranges at the end of the trace
        unclosed = unclosed | (pl.col("end") >= trace_end)
    cross_thread = pl.col("row").is_in(ended_elsewhere["row"].to_list()) if row else pl.lit(False)
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


def _by_row(db: ExportDb, value: str, kinds: str, dtype: pl.DataType, condition: str | None = None) -> pl.DataFrame:
    """(row, value) of the NVTX events of `kinds` where `value` (or `condition`) holds: rare rows."""
    if value == "NULL":
        return pl.DataFrame(schema={"row": pl.Int64, "value": dtype})
    return db.frame(f"SELECT e.rowid, {value} FROM NVTX_EVENTS e WHERE e.eventType IN ({kinds}) "
                    f"AND {condition or f'{value} IS NOT NULL'}", {"row": pl.Int64, "value": dtype})


def _domains(db: ExportDb) -> pl.DataFrame:
    """(pid, domain_id, domain) from the domain-create events: a domain id means something only
    within the process that created it."""
    table = "NVTX_EVENTS"
    name = db.col(table, "e", "text")
    join = ""
    if "textId" in db.columns(table) and "StringIds" in db.tables:
        name, join = f"coalesce({name}, s.value)", "LEFT JOIN StringIds s ON s.id = e.textId"
    thread = _thread_of("globalTid")
    return db.frame(f"SELECT {thread['pid']}, coalesce({db.col(table, 'e', 'domainId')}, 0), {name} "
                    f"FROM {table} e {join} WHERE e.eventType = {DOMAIN_CREATE}",
                    {"pid": pl.Int64, "domain_id": pl.Int64, "domain": pl.String}).unique(
        ["pid", "domain_id"], keep="first", maintain_order=True)


def _resolve_names(events: pl.DataFrame, strings: pl.DataFrame, inline: pl.DataFrame,
                   domains: pl.DataFrame) -> pl.DataFrame:
    """Event names (registered string or inline text) and domain names (per process)."""
    events = _named(events, strings, "text_id", "name").with_columns(pl.col("domain_id").fill_null(0))
    if "row" in events.columns and inline.height:
        events = (events.join(inline.rename({"value": "inline_name"}), on="row", how="left")
                  .with_columns(name=pl.coalesce("inline_name", "name")).drop("inline_name"))
    return events.join(domains, on=["pid", "domain_id"], how="left")


def _trace_end(db: ExportDb) -> int | None:
    """The trace's end on the event clock: where nsys ends ranges that were never closed.

    nsys 2022.4 writes event times relative to the trace start and the trace's length as
    ANALYSIS_DETAILS.duration; it is used only when every NVTX event lies within it (on another
    clock it would mark every range unclosed).
    """
    if "duration" not in db.columns("ANALYSIS_DETAILS"):
        return None
    duration = db.scalar("SELECT max(duration) FROM ANALYSIS_DETAILS")
    latest = db.scalar("SELECT max(start) FROM NVTX_EVENTS")
    return duration if duration is not None and latest is not None and latest <= duration else None


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


def _runtime_calls(db: ExportDb, strings: pl.DataFrame) -> pl.DataFrame:
    calls = db.int_frame("CUPTI_ACTIVITY_KIND_RUNTIME", {
        "start": "e.start", "end": "e.end", **_thread_of("globalTid"), "correlation_id": "e.correlationId",
        "name_id": "e.nameId"})
    apis = strings.select("string_id", value=pl.col("value").str.replace(r"(_ptsz|_ptds)?(_v\d+)?$", ""))
    return _named(calls, apis, "name_id", "api")


def _gpu_ops(db: ExportDb, runtime: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    common = {"start": "e.start", "end": "e.end", "correlation_id": "e.correlationId",
              "pid": _thread_of("globalPid")["pid"]}
    kernel, memcpy, memset = (f"CUPTI_ACTIVITY_KIND_{k}" for k in ("KERNEL", "MEMCPY", "MEMSET"))
    kernels = db.int_frame(kernel, {**common, "name_id": db.first_col(kernel, "e", ("shortName", "demangledName"))},
                           nullable={"name_id"})
    copies = db.int_frame(memcpy, {**common, "copy_kind": db.col(memcpy, "e", "copyKind")}, nullable={"copy_kind"})
    sets = db.int_frame(memset, common)
    label = pl.col("copy_kind").replace_strict(COPY_KINDS, default=None, return_dtype=pl.String).fill_null("?")
    no_copy_kind = pl.lit(None, pl.Int64)
    ops = pl.concat([
        _named(kernels, strings, "name_id", "name").with_columns(kind=pl.lit("kernel"), copy_kind=no_copy_kind),
        copies.with_columns(kind=pl.lit("memcpy"), name=pl.concat_str(pl.lit("[memcpy "), label, pl.lit("]"))),
        sets.with_columns(kind=pl.lit("memset"), name=pl.lit("[memset]"), copy_kind=no_copy_kind),
    ], how="diagonal")
    # One int64 key (pid, correlationId) joins twice as fast as two columns.
    key = pl.col("pid") * _KEY_SPAN + pl.col("correlation_id")
    launches = runtime.select(key.alias("key"), launch_tid="tid", launch_start="start", launch_api="api")
    joined = ops.with_columns(key.alias("key")).join(launches, on="key", how="left")
    if joined.height != ops.height:  # a correlationId on two runtime calls: keep the first
        joined = ops.with_columns(key.alias("key")).join(launches.unique("key", keep="first"), on="key", how="left")
    return (joined.select("start", "end", "kind", "name", "pid", "correlation_id", "copy_kind",
                          "launch_tid", "launch_start", "launch_api")
            .sort("start"))
