"""Hand-built Nsight Systems exports in the real schema, for tests with known answers (eager GPU ops
and CUDA graph replays recorded either way nsys records them: `graph_launch`).

The 2022.4 DDL below is copied from a real export made here (NVTX_EVENTS, StringIds,
ANALYSIS_DETAILS) and from the column lists of that version's exporter (the CUPTI tables). The
2025.3 variant reorders columns, adds the newer ones (binaryData, greenContextId, ...) and leaves
out some optional NVTX columns, so a loader that reads by position or needs every column fails.
Tables are created only when they get rows, as nsys does. Range and mark names are registered
strings (`textId`, as this project's engine writes them), inline text (the `text` column, as
`nvtxRangePushA` and `torch.cuda.nvtx` write them) or a mix of both, by the Export's `names`.

    export = Export()
    export.range("step", 0, 100)
    export.kernel(10, 40, launch=(5, 8))
    export.write(tmp_path / "run.sqlite")
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from engine.stages import DOMAIN, TOKENS_MARK

MARK, PUSH_POP, START_END, DOMAIN_CREATE, DOMAIN_DESTROY = 34, 59, 60, 75, 76
DTOH, HTOD = 2, 1
_VM = 1 << 48  # real globalTids carry a high "VM" bit above pid and tid

NVTX_COLUMNS = {
    "2022.4": ("start", "end", "eventType", "rangeId", "category", "color", "text", "globalTid", "endGlobalTid",
               "textId", "domainId", "uint64Value", "int64Value", "doubleValue", "uint32Value", "int32Value",
               "floatValue", "jsonTextId", "jsonText"),
    "2025.3": ("eventType", "start", "end", "textId", "text", "domainId", "globalTid", "endGlobalTid", "rangeId",
               "category", "color", "int64Value", "uint64Value", "int32Value", "uint32Value", "doubleValue",
               "binaryData"),
}
KERNEL_COLUMNS = {
    "2022.4": ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "demangledName",
               "shortName", "mangledName", "launchType", "cacheConfig", "registersPerThread", "gridX", "gridY",
               "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
               "localMemoryPerThread", "localMemoryTotal", "gridId", "sharedMemoryExecuted", "graphNodeId",
               "sharedMemoryLimitConfig"),
    "2025.3": ("globalPid", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "start", "end",
               "shortName", "demangledName", "mangledName", "launchType", "cacheConfig", "registersPerThread",
               "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory",
               "dynamicSharedMemory", "localMemoryPerThread", "localMemoryTotal", "gridId",
               "sharedMemoryExecuted", "graphNodeId", "sharedMemoryLimitConfig", "maxPotentialClusterSize",
               "maxActiveClusters"),
}
MEMCPY_COLUMNS = {
    "2022.4": ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "bytes",
               "copyKind", "deprecatedSrcId", "srcKind", "dstKind", "srcDeviceId", "srcContextId", "dstDeviceId",
               "dstContextId", "migrationCause", "graphNodeId", "virtualAddress"),
    "2025.3": ("globalPid", "correlationId", "start", "end", "deviceId", "contextId", "greenContextId", "streamId",
               "bytes", "copyKind", "srcKind", "dstKind", "srcDeviceId", "srcContextId", "dstDeviceId",
               "dstContextId", "migrationCause", "graphNodeId", "virtualAddress", "copyCount"),
}
MEMSET_COLUMNS = {
    "2022.4": ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "value", "bytes",
               "graphNodeId", "memKind"),
    "2025.3": ("globalPid", "correlationId", "start", "end", "deviceId", "contextId", "greenContextId", "streamId",
               "value", "bytes", "graphNodeId", "memKind"),
}
# nsys 2022.4's exporter has no graph-record table (its --cuda-graph-trace=graph records are not
# exported); the 2025.3 columns are those of the nsys SQLite schema reference.
GRAPH_TRACE_COLUMNS = {
    "2025.3": ("start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
               "graphId", "graphExecId"),
}
GRAPH_MODES = ("node", "graph")  # nsys --cuda-graph-trace
RUNTIME_COLUMNS = {
    "2022.4": ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId"),
    "2025.3": ("correlationId", "globalTid", "start", "end", "eventClass", "nameId", "returnValue", "callchainId"),
}
_COLUMN_TYPES = {"text": "TEXT", "jsonText": "TEXT", "binaryData": "BLOB", "doubleValue": "REAL", "floatValue": "REAL"}


def global_tid(pid: int, tid: int) -> int:
    return _VM | (pid << 24) | tid


def global_pid(pid: int) -> int:
    return _VM | (pid << 24)


def _create(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> None:
    spec = ", ".join(f"{c} {_COLUMN_TYPES.get(c, 'INTEGER')}" for c in columns)
    db.execute(f"CREATE TABLE {table} ({spec})")


NAME_ENCODINGS = ("registered", "inline", "mixed")


class Export:
    """Rows of one hand-built export; `write` turns them into an nsys-schema SQLite file.

    names: how NVTX range and mark names are written, one of NAME_ENCODINGS ("mixed": every other
    distinct name inline, as nsys writes when an application registers only some strings)."""

    def __init__(self, schema: str = "2022.4", names: str = "registered"):
        self.schema = schema
        self.names = names
        self._distinct_names: dict[str, int] = {}
        self.strings: dict[str, int] = {}
        self.nvtx: list[dict] = []
        self.tables: dict[str, list[dict]] = {}
        self.domain_ids: dict[tuple[int, str], int] = {}
        self.trace_end: int | None = None
        self._correlation = itertools.count(1)

    def string_id(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings) + 1)

    def _name(self, name: str, registered: bool | None) -> dict:
        """The NVTX columns that hold `name`: textId, or text (`registered` None: as `names` says)."""
        if registered is None:
            order = self._distinct_names.setdefault(name, len(self._distinct_names))
            registered = self.names == "registered" or (self.names == "mixed" and order % 2 == 0)
        return dict(textId=self.string_id(name)) if registered else dict(text=name)

    def declare_domain(self, name: str, pid: int = 1, tid: int = 1, at: int = 0) -> int:
        """Create `name` in process `pid` (the next free id there) and return its domainId."""
        key = (pid, name)
        if key not in self.domain_ids:
            self.domain_ids[key] = 1 + sum(1 for p, _ in self.domain_ids if p == pid)
            self.nvtx.append(dict(start=at, eventType=DOMAIN_CREATE, text=name, globalTid=global_tid(pid, tid),
                                  domainId=self.domain_ids[key]))
        return self.domain_ids[key]

    def _domain_id(self, domain: str | None, pid: int, tid: int, at: int) -> int:
        return 0 if domain is None else self.declare_domain(domain, pid, tid, min(at, 0))

    def range(self, name: str, start: int, end: int | None, *, domain: str | None = DOMAIN, pid: int = 1,
              tid: int = 1, start_end: bool = False, end_tid: int | None = None,
              registered: bool | None = None) -> None:
        """A push/pop range (or a start/end one, which may end on `end_tid`); end None: never closed."""
        row = dict(start=start, end=end, eventType=START_END if start_end else PUSH_POP,
                   globalTid=global_tid(pid, tid), domainId=self._domain_id(domain, pid, tid, start), color=255,
                   **self._name(name, registered))
        if end_tid is not None:
            row["endGlobalTid"] = global_tid(pid, end_tid)
        if start_end:
            row["rangeId"] = len(self.nvtx) + 1
        self.nvtx.append(row)

    def mark(self, name: str, time: int, payload: int | None = None, *, domain: str | None = DOMAIN,
             pid: int = 1, tid: int = 1, payload_column: str = "int64Value") -> None:
        row = dict(start=time, eventType=MARK, globalTid=global_tid(pid, tid),
                   domainId=self._domain_id(domain, pid, tid, time), **self._name(name, None))
        if payload is not None:
            row[payload_column] = payload
        self.nvtx.append(row)

    def runtime_call(self, api: str, start: int, end: int, *, pid: int = 1, tid: int = 1,
                     correlation: int | None = None) -> int:
        correlation = next(self._correlation) if correlation is None else correlation
        self.tables.setdefault("CUPTI_ACTIVITY_KIND_RUNTIME", []).append(dict(
            start=start, end=end, eventClass=1, globalTid=global_tid(pid, tid), correlationId=correlation,
            nameId=self.string_id(api), returnValue=0))
        return correlation

    def _gpu(self, table: str, start: int, end: int, launch, api: str, pid: int, tid: int,
             correlation: int | None = None, graph_node: int | None = None, **extra) -> int:
        """An op row; `launch` None: its launch is not in the trace, or (with `correlation`) it is
        a node of the graph launch of that correlation id (`graph_node` its graphNodeId)."""
        if launch is None:
            correlation = next(self._correlation) if correlation is None else correlation
        else:
            correlation = self.runtime_call(api, *launch, pid=pid, tid=tid, correlation=correlation)
        self.tables.setdefault(table, []).append(dict(
            start=start, end=end, deviceId=0, contextId=1, streamId=7, correlationId=correlation,
            globalPid=global_pid(pid), graphNodeId=graph_node, **extra))
        return correlation

    def kernel(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               name: str = "kernel", api: str = "cudaLaunchKernel_v7000", correlation: int | None = None,
               graph_node: int | None = None) -> int:
        name_id = self.string_id(name)
        return self._gpu("CUPTI_ACTIVITY_KIND_KERNEL", start, end, launch, api, pid, tid, correlation, graph_node,
                         shortName=name_id, demangledName=name_id, mangledName=name_id, gridX=1, gridY=1, gridZ=1,
                         blockX=128, blockY=1, blockZ=1)

    def memcpy(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               copy_kind: int = DTOH, api: str = "cudaMemcpyAsync_v3020", dst_kind: int = 0,
               correlation: int | None = None, graph_node: int | None = None) -> int:
        """dst_kind: ENUM_CUDA_MEM_KIND (0 pageable, 1 pinned, 2 device)."""
        return self._gpu("CUPTI_ACTIVITY_KIND_MEMCPY", start, end, launch, api, pid, tid, correlation, graph_node,
                         bytes=4096, copyKind=copy_kind, srcKind=2, dstKind=dst_kind)

    def memset(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               api: str = "cudaMemsetAsync_v3020", correlation: int | None = None,
               graph_node: int | None = None) -> int:
        return self._gpu("CUPTI_ACTIVITY_KIND_MEMSET", start, end, launch, api, pid, tid, correlation, graph_node,
                         value=0, bytes=4096, memKind=2)

    def graph_launch(self, launch: tuple[int, int], nodes: Sequence[tuple[int, int, str]], *, mode: str,
                     graph: int = 1, pid: int = 1, tid: int = 1, api: str = "cudaGraphLaunch_v10000") -> int:
        """One replay of CUDA graph `graph`, launched by a `cudaGraphLaunch` call over `launch`;
        `nodes` are its ops as (start, end, kind: kernel | memcpy | memset; a kernel node is named
        graph<graph>.node<index>, a memcpy node copies device to pageable host memory). As nsys
        writes them, by `mode` (GRAPH_MODES): `node`, each node its own row with the launch's
        correlationId and its graphNodeId (the same in every replay); `graph`, one
        CUPTI_ACTIVITY_KIND_GRAPH_TRACE row from the first node's start to the last one's end, with
        the launch's correlationId (the 2025.3 schema only)."""
        correlation = self.runtime_call(api, *launch, pid=pid, tid=tid)
        if mode == "graph":
            self.tables.setdefault("CUPTI_ACTIVITY_KIND_GRAPH_TRACE", []).append(dict(
                start=min(n[0] for n in nodes), end=max(n[1] for n in nodes), deviceId=0, contextId=1, streamId=7,
                correlationId=correlation, globalPid=global_pid(pid), graphId=graph, graphExecId=graph))
            return correlation
        write = {"kernel": self.kernel, "memcpy": self.memcpy, "memset": self.memset}
        for index, (start, end, kind) in enumerate(nodes):
            named = {"name": f"graph{graph}.node{index}"} if kind == "kernel" else {}
            write[kind](start, end, launch=None, pid=pid, tid=tid, correlation=correlation,
                        graph_node=graph * 1_000 + index, **named)
        return correlation

    def write(self, path: Path) -> Path:
        ends = [r.get("end") or r["start"] for r in self.nvtx] + [
            r["end"] for rows in self.tables.values() for r in rows]
        duration = self.trace_end if self.trace_end is not None else max(ends, default=0) + 1_000
        nvtx = self.nvtx + [dict(start=duration - 10, eventType=DOMAIN_DESTROY, globalTid=global_tid(pid, 1),
                                 domainId=domain_id) for (pid, _), domain_id in self.domain_ids.items()]
        tables = {"NVTX_EVENTS": nvtx, **self.tables}
        return write_tables(path, self.schema, self.strings, duration, {
            table: {c: [row.get(c) for row in rows] for c in {key for row in rows for key in row}}
            for table, rows in tables.items()})


