"""Several ranks as one run (ddprof.ranks), with known answers: a report holding two processes and
a set of per-rank reports, in both export schemas; CPU (nested moe_all_reduce ranges) and CUDA
(NCCL kernels) communication."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.errors import DdprofError
from ddprof.ranks import analyse_ranks, processes
from engine.stages import STAGES
from tests.ddprof.exports import (RANK_ALL_REDUCE_NS, RANK_PIDS, RANK_SLOW, RANK_STAGE_NS, Export,
                                  ranks_example)

ROOT = Path(__file__).resolve().parents[2]
VERIFY = STAGES.index("verify")
BASE_STEP = sum(RANK_STAGE_NS)


def one_report(tmp_path, schema, cuda=False, name="run.sqlite"):
    export = Export(schema)
    for rank in (0, 1):
        ranks_example(export, rank, cuda=cuda)
    return [export.write(tmp_path / name)]


def per_rank_reports(tmp_path, schema, cuda=False):
    return [ranks_example(Export(schema), rank, cuda=cuda).write(tmp_path / f"run.rank{rank}.sqlite")
            for rank in (1, 0)]  # given out of order: the rank marks order them


LAYOUTS = {"one report": one_report, "per-rank reports": per_rank_reports}


@pytest.mark.parametrize("schema", ["2022.4", "2025.3"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cuda", [False, True])
def test_known_answers(tmp_path, schema, layout, cuda):
    ranked = analyse_ranks(processes(LAYOUTS[layout](tmp_path, schema, cuda)))
    s = ranked.summary
    assert [r["rank"] for r in s["ranks"]] == [0, 1]
    assert [r["pid"] for r in s["ranks"]] == list(RANK_PIDS)
    assert s["matched_steps"] == 3 and s["step_counts"] == [3, 3]
    # Step i's critical path is its slowest rank's: rank 1 in steps 0 and 1, rank 0 in step 2.
    assert ranked.slowest.tolist() == [1, 1, 0]
    crit = s["critical_path"]
    assert crit["steps"] == 3 and crit["tokens"] == 12
    assert crit["step_ms"]["total"] * 1e6 == pytest.approx(3 * BASE_STEP + 50 + 70 + 30)
    verify = crit["stages"][VERIFY]
    assert verify["crit_ms"] * 1e6 == pytest.approx(3 * RANK_STAGE_NS[VERIFY] + 50 + 70 + 30)
    # Communication: each rank's own, and on the critical path the slowest rank's of each step.
    assert verify["comm_ms"] * 1e6 == pytest.approx(2 * RANK_ALL_REDUCE_NS[1] + RANK_ALL_REDUCE_NS[0])
    assert all(row["comm_ms"] == 0 for row in crit["stages"] if row["stage"] != "verify")
    for rank, row in enumerate(s["ranks"]):
        assert row["stages"][VERIFY]["comm_ms"] * 1e6 == pytest.approx(3 * RANK_ALL_REDUCE_NS[rank])
        extra = sum(ns for (r, _), ns in RANK_SLOW.items() if r == rank)
        assert row["stages"][VERIFY]["crit_ms"] * 1e6 == pytest.approx(3 * RANK_STAGE_NS[VERIFY] + extra)
    assert s["communication"] == ("GPU time of NCCL kernels" if cuda else "host time of moe_all_reduce ranges")
    stragglers = {row["rank"]: row for row in s["stragglers"]}
    assert stragglers[1]["slowest_steps"] == 2 and stragglers[0]["slowest_steps"] == 1
    assert stragglers[1]["behind_ms_total"] * 1e6 == pytest.approx(50 + 70)
    assert stragglers[1]["behind_ms_mean"] * 1e6 == pytest.approx(60)
    assert stragglers[0]["behind_ms_mean"] * 1e6 == pytest.approx(30)


def test_steps_match_by_index_when_a_rank_has_more(tmp_path):
    export = Export()
    ranks_example(export, 0, steps=3)
    ranks_example(export, 1, steps=2)
    s = analyse_ranks(processes([export.write(tmp_path / "run.sqlite")])).summary
    assert s["step_counts"] == [3, 2] and s["matched_steps"] == 2 and s["critical_path"]["steps"] == 2


def test_one_rank_twice_is_refused(tmp_path):
    paths = [ranks_example(Export(), 0).write(tmp_path / f"copy{i}.sqlite") for i in (0, 1)]
    with pytest.raises(DdprofError, match="rank 0 appears in 2 processes"):
        processes(paths)


def ddprof(*args):
    return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_breakdown_cli_takes_a_glob_of_per_rank_reports_and_one_report(tmp_path):
    per_rank_reports(tmp_path, "2022.4")
    single = one_report(tmp_path, "2022.4", name="both.sqlite")[0]
    outputs = []
    for args in ([tmp_path / "run.rank*.sqlite"], [tmp_path / "run.rank0.sqlite", tmp_path / "run.rank1.sqlite"],
                 [single]):
        done = ddprof("breakdown", *args, "--json")
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    for out in outputs:
        assert out["matched_steps"] == 3 and [r["slowest_steps"] for r in out["stragglers"]] == [1, 2]
    table = ddprof("breakdown", single)
    assert table.returncode == 0, table.stderr
    for words in ("rank 0", "rank 1", "comm ms", "straggler", "critical path"):
        assert words in table.stdout, words
    missing = ddprof("breakdown", tmp_path / "nothing*.sqlite")
    assert missing.returncode == 2 and "no file matches this pattern" in missing.stderr


def test_compare_reads_each_run_as_its_critical_path(tmp_path):
    """A (one report of both ranks) against B (a glob of per-rank reports of the same steps, rank 1's
    verify 100 ns slower in every step): B's critical path is rank 1's in every step."""
    a = one_report(tmp_path, "2022.4")[0]
    slower = {key: ns + 100 if key[0] == 1 else ns for key, ns in RANK_SLOW.items()} | {(1, 2): 100}
    for rank in (0, 1):
        ranks_example(Export(), rank, slow=slower).write(tmp_path / f"b.rank{rank}.sqlite")
    done = ddprof("compare", a, tmp_path / "b.rank*.sqlite", "--json")
    assert done.returncode == 0, done.stderr
    verify = next(row for row in json.loads(done.stdout)["stages"] if row["stage"] == "verify")
    # A's verify per step: (300 + 50, 300 + 70, 300 + 30); B's: rank 1's (350, 370, 400) after the 100 ns.
    assert verify["a_crit_ms_per_step"] * 1e6 == pytest.approx((350 + 370 + 330) / 3)
    assert verify["b_crit_ms_per_step"] * 1e6 == pytest.approx((450 + 470 + 400) / 3)


def test_dashboard_shows_each_rank_of_a_report_as_a_run(tmp_path):
    report = one_report(tmp_path, "2025.3")[0]
    done = ddprof("dashboard", report, "--out", tmp_path / "ranks.html", "--plotly", "cdn", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    labels = [run["label"] for run in out["runs"]]
    assert labels == ["run · rank 0", "run · rank 1"], out
    page = (tmp_path / "ranks.html").read_text()
    assert 'id="ranks-critical-path-0"' in page and "3 steps matched by index" in page
    stragglers = page[page.index('id="ranks-stragglers-0"'):]
    assert "<td>rank 1</td><td>2</td><td>66.7%</td><td>6e-05</td>" in stragglers  # 60 ns behind, in ms


def test_dashboard_of_a_glob_of_per_rank_reports(tmp_path):
    per_rank_reports(tmp_path, "2022.4")
    done = ddprof("dashboard", tmp_path / "run.rank*.sqlite", "--out", tmp_path / "ranks.html", "--plotly", "cdn",
                  "--json")
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [run["label"] for run in runs] == ["run.rank0 · rank 0", "run.rank1 · rank 1"]
    assert 'id="ranks-stragglers-0"' in (tmp_path / "ranks.html").read_text()
