"""benchmarks/capture_kernels.py on real H200 exports (graphed with node-level traces; eager with
prefills): kernels per stage with and without their grids, the prefills' host side, events placed
in ranges, the run end to end and on bad input."""

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from benchmarks.capture_kernels import inside, prefill_side, prefills, stage_kernels
from ddprof.attribution import attribute
from ddprof.errors import DdprofError
from ddprof.load import load
from engine.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]
GRAPHS = ROOT / "tests" / "data" / "h200_nsys2025_small_graphs.sqlite"
EAGER = ROOT / "tests" / "data" / "h200_nsys2025_small_gpu_builder.sqlite"


def test_grids_split_a_stage_s_kernels_without_losing_or_doubling_any():
    trace = load(GRAPHS)
    attribution = attribute(trace)
    by_name, by_grid = stage_kernels(trace, attribution), stage_kernels(trace, attribution, by_grid=True)
    kernels = attribution.gpu_ops.filter((pl.col("kind") == "kernel") & pl.col("stage").is_in(STAGES))
    want = kernels.group_by("stage").agg(count=pl.len(), ns=(pl.col("end") - pl.col("start")).sum()).sort("stage")
    for table in (by_name, by_grid):
        assert table.group_by("stage").agg(pl.col("count").sum(), pl.col("ns").sum()).sort("stage").equals(want)
    assert by_grid["name"].null_count() == 0 and by_grid["name"].str.contains(r" \[\d+,\d+,\d+\]$").all()
    assert by_grid.height > by_name.height  # some kernel ran on more than one grid


def test_each_prefill_s_calls_and_kernels_are_its_own():
    trace = load(EAGER)
    ranges = prefills(trace)
    side = prefill_side(trace, ranges)
    assert side["prefills"] == ranges.height > 0
    assert 0 < side["in_calls_ms_per_prefill"] <= side["host_ms_per_prefill"]
    assert side["kernels_per_prefill"] > 0 and side["kernel_gpu_ms_per_prefill"] > 0
    launches = sum(call["per_prefill"] for call in side["runtime_calls"] if "Launch" in call["api"])
    assert launches >= side["kernels_per_prefill"]  # each kernel has its launch call in the prefill


def test_an_event_belongs_to_the_range_on_its_own_thread_that_holds_it():
    ranges = pl.DataFrame({"pid": [1, 1, 1], "tid": [7, 7, 8], "start": [10, 30, 10], "end": [20, 40, 50]})
    events = pl.DataFrame({"pid": [1, 1, 1, 1, 1, 2, 1], "thread": [7, 7, 7, 8, 9, 7, 7],
                           "at": [15, 25, 40, 45, 15, 15, 30],
                           "label": ["in first", "between", "at the end", "other thread's", "no range", "other pid",
                                     "at the start"]})
    assert sorted(inside(ranges, events, "at", "thread")["label"]) == ["at the start", "in first", "other thread's"]
    with pytest.raises(DdprofError, match="overlap"):
        inside(pl.DataFrame({"pid": [1, 1], "tid": [7, 7], "start": [10, 15], "end": [20, 30]}), events, "at", "thread")


def test_a_capture_against_itself_differs_nowhere(tmp_path):
    out = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, "benchmarks/capture_kernels.py", str(EAGER), str(EAGER), "--by-grid",
                           "--top", "3", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    verify = result["stages"]["verify"]
    assert len(verify["kernels"]) > 3  # every kernel kept, --top only printed
    assert verify["a_ms_per_step"] == pytest.approx(sum(row["a_ms_per_step"] for row in verify["kernels"]))
    assert all(row["delta_ms_per_step"] == 0 for stage in result["stages"].values() for row in stage["kernels"])
    assert result["a"]["prefill"]["prefills"] > 0 and result["a"]["prefill"] == result["b"]["prefill"]


@pytest.mark.parametrize("bad", [["MISSING", str(EAGER)], [str(EAGER), str(EAGER), "--top", "0"]])
def test_bad_input_gets_a_line_exit_2_and_no_file(tmp_path, bad):
    args = [str(tmp_path / "none.sqlite") if arg == "MISSING" else arg for arg in bad]
    out = tmp_path / "k.json"
    done = subprocess.run([sys.executable, "benchmarks/capture_kernels.py", *args, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not out.exists()
    assert "none.sqlite" in done.stderr if bad[0] == "MISSING" else "--top" in done.stderr