COLUMNS = {"NVTX_EVENTS": NVTX_COLUMNS, "CUPTI_ACTIVITY_KIND_KERNEL": KERNEL_COLUMNS,
           "CUPTI_ACTIVITY_KIND_MEMCPY": MEMCPY_COLUMNS, "CUPTI_ACTIVITY_KIND_MEMSET": MEMSET_COLUMNS,
           "CUPTI_ACTIVITY_KIND_RUNTIME": RUNTIME_COLUMNS, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": GRAPH_TRACE_COLUMNS}


def write_tables(path: Path, schema: str, strings: dict[str, int], duration: int,
                 tables: dict[str, dict[str, list]]) -> Path:
    """Write an export from column lists (absent columns are NULL): the bulk path benchmarks use."""
    path = Path(path)
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in strings.items()])
    db.execute("CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
               "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL)")
    db.execute("INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (_VM, duration, 5_000, 5_000 + duration))
    for table, data in tables.items():
        if schema not in COLUMNS[table]:
            raise ValueError(f"the {schema} schema has no {table} table")
        columns = COLUMNS[table][schema]
        unknown = set(data) - set(columns)
        if any(any(v is not None for v in data[c]) for c in unknown):
            raise ValueError(f"{table} has no columns {sorted(unknown)} in the {schema} schema")
        _create(db, table, columns)
        rows = max((len(v) for v in data.values()), default=0)
        values = [data[c] if c in data else itertools.repeat(None, rows) for c in columns]
        db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                       zip(*values))
    db.commit()
    db.close()
    return path


