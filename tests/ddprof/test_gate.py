"""`ddprof compare --fail-if`: the regression gate on real exports and their slowed copies.

A slowed copy is the export itself with time inserted at the end of a stage's ranges: every
timestamp at or after the insertion point (NVTX, runtime calls, GPU ops, the trace's end) moves
later, so that stage, its steps and the run's tok/s change and nothing else does.
"""

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.compare import compare
from ddprof.errors import DdprofError
from ddprof.gate import MEASURES, TOK_PER_S, parse_rule
from ddprof.load import load
from engine.stages import DOMAIN
from tests.ddprof.exports import NAME_ENCODINGS, example
from tests.ddprof.test_breakdown_cli import ddprof
from tests.ddprof.test_compare import run
from tests.ddprof.test_gaps import H200_EXPORT

FIXTURE_2025 = Path(__file__).resolve().parents[1] / "data" / "ddtree_nsys2025_schema.sqlite"
GPU_FIELDS = ("gpu_ms", "crit_gpu_ms", "wait_ms", "busy_ms", "gpu_ops", "graph_launches", "sync_calls")


def slowed_copy(source: Path, target: Path, stage: str, extra_ns) -> Path:
    """A copy of `source` with extra_ns[k] ns inserted at the end of the k-th `stage` range."""
    ends = (load(source).ranges.filter((pl.col("name") == stage) & (pl.col("domain") == DOMAIN))
            .sort("start")["end"].to_list())
    shutil.copyfile(source, target)
    with sqlite3.connect(target) as db:
        db.execute("CREATE TEMP TABLE shift (at INTEGER PRIMARY KEY, total INTEGER)")
        db.executemany("INSERT INTO shift VALUES (?, ?)", zip(ends, np.cumsum(extra_ns).tolist()))
        moved = "coalesce((SELECT total FROM shift WHERE at <= {0} ORDER BY at DESC LIMIT 1), 0)"
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")} & {"start", "end"}
            if columns:
                db.execute(f"UPDATE {table} SET " + ", ".join(f'"{c}" = "{c}" + {moved.format(c)}' for c in columns))
        db.execute(f"UPDATE ANALYSIS_DETAILS SET duration = duration + {sum(extra_ns)}, "
                   f"stopTime = stopTime + {sum(extra_ns)}")
    return target


def verdicts(path_a: Path, path_b: Path, rules: list[str], resamples: int = 2000) -> list[dict]:
    runs = [attribute(load(path)) for path in (path_a, path_b)]
    summaries = [breakdown(r) for r in runs]
    return compare(*runs, *summaries, resamples=resamples, fail_if=[parse_rule(r) for r in rules])["verdicts"]


def _every_rule(gpu: bool) -> list[str]:
    fields = [f for f in (TOK_PER_S, *MEASURES) if gpu or f.partition(".")[2] not in GPU_FIELDS]
    return [f"{field} {op} {threshold}" for field in fields for op, threshold in (("<", "-3%"), (">", "+3%"))]


@pytest.mark.parametrize("names", NAME_ENCODINGS)
def test_a_trace_against_itself_never_fails_on_any_field(tmp_path, names):
    for source in (H200_EXPORT, FIXTURE_2025, example("2022.4", names).write(tmp_path / "example.sqlite")):
        copy = tmp_path / "copy.sqlite"
        shutil.copyfile(source, copy)
        found = verdicts(source, copy, _every_rule(gpu=True), resamples=500)
        assert len(found) == 2 * (1 + len(MEASURES))
        assert not [v["rule"] for v in found if v["regression"]], source
        assert all(v["change_pct"] == 0 for v in found)


def test_a_host_only_trace_against_itself_passes_every_field_it_knows(tmp_path):
    host_only = run([60, 80, 70, 90] * 5, tmp_path, "a")[0].source
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(host_only, copy)
    assert not [v for v in verdicts(host_only, copy, _every_rule(gpu=False)) if v["regression"]]


