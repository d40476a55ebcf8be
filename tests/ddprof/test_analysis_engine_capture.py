"""breakdown and compare on a real capture of the engine (`ddprof capture`, tiny model, CPU)."""

import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.capture import CaptureRequest, capture
from ddprof.compare import compare
from ddprof.load import load
from engine.stages import STAGES


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine") / "run"
    result = capture(CaptureRequest(workload="chat", concurrency=2, out=out, model="tiny", requests=2,
                                    max_new_tokens=6, seed=5))
    attribution = attribute(load(result.sqlite))
    return result, attribution, breakdown(attribution)


def test_breakdown_counts_what_the_engine_counted(engine_run):
    result, _, summary = engine_run
    assert summary["steps"] == result.meta["steps"] > 0
    assert summary["tokens"] == result.meta["tokens"] > 0
    for stage in summary["stages"]:
        assert stage["count"] == summary["steps"], stage["stage"]  # six stage ranges in every step
        assert stage["cpu_ms"] > 0
        if not summary["gpu_activity"]:  # host-only: a stage owns at most the time its ranges cover
            assert stage["crit_ms"] == pytest.approx(stage["cpu_ms"])
    shares = [s["crit_share"] for s in summary["stages"]] + [summary["other_crit_share"]]
    assert sum(shares) == pytest.approx(1.0)
    assert summary["bound_by"] in STAGES
    assert summary["tok_per_s"] == pytest.approx(summary["tokens"] / summary["wall_s"])


def test_a_run_compared_with_itself_changes_nothing(engine_run):
    _, attribution, summary = engine_run
    result = compare(attribution, attribution, summary, summary, resamples=200)
    assert result["tok_per_s_ratio"] == pytest.approx(1.0)
    for row in result["stages"]:
        assert row["crit_ms_per_step_delta"] == pytest.approx(0.0)
        low, high = row["crit_ms_per_step_delta_ci"]
        assert low <= 0.0 <= high
