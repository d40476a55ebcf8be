"""A real sweep: the tiny model under nsys with the CPU heapq and the GPU builder (interpreted here),
then its dashboard in headless Chromium, where the drawn bars must equal `ddprof breakdown`'s shares.

Two captures of two short requests keep this to about a minute on the 2-core machine.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.attribution import OTHER
from ddprof.capture import PHASES as CAPTURE_PHASES
from ddprof.dashboards.headline import headline
from ddprof.dashboards.page import write_dashboard
from ddprof.dashboards.runs import load_runs
from ddprof.pipeline import PHASES
from ddprof.sweep import Grid, run_sweep
from tests.ddprof.browser import keep_artifact, open_page
from tests.ddprof.test_dashboard_browser import check_page

ROOT = Path(__file__).resolve().parents[2]
GRID = dict(concurrency=(2,), builders=("cpu", "gpu"), budgets=(4,), model="tiny", requests=2, max_new_tokens=4)
# What the page drew: every step-share trace's name, bars and heights, as the browser holds them.
DRAWN_SHARES = ("Array.from(document.getElementById('step-share').data, t => "
                "({name: t.name, x: Array.from(t.x), y: Array.from(t.y)}))")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    events = []
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TRITON_INTERPRET", raising=False)  # the capture sets it for the GPU builder's engine itself
        result = run_sweep(Grid(**GRID, out_dir=folder / "traces"), folder / "sweep.html",
                           on_capture=lambda index, total, request: events.append(("capture", index, total,
                                                                                   request.out.name)),
                           on_requests=lambda phase, done, total: events.append(("requests", phase, done, total)),
                           advance=lambda label: events.append(("dashboard", label)))
        interpret_after = os.environ.get("TRITON_INTERPRET")
    return folder, result, events, interpret_after


def test_every_grid_point_leaves_a_complete_capture(swept):
    folder, result, _, _ = swept
    names = ["chat-tiny-c2-cpu-b4", "chat-tiny-c2-gpu-b4"]
    assert sorted(p.name for p in (folder / "traces").iterdir()) == sorted(
        f"{name}{suffix}" for name in names for suffix in (".json", ".nsys-rep", ".sqlite"))
    for capture, name, builder in zip(result.captures, names, ("cpu", "gpu")):
        meta = json.loads(capture.json_path.read_text())
        assert capture.sqlite.stem == name
        assert (meta["builder"], meta["concurrency"], meta["budget"], meta["model"]) == (builder, 2, 4, "tiny")
    assert result.interpreted is True  # no CUDA here
    assert [run.label for run in result.runs] == ["CPU heapq", "GPU builder"]
    assert result.runs[1].interpreted_gpu_builder


def test_the_gpu_builder_ran_interpreted_and_the_environment_is_restored(swept):
    _, result, _, interpret_after = swept
    assert interpret_after is None
    gpu_run = result.runs[1]
    assert gpu_run.setting("builder") == "gpu" and gpu_run.setting("device").startswith("cpu")
    # Both builders build the same tree (bit-identical), so the decode is the same step for step: the
    # tokens each step emitted. The trained pair accepts drafts (fewer steps than the max_new_tokens - 1
    # that one token per step would take after prefill), so a wrong tree would change them.
    per_step = [run.attribution.steps.sort("start")["tokens"].to_list() for run in result.runs]
    assert per_step[0] == per_step[1] and len(per_step[0]) < GRID["max_new_tokens"] - 1


def test_progress_is_reported_per_capture_per_request_and_per_dashboard_phase(swept):
    _, _, events, _ = swept
    captures = [e for e in events if e[0] == "capture"]
    assert captures == [("capture", 0, 2, "chat-tiny-c2-cpu-b4"), ("capture", 1, 2, "chat-tiny-c2-gpu-b4")]
    first, second = events.index(captures[0]), events.index(captures[1])
    all_done = ("requests", "serving", GRID["requests"], GRID["requests"])
    assert all_done in events[first:second] and all_done in events[second:]
    for part in (events[first:second], events[second:]):  # each capture's phases, in order
        named = [e[1] for e in part if e[0] == "requests"]
        assert list(dict.fromkeys(named)) == list(CAPTURE_PHASES)
    phases = [e[1] for e in events if e[0] == "dashboard"]
    assert len(phases) == 2 * PHASES + 1 and phases[-1].startswith("writing ")


def _breakdown_json(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", "breakdown", str(path),
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_dashboard_draws_the_breakdowns_shares_in_a_real_browser(swept, tmp_path):
    folder, result, _, _ = swept
    report = open_page(result.dashboard, tmp_path / "dashboard-real-sweep.png", evaluate={"shares": DRAWN_SHARES})
    check_page(report, result.runs)
    keep_artifact(report.screenshot)
    assert report.headline == headline(result.runs)
    drawn = {trace["name"]: dict(zip(trace["x"], trace["y"])) for trace in report.values["shares"]}
    for capture, bar in zip(result.captures, ("CPU heapq", "GPU builder")):
        summary = _breakdown_json(capture.sqlite)
        assert drawn[OTHER][bar] == pytest.approx(summary["other_crit_ms"] / summary["step_ms"]["total"], rel=1e-9)
        for stage in summary["stages"]:
            assert drawn[stage["stage"]][bar] == pytest.approx(stage["crit_share"], rel=1e-12, abs=1e-15)
        assert report.headline.count(f"{summary['bound_by']} bounds tok/s") == 1


def test_dashboard_of_a_report_and_a_trace_without_metadata(swept, tmp_path):
    """`ddprof dashboard` on the sweep's files: one given as its .nsys-rep, one stripped of its JSON."""
    _, result, _, _ = swept
    cpu, gpu = result.captures
    bare = tmp_path / "bare.sqlite"
    shutil.copy(gpu.sqlite, bare)
    runs = load_runs([cpu.report, bare])
    assert [run.label for run in runs] == ["CPU heapq", "bare"]
    assert runs[0].source == cpu.report and runs[0].meta == cpu.meta
    page = write_dashboard(runs, tmp_path / "mixed.html")
    report = open_page(page, tmp_path / "dashboard-mixed.png")
    check_page(report, runs)
    assert "bare: no bare.json beside the trace" in page.read_text()
