"""The real toolchain: NVTX from Python -> nsys profile -> SQLite export -> exact rows back."""

import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from ddprof import export_db
from ddprof.errors import DdprofError
from ddprof.nsys import export_sqlite, find_nsys, profile, trace_flags

PROGRAM = Path(__file__).with_name("nvtx_program.py")
PUSH_POP_RANGE, MARK, DOMAIN_CREATE = 59, 34, 75


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("nsys")
    ids_file = out_dir / "ids.json"
    report = profile([sys.executable, str(PROGRAM), str(ids_file)], out_dir / "run")
    sqlite_path = export_sqlite(report)
    return report, sqlite_path, json.loads(ids_file.read_text())


def _ranges(db):
    domain = dict(db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = ?", (DOMAIN_CREATE,)))
    rows = db.execute(
        "SELECT e.start, e.end, coalesce(e.text, s.value), e.domainId, e.globalTid, e.int64Value, e.eventType "
        "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (?, ?)",
        (PUSH_POP_RANGE, MARK)).fetchall()
    return [dict(start=s, end=e, name=n, domain=domain.get(d), tid=g & 0xFFFFFF, pid=(g >> 24) & 0xFFFFFF,
                 payload=p, kind=k) for s, e, n, d, g, p, k in rows]


def test_ranges_nesting_threads_and_payload_come_back_exactly(capture):
    report, sqlite_path, ids = capture
    assert report.suffix == ".nsys-rep" and report.stat().st_size > 0
    with sqlite3.connect(sqlite_path) as db:
        events = _ranges(db)
    ranges = {e["name"]: e for e in events if e["kind"] == PUSH_POP_RANGE}
    assert set(ranges) == {"outer_a", "inner_a", "outer_b", "inner_b"}
    assert all(e["domain"] == "ddtree" for e in events)
    for label in "ab":
        outer, inner = ranges[f"outer_{label}"], ranges[f"inner_{label}"]
        assert outer["tid"] == inner["tid"] == ids[label]
        assert outer["start"] < inner["start"] < inner["end"] < outer["end"]
    assert ids["a"] != ids["b"]
    assert len({e["pid"] for e in events}) == 1

    marks = [e for e in events if e["kind"] == MARK]
    assert [(m["name"], m["payload"], m["tid"]) for m in marks] == [("tokens", 12345, ids["a"])]


def test_cuda_captures_record_each_graph_node_and_the_local_nsys_accepts_it(tmp_path):
    """`--cuda-graph-trace=node` only with CUDA traced (nsys refuses an unknown value with exit 1)."""
    assert trace_flags("nvtx") == ["--trace=nvtx"]
    assert trace_flags("cuda,nvtx") == ["--trace=cuda,nvtx", "--cuda-graph-trace=node"]
    report = profile([sys.executable, "-c", "pass"], tmp_path / "run", trace="cuda,nvtx")
    assert report.stat().st_size > 0


def test_find_nsys_reports_a_version():
    nsys = find_nsys()
    assert nsys.path.is_file()
    assert nsys.version_tuple[0] >= 2022


def test_a_report_in_a_read_only_folder_is_exported_once_into_the_cache(capture, tmp_path, monkeypatch):
    report, sqlite_path, _ = capture
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    shared = shelf / "run.nsys-rep"
    shutil.copy2(report, shared)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # Tests run as root, to whom every folder is writable: the shelf is made to look read-only.
    real_access = os.access

    def access(path, mode):
        return real_access(path, mode) and not (Path(path) == shelf and mode == os.W_OK)

    monkeypatch.setattr(export_db.os, "access", access)

    first = export_db.resolve_export(shared)
    assert first.is_relative_to(tmp_path / "cache" / "ddprof" / "exports") and first.name == "run.sqlite"
    assert list(shelf.iterdir()) == [shared] and list(first.parent.iterdir()) == [first]
    with sqlite3.connect(first) as db, sqlite3.connect(sqlite_path) as original:
        assert _ranges(db) == _ranges(original)
    exported_at = first.stat().st_mtime_ns
    assert export_db.resolve_export(shared) == first and first.stat().st_mtime_ns == exported_at  # reused

    stat = shared.stat()
    os.utime(shared, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new report under the same name
    assert export_db.resolve_export(shared) != first


def test_explicit_nsys_that_does_not_exist_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("NSYS", "/nonexistent/nsys")
    with pytest.raises(DdprofError, match="NSYS=/nonexistent/nsys is not a working nsys"):
        find_nsys()


def test_missing_output_folder_is_refused(tmp_path):
    with pytest.raises(DdprofError, match="output folder does not exist"):
        profile([sys.executable, "-c", "pass"], tmp_path / "missing" / "run")


def test_failing_program_leaves_no_report(tmp_path):
    with pytest.raises(DdprofError, match=r"profiled program failed \(exit 3\)"):
        profile([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "run")
    assert not (tmp_path / "run.nsys-rep").exists()


def test_export_of_a_non_report_is_a_clear_error(tmp_path):
    bogus = tmp_path / "bogus.nsys-rep"
    bogus.write_bytes(b"not a report")
    with pytest.raises(DdprofError, match="bogus.nsys-rep"):
        export_sqlite(bogus)
    assert not (tmp_path / "bogus.sqlite").exists()


def test_timeout_kills_the_capture_and_shuts_down_the_session(tmp_path):
    with pytest.raises(DdprofError, match="timed out"):
        profile([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "run", timeout_s=5)
    assert not (tmp_path / "run.nsys-rep").exists()
    assert _agents_of(f"ddprof-{os.getpid()}-") == []


def _agents_of(session_prefix: str) -> list[str]:
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "--start-agent" in cmdline and session_prefix in cmdline:
            found.append(cmdline)
    return found
