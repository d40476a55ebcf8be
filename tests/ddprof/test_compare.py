"""`ddprof compare`: per-stage deltas per step with bootstrap CIs, and the tok/s ratio."""

import json

import numpy as np
import pytest

from ddprof.analysis import breakdown, stage_row
from ddprof.attribution import OWNERS, attribute
from ddprof.compare import compare
from ddprof.load import load
from engine.stages import STEP, TOKENS_MARK
from tests.ddprof.exports import Export
from tests.ddprof.test_breakdown_cli import ddprof
from tests.ddprof.test_gaps import H200_EXPORT


def run(tree_build_ns: list[int], tmp_path, name: str, verify_ns: int = 20, gap: int = 10):
    """Serial steps of tree_build then verify (host only), 2 tokens each."""
    export = Export()
    t = 0
    for tree in tree_build_ns:
        export.range(STEP, t, t + tree + verify_ns)
        export.range("tree_build", t, t + tree)
        export.range("verify", t + tree, t + tree + verify_ns)
        export.mark(TOKENS_MARK, t + tree + verify_ns, 2)
        t += tree + verify_ns + gap
    attribution = attribute(load(export.write(tmp_path / f"{name}.sqlite")))
    return attribution, breakdown(attribution)


def row(result: dict, stage: str) -> dict:
    return next(r for r in result["stages"] if r["stage"] == stage)


def test_constant_steps_give_exact_deltas_and_degenerate_intervals(tmp_path):
    a, summary_a = run([60] * 5, tmp_path, "a")
    b, summary_b = run([10] * 8, tmp_path, "b")
    result = compare(a, b, summary_a, summary_b, resamples=200)
    tree = row(result, "tree_build")
    assert tree["a_crit_ms_per_step"] == pytest.approx(60e-6) and tree["b_crit_ms_per_step"] == pytest.approx(10e-6)
    assert tree["crit_ms_per_step_delta"] == pytest.approx(-50e-6)
    assert tree["crit_ms_per_step_delta_ci"] == pytest.approx([-50e-6, -50e-6])
    assert row(result, "verify")["crit_ms_per_step_delta"] == pytest.approx(0)
    assert tree["gpu_ms_per_step_delta"] is None  # neither run has GPU activity
    assert tree["a_gpu_ops_per_step"] is None and tree["sync_calls_per_step_delta"] is None
    # A: 5 steps of 80 ns + 4 gaps of 10 = 440 ns for 10 tokens; B: 8 of 30 + 7 of 10 = 310 ns for 16.
    assert result["tok_per_s_ratio"] == pytest.approx((16 / 310) / (10 / 440))
    assert result["tok_per_s_ratio_ci"] == pytest.approx([result["tok_per_s_ratio"]] * 2)
    assert [r["stage"] for r in result["stages"]] == list(OWNERS)
    assert tree["a_crit_share"] == pytest.approx(60 / 80) and tree["b_crit_share"] == pytest.approx(10 / 30)


def test_interval_covers_the_true_difference_of_noisy_runs(tmp_path):
    rng = np.random.default_rng(3)
    a, summary_a = run(rng.integers(50, 151, 150).tolist(), tmp_path, "a")   # mean 100
    b, summary_b = run(rng.integers(40, 141, 120).tolist(), tmp_path, "b")   # mean 90
    result = compare(a, b, summary_a, summary_b, resamples=2000, seed=1)
    tree = row(result, "tree_build")
    low, high = tree["crit_ms_per_step_delta_ci"]
    assert low < tree["crit_ms_per_step_delta"] < high
    assert low < -10e-6 < high  # the true difference of the two means
    assert high - low < 20e-6   # and the interval is informative at this size
    low, high = result["tok_per_s_ratio_ci"]
    assert low < result["tok_per_s_ratio"] < high
    again = compare(a, b, summary_a, summary_b, resamples=2000, seed=1)
    assert again == result  # seeded: reproducible


def test_cli_compare_json_and_table(tmp_path):
    run([60] * 4, tmp_path, "a")
    run([10] * 4, tmp_path, "b")
    done = ddprof("compare", tmp_path / "a.sqlite", tmp_path / "b.sqlite", "--json", "--resamples", "100")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["a"]["source"].endswith("a.sqlite") and result["b"]["bound_by"] == "verify"
    assert result["bound_by_changed"] is True and result["resamples"] == 100
    table = ddprof("compare", tmp_path / "a.sqlite", tmp_path / "b.sqlite", "--resamples", "100")
    assert table.returncode == 0 and "tok/s ratio B/A" in table.stdout and "tree_build" in table.stdout


def test_cli_compare_bad_input(tmp_path):
    run([60] * 2, tmp_path, "a")
    done = ddprof("compare", tmp_path / "a.sqlite", tmp_path / "missing.sqlite")
    assert done.returncode == 2 and "missing.sqlite: no such file" in done.stderr
    run([10] * 2, tmp_path, "b")
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    for options, message in ((["--resamples", "0"], "--resamples must be between 1 and 1,000,000 (got 0)"),
                             (["--resamples", "10000000000"], "--resamples must be between 1 and 1,000,000"),
                             (["--seed", "-1"], "--seed must be 0 or more (got -1)")):
        done = ddprof("compare", a, b, *options)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    done = ddprof("compare", a, tmp_path / "." / "a.sqlite")
    assert done.returncode == 2 and "A and B are the same trace" in done.stderr


def test_cli_tables_are_whole_when_piped(tmp_path):
    """Piped (as here: captured), rich would cut cells at 80 columns with an ellipsis."""
    run([60] * 4, tmp_path, "a-run-with-a-long-name-" + "x" * 60)
    run([10] * 4, tmp_path, "b")
    long_name = tmp_path / ("a-run-with-a-long-name-" + "x" * 60 + ".sqlite")
    done = ddprof("compare", long_name, tmp_path / "b.sqlite")
    assert done.returncode == 0 and f"A: {long_name} · 4 steps" in done.stdout
    shares = [line.split()[-1] for line in done.stdout.splitlines() if line.strip().startswith(("draft", "verify"))]
    assert len(shares) == 2 and all(share.endswith("%") for share in shares)  # "18.4% → 2.…" before


def test_ops_and_waits_per_step_on_a_real_h200_export():
    attribution = attribute(load(H200_EXPORT))
    summary = breakdown(attribution)
    result = compare(attribution, attribution, summary, summary, resamples=50)
    for r in result["stages"][:-1]:  # `other` launches nothing
        stage = stage_row(summary, r["stage"])
        assert r["a_gpu_ops_per_step"] == pytest.approx(stage["gpu_ops"] / summary["steps"])
        assert r["b_sync_calls_per_step"] == pytest.approx(stage["sync_calls"] / summary["steps"])
        assert r["gpu_ops_per_step_delta"] == 0
    assert all(r["a_gpu_ops_per_step"] > 0 for r in result["stages"][:-1])
