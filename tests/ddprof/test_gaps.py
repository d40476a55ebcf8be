"""ddprof gaps: host time outside CUDA calls, on a trace with known answers and on a real H200 export."""

import json
from pathlib import Path

import pytest

from ddprof.gaps import host_gaps
from ddprof.pipeline import analyse
from engine.stages import STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export
from tests.ddprof.test_breakdown_cli import ddprof

H200_EXPORT = Path(__file__).resolve().parents[1] / "data" / "h200_nsys2025_small_gpu_builder.sqlite"
NS = 1e-6  # one ns in ms


def known() -> Export:
    """One step [0, 200). draft [0, 100): calls [10, 20) (launches k1), [60, 65) (a module load),
    [70, 72) (launches k2). verify [100, 200) with accept [120, 140) nested in it; a call [150, 165)
    launches k3. Gaps: draft [0, 10) [20, 60) [65, 70) [72, 100); verify [100, 120) [140, 150)
    [165, 200); accept [120, 140)."""
    export = Export()
    export.range(STEP, 0, 200)
    export.range("draft", 0, 100)
    export.range("verify", 100, 200)
    export.range("accept", 120, 140)
    export.kernel(30, 40, launch=(10, 20), name="k1")
    export.runtime_call("cuLibraryLoadData", 60, 65)
    export.kernel(80, 90, launch=(70, 72), name="k2")
    export.kernel(170, 180, launch=(150, 165), name="k3")
    export.mark(TOKENS_MARK, 200, 1)
    return export


def test_known_gaps(tmp_path):
    trace, attribution, _ = analyse(known().write(tmp_path / "known.sqlite"))
    result = host_gaps(trace, attribution, min_ms=20 * NS, top=4)
    got = {s["stage"]: tuple(round(s[key] / NS) for key in ("host_ms", "in_calls_ms", "outside_calls_ms", "gaps_ms"))
           + (s["gaps"],) for s in result["stages"] if s["host_ms"]}
    # The innermost range owns each ns: verify's host time leaves out the nested accept.
    assert got == {"draft": (100, 17, 83, 68, 2), "verify": (80, 15, 65, 55, 2), "accept": (20, 0, 20, 20, 1)}
    longest = [(g["stage"], round(g["at_ms"] / NS), round(g["ms"] / NS), g["next_call"], g["next_kernel"])
               for g in result["longest"]]
    assert longest == [("draft", 20, 40, "cuLibraryLoadData", "k2"), ("verify", 165, 35, "(the range ends)", None),
                       ("draft", 72, 28, "(into verify)", "k3"), ("verify", 100, 20, "(into accept)", "k3")]


def test_a_thread_without_calls_and_a_stage_made_of_nested_ranges(tmp_path):
    """Thread 2 runs a stage and no CUDA call (all of it one gap); on thread 1 a stage map makes
    verify of two nested ranges, whose call-free stretch is one gap, as the breakdown counts it once."""
    export = Export()
    export.range(STEP, 0, 200)
    export.range("fwd", 100, 200)
    export.range("attn", 120, 140)
    export.kernel(170, 180, launch=(195, 198), name="k3")
    export.range(STEP, 0, 200, tid=2)
    export.range("build", 100, 150, tid=2)
    export.mark(TOKENS_MARK, 200, 1)
    (tmp_path / "map.json").write_text(json.dumps({"ranges": {"step": "step", "fwd": "verify", "attn": "verify",
                                                               "build": "tree_build"}}))
    done = ddprof("gaps", export.write(tmp_path / "nested.sqlite"), "--stage-map", tmp_path / "map.json",
                  "--min-ms", "0.00003", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    longest = [(g["stage"], round(g["at_ms"] / NS), round(g["ms"] / NS), g["next_call"]) for g in result["longest"]]
    assert longest == [("verify", 100, 95, "cudaLaunchKernel"), ("tree_build", 100, 50, "(the range ends)")]


def test_real_h200_export_splits_each_stage_host_time():
    trace, attribution, summary = analyse(H200_EXPORT)
    result = host_gaps(trace, attribution, min_ms=0.05, top=5)
    for s, row in zip(summary["stages"], result["stages"]):
        assert row["stage"] == s["stage"] and row["host_ms"] == pytest.approx(s["cpu_ms"])
        assert 0 < row["in_calls_ms"] < row["host_ms"] and row["gaps_ms"] <= row["outside_calls_ms"]
    lengths = [g["ms"] for g in result["longest"]]
    assert len(lengths) == 5 and lengths == sorted(lengths, reverse=True) and lengths[-1] >= 0.05
    assert all(g["stage"] in STAGES for g in result["longest"])


def test_cli_table_and_json(tmp_path):
    path = known().write(tmp_path / "known.sqlite")
    done = ddprof("gaps", path, "--min-ms", "0.00002", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["longest"][0]["next_kernel"] == "k2"
    table = ddprof("gaps", path, "--min-ms", "0.00002")
    assert table.returncode == 0 and "cuLibraryLoadData" in table.stdout and "k2" in table.stdout


def test_bad_input_is_one_line(tmp_path):
    host_only = Export()
    host_only.range(STEP, 0, 100)
    host_only.range("verify", 10, 60)
    path = host_only.write(tmp_path / "host.sqlite")
    for args, message in (((path,), "no CUDA runtime calls"), ((path, "--top", "0"), "--top must be"),
                          ((path, "--min-ms", "-1"), "--min-ms must be")):
        done = ddprof("gaps", *args)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


def test_dropped_ranges_are_counted_in_the_output(tmp_path):
    export = known()
    export.range(STEP, 300, None)  # never closed
    path = export.write(tmp_path / "unclosed.sqlite")
    assert ddprof("gaps", path).returncode == 2
    done = ddprof("gaps", path, "--drop-incomplete")
    assert done.returncode == 0 and "left out 1 unclosed" in done.stdout, done.stdout + done.stderr
    assert json.loads(ddprof("gaps", path, "--drop-incomplete", "--json").stdout)["dropped_ranges"]["unclosed"] == 1
