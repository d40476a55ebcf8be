"""OS errors on inputs and outputs, through the one error path: odd paths, unwritable and full
output folders, a stale nsys lock. One line naming the file, exit 2, and never a partial file."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.atomic import atomic_path, atomic_paths
from ddprof.errors import DdprofError
from ddprof.export_db import resolve_export
from ddprof.nsys import _nsys_pids, clear_stale_locks, profile
from tests.ddprof import known_runs
from tests.ddprof.exports import example

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("nvtx_program.py")


def ddprof(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *map(os.fsdecode, args)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)


def _one_line(done: subprocess.CompletedProcess, names: str) -> None:
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"ddprof: error: {names}"), done.stderr


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB filesystem (tmpfs), for the full-disk cases; skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_name_too_long_and_a_symlink_loop_are_one_line(tmp_path):
    long_name = tmp_path / ("x" * 300 + ".sqlite")
    _one_line(ddprof("breakdown", long_name), f"{long_name}: File name too long")
    loop = tmp_path / "loop.sqlite"
    loop.symlink_to(tmp_path / "other.sqlite")
    (tmp_path / "other.sqlite").symlink_to(loop)
    _one_line(ddprof("breakdown", loop), f"{loop}: Too many levels of symbolic links")


def test_a_folder_without_search_permission_is_one_line(tmp_path):
    """As another user (root searches every folder), in a forked child: the venv may not be theirs to run."""
    if os.getuid() != 0:
        pytest.skip("needs root to become another user")
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    export = example("2022.4").write(shelf / "run.sqlite")
    tmp_path.chmod(0o755)
    shelf.chmod(0o600)  # its listing is readable, but no search (x) permission
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        os.close(read)
        os.setuid(65534)
        try:
            resolve_export(export)
            message = "read it"
        except DdprofError as exc:
            message = str(exc)
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as answer:
        assert answer.read() == f"{export}: Permission denied"


def test_a_dashboard_of_a_trace_whose_name_is_not_utf8(tmp_path):
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/run-\xff.sqlite"))
    shutil.copyfile(known_runs.write(tmp_path, "gpu"), odd)
    out = tmp_path / "pages" / "odd.html"
    done = ddprof("dashboard", odd, "--out", out)
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.parent.iterdir()] == ["odd.html"]  # no partial beside it


def test_full_disk_for_parquet_and_dashboard_is_one_line_and_leaves_nothing(small_disk, tmp_path):
    big = known_runs.write(tmp_path, "gpu")
    done = ddprof("dashboard", big, "--out", small_disk / "page.html")  # plotly.js alone is ~5 MB
    _one_line(done, f"{small_disk / 'page.html'}: cannot write the dashboard (No space left on device)")
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024 - 8192))
    done = ddprof("breakdown", big, "--parquet", small_disk / "frames")
    _one_line(done, f"{small_disk / 'frames'}: cannot write the parquet files")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "frames"]
    assert list((small_disk / "frames").iterdir()) == []  # all of the set or none


def test_an_export_on_a_full_disk_says_so_and_leaves_no_sqlite_the_next_run_would_trust(small_disk, tmp_path):
    report = profile([sys.executable, str(PROGRAM), str(tmp_path / "ids.json")], tmp_path / "run")
    shutil.copyfile(report, small_disk / "run.nsys-rep")
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1024 * 1024 - report.stat().st_size - 16384))
    done = ddprof("breakdown", small_disk / "run.nsys-rep")
    _one_line(done, f"{small_disk / 'run.sqlite'}: no space left on the device for the export")
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "run.nsys-rep"]
    filler.unlink()
    done = ddprof("breakdown", small_disk / "run.nsys-rep", "--json")
    assert "no step ranges" in done.stderr  # read this time: nvtx_program.py's ranges are not the engine's


def test_a_dashboard_on_a_read_only_mount_is_one_line(small_disk, tmp_path):
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    done = ddprof("dashboard", known_runs.write(tmp_path, "gpu"), "--out", small_disk / "page.html")
    _one_line(done, f"{small_disk / 'page.html'}: cannot write the dashboard (Read-only file system)")


def test_an_interrupted_write_leaves_nothing_and_keeps_the_old_file(tmp_path):
    old = tmp_path / "x.sqlite"
    old.write_text("the whole old file")
    with pytest.raises(KeyboardInterrupt), atomic_path(old) as partial:
        partial.write_text("half of the new")
        raise KeyboardInterrupt
    assert [p.name for p in tmp_path.iterdir()] == ["x.sqlite"] and old.read_text() == "the whole old file"
    (tmp_path / "b.parquet").mkdir()  # a set whose second file cannot be put in place: none of it is
    with pytest.raises(IsADirectoryError), atomic_paths([tmp_path / "a.parquet", tmp_path / "b.parquet"]) as partials:
        for partial in partials:
            partial.write_text("frame")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.parquet", "x.sqlite"]


def test_an_empty_export_beside_a_report_says_what_to_do(tmp_path):
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"not read")
    (tmp_path / "run.sqlite").write_bytes(b"")
    _one_line(ddprof("breakdown", report), f"{tmp_path / 'run.sqlite'}: empty (an interrupted export?); delete it")


def test_a_stale_nsys_lock_is_removed_when_no_nsys_is_alive(tmp_path):
    if _nsys_pids():
        pytest.skip("an nsys of another capture is running on this machine")
    lock = tmp_path / "NSys-2022.4.2.1"
    lock.write_bytes(b"\0" * 64)
    (tmp_path / "quadd-agent-instance-1").write_bytes(b"")
    assert clear_stale_locks(tmp_path) == [lock]
    assert [p.name for p in tmp_path.iterdir()] == ["quadd-agent-instance-1"]