def example(schema: str, names: str = "registered") -> Export:
    """A small, varied trace with known answers (see tests/ddprof/test_load.py), in either schema
    and any of NAME_ENCODINGS: two steps in process 7 with CCCL ranges, kernels running into the
    next stage, a memcpy, a memset, a synchronize, token marks; process 8 reuses process 7's domain
    ids the other way round."""
    export = Export(schema, names)
    export.declare_domain(DOMAIN, pid=7, tid=70)
    export.declare_domain("CCCL", pid=7, tid=70)
    export.declare_domain("CCCL", pid=8, tid=80)
    export.declare_domain(DOMAIN, pid=8, tid=80)
    export.range("prefill", 0, 900, pid=7, tid=70)
    for start in (1_000, 2_000):
        export.range("step", start, start + 800, pid=7, tid=70)
        for offset, name in enumerate(("draft", "tree_build", "verify", "accept", "kv_compact", "sampling")):
            export.range(name, start + 100 * offset, start + 100 * offset + 90, pid=7, tid=70)
        export.range("cub::DeviceScan", start + 210, start + 230, domain="CCCL", pid=7, tid=70)
        export.kernel(start + 20, start + 150, launch=(start + 5, start + 10), pid=7, tid=70, name="draft_gemm")
        export.memcpy(start + 305, start + 320, launch=(start + 300, start + 325), pid=7, tid=70,
                      api="cudaMemcpy_v3020")
        export.memset(start + 410, start + 415, launch=(start + 405, start + 406), pid=7, tid=70)
        export.runtime_call("cudaStreamSynchronize_v3020", start + 520, start + 560, pid=7, tid=70)
        export.mark(TOKENS_MARK, start + 800, 3 if start == 1_000 else 5, pid=7, tid=70)
    export.range("step", 1_000, 1_500, domain="CCCL", pid=8, tid=80)  # not a step: CCCL in process 8
    export.mark(TOKENS_MARK, 1_600, 7, pid=8, tid=80)
    return export