def test_a_slowed_copy_fails_naming_the_stage_and_exit_code_1(tmp_path):
    slowed = slowed_copy(H200_EXPORT, tmp_path / "slowed.sqlite", "verify", [40_000_000] * 6)  # +40 ms a step
    rules = ["tok_per_s < -3%", "verify.crit_ms > +5%", "verify.cpu_ms > +5%", "draft.crit_ms > +5%",
             "tree_build.gpu_ms > +5%"]
    done = ddprof("compare", H200_EXPORT, slowed, "--resamples", "500", *(f"--fail-if={r}" for r in rules))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and all(line.startswith("ddprof: regression: ") for line in lines)
    assert "verify.crit_ms changed +" in lines[0] and "'verify.crit_ms > +5%'" in lines[0]
    assert "verify.cpu_ms" in lines[1]
    assert "REGRESSION" in done.stdout and "--fail-if" in done.stdout
    as_json = ddprof("compare", H200_EXPORT, slowed, "--resamples", "500", "--json", *(f"--fail-if={r}" for r in rules))
    assert as_json.returncode == 1
    result = json.loads(as_json.stdout)
    by_field = {v["field"]: v for v in result["verdicts"]}
    assert result["regressions"] == 2 and [v["regression"] for v in result["verdicts"]] == [
        False, True, True, False, False]
    verify = by_field["verify.crit_ms"]
    assert verify["b"] - verify["a"] == pytest.approx(40, rel=1e-3)  # ms per step, what was inserted
    assert verify["change_ci_pct"][0] > 5 and verify["change_pct"] == pytest.approx(100 * 40 / verify["a"], rel=1e-3)
    assert by_field["draft.crit_ms"]["change_pct"] == 0
    assert by_field[TOK_PER_S]["change_pct"] < -3  # slower, but 6 steps leave its interval wide
    assert by_field[TOK_PER_S]["change_ci_pct"][1] > -3


def test_a_small_noisy_difference_inside_the_interval_passes(tmp_path):
    """One step's verify 4 ms slower: +2% per step on average, past a +1% rule as a point
    estimate, but the interval reaches below it, so no regression."""
    slowed = slowed_copy(H200_EXPORT, tmp_path / "noisy.sqlite", "verify", [0, 0, 4_000_000, 0, 0, 0])
    (verify,) = verdicts(H200_EXPORT, slowed, ["verify.crit_ms > +1%"])
    assert verify["change_pct"] > 1 and verify["change_ci_pct"][0] < 1
    assert verify["regression"] is False
    done = ddprof("compare", H200_EXPORT, slowed, "--fail-if", "verify.crit_ms > +1%", "--resamples", "500")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "pass" in done.stdout


def test_a_regression_on_many_steps_is_found_when_small(tmp_path):
    """The interval narrows with the number of steps: a 4% slower tree_build over 300 noisy steps
    fails a +2% rule, and passes a +6% one."""
    rng = np.random.default_rng(0)
    base = rng.integers(900, 1100, 300)
    a, summary_a = run(base.tolist(), tmp_path, "a")
    b, summary_b = run((base * 1.04).astype(int).tolist(), tmp_path, "b")
    found = compare(a, b, summary_a, summary_b, fail_if=[parse_rule("tree_build.crit_ms > +2%"),
                                                         parse_rule("tree_build.crit_ms > +6%")])["verdicts"]
    assert [v["regression"] for v in found] == [True, False]


@pytest.mark.parametrize("rule, message", [
    ("tok_per_s -3%", "expected FIELD < N% or FIELD > N%"),
    ("tok_per_s < -3", "expected FIELD < N% or FIELD > N%"),
    ("verify.crit_ms >= 5%", "expected FIELD < N% or FIELD > N%"),
    ("verfy.crit_ms > +5%", "verfy.crit_ms is not a breakdown field; fields: tok_per_s, other_crit_ms"),
    ("verify.stage > +5%", "verify.stage is not a breakdown field"),
])
def test_a_bad_rule_is_one_line_and_exit_2_before_any_trace_is_read(tmp_path, rule, message):
    with pytest.raises(DdprofError, match="--fail-if"):
        parse_rule(rule)
    done = ddprof("compare", tmp_path / "a.sqlite", tmp_path / "b.sqlite", "--fail-if", rule)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_a_rule_on_a_field_a_run_leaves_unknown_is_exit_2(tmp_path):
    run([60, 70], tmp_path, "a")
    run([50, 60], tmp_path, "b")
    done = ddprof("compare", tmp_path / "a.sqlite", tmp_path / "b.sqlite", "--fail-if", "verify.gpu_ms > +5%")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "verify.gpu_ms is unknown in run A" in done.stderr and "no GPU activity" in done.stderr


def test_rules_parse_as_written():
    rule = parse_rule("  verify.crit_ms>+5.5%  ")
    assert (rule.field, rule.above, rule.threshold_pct) == ("verify.crit_ms", True, 5.5)
    assert rule.text == "verify.crit_ms>+5.5%"
    assert parse_rule("tok_per_s < -3%").threshold_pct == -3 and not parse_rule("tok_per_s < -3%").above
