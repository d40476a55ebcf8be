"""breakdown and compare on a real capture of the engine (`ddprof capture`, tiny model, CPU)."""

import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import OTHER, attribute
from ddprof.capture import CaptureRequest, capture
from ddprof.compare import compare
from ddprof.load import load
from engine.stages import STAGES


def captured(tmp_path_factory, budget=None, max_new_tokens=6):
    out = tmp_path_factory.mktemp("engine") / "run"
    result = capture(CaptureRequest(workload="chat", concurrency=2, out=out, model="tiny", requests=2,
                                    max_new_tokens=max_new_tokens, seed=5, budget=budget))
    attribution = attribute(load(result.sqlite))
    return result, attribution, breakdown(attribution)


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    return captured(tmp_path_factory)


@pytest.fixture(scope="module")
def bigger_tree_run(tmp_path_factory):
    return captured(tmp_path_factory, budget=16, max_new_tokens=8)


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


def crit_ms_per_step(summary: dict, owner: str) -> float:
    if owner == OTHER:
        return summary["other_crit_ms"] / summary["steps"]
    return next(s["crit_ms"] for s in summary["stages"] if s["stage"] == owner) / summary["steps"]


def test_compare_of_two_captures_agrees_with_their_breakdowns(engine_run, bigger_tree_run):
    """compare's per-step means come from its own step matrix; breakdown's totals from the same
    attribution summed another way: on two real, different runs they must agree."""
    (_, a, summary_a), (_, b, summary_b) = engine_run, bigger_tree_run
    result = compare(a, b, summary_a, summary_b, resamples=200)
    assert result["a"]["steps"] == summary_a["steps"] and result["b"]["steps"] == summary_b["steps"]
    assert result["tok_per_s_ratio"] == pytest.approx(summary_b["tok_per_s"] / summary_a["tok_per_s"])
    assert result["bound_by_changed"] == (summary_a["bound_by"] != summary_b["bound_by"])
    for row in result["stages"]:
        want_a, want_b = crit_ms_per_step(summary_a, row["stage"]), crit_ms_per_step(summary_b, row["stage"])
        assert row["a_crit_ms_per_step"] == pytest.approx(want_a, rel=1e-9, abs=1e-12), row["stage"]
        assert row["b_crit_ms_per_step"] == pytest.approx(want_b, rel=1e-9, abs=1e-12), row["stage"]
        assert row["crit_ms_per_step_delta"] == pytest.approx(want_b - want_a, rel=1e-9, abs=1e-12)
    assert any(row["crit_ms_per_step_delta"] != 0 for row in result["stages"])
