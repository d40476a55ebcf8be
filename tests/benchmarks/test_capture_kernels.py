"""benchmarks/capture_kernels.py on a real H200 export (graphed, node-level traces): kernels per
stage with and without their grids, events placed in ranges, the run end to end and on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import polars as pl

from benchmarks.capture_kernels import inside, stage_kernels
from ddprof.load import load

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "tests" / "data" / "h200_nsys2025_small_graphs.sqlite"


def test_grids_split_a_stage_s_kernels_without_losing_or_doubling_any():
    trace = load(EXPORT)
    steps, by_name = stage_kernels(trace)
    _, by_grid = stage_kernels(trace, by_grid=True)
    assert steps > 0 and by_name.height > 0
    totals = [table.group_by("stage").agg(pl.col("count").sum(), pl.col("ns").sum()).sort("stage")
              for table in (by_name, by_grid)]
    assert totals[0].equals(totals[1])
    assert by_grid["name"].str.contains(r" \[\d+,\d+,\d+\]$").all()  # every launch found its grid
    assert by_grid.height >= by_name.height


def test_an_event_belongs_to_the_range_on_its_own_thread_that_holds_it():
    ranges = pl.DataFrame({"pid": [1, 1, 1], "tid": [7, 7, 8], "start": [10, 30, 10], "end": [20, 40, 50]})
    events = pl.DataFrame({"pid": [1, 1, 1, 1, 1, 2], "thread": [7, 7, 7, 8, 9, 7], "at": [15, 25, 40, 45, 15, 15],
                           "label": ["in first", "between", "at the end", "other thread's", "no range", "other pid"]})
    placed = inside(ranges, events, "at", "thread")
    assert sorted(placed["label"]) == ["at the end", "in first", "other thread's"]


def test_a_capture_against_itself_differs_nowhere(tmp_path):
    out = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, "benchmarks/capture_kernels.py", str(EXPORT), str(EXPORT), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["stages"] and all(row["delta_ms_per_step"] == 0 for stage in result["stages"].values()
                                    for row in stage["kernels"])
    assert result["a"]["prefill"] == result["b"]["prefill"]


def test_a_missing_export_gets_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "none.sqlite"
    done = subprocess.run([sys.executable, "benchmarks/capture_kernels.py", str(missing), str(EXPORT),
                           "--out", str(tmp_path / "k.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and str(missing) in done.stderr
    assert not (tmp_path / "k.json").exists()
