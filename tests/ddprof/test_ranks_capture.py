"""A real 2-rank expert-parallel capture (gloo on this CPU, under nsys 2022.4), read by ddprof:
one report holding both ranks' processes, and the per-rank reports cut out of it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.capture import CaptureRequest, capture
from ddprof.ranks import analyse_ranks, processes
from engine.stages import STAGES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ranked_capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks") / "run"
    return capture(CaptureRequest(workload="chat", concurrency=3, out=out, model="tiny", requests=3,
                                  max_new_tokens=12, seed=1, ranks=2))


def test_the_report_holds_both_ranks_with_the_engines_steps(ranked_capture):
    meta = ranked_capture.meta
    assert meta["ranks"] == 2 and meta["trace_steps"] == 2 * meta["steps"]
    found = processes([ranked_capture.sqlite])
    assert [p.rank for p in found] == [0, 1] and len({p.pid for p in found}) == 2
    s = analyse_ranks(found).summary
    assert s["step_counts"] == [meta["steps"]] * 2 and s["matched_steps"] == meta["steps"]
    assert s["critical_path"]["tokens"] == meta["tokens"]
    for rank in s["ranks"]:
        assert rank["tokens"] == meta["tokens"]  # every rank commits the same tokens
        comm = {row["stage"]: row["comm_ms"] for row in rank["stages"]}
        assert comm["verify"] > 0  # the MoE's all-reduce, nested in verify
        assert all(comm[stage] == 0 for stage in STAGES if stage != "verify")  # the drafter is dense
        verify = next(row for row in rank["stages"] if row["stage"] == "verify")
        assert comm["verify"] < verify["cpu_ms"]
    assert sum(row["slowest_steps"] for row in s["stragglers"]) == meta["steps"]


def test_breakdown_and_gaps_of_the_ranks(ranked_capture):
    def ddprof(*args):
        return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *map(str, args)],
                              capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    done = ddprof("breakdown", ranked_capture.sqlite, "--json")
    assert done.returncode == 0, done.stderr
    assert [r["rank"] for r in json.loads(done.stdout)["ranks"]] == [0, 1]
    gaps = ddprof("gaps", ranked_capture.sqlite)
    assert gaps.returncode == 2 and "no CUDA runtime calls" in gaps.stderr and gaps.stderr.count("\n") == 1
