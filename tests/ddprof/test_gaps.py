"""ddprof gaps: host time outside CUDA calls, on a trace with known answers and on a real H200 export."""

import json
from pathlib import Path

import numpy as np
import pytest

from ddprof.gaps import host_gaps
from ddprof.pipeline import analyse
from engine.stages import STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export
from tests.ddprof.test_breakdown_cli import ddprof
from tests.ddprof.test_attribution_reference import pieces, random_export
from tests.ddprof.test_graphs import CASES, running_ahead

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


@pytest.mark.parametrize("schema, mode", CASES)
def test_gaps_of_graph_launching_stages_whose_work_runs_after_their_ranges(schema, mode, tmp_path):
    """tests/ddprof/test_graphs.py's `running_ahead`: draft and verify each spend [2, 4) of their
    10 ns in a cudaGraphLaunch whose graph runs after both ranges ended. A gap's next kernel is what
    the next launch ran first: the graph's first node, or its whole-graph record."""
    trace, attribution, _ = analyse(running_ahead(schema, mode).write(tmp_path / "run.sqlite"))
    result = host_gaps(trace, attribution, min_ms=NS, top=10)
    got = {s["stage"]: tuple(round(s[key] / NS) for key in ("host_ms", "in_calls_ms", "outside_calls_ms"))
           for s in result["stages"] if s["host_ms"]}
    assert got == {"draft": (10, 2, 8), "verify": (10, 2, 8), "accept": (10, 0, 10), "sampling": (70, 63, 7)}
    first = {"node": "graph{}.node0", "graph": "[graph {}]"}[mode].format
    longest = [(g["stage"], round(g["at_ms"] / NS), round(g["ms"] / NS), g["next_call"], g["next_kernel"])
               for g in result["longest"]]
    assert longest == [("accept", 20, 10, "(into sampling)", None), ("draft", 4, 6, "(into verify)", first(2)),
                       ("verify", 14, 6, "(into accept)", None), ("sampling", 95, 5, "(the range ends)", None),
                       ("draft", 0, 2, "cudaGraphLaunch", first(1)), ("verify", 10, 2, "cudaGraphLaunch", first(2)),
                       ("sampling", 30, 2, "cudaStreamSynchronize", None)]


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
    for args, message in (((path,), "no CUDA runtime calls in this trace (a host-only capture"),
                          ((path,), "capture on a CUDA machine for gaps, or read this trace's host time per stage "
                                    "with ddprof breakdown"), ((path, "--top", "0"), "--top must be"),
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


def brute_force(trace, attribution, min_ns: int) -> tuple[dict, list[int]]:
    """Per stage (in-call ns, outside ns, gaps >= min_ns, their ns) and the sorted gap lengths,
    walking every ns of every thread (a piece at a time): the innermost range (latest start, then
    earliest end) owns it."""
    per_stage = {stage: [0, 0, 0, 0] for stage in STAGES}
    lengths = []
    for (pid, tid), ranges in attribution.stage_ranges.group_by("pid", "tid"):
        mine = ranges.rows(named=True)
        calls = trace.runtime.filter((trace.runtime["pid"] == pid) & (trace.runtime["tid"] == tid)).rows(named=True)
        run = None  # (stage, step, length) of the gap being walked
        bounds = [x for r in (*mine, *calls) for x in (r["start"], r["end"])]
        for t, n in pieces(min(r["start"] for r in mine), max(r["end"] for r in mine) + 1, bounds):
            covering = [r for r in mine if r["start"] <= t < r["end"]]
            owner = max(covering, key=lambda r: (r["start"], -r["end"])) if covering else None
            outside = owner is not None and not any(c["start"] <= t < c["end"] for c in calls)
            key = (owner["stage"], owner["step_id"]) if outside else None
            if run and run[:2] != key:
                lengths.append(run[2])
                if run[2] >= min_ns:
                    per_stage[run[0]][2] += 1
                    per_stage[run[0]][3] += run[2]
                run = None
            if owner is not None:
                per_stage[owner["stage"]][1 if outside else 0] += n
            if outside:
                run = (*key, run[2] + n) if run else (*key, n)
    return per_stage, sorted(lengths, reverse=True)


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_on_random_exports(seed, tmp_path):
    rng = np.random.default_rng(seed)
    path = random_export(rng, "2025.3" if seed % 2 else "2022.4").write(tmp_path / "random.sqlite")
    trace, attribution, _ = analyse(path, drop_incomplete=True)  # stage ranges across a step's bounds
    if trace.runtime.height == 0:
        pytest.skip("this draw made no CUDA calls")
    min_ns = int(rng.integers(1, 6))
    result = host_gaps(trace, attribution, min_ms=min_ns * NS, top=1000)
    want, lengths = brute_force(trace, attribution, min_ns)
    for row in result["stages"]:
        got = (round(row["in_calls_ms"] / NS), round(row["outside_calls_ms"] / NS), row["gaps"],
               round(row["gaps_ms"] / NS))
        assert got == tuple(want[row["stage"]]), row["stage"]
    assert [round(g["ms"] / NS) for g in result["longest"]] == [n for n in lengths if n >= min_ns]


def test_a_gap_never_spans_two_steps(tmp_path):
    export = Export()
    for start in (0, 100):  # back to back, verify last in the first step and first in the second
        export.range(STEP, start, start + 100)
        export.range("verify", start, start + 100)
    export.kernel(250, 260, launch=(200, 210), name="k")
    export.mark(TOKENS_MARK, 200, 1)
    trace, attribution, _ = analyse(export.write(tmp_path / "steps.sqlite"))
    result = host_gaps(trace, attribution, min_ms=NS, top=5)
    assert [(g["step_id"], round(g["ms"] / NS)) for g in result["longest"]] == [(0, 100), (1, 100)]
