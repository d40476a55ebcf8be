"""Hand-built Nsight Systems exports in the real schema, for tests with known answers.

The 2022.4 DDL below is copied from a real export made here (NVTX_EVENTS, StringIds,
ANALYSIS_DETAILS) and from the column lists of that version's exporter (the CUPTI tables). The
2025.3 variant reorders columns, adds the newer ones (binaryData, greenContextId, ...) and leaves
out some optional NVTX columns, so a loader that reads by position or needs every column fails.
Tables are created only when they get rows, as nsys does.

    export = Export()
    export.range("step", 0, 100)
    export.kernel(10, 40, launch=(5, 8))
    export.write(tmp_path / "run.sqlite")
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path

from engine.stages import DOMAIN

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
RUNTIME_COLUMNS = {
    "2022.4": ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue", "callchainId"),
    "2025.3": ("correlationId", "globalTid", "start", "end", "eventClass", "nameId", "returnValue", "callchainId"),
}
_TEXT_COLUMNS = {"text", "jsonText", "binaryData"}


def global_tid(pid: int, tid: int) -> int:
    return _VM | (pid << 24) | tid


def global_pid(pid: int) -> int:
    return _VM | (pid << 24)


def _create(db: sqlite3.Connection, table: str, columns: tuple[str, ...]) -> None:
    spec = ", ".join(f"{c} {'TEXT' if c in _TEXT_COLUMNS else 'INTEGER'}" for c in columns)
    db.execute(f"CREATE TABLE {table} ({spec})")


class Export:
    """Rows of one hand-built export; `write` turns them into an nsys-schema SQLite file."""

    def __init__(self, schema: str = "2022.4"):
        self.schema = schema
        self.strings: dict[str, int] = {}
        self.nvtx: list[dict] = []
        self.tables: dict[str, list[dict]] = {}
        self.domain_ids: dict[tuple[int, str], int] = {}
        self.trace_end: int | None = None
        self._correlation = itertools.count(1)

    def string_id(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings) + 1)

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
              tid: int = 1, start_end: bool = False, end_tid: int | None = None, registered: bool = True) -> None:
        """A push/pop range (or a start/end one, which may end on `end_tid`); end None: never closed."""
        row = dict(start=start, end=end, eventType=START_END if start_end else PUSH_POP,
                   globalTid=global_tid(pid, tid), domainId=self._domain_id(domain, pid, tid, start), color=255)
        row.update(textId=self.string_id(name)) if registered else row.update(text=name)
        if end_tid is not None:
            row["endGlobalTid"] = global_tid(pid, end_tid)
        if start_end:
            row["rangeId"] = len(self.nvtx) + 1
        self.nvtx.append(row)

    def mark(self, name: str, time: int, payload: int | None = None, *, domain: str | None = DOMAIN,
             pid: int = 1, tid: int = 1, payload_column: str = "int64Value") -> None:
        row = dict(start=time, eventType=MARK, textId=self.string_id(name), globalTid=global_tid(pid, tid),
                   domainId=self._domain_id(domain, pid, tid, time))
        if payload is not None:
            row[payload_column] = payload
        self.nvtx.append(row)

    def runtime_call(self, api: str, start: int, end: int, *, pid: int = 1, tid: int = 1) -> int:
        correlation = next(self._correlation)
        self.tables.setdefault("CUPTI_ACTIVITY_KIND_RUNTIME", []).append(dict(
            start=start, end=end, eventClass=1, globalTid=global_tid(pid, tid), correlationId=correlation,
            nameId=self.string_id(api), returnValue=0))
        return correlation

    def _gpu(self, table: str, start: int, end: int, launch, api: str, pid: int, tid: int, **extra) -> int:
        if launch is None:  # an op whose launch the trace lacks
            correlation = next(self._correlation)
        else:
            correlation = self.runtime_call(api, *launch, pid=pid, tid=tid)
        self.tables.setdefault(table, []).append(dict(
            start=start, end=end, deviceId=0, contextId=1, streamId=7, correlationId=correlation,
            globalPid=global_pid(pid), **extra))
        return correlation

    def kernel(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               name: str = "kernel", api: str = "cudaLaunchKernel_v7000") -> int:
        name_id = self.string_id(name)
        return self._gpu("CUPTI_ACTIVITY_KIND_KERNEL", start, end, launch, api, pid, tid, shortName=name_id,
                         demangledName=name_id, mangledName=name_id, gridX=1, gridY=1, gridZ=1, blockX=128,
                         blockY=1, blockZ=1)

    def memcpy(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               copy_kind: int = DTOH, api: str = "cudaMemcpyAsync_v3020") -> int:
        return self._gpu("CUPTI_ACTIVITY_KIND_MEMCPY", start, end, launch, api, pid, tid, bytes=4096,
                         copyKind=copy_kind, srcKind=2, dstKind=0)

    def memset(self, start: int, end: int, *, launch: tuple[int, int] | None, pid: int = 1, tid: int = 1,
               api: str = "cudaMemsetAsync_v3020") -> int:
        return self._gpu("CUPTI_ACTIVITY_KIND_MEMSET", start, end, launch, api, pid, tid, value=0, bytes=4096,
                         memKind=2)

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.unlink(missing_ok=True)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()])
        ends = [r.get("end") or r["start"] for r in self.nvtx] + [
            r["end"] for rows in self.tables.values() for r in rows]
        duration = self.trace_end if self.trace_end is not None else max(ends, default=0) + 1_000
        db.execute("CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL, "
                   "startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL)")
        db.execute("INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (_VM, duration, 5_000, 5_000 + duration))
        nvtx = self.nvtx + [dict(start=duration - 10, eventType=DOMAIN_DESTROY, globalTid=global_tid(pid, 1),
                                 domainId=domain_id) for (pid, _), domain_id in self.domain_ids.items()]
        self._insert(db, "NVTX_EVENTS", NVTX_COLUMNS[self.schema], nvtx)
        columns = {"CUPTI_ACTIVITY_KIND_KERNEL": KERNEL_COLUMNS, "CUPTI_ACTIVITY_KIND_MEMCPY": MEMCPY_COLUMNS,
                   "CUPTI_ACTIVITY_KIND_MEMSET": MEMSET_COLUMNS, "CUPTI_ACTIVITY_KIND_RUNTIME": RUNTIME_COLUMNS}
        for table, rows in self.tables.items():
            self._insert(db, table, columns[table][self.schema], rows)
        db.commit()
        db.close()
        return path

    @staticmethod
    def _insert(db: sqlite3.Connection, table: str, columns: tuple[str, ...], rows: list[dict]) -> None:
        _create(db, table, columns)
        unknown = {key for row in rows for key in row} - set(columns)
        if unknown - {"floatValue", "jsonText", "jsonTextId"}:
            raise ValueError(f"{table} has no columns {sorted(unknown)} in this schema")
        db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                       [tuple(row.get(c) for c in columns) for row in rows])
