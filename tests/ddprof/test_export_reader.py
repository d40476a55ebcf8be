"""The reader of big export tables and the merge-based interval helpers, against plain answers.

ExportDb.table_frame reads table pages in C (ddprof.btree_scan) on background threads; these tests
hold it to what Python's sqlite3 returns for the same columns, on the real nsys 2025.3 export, and
to the NULL rules the loader relies on. `ranked` and `first_cover` are held to np.unique/searchsorted and
to a brute-force scan over every elementary segment.
"""

import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ddprof.errors import DdprofError
from ddprof.export_db import ExportDb
from ddprof.intervals import first_cover, ranked

EXPORT = Path(__file__).parents[1] / "data" / "h200_nsys2025_small_gpu_builder.sqlite"


@pytest.mark.parametrize("table, columns", [
    ("NVTX_EVENTS", ("start", "end", "eventType", "textId", "domainId", "globalTid")),
    ("CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId", "globalPid", "shortName")),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "end", "globalTid", "correlationId", "nameId")),
])
def test_table_reader_matches_sqlite3_on_a_real_export(table, columns):
    with ExportDb(EXPORT) as db:
        frame = db.table_frame(table, {c: c for c in columns}, nullable=set(columns)).result()
    with sqlite3.connect(EXPORT) as plain:
        rows = plain.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid").fetchall()
    assert frame.height == len(rows) > 0
    assert frame.schema == dict.fromkeys(columns, pl.Int64)
    assert frame.rows() == rows


def test_nulls_stay_null_only_in_nullable_columns_and_absent_tables_are_empty(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b INTEGER, s TEXT)")
        db.executemany("INSERT INTO t (a, b, s) VALUES (?, ?, ?)", [(6, None, None)] * 70_000 + [(7, 8, "x")])
    with ExportDb(path) as export:
        frame = export.table_frame("t", {"id": "id", "a": "a", "b": "b", "c": "no_such_column", "has_s": "s"},
                                   nullable={"b", "c"}, present={"has_s"}).result()
        absent = export.table_frame("missing", {"x": "x"}).result()
    assert frame.schema == {"id": pl.Int64, "a": pl.Int64, "b": pl.Int64, "c": pl.Int64, "has_s": pl.Boolean}
    assert frame.row(0) == (1, 6, None, None, False) and frame.row(-1) == (70_001, 7, 8, None, True)
    assert absent.height == 0 and absent.schema == {"x": pl.Int64}


def test_a_null_in_a_column_nsys_always_fills_is_refused_never_read_as_0(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(1, 2)] * 5 + [(None, 2)] + [(1, 2)] * 5)
    with ExportDb(path) as export, pytest.raises(DdprofError, match=r"t.sqlite: t.a is NULL in 1 rows \(first: row 6\)"):
        export.table_frame("t", {"x": "a", "y": "b"}).result()
    with ExportDb(path) as export, pytest.raises(DdprofError, match=r"t.sqlite: table t has no column z"):
        export.table_frame("t", {"x": "a", "y": "z"})


def test_damaged_table_pages_are_a_one_line_error_naming_the_file(tmp_path):
    path = tmp_path / "damaged.sqlite"
    data = bytearray(EXPORT.read_bytes())
    with sqlite3.connect(EXPORT) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    data[(root - 1) * page_size] = 0x77  # the root page's type byte
    path.write_bytes(data)
    with ExportDb(path) as db, pytest.raises(DdprofError, match="unreadable SQLite export") as caught:
        db.table_frame("NVTX_EVENTS", {"start": "start"}).result()
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_schema_that_is_not_utf8_is_a_one_line_error_naming_the_file(tmp_path):
    path = tmp_path / "schema.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE qqqqqqqq (a INTEGER)")
    path.write_bytes(path.read_bytes().replace(b"qqqqqqqq", b"\xff" * 8))  # the table's name, where it is stored
    with pytest.raises(DdprofError, match="unreadable SQLite export") as caught:
        ExportDb(path)
    assert str(path) in str(caught.value)


@pytest.mark.parametrize("create", ["CREATE TABLE t (a INTEGER) WITHOUT ROWID",
                                    "CREATE TABLE t (a INTEGER PRIMARY KEY, b INTEGER AS (a + 1))",
                                    "CREATE TABLE t (a INTEGER, b INTEGER DEFAULT 7)"])
def test_table_layouts_the_page_reader_cannot_read_are_refused(tmp_path, create):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute(create.replace("INTEGER) WITHOUT", "INTEGER PRIMARY KEY) WITHOUT"))
    with ExportDb(path) as export, pytest.raises(DdprofError, match="layout ddprof cannot read"):
        export.table_frame("t", {"a": "a"})


def test_an_export_with_uncheckpointed_wal_changes_is_refused(tmp_path):
    path = tmp_path / "wal.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE NVTX_EVENTS (start INTEGER)")
    db.execute("INSERT INTO NVTX_EVENTS VALUES (1)")
    db.commit()  # stays in the -wal file while this connection is open
    try:
        with pytest.raises(DdprofError, match="uncheckpointed changes"):
            ExportDb(path)
    finally:
        db.close()


def test_ranked_is_unique_plus_searchsorted():
    rng = np.random.default_rng(1)
    arrays = [np.sort(rng.integers(0, 500, 300)), rng.integers(0, 500, 200), np.array([], np.int64)]
    values, positions = ranked(*arrays)
    assert values.tolist() == np.unique(np.concatenate(arrays)).tolist()
    for array, at in zip(arrays, positions):
        assert at.tolist() == np.searchsorted(values, array).tolist()


@pytest.mark.parametrize("seed", range(5))
def test_first_cover_picks_the_best_covering_interval_of_every_segment(seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 200, 150)
    ends = starts + rng.integers(0, 40, 150)  # some empty
    precedence = rng.permutation(150)
    bounds, winner = first_cover(starts, ends, precedence)
    rank = np.argsort(precedence)
    for k in range(bounds.size - 1):
        covering = np.flatnonzero((starts <= bounds[k]) & (ends >= bounds[k + 1]) & (ends > starts))
        expected = covering[np.argmin(rank[covering])] if covering.size else -1
        assert winner[k] == expected
