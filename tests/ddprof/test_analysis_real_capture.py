"""breakdown on REAL nsys captures of a program that emits the engine's NVTX contract.

The program (stage_emitter.py) records what it emitted and how long each range took by its own
clock; the breakdown of nsys's export must agree: steps and tokens exactly, and every range's
duration within the program's bracket of it (which also holds the push and pop calls, and any
preemption around them on a busy machine).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.errors import DdprofError
from ddprof.load import load
from ddprof.nsys import export_sqlite, profile
from engine.stages import STAGES
from tests.ddprof.stage_emitter import STAGE_US

EMITTER = Path(__file__).with_name("stage_emitter.py")


def _capture(folder: Path, *flags: str):
    record = folder / "record.json"
    report = profile([sys.executable, str(EMITTER), str(record), *flags], folder / "run")
    return report, export_sqlite(report), json.loads(record.read_text())


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("capture"))


def _within_brackets(nsys_ns: list[int], program_ns: list[int], busy_us: int) -> None:
    """Each range as nsys recorded it lasted at least the program's busy-wait inside it and at most
    the program's own bracket around it: bounds the program guarantees, whatever the machine's speed."""
    nsys_ns, program_ns = np.asarray(nsys_ns), np.asarray(program_ns)
    assert len(nsys_ns) == len(program_ns)
    assert (nsys_ns >= busy_us * 1000).all()
    assert (nsys_ns <= program_ns + 1_000).all()  # two monotonic clocks read a few instructions apart


def test_breakdown_agrees_with_what_the_program_emitted_and_timed(capture):
    _, sqlite_path, record = capture
    attribution = attribute(load(sqlite_path))
    summary = breakdown(attribution)
    assert summary["steps"] == record["steps"] == 20
    assert summary["tokens"] == record["tokens"]
    assert summary["gpu_activity"] is False
    steps = attribution.steps.sort("start")
    assert steps["tid"].unique().to_list() == [record["thread"]]
    _within_brackets((steps["end"] - steps["start"]).to_list(), record["step_ns"], sum(STAGE_US.values()))
    for stage in summary["stages"]:
        ranges = attribution.stage_ranges.filter(pl.col("stage") == stage["stage"]).sort("start")
        durations = (ranges["end"] - ranges["start"]).to_list()
        _within_brackets(durations, record["stage_ns"][stage["stage"]], STAGE_US[stage["stage"]])
        assert stage["count"] == record["steps"]
        assert stage["cpu_ms"] == pytest.approx(sum(durations) / 1e6)
        assert stage["crit_ms"] == pytest.approx(stage["cpu_ms"], abs=1e-9)  # no GPU, no nesting
    step_ms = summary["step_ms"]["total"]
    assert summary["other_crit_ms"] == pytest.approx(step_ms - sum(s["cpu_ms"] for s in summary["stages"]))
    # The stage that took longest by the program's own clock (verify spins longest, but a loaded machine
    # may stretch any stage: the program's record, not the spin times, is what ddprof must agree with).
    assert summary["bound_by"] == max(record["stage_ns"], key=lambda stage: sum(record["stage_ns"][stage]))
    assert summary["tok_per_s"] == pytest.approx(record["tokens"] / summary["wall_s"])


def test_a_report_without_its_export_is_exported_with_the_local_nsys(capture, tmp_path):
    report, sqlite_path, _ = capture
    alone = tmp_path / report.name
    shutil.copy(report, alone)
    trace = load(alone)
    assert trace.source == alone.with_suffix(".sqlite") and trace.source.is_file()
    assert trace.ranges.height == load(sqlite_path).ranges.height


def test_cli_json_on_the_real_capture(capture):
    _, sqlite_path, record = capture
    done = subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", "breakdown", "--json",
                           str(sqlite_path)], capture_output=True, text=True, cwd=Path(__file__).parents[2],
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["steps"], summary["tokens"]) == (record["steps"], record["tokens"])
    assert [s["stage"] for s in summary["stages"]] == list(STAGES)


def test_ranges_left_open_at_exit_are_reported_not_dropped(tmp_path):
    _, sqlite_path, record = _capture(tmp_path, "--leave-open", "--steps", "2")
    with pytest.raises(DdprofError, match=r"2 unclosed and 0 cross-thread step/stage ranges"):
        attribute(load(sqlite_path))
    summary = breakdown(attribute(load(sqlite_path), drop_incomplete=True))
    assert summary["steps"] == record["steps"] == 2
    assert summary["dropped_ranges"] == {"unclosed": 2, "cross_thread": 0, "outside_step": 0}
