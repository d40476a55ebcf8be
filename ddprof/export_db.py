"""Open an Nsight Systems export for reading: the input checks, and columns read by name.

Users hand ddprof a `.sqlite` export or a `.nsys-rep` report. Every way that input can be wrong
(missing, a folder, not SQLite, cut short by a failed copy, no NVTX table, a report from a newer
nsys) becomes one DdprofError naming the file. Queries only ever name columns that exist, because
nsys versions add and drop columns and create tables lazily (absent when empty).
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import adbc_driver_manager
import adbc_driver_sqlite.dbapi as adbc_sqlite
import polars as pl

from ddprof.errors import DdprofError
from ddprof.nsys import export_sqlite

SQLITE_MAGIC = b"SQLite format 3\x00"
_BATCH_ROWS = "65536"  # rows per Arrow batch: fewer chunks than ADBC's 1024, and column types guessed from more rows
_READERS = 3  # big tables read at once: NVTX events, runtime calls, kernels


def resolve_export(path: Path) -> Path:
    """The SQLite export to read for `path`: itself, or the export of a `.nsys-rep`.

    A report's sibling `.sqlite` is used when present (a report from a newer nsys can only be
    exported where it was captured); otherwise the local nsys exports it beside the report, or
    into a temporary folder when the report's folder is read-only.
    """
    path = Path(path)
    if not path.exists():
        raise DdprofError(f"{path}: no such file")
    if not path.is_file():
        raise DdprofError(f"{path}: not a file")
    if path.suffix == ".nsys-rep":
        sibling = path.with_suffix(".sqlite")
        if sibling.is_file():
            return sibling
        if os.access(path.parent, os.W_OK):
            return export_sqlite(path)
        return export_sqlite(path, Path(tempfile.mkdtemp(prefix="ddprof-export-")) / sibling.name)
    return path


def _check_sqlite_file(path: Path) -> None:
    """Refuse non-SQLite and truncated files before sqlite3 gives a vaguer answer mid-query."""
    size = path.stat().st_size
    with path.open("rb") as f:
        header = f.read(100)
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


class ExportDb:
    """A read-only connection to one export, which knows its tables and their columns."""

    def __init__(self, path: Path):
        self.path = Path(path)
        _check_sqlite_file(self.path)
        self._uri = self.path.resolve().as_uri() + "?mode=ro"
        self._db = sqlite3.connect(self._uri, uri=True)
        try:
            rows = self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise DdprofError(f"{self.path}: unreadable SQLite file ({exc})") from None
        self.tables = {name for (name,) in rows}
        self._columns: dict[str, set[str]] = {}
        self._readers = ThreadPoolExecutor(_READERS, thread_name_prefix="ddprof-read")

    def close(self) -> None:
        self._readers.shutdown(cancel_futures=True)
        self._db.close()

    def __enter__(self) -> ExportDb:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def columns(self, table: str) -> set[str]:
        """Column names of `table` (empty when the table is absent)."""
        if table not in self._columns:
            if table in self.tables:
                rows = self._execute(f'PRAGMA table_info("{table}")').fetchall()
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

    def int_frame(self, table: str, columns: dict[str, str], where: str = "1",
                  nullable: frozenset[str] | set[str] = frozenset()) -> Future[pl.DataFrame]:
        """Start reading integer columns of `table` (output name -> SQL expression over alias `e`)
        as Int64; the future's result is the frame.

        Python's sqlite3 builds one object per value, which dominates load time on million-row
        tables; here the ADBC SQLite driver fills Arrow columns in C and polars takes them as they
        are, on a thread of its own that runs beside the others (polars releases the GIL while it
        pulls the Arrow stream). NULL stays null in `nullable` columns and reads as 0 in the others
        (which must never be NULL); an absent table is an empty frame.
        """
        if table not in self.tables:
            done: Future[pl.DataFrame] = Future()
            done.set_result(pl.DataFrame(schema={name: pl.Int64 for name in columns}))
            return done
        select = ", ".join(f'{expr} AS "{name}"' for name, expr in columns.items())
        zero_for_null = [name for name, expr in columns.items() if name not in nullable and expr != "NULL"]
        return self._readers.submit(self._arrow_ints, f'SELECT {select} FROM "{table}" e WHERE {where}',
                                    list(columns), zero_for_null)

    def _arrow_ints(self, sql: str, names: list[str], zero_for_null: list[str]) -> pl.DataFrame:
        try:
            with adbc_sqlite.connect(self._uri) as connection, connection.cursor() as cursor:
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": _BATCH_ROWS})
                cursor.execute(sql)
                rows = pl.from_arrow(cursor.fetch_arrow())
        except (adbc_driver_manager.Error, pl.exceptions.PolarsError, OSError) as exc:
            raise DdprofError(f"{self.path}: unreadable SQLite export ({_one_line(exc)})") from None
        frame = rows.struct.unnest() if isinstance(rows, pl.Series) else rows
        return frame.select(pl.col(names).cast(pl.Int64)).with_columns(pl.col(zero_for_null).fill_null(0))

    def frame(self, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """Rows of a small query (text, reals) as a frame with exactly `schema`."""
        rows = self._execute(sql).fetchall()
        return pl.DataFrame(rows, schema=schema, orient="row")

    def _execute(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise DdprofError(f"{self.path}: unreadable SQLite export ({exc})") from None

    def scalar(self, sql: str):
        row = self._execute(sql).fetchone()
        return row[0] if row else None


def _one_line(exc: Exception) -> str:
    """A driver's message on one line (ADBC appends the query on a second one)."""
    return " ".join(str(exc).split())
