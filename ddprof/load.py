"""An Nsight Systems export as polars frames: NVTX ranges and marks, GPU ops and their launches.

Works for the nsys 2022.4 schema (CPU captures here) and the 2025.x one (H200 captures): columns
are read by name and absent tables (nsys creates them lazily) are empty frames. What this module
resolves so nothing downstream has to: registered strings (`textId`) vs inline `text`, NVTX domain
names (a domain id means something only within its process), `globalTid` -> pid/tid, the payload
union, and the GPU op -> launching runtime call join (same correlationId, same process).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import polars as pl

from ddprof import validate
from ddprof.errors import DdprofError
from ddprof.export_db import ExportDb, resolve_export

# NVTX_EVENTS.eventType values (ENUM_NSYS_EVENT_TYPE).
MARK, PUSH_POP_RANGE, START_END_RANGE, DOMAIN_CREATE = 34, 59, 60, 75
RANGE_TYPES = (PUSH_POP_RANGE, START_END_RANGE)

GRAPH = "graph"  # gpu_ops.kind of a whole-graph record

# CUPTI memcpy copyKind values (ENUM_CUDA_MEMCPY_OPER) that get a readable name.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 9: "HtoH", 10: "PtoP"}
DTOH = 2
PAGEABLE = 0  # a memcpy's dstKind / srcKind (ENUM_CUDA_MEM_KIND): pageable host memory

_ID_SPAN = 1 << 24  # globalTid packs pid and tid in 24-bit fields
_KEY_SPAN = 1 << 32  # correlation ids are 32-bit
_INT_PAYLOADS = ("int64Value", "uint64Value", "int32Value", "uint32Value")  # NVTX's payload union, by type
_FLOAT_PAYLOADS = ("doubleValue", "floatValue")


@dataclass(frozen=True)
class Trace:
    """Everything ddprof reads from one export. Times are ns on the export's clock.

    ranges:     closed NVTX ranges: range_id, start, end, name, domain (null: default domain),
                pid, tid, depth (ranges of the same thread and domain open when it starts),
                parent (range_id of the innermost of those, null at depth 0), kind (push_pop|start_end)
    flat_ranges: the same ranges in no set order, with domain_id (the domain's id within its
                process) in place of range_id, depth and parent: all the attribution needs, without
                the sort and sweep that nesting costs (`ranges` is computed from it on first use)
    marks:      NVTX marks: time, name, domain, pid, tid, payload (integer payload or null),
                payload_float
    incomplete: ranges that cannot be placed on one thread's timeline: start, end, name, domain,
                pid, tid, problem ('unclosed': never ended before the trace did; 'cross-thread':
                ended on another thread)
    gpu_ops:    kernels, memcpys and memsets, and whole CUDA graph replays (kind `graph`, nsys's
                CUPTI_ACTIVITY_KIND_GRAPH_TRACE, written with --cuda-graph-trace=graph): start, end,
                kind, name, pid, correlation_id, copy_kind, to_pageable (a memcpy into pageable host
                memory; null for other ops), graph_node_id (the node of a graph replay that ran this
                op, --cuda-graph-trace=node; null for eager ops and graph records), graph_id (a graph
                record's graph; null for other ops), launch_tid, launch_start, launch_api (launch_*
                null without a runtime call; a graph's nodes and record share its cudaGraphLaunch)
    runtime:    CUDA runtime calls: start, end, pid, tid, correlation_id, api (name without the
                `_v7000`/`_ptsz` suffixes)
    """

    source: Path
    flat_ranges: pl.DataFrame
    marks: pl.DataFrame
    incomplete: pl.DataFrame
    gpu_ops: pl.DataFrame
    runtime: pl.DataFrame

    @cached_property
    def ranges(self) -> pl.DataFrame:
        preorder = (self.flat_ranges.sort(["pid", "tid", "domain_id", "start", "end"],
                                          descending=[False, False, False, False, True])
                    .with_row_index("range_id"))
        return _with_nesting(preorder).select(
            pl.col("range_id").cast(pl.Int64), "start", "end", "name", "domain", "pid", "tid", "depth",
            "parent", "kind")

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
        # The big tables are read on background threads while this one runs the small queries; the
        # GPU side (the smaller reads) is built while NVTX_EVENTS is still being read.
        events, calls, ops = _read_nvtx_events(db), _read_runtime_calls(db), _read_gpu_ops(db)
        strings = _strings(db)
        duration = _trace_duration(db)
        runtime = _runtime_calls(calls.result(), strings)
        gpu_ops = _gpu_ops(*(op.result() for op in ops), runtime, strings)
        events = _nvtx_events(events.result())
        validate.nvtx_threads(sqlite_path, events, (MARK, *RANGE_TYPES, DOMAIN_CREATE))
        ranges, marks, incomplete = _nvtx_frames(events, strings, duration)
    validate.trace_values(sqlite_path, ranges, incomplete, marks, gpu_ops, runtime)
    return Trace(sqlite_path, ranges, marks, incomplete, gpu_ops, runtime)


def _strings(db: ExportDb) -> pl.DataFrame:
    """StringIds as (string_id, value): names are read as ids and joined here, never as text rows."""
    schema = {"string_id": pl.Int64, "value": pl.String}
    if "StringIds" not in db.tables:
        return pl.DataFrame(schema=schema)
    return validate.string_ids(db.path, db.frame("SELECT id, value FROM StringIds", schema))


def _text_of(id_column: str, strings: pl.DataFrame) -> pl.Expr:
    """The text of the string ids in `id_column` (null where absent): a lookup that makes one
    column, where a join would copy every other column of a million-row frame."""
    return pl.col(id_column).replace_strict(strings["string_id"], strings["value"], default=None,
                                            return_dtype=pl.String)


def _thread_of(column: str) -> list[pl.Expr]:
    """pid and tid from a serialized globalTid/globalPid column (split here, not in SQL: cheaper)."""
    return [(pl.col(column) // _ID_SPAN % _ID_SPAN).alias("pid"), (pl.col(column) % _ID_SPAN).alias("tid")]


def _read_nvtx_events(db: ExportDb) -> Future[pl.DataFrame]:
    """Every NVTX event in one pass (ranges, marks and domain creations alike): the integer columns,
    the inline name (`text`, where the application registered no string) and the float payloads."""
    payloads = {f"payload_{i}": column for i, column in enumerate(_INT_PAYLOADS)}
    floats = {f"float_{i}": column for i, column in enumerate(_FLOAT_PAYLOADS)}
    return db.table_frame("NVTX_EVENTS", {
        "start": "start", "end": "end", "event_type": "eventType", "text_id": "textId", "text": "text",
        "domain_id": "domainId", "global_tid": "globalTid", "end_global_tid": "endGlobalTid", **payloads, **floats},
        nullable={"end", "text_id", "domain_id", "global_tid", "end_global_tid", *payloads}, real=set(floats),
        text={"text"})


def _nvtx_events(raw: pl.DataFrame) -> pl.DataFrame:
    """One row per event: `payload` the first integer payload present, `payload_float` the first
    float one, `ended_elsewhere` for a range that ends on another thread."""
    return raw.select(
        "start", "end", "event_type", "text_id", "text", "domain_id", "global_tid",
        payload=pl.coalesce(f"payload_{i}" for i in range(len(_INT_PAYLOADS))),
        payload_float=pl.coalesce(f"float_{i}" for i in range(len(_FLOAT_PAYLOADS))),
        ended_elsewhere=(pl.col("end_global_tid") != pl.col("global_tid")).fill_null(False))


def _trace_duration(db: ExportDb) -> int | None:
    """ANALYSIS_DETAILS.duration: nsys 2022.4 writes event times relative to the trace start and
    the trace's length there."""
    if "duration" not in db.columns("ANALYSIS_DETAILS"):
        return None
    return db.frame("SELECT max(duration) FROM ANALYSIS_DETAILS", {"duration": pl.Int64}).item()


def _nvtx_frames(events: pl.DataFrame, strings: pl.DataFrame,
                 duration: int | None) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Closed ranges (flat), marks and incomplete ranges, with names, domains, pid and tid."""
    # nsys ends ranges still open at the trace's end there; trusted only when every NVTX event lies
    # within it (on another clock it would mark every range unclosed).
    latest = events["start"].max()
    trace_end = duration if duration is not None and latest is not None and latest <= duration else None

    def resolved(kinds: tuple[int, ...]) -> pl.LazyFrame:
        """Events of `kinds` in scan order with pid, tid, name (inline text, else the registered
        string) and domain_id (0: the default domain)."""
        return (events.lazy().filter(pl.col("event_type").is_in(kinds))
                .with_columns(*_thread_of("global_tid"), pl.col("domain_id").fill_null(0),
                              name=pl.coalesce("text", _text_of("text_id", strings))))

    # A domain id means something only within the process that created it; the first creation counts.
    domains = (resolved((DOMAIN_CREATE,)).select(_domain_key(), "name")
               .unique("key", keep="first", maintain_order=True).collect())
    named = resolved((MARK, *RANGE_TYPES)).with_columns(
        domain=_domain_key().replace_strict(domains["key"], domains["name"], default=None, return_dtype=pl.String))
    marks = (named.filter(pl.col("event_type") == MARK)
             .select(time="start", name="name", domain="domain", pid="pid", tid="tid", payload="payload",
                     payload_float="payload_float").sort("time"))
    unclosed = pl.col("end").is_null()
    if trace_end is not None:
        unclosed = unclosed | (pl.col("end") >= trace_end)
    ranges = named.filter(pl.col("event_type") != MARK).with_columns(
        problem=pl.when(unclosed).then(pl.lit("unclosed"))
        .when(pl.col("ended_elsewhere")).then(pl.lit("cross-thread"))
        .otherwise(pl.lit(None, dtype=pl.String)))
    incomplete = (ranges.filter(pl.col("problem").is_not_null())
                  .select("start", "end", "name", "domain", "pid", "tid", "problem").sort("start"))
    closed = (ranges.filter(pl.col("problem").is_null())
              .select("start", "end", "name", "domain", "domain_id", "pid", "tid",
                      kind=pl.when(pl.col("event_type") == PUSH_POP_RANGE)
                      .then(pl.lit("push_pop")).otherwise(pl.lit("start_end"))))
    closed, marks, incomplete = pl.collect_all([closed, marks, incomplete])
    return closed, marks, incomplete


def _domain_key() -> pl.Expr:
    """(pid, domain_id) as one int64 (domain ids are 32-bit), named `key`."""
    return (pl.col("pid") * _KEY_SPAN + pl.col("domain_id")).alias("key")


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


def _read_runtime_calls(db: ExportDb) -> Future[pl.DataFrame]:
    return db.table_frame("CUPTI_ACTIVITY_KIND_RUNTIME", {
        "start": "start", "end": "end", "global_tid": "globalTid", "correlation_id": "correlationId",
        "name_id": "nameId"})


def _runtime_calls(calls: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    apis = strings.select("string_id", value=pl.col("value").str.replace(r"(_ptsz|_ptds)?(_v\d+)?$", ""))
    return calls.select("start", "end", *_thread_of("global_tid"), "correlation_id", api=_text_of("name_id", apis))


def _read_gpu_ops(db: ExportDb) -> tuple[Future[pl.DataFrame], ...]:
    """Kernels, memcpys, memsets and graph records: each with start, end, correlation_id, global_pid
    and its own columns (a kernel's name: its short name, else its demangled one; a node's
    graphNodeId, in both schemas; a graph record's graphId)."""
    common = {"start": "start", "end": "end", "correlation_id": "correlationId", "global_pid": "globalPid"}
    node = {**common, "graph_node_id": "graphNodeId"}
    kernel, memcpy, memset, graph = (f"CUPTI_ACTIVITY_KIND_{k}" for k in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE"))
    return (db.table_frame(kernel, {**node, "short_name": "shortName", "demangled_name": "demangledName"},
                           nullable={"short_name", "demangled_name", "graph_node_id"}),
            db.table_frame(memcpy, {**node, "copy_kind": "copyKind", "dst_kind": "dstKind"},
                           nullable={"copy_kind", "dst_kind", "graph_node_id"}),
            db.table_frame(memset, node, nullable={"graph_node_id"}),
            db.table_frame(graph, {**common, "graph_id": "graphId"}))


def _gpu_ops(kernels: pl.DataFrame, copies: pl.DataFrame, sets: pl.DataFrame, graphs: pl.DataFrame,
             runtime: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    label = pl.col("copy_kind").replace_strict(COPY_KINDS, default=None, return_dtype=pl.String).fill_null("?")
    no_copy_kind = pl.lit(None, pl.Int64)
    ops = pl.concat([
        kernels.with_columns(name_id=pl.coalesce("short_name", "demangled_name"))
        .select(pl.exclude("short_name", "demangled_name", "name_id"), name=_text_of("name_id", strings),
                kind=pl.lit("kernel"), copy_kind=no_copy_kind),
        copies.with_columns(kind=pl.lit("memcpy"), name=pl.concat_str(pl.lit("[memcpy "), label, pl.lit("]")),
                            to_pageable=pl.col("dst_kind") == PAGEABLE).drop("dst_kind"),
        sets.with_columns(kind=pl.lit("memset"), name=pl.lit("[memset]"), copy_kind=no_copy_kind),
        graphs.with_columns(kind=pl.lit(GRAPH), name=pl.format("[graph {}]", "graph_id"), copy_kind=no_copy_kind),
    ], how="diagonal").with_columns(_thread_of("global_pid")[0])
    # One int64 key (pid, correlationId) joins twice as fast as two columns.
    key = pl.col("pid") * _KEY_SPAN + pl.col("correlation_id")
    ops = _flag_sorted(ops.with_columns(key.alias("key")), "key")
    launches = _flag_sorted(runtime.select(key.alias("key"), launch_tid="tid", launch_start="start",
                                           launch_api="api"), "key")
    joined = ops.join(launches, on="key", how="left")
    if joined.height != ops.height:  # a correlationId on two runtime calls: keep the first
        joined = ops.join(launches.unique("key", keep="first", maintain_order=True), on="key", how="left")
    joined = joined.select("start", "end", "kind", "name", "pid", "correlation_id", "copy_kind", "to_pageable",
                           "graph_node_id", "graph_id", "launch_tid", "launch_start", "launch_api")
    return joined if joined["start"].is_sorted() else joined.sort("start")


def _flag_sorted(frame: pl.DataFrame, column: str) -> pl.DataFrame:
    """Mark `column` sorted when it is (checked, in one pass): a single-process capture lists its
    runtime calls and often its GPU ops in correlation order, and polars joins two sorted keys by
    merging them, several times faster than by hashing."""
    return frame.with_columns(pl.col(column).set_sorted()) if frame[column].is_sorted() else frame
