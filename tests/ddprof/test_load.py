"""ddprof.load on hand-built exports in both schema versions, and its one-line errors on bad input."""

import os
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from ddprof.errors import DdprofError
from ddprof.load import load
from engine.stages import DOMAIN, STEP, TOKENS_MARK
from tests.ddprof.exports import DTOH, Export, example

FIXTURE_2025 = Path(__file__).resolve().parents[1] / "data" / "ddtree_nsys2025_schema.sqlite"


def test_both_schema_versions_load_to_the_same_frames(tmp_path):
    old = load(example("2022.4").write(tmp_path / "old.sqlite"))
    new = load(example("2025.3").write(tmp_path / "new.sqlite"))
    for name in ("ranges", "marks", "incomplete", "gpu_ops", "runtime"):
        assert getattr(old, name).equals(getattr(new, name)), name


def test_committed_2025_fixture_loads_by_column_name():
    with sqlite3.connect(FIXTURE_2025) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
        kernel_columns = {row[1] for row in db.execute("PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")}
    assert "binaryData" in columns and "jsonText" not in columns and "greenContextId" in kernel_columns
    trace = load(FIXTURE_2025)
    ddtree = trace.ranges.filter(pl.col("domain") == DOMAIN)
    assert ddtree.height == 1 + 2 * 7  # prefill, and two steps of a step and six stages
    assert trace.ranges.filter(pl.col("domain") == "CCCL")["name"].to_list() == [
        "cub::DeviceScan", "cub::DeviceScan", STEP]
    assert trace.marks.select("name", "domain", "pid", "payload").rows() == [
        (TOKENS_MARK, DOMAIN, 8, 7), (TOKENS_MARK, DOMAIN, 7, 3), (TOKENS_MARK, DOMAIN, 7, 5)]
    assert trace.gpu_ops["kind"].to_list() == ["kernel", "memcpy", "memset"] * 2
    assert trace.gpu_ops.filter(pl.col("kind") == "kernel")["name"].unique().to_list() == ["draft_gemm"]
    assert set(trace.runtime["api"]) == {"cudaLaunchKernel", "cudaMemcpy", "cudaMemsetAsync", "cudaStreamSynchronize"}


def test_names_threads_payloads_and_nesting(tmp_path):
    export = Export()
    export.range("outer", 0, 100, pid=4839, tid=4847)
    export.range("inner", 10, 50, pid=4839, tid=4847, registered=False)  # inline `text`
    export.range("zero", 10, 10, pid=4839, tid=4847)                     # zero-length, at inner's start
    export.range("sibling", 50, 60, pid=4839, tid=4847)                  # touches inner's end
    export.range("other_thread", 20, 30, pid=4839, tid=4848)
    export.range("cub", 20, 30, domain="CCCL", pid=4839, tid=4847)         # own stack per domain
    export.mark("tokens", 70, 2**40, pid=4839, tid=4847, payload_column="uint64Value")
    trace = load(export.write(tmp_path / "run.sqlite"))
    ranges = {row["name"]: row for row in trace.ranges.iter_rows(named=True)}
    assert {row["pid"] for row in ranges.values()} == {4839}
    assert ranges["other_thread"]["tid"] == 4848 and ranges["outer"]["tid"] == 4847
    depth = {name: row["depth"] for name, row in ranges.items()}
    assert depth == {"outer": 0, "inner": 1, "zero": 2, "sibling": 1, "other_thread": 0, "cub": 0}
    parent = {name: row["parent"] for name, row in ranges.items()}
    assert parent["inner"] == parent["sibling"] == ranges["outer"]["range_id"]
    assert parent["zero"] == ranges["inner"]["range_id"] and parent["cub"] is None
    assert trace.marks.select("name", "payload", "tid").rows() == [("tokens", 2**40, 4847)]


def test_gpu_ops_join_their_launch_by_correlation_id_within_the_process(tmp_path):
    export = Export()
    export.range(STEP, 0, 100, pid=1)
    export.kernel(10, 20, launch=(1, 2), pid=1, tid=11, correlation=7, name="k1")
    export.kernel(30, 40, launch=(3, 4), pid=2, tid=22, correlation=7, name="k2")  # same id, other process
    export.memcpy(50, 60, launch=(5, 6), pid=1, tid=12, copy_kind=DTOH)
    export.memset(70, 80, launch=None, pid=1, tid=11)
    trace = load(export.write(tmp_path / "run.sqlite"))
    assert trace.gpu_ops.select("name", "pid", "launch_tid", "launch_start", "launch_api").rows() == [
        ("k1", 1, 11, 1, "cudaLaunchKernel"), ("k2", 2, 22, 3, "cudaLaunchKernel"),
        ("[memcpy DtoH]", 1, 12, 5, "cudaMemcpyAsync"), ("[memset]", 1, None, None, None)]


def test_a_correlation_id_on_two_runtime_calls_joins_the_first_only(tmp_path):
    export = Export()
    export.runtime_call("cudaLaunchKernel_v7000", 1, 2, tid=11, correlation=9)
    export.kernel(10, 20, launch=(5, 6), tid=12, correlation=9)
    trace = load(export.write(tmp_path / "run.sqlite"))
    assert trace.gpu_ops.select("launch_tid", "launch_start").rows() == [(11, 1)]


