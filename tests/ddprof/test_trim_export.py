"""tests/ddprof/trim_export.py, the tool that cut the real graph export in tests/data/: a cut keeps
its steps' numbers exactly, and bad input is one line naming the file, exit code 2."""

import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl

from ddprof.pipeline import analyse
from tests.ddprof.trim_export import main

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "tests" / "data" / "h200_nsys2025_small_graphs.sqlite"


def test_a_cut_keeps_every_number_of_its_steps(tmp_path):
    """Steps 2 and 3 of the fixture, cut out again: their per-step rows (host, GPU, critical path,
    ops, graph launches, waits) and tokens are those of the whole fixture, every table is kept."""
    target = tmp_path / "cut.sqlite"
    assert main([str(EXPORT), str(target), "--first-step", "2", "--steps", "2"]) == 0
    _, whole, _ = analyse(EXPORT)
    _, cut, summary = analyse(target)
    assert summary["steps"] == 2
    expected = (whole.per_step.filter(pl.col("step_id").is_in([2, 3]))
                .with_columns(pl.col("step_id") - 2).sort("step_id", "owner"))
    assert cut.per_step.sort("step_id", "owner").equals(expected)
    assert cut.steps["tokens"].to_list() == whole.steps["tokens"].to_list()[2:4]

    def tables(path):
        with sqlite3.connect(path) as db:
            return db.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()

    assert tables(target) == tables(EXPORT)
    assert target.stat().st_size < EXPORT.stat().st_size


def test_bad_input_is_one_line_naming_the_file_and_leaves_no_file(tmp_path):
    target = tmp_path / "cut.sqlite"
    not_sqlite = tmp_path / "notes.sqlite"
    not_sqlite.write_text("not a database, but long enough to be read as one " * 20)
    for args, problem in (([EXPORT, "--first-step", "5", "--steps", "2"], "6 steps in the ddtree domain"),
                          ([EXPORT, "--steps", "0"], "--steps >= 1"),
                          ([not_sqlite], "file is not a database"),
                          ([tmp_path / "missing.sqlite"], "No such file")):
        source, *options = args
        done = subprocess.run([sys.executable, "-m", "tests.ddprof.trim_export", str(source), str(target), *options],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith(f"{source}: ") and problem in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and not target.exists()
