"""Open an Nsight Systems export for reading: the input checks, and columns read by name.

Users hand ddprof a `.sqlite` export or a `.nsys-rep` report. Every way the file itself can be
wrong (missing, a folder, unreadable, not SQLite, cut short by a failed copy, damaged pages)
becomes one DdprofError naming the file here; ddprof.nsys refuses reports from a newer nsys and
ddprof.load exports without NVTX. Queries only ever name columns that exist, because
nsys versions add and drop columns and create tables lazily (absent when empty).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl

from ddprof.btree_scan import INT, NULLABLE_INT, PRESENCE, REAL, ROWID, TEXT, MappedFile, ScanError, scan_table
from ddprof.cache import cache_dir
from ddprof.errors import DdprofError
from ddprof.nsys import export_sqlite

SQLITE_MAGIC = b"SQLite format 3\x00"
# A report's sibling export older than the report by more than this is stale (a later capture wrote
# the report); copies and checkouts leave the two within seconds of each other, in either order.
STALE_EXPORT_S = 60
_READERS = 3  # big tables read at once: NVTX events, runtime calls, kernels


def resolve_export(path: Path) -> Path:
    """The SQLite export to read for `path`: itself, or the export of a `.nsys-rep`.

    A report's sibling `.sqlite` is used when present (a report from a newer nsys can only be
    exported where it was captured); otherwise the local nsys exports it beside the report, or
    into ddprof's cache when the report's folder is read-only (exported once, reused after).
    """
    path = Path(path)
    try:
        path.stat()
    except FileNotFoundError:
        raise DdprofError(f"{path}: no such file") from None
    except OSError as exc:  # a name too long, a symlink loop, a folder on the way without search permission
        raise DdprofError(f"{path}: {exc.strerror}") from None
    if not path.is_file():
        raise DdprofError(f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise DdprofError(f"{path}: not readable (permission denied)")
    if path.suffix == ".nsys-rep":
        sibling = path.with_suffix(".sqlite")
        if sibling.is_file():
            if sibling.stat().st_size == 0:  # what an interrupted export wrote before exports were atomic
                raise DdprofError(f"{sibling}: empty (an interrupted export?); delete it to export {path.name} again")
            behind = path.stat().st_mtime - sibling.stat().st_mtime
            if behind > STALE_EXPORT_S:  # an export is written after its report, seconds later at most
                raise DdprofError(f"{sibling}: {behind:.0f} s older than {path.name}, so an export of an earlier "
                                  "capture; delete it to export the report again, or pass the .sqlite itself")
            return sibling
        if os.access(path.parent, os.W_OK):
            return export_sqlite(path)
        return _cached_export(path)
    return path


def _cached_export(report: Path) -> Path:
    """The export of a report in a read-only folder, kept in ddprof's cache under a key of the
    report's path, size and modification time, so that a changed report is exported afresh."""
    stat = report.stat()
    key = hashlib.sha256(f"{report.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / "exports" / key / report.with_suffix(".sqlite").name
    if not cached.is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=cached.parent))  # an interrupted export is never taken for a whole one
        try:
            os.replace(export_sqlite(report, staging / cached.name), cached)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return cached