def test_absent_gpu_tables_give_empty_frames(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    trace = load(export.write(tmp_path / "run.sqlite"))
    assert trace.gpu_ops.height == 0 and trace.runtime.height == 0 and not trace.has_gpu_activity


def test_real_export_rows_that_are_not_ranges_or_marks_are_ignored(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    path = export.write(tmp_path / "run.sqlite")
    with sqlite3.connect(path) as db:  # a category name event (33) and a thread name (39), as nsys writes
        db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (5, 33, 'cat', 1)")
        db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (6, 39, 'main', 1)")
    trace = load(path)
    assert trace.ranges["name"].to_list() == [STEP] and trace.marks.height == 0


def test_ranges_ending_at_the_trace_end_are_unclosed_only_on_the_same_clock(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.range(STEP, 200, 5_000)  # nsys ends a range left open at the trace's end
    export.trace_end = 5_000
    assert load(export.write(tmp_path / "run.sqlite")).incomplete.select("start", "problem").rows() == [
        (200, "unclosed")]
    export.trace_end = 150  # a duration on another clock than the events: no basis to judge
    trace = load(export.write(tmp_path / "run.sqlite"))
    assert trace.incomplete.height == 0 and trace.ranges.height == 2


def test_nsys_rep_with_a_sibling_export_reads_the_sibling(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    export.write(tmp_path / "run.sqlite")
    (tmp_path / "run.nsys-rep").write_bytes(b"a report nsys would need to export")
    assert load(tmp_path / "run.nsys-rep").source == tmp_path / "run.sqlite"


def test_a_sibling_export_older_than_its_report_is_refused(tmp_path):
    export = Export()
    export.range(STEP, 0, 100)
    sibling = export.write(tmp_path / "run.sqlite")
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"a later capture's report")
    now = report.stat().st_mtime
    os.utime(sibling, (now - 30, now - 30))  # within a copy's jitter: still read
    assert load(report).source == sibling
    os.utime(sibling, (now - 3600, now - 3600))
    with pytest.raises(DdprofError, match=r"run.sqlite: 3600 s older than run.nsys-rep"):
        load(report)


def _sqlite_without_nvtx(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")


def _other_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (x)")


def _truncated(path: Path) -> None:
    export = Export()
    for i in range(2000):
        export.range(STEP, i * 10, i * 10 + 5)
    full = export.write(path.with_suffix(".full"))
    path.write_bytes(full.read_bytes()[:8192])


def _corrupted(path: Path) -> None:
    export = Export()
    for i in range(2000):
        export.range(STEP, i * 10, i * 10 + 5)
    data = bytearray(export.write(path.with_suffix(".full")).read_bytes())
    data[4096:-4096] = b"\xff" * (len(data) - 8192)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("make, message", [
    (None, "no such file"),
    (lambda p: p.mkdir(), "not a file"),
    (lambda p: p.write_text("start,end\n1,2\n"), "not an SQLite file"),
    (lambda p: p.write_bytes(b""), "not an SQLite file"),
    (_truncated, r"truncated SQLite file \(8192 of \d+ bytes\)"),
    (_corrupted, "unreadable SQLite"),
    (_sqlite_without_nvtx, "export has no NVTX_EVENTS table"),
    (_other_sqlite, "without NVTX_EVENTS or StringIds: not an Nsight Systems export"),
    (lambda p: p.with_suffix(".nsys-rep").write_bytes(b"junk"), "nsys export failed|newer Nsight Systems"),
])
def test_bad_inputs_are_one_line_errors_naming_the_file(tmp_path, make, message):
    path = tmp_path / "input.sqlite"
    if make is not None:
        make(path)
    if path.with_suffix(".nsys-rep").exists():
        path = path.with_suffix(".nsys-rep")
    with pytest.raises(DdprofError, match=message) as caught:
        load(path)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("schema", ["2022.4", "2025.3"])
@pytest.mark.parametrize("names", ["inline", "mixed"])
def test_inline_and_mixed_names_load_to_the_frames_of_registered_ones(tmp_path, schema, names):
    registered = load(example(schema).write(tmp_path / "registered.sqlite"))
    path = example(schema, names).write(tmp_path / f"{names}.sqlite")
    with sqlite3.connect(path) as db:
        inline, by_id = db.execute("SELECT count(text), count(textId) FROM NVTX_EVENTS "
                                   "WHERE eventType != 75").fetchone()  # not the domain creations
    assert inline > 0 and (by_id > 0) == (names == "mixed")  # the file holds what it claims to
    other = load(path)
    for name in ("ranges", "marks", "incomplete", "gpu_ops", "runtime"):
        assert getattr(registered, name).equals(getattr(other, name)), name


def test_unique_inline_names_and_float_payloads(tmp_path):
    """Every range its own inline name (e.g. a step number in it), marks with float payloads."""
    export = Export(names="inline")
    names = [f"r{i} é" for i in range(5000)]
    for i, name in enumerate(names):
        export.range(name, 10 * i, 10 * i + 5)
    export.range("elsewhere", 90_000, 90_050, start_end=True, end_tid=2)
    export.mark("loss", 90_100, 0.25, payload_column="doubleValue")
    export.mark("lr", 90_200, 3e-4, payload_column="floatValue")
    export.mark("tokens", 90_300, 4)
    trace = load(export.write(tmp_path / "run.sqlite"))
    assert trace.ranges.sort("start")["name"].to_list() == names
    assert trace.ranges["domain"].unique().to_list() == [DOMAIN]
    assert trace.incomplete.select("name", "problem").rows() == [("elsewhere", "cross-thread")]
    assert trace.marks.select("name", "payload", "payload_float").rows() == [
        ("loss", None, 0.25), ("lr", None, pytest.approx(3e-4)), ("tokens", 4, None)]