if __name__ == "__main__":  # regenerate the committed fixture: python -m tests.ddprof.exports
    target = Path(__file__).resolve().parents[1] / "data" / "ddtree_nsys2025_schema.sqlite"
    target.parent.mkdir(exist_ok=True)
    print(example("2025.3").write(target))


# Per-stage host ns of each rank's steps in `ranks_example`: rank r's step i stage s lasts STAGE_NS[s]
# plus SLOW_NS where (r, i) is in SLOW; verify holds a moe_all_reduce range of ALL_REDUCE_NS[r].
RANK_STAGE_NS = (100, 20, 300, 10, 10, 10)
RANK_SLOW = {(1, 0): 50, (1, 1): 70, (0, 2): 30}  # (rank, step) -> extra ns in verify
RANK_ALL_REDUCE_NS = (40, 60)
RANK_PIDS = (11, 10)  # rank 0's pid is the larger: ranks come from the rank marks, not pid order


def ranks_example(export: Export, rank: int, *, steps: int = 3, cuda: bool = False,
                  slow: dict[tuple[int, int], int] = RANK_SLOW) -> Export:
    """Rank `rank` of a 2-rank expert-parallel run in `export` (one process per rank; the same
    Export twice gives one report holding both), with known stage times, stragglers and
    communication (`slow`: extra verify ns by (rank, step)): on the CPU as nested moe_all_reduce ranges, with `cuda` as an NCCL kernel that
    verify launches (and a compute kernel that is not communication)."""
    from engine.stages import MOE_ALL_REDUCE, RANK_MARK, STAGES

    pid = RANK_PIDS[rank]
    tid = pid * 10
    export.declare_domain(DOMAIN, pid=pid, tid=tid)
    export.mark(RANK_MARK, 500, rank, pid=pid, tid=tid)
    start = 1_000 + 7 * rank  # the ranks' clocks disagree a little
    for step in range(steps):
        at = start
        for name, ns in zip(STAGES, RANK_STAGE_NS):
            ns += slow.get((rank, step), 0) if name == "verify" else 0
            export.range(name, at, at + ns, pid=pid, tid=tid)
            if name == "verify":
                if cuda:
                    export.kernel(at + 5, at + 5 + RANK_ALL_REDUCE_NS[rank], launch=(at + 1, at + 3), pid=pid,
                                  tid=tid, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
                    export.kernel(at + 100, at + 120, launch=(at + 50, at + 52), pid=pid, tid=tid, name="moe_gemm")
                else:
                    export.range(MOE_ALL_REDUCE, at + 5, at + 5 + RANK_ALL_REDUCE_NS[rank], pid=pid, tid=tid)
            at += ns
        export.range("step", start, at, pid=pid, tid=tid)
        export.mark(TOKENS_MARK, at + 1, 4, pid=pid, tid=tid)
        start = at + 200
    return export