def _check_sqlite_file(path: Path) -> None:
    """Refuse non-SQLite and truncated files before sqlite3 gives a vaguer answer mid-query."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise DdprofError(f"{path}: cannot read ({exc.strerror})") from None
    if not header.startswith(SQLITE_MAGIC):
        raise DdprofError(f"{path}: not an SQLite file (expected an nsys SQLite export or a .nsys-rep report)")
    if len(header) < 100:
        raise DdprofError(f"{path}: truncated SQLite file ({size} bytes, shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    count_is_valid = header[24:28] == header[92:96]  # the in-header size is trusted only then
    if count_is_valid and size < page_size * page_count:
        raise DdprofError(f"{path}: truncated SQLite file ({size} of {page_size * page_count} bytes)")
    wal = path.with_name(path.name + "-wal")
    if header[18] == 2 and wal.is_file() and wal.stat().st_size:  # its pages are read from the file itself
        raise DdprofError(f"{path}: has uncheckpointed changes in {wal.name}: checkpoint it (sqlite3 "
                          f"{path.name} 'PRAGMA wal_checkpoint') or export again")


# What sqlite3 returns for each column type of a small query, and how SQLite names those types.
_PYTHON_TYPES = {pl.Int64: (int,), pl.Float64: (float, int), pl.String: (str,)}
_SQL_TYPES = {int: "an integer", float: "a real", str: "text", bytes: "a BLOB"}
_DTYPES = {INT: pl.Int64, NULLABLE_INT: pl.Int64, PRESENCE: pl.Boolean, REAL: pl.Float64, TEXT: pl.String}


def _column(name: str, kind: str, value, has, texts: pl.Series) -> pl.Series:
    """One scanned column as a Series: null where not present (a text column: its codes looked up)."""
    if value is None:
        return pl.Series(name, has)
    if kind == TEXT and not has.any():  # the usual inline-name column of an export of registered names
        return pl.repeat(None, has.size, dtype=pl.String, eager=True).alias(name)
    series = pl.Series(name, value)
    if has is not None and not has.all():
        series = pl.select(pl.when(pl.Series(has)).then(series)).to_series()
    return texts.gather(series).alias(name) if kind == TEXT else series


class ExportDb:
    """A read-only connection to one export, which knows its tables and their columns."""

    def __init__(self, path: Path):
        self.path = Path(path)
        _check_sqlite_file(self.path)
        self._uri = self.path.resolve().as_uri() + "?mode=ro"
        self._db = sqlite3.connect(self._uri, uri=True)
        try:
            rows = self._fetch("SELECT name FROM sqlite_master WHERE type = 'table'")
        except DdprofError:
            self._db.close()
            raise
        self.tables = {name for (name,) in rows}
        self._columns: dict[str, set[str]] = {}
        self._pages = MappedFile(self.path)
        self._readers = ThreadPoolExecutor(_READERS, thread_name_prefix="ddprof-read")

    def close(self) -> None:
        self._readers.shutdown(cancel_futures=True)  # waits for running scans: they read the mapping
        self._pages.close()
        self._db.close()

    def __enter__(self) -> ExportDb:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def columns(self, table: str) -> set[str]:
        """Column names of `table` (empty when the table is absent)."""
        if table not in self._columns:
            if table in self.tables:
                rows = self._fetch(f'PRAGMA table_info("{table}")')
                self._columns[table] = {row[1] for row in rows}
            else:
                self._columns[table] = set()
        return self._columns[table]

    def col(self, table: str, alias: str, column: str) -> str:
        """`alias.column` when the column exists, else SQL NULL: a query that reads by name."""
        return f"{alias}.{column}" if column in self.columns(table) else "NULL"

    def first_col(self, table: str, alias: str, columns: tuple[str, ...]) -> str:
        """coalesce() over whichever of `columns` exist, in order (NULL when none does)."""
        present = [f"{alias}.{c}" for c in columns if c in self.columns(table)]
        if not present:
            return "NULL"
        return present[0] if len(present) == 1 else f"coalesce({', '.join(present)})"

    def table_frame(self, table: str, columns: dict[str, str], nullable: frozenset[str] | set[str] = frozenset(),
                    present: frozenset[str] | set[str] = frozenset(), real: frozenset[str] | set[str] = frozenset(),
                    text: frozenset[str] | set[str] = frozenset()) -> Future[pl.DataFrame]:
        """Start reading columns of a big table (output name -> column name, or "rowid") in rowid
        order; the future's result is the frame.

        The table's B-tree pages are decoded by ddprof.btree_scan on a reader thread of its own, so
        the big tables are read at once. Columns are Int64: NULL stays null in `nullable` columns;
        in the others (times, ids: nsys always writes them) a NULL, or the column missing, refuses
        the file, never reads as 0 (a NULL start read as 0 made an op run for minutes); `present`
        columns are Boolean,
        whether the value (of any type) is not NULL; `real` columns are Float64 and `text` columns
        String, both null where NULL. A column the table lacks is all null (False for `present`);
        an absent table is an empty frame.
        """
        kinds = {name: PRESENCE if name in present else REAL if name in real else TEXT if name in text else
                 NULLABLE_INT if name in nullable else INT for name in columns}
        schema = {name: _DTYPES[kind] for name, kind in kinds.items()}
        if table not in self.tables:
            done: Future[pl.DataFrame] = Future()
            done.set_result(pl.DataFrame(schema=schema))
            return done
        root, layout = self._layout(table)
        missing = [column for name, column in columns.items() if kinds[name] == INT and column not in layout]
        if missing:
            raise DdprofError(f"{self.path}: table {table} has no column {missing[0]}, which every nsys export's has: "
                              "a damaged export")
        asked = {name: layout[column] for name, column in columns.items() if column in layout}
        # Required integers are read with their presence, to be checked.
        spec = [(index, NULLABLE_INT if kinds[name] == INT else kinds[name]) for name, index in asked.items()]
        required = {name: columns[name] for name in asked if kinds[name] == INT}
        return self._readers.submit(self._scan, table, root, spec, list(asked), schema, required)

    def _layout(self, table: str) -> tuple[int, dict[str, int]]:
        """The table's root page and each column's index in the stored record (ROWID for the rowid
        and an INTEGER PRIMARY KEY column, which is the rowid under another name)."""
        (root, sql), = self._fetch("SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                   (table,))
        if not isinstance(root, int) or not isinstance(sql, str):
            raise DdprofError(f"{self.path}: unreadable SQLite export (the schema's entry for table {table} is damaged)")
        info = self._fetch(f'PRAGMA table_xinfo("{table}")')  # cid, name, type, notnull, default, pk, hidden
        # Rows written before an ALTER TABLE ADD COLUMN ... DEFAULT lack the column and mean its
        # default, which the page reader cannot know; nsys declares no defaults.
        if "WITHOUT ROWID" in sql.upper() or any(row[6] or row[4] is not None for row in info):
            raise DdprofError(f"{self.path}: table {table} has a layout ddprof cannot read (WITHOUT ROWID, "
                              "generated columns or column defaults): not an Nsight Systems export")
        keys = [row for row in info if row[5]]
        alias = keys[0][1] if len(keys) == 1 and keys[0][2].upper() == "INTEGER" else None
        return root, {"rowid": ROWID, **{row[1]: ROWID if row[1] == alias else row[0] for row in info}}

    def _scan(self, table: str, root: int, spec: list[tuple[int, str]], names: list[str],
              schema: dict[str, pl.DataType], required: dict[str, str]) -> pl.DataFrame:
        try:
            scan = scan_table(self._pages, root, spec)
        except ScanError as exc:
            raise DdprofError(f"{self.path}: unreadable SQLite export (table {table}: {exc})") from None
        for name, has in zip(names, scan.present):
            if name in required and not has.all():
                raise DdprofError(f"{self.path}: {table}.{required[name]} is NULL in {int((~has).sum()):,} rows "
                                  f"(first: row {int(np.argmin(has)) + 1}), where nsys always writes a value: "
                                  "a damaged export")
        texts = pl.Series(scan.texts, dtype=pl.String)
        read = {name: _column(name, kind, value, has, texts)
                for name, (_, kind), value, has in zip(names, spec, scan.values, scan.present)}
        # A column the table lacks holds no value: null, and False where only presence was asked.
        return pl.DataFrame([read[name] if name in read else
                             pl.repeat(False if dtype == pl.Boolean else None, scan.rows, dtype=dtype,
                                       eager=True).alias(name)
                             for name, dtype in schema.items()])

    def frame(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """Rows of a small query (text, reals) as a frame with exactly `schema`; a value of another
        type (a BLOB where the export holds text) refuses the file in one line."""
        rows = self._fetch(sql)
        for index, (name, dtype) in enumerate(schema.items()):
            expected = _PYTHON_TYPES[dtype]
            wrong = next((row[index] for row in rows if row[index] is not None
                          and not isinstance(row[index], expected)), None)
            if wrong is not None:
                table = re.search(r"FROM\s+(\w+)", sql, re.I)
                where = f"{table.group(1)}.{name}" if table else name
                raise DdprofError(f"{self.path}: {where} holds a {_SQL_TYPES.get(type(wrong), type(wrong).__name__)} "
                                  f"where the export holds {_SQL_TYPES[expected[0]]}: a damaged export")
        return pl.DataFrame(rows, schema=schema, orient="row")

    def _fetch(self, sql: str, params: tuple = ()) -> list[tuple]:
        """All rows of a query. A damaged file fails here, in the query or while rows are decoded
        (text that is not UTF-8), and every such failure names the file."""
        try:
            return self._db.execute(sql, params).fetchall()
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # may quote a damaged schema's SQL: one line
            raise DdprofError(f"{self.path}: unreadable SQLite export ({' '.join(str(exc).split())[:200]})") from None
