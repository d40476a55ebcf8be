"""The sweep's grid: points, names, machine-sized defaults and the one-line errors (no capture runs here)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.errors import DdprofError
from ddprof.sweep import CPU_DEFAULTS, GPU_DEFAULTS, Grid, defaults, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def grid(**changes) -> Grid:
    return Grid(**{**CPU_DEFAULTS, "out_dir": Path("out"), **changes})


def test_points_cover_the_grid_budget_major_with_the_builders_side_by_side():
    points = grid(concurrency=(1, 4), builders=("cpu", "gpu"), budgets=(8, 16)).points()
    assert [(p.budget, p.concurrency, p.builder) for p in points] == [
        (8, 1, "cpu"), (8, 1, "gpu"), (8, 4, "cpu"), (8, 4, "gpu"),
        (16, 1, "cpu"), (16, 1, "gpu"), (16, 4, "cpu"), (16, 4, "gpu")]
    assert points[0].out == Path("out/chat-tiny-c1-cpu-b8")
    assert len({p.out for p in points}) == len(points)
    assert {(p.workload, p.model, p.requests, p.max_new_tokens, p.seed) for p in points} == {
        ("chat", "tiny", CPU_DEFAULTS["requests"], CPU_DEFAULTS["max_new_tokens"], 0)}


def test_defaults_are_sized_for_the_machine():
    assert defaults(cuda=False) == CPU_DEFAULTS and defaults(cuda=True) == GPU_DEFAULTS
    cpu, gpu = grid(), Grid(**GPU_DEFAULTS)
    assert set(cpu.builders) == set(gpu.builders) == {"cpu", "gpu"}
    # The CPU grid stays small (the GPU builder runs interpreted there): a smaller model, fewer and shorter runs.
    assert (cpu.model, gpu.model) == ("tiny", "small")
    assert len(cpu.points()) < len(gpu.points())
    assert cpu.requests * cpu.max_new_tokens * 16 <= gpu.requests * gpu.max_new_tokens


@pytest.mark.parametrize("changes, message", [
    (dict(concurrency=()), "sweep: --concurrency needs at least one value"),
    (dict(budgets=(8, 8)), "sweep: --budget lists a value twice (8,8)"),
    (dict(builders=("cpu", "fpga")), "sweep: unknown tree builder 'fpga'; choose from cpu, gpu"),
    (dict(concurrency=(2, 0)), "sweep: --concurrency must be at least 1 (got 0)"),
    (dict(requests=0), "sweep: --requests must be at least 1 (got 0)"),
    (dict(max_new_tokens=-1), "sweep: --max-new-tokens must be at least 1 (got -1)"),
])
def test_a_bad_grid_is_refused_before_anything_runs(changes, message):
    with pytest.raises(DdprofError) as error:
        grid(**changes)
    assert str(error.value) == message


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,two"], "ddprof: error: --concurrency '1,two': expected comma-separated whole numbers, e.g. 1,2,4"),
    (["--budget", "0"], "ddprof: error: sweep: --budget must be at least 1 (got 0)"),
    (["--builder", "cpu,cpu"], "ddprof: error: sweep: --builder lists a value twice (cpu,cpu)"),
])
def test_cli_errors_are_one_line_and_leave_no_files(tmp_path, args, message):
    done = subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", "sweep", *args,
                           "--out-dir", str(tmp_path / "traces"), "--dashboard", str(tmp_path / "page.html")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip() == message
    assert list(tmp_path.iterdir()) == []


def test_a_dashboard_path_that_cannot_be_made_is_refused_before_any_capture(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the dashboard's folder should go")
    with pytest.raises(DdprofError, match=f"^{blocker / 'pages'}: cannot create the dashboard's folder"):
        run_sweep(grid(out_dir=tmp_path / "traces"), blocker / "pages" / "sweep.html")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no capture ran


def test_the_page_title_says_what_was_swept():
    assert grid(concurrency=(1, 8), budgets=(8, 32)).title() == (
        "ddprof sweep: chat on tiny, concurrency 1,8 x builder cpu,gpu x budget 8,32")
