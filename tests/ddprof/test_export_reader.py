"""The Arrow reader of export tables and the merge-based interval helpers, against plain answers.

ExportDb.int_frame reads through the ADBC SQLite driver on background threads; these tests hold
it to what Python's sqlite3 returns for the same query, on the real nsys 2025.3 export, and to the
NULL rules the loader relies on. `ranked` and `first_cover` are held to np.unique/searchsorted and
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
def test_arrow_reader_matches_sqlite3_on_a_real_export(table, columns):
    with ExportDb(EXPORT) as db:
        frame = db.int_frame(table, {c: f"e.{c}" for c in columns}, nullable=set(columns)).result()
    with sqlite3.connect(EXPORT) as plain:
        rows = plain.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid").fetchall()
    assert frame.height == len(rows) > 0
    assert frame.schema == dict.fromkeys(columns, pl.Int64)
    assert frame.rows() == rows


def test_nulls_stay_null_only_in_nullable_columns_and_absent_tables_are_empty(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
        # More leading NULLs than one Arrow batch holds: the column type must still come out Int64.
        db.executemany("INSERT INTO t VALUES (?, ?)", [(None, None)] * 70_000 + [(7, 8)])
    with ExportDb(path) as export:
        frame = export.int_frame("t", {"a": "e.a", "b": "e.b", "c": "NULL"}, nullable={"b"}).result()
        absent = export.int_frame("missing", {"x": "e.x"}).result()
    assert frame.schema == {"a": pl.Int64, "b": pl.Int64, "c": pl.Int64}
    assert frame.row(0) == (0, None, None) and frame.row(-1) == (7, 8, None)
    assert absent.height == 0 and absent.schema == {"x": pl.Int64}


def test_a_failing_query_is_a_one_line_error_naming_the_file():
    with ExportDb(EXPORT) as db, pytest.raises(DdprofError, match="unreadable SQLite export") as caught:
        db.int_frame("NVTX_EVENTS", {"x": "e.no_such_column"}).result()
    assert str(EXPORT) in str(caught.value) and "\n" not in str(caught.value)


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
