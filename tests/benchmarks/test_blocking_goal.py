"""benchmarks/blocking_goal.py: issue 29's goal points from the committed blocking tuning runs."""

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.blocking_goal import blocking_tunings, points, standing

ROOT = Path(__file__).resolve().parents[2]


def write_run(path: Path, rows: list[tuple]) -> Path:
    path.write_text(json.dumps({"rows": [{"shape": shape, "m": m, "ratio_to_cublas": ratio, "dtype": dtype}
                                         for shape, m, ratio, dtype in rows]}))
    return path


def test_a_later_run_stands_for_the_shapes_it_timed_and_only_the_goal_s_points_count(tmp_path):
    write_run(tmp_path / "batch_invariant_matmul_blocking_tuning.json",
              [("a", 1, 1.29, "bfloat16"), ("a", 136, 1.30, "bfloat16"), ("b", 17, 1.16, "bfloat16")])
    write_run(tmp_path / "batch_invariant_matmul_blocking_tuning_10.json", [("a", 136, 1.15, "bfloat16")])
    write_run(tmp_path / "batch_invariant_matmul_blocking_tuning_2.json",
              [("a", 136, 1.50, "bfloat16"), ("b", 4096, 9.0, "bfloat16"), ("router", 17, 9.0, "float32")])
    paths = blocking_tunings(tmp_path)
    assert [p.name.rpartition("tuning")[2] for p in paths] == [".json", "_2.json", "_10.json"]
    shapes = standing(paths)
    assert shapes["a"] == {"run": "batch_invariant_matmul_blocking_tuning_10.json", "ratios": {136: 1.15}}
    assert shapes["b"]["ratios"] == {4096: 9.0}  # _2 timed b again (its other M are not carried over)
    assert "router" not in shapes
    score = points(shapes)
    assert score["met"]["from_17"] == [{"shape": "a", "m": 136, "ratio": 1.15}]
    assert score["missed"] == {"below_17": [], "from_17": []}  # M = 4,096 is no goal point


def test_a_file_that_is_no_tuning_run_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "batch_invariant_matmul_blocking_tuning_3.json").write_text('{"rows": [{"shape": "a"}]}')
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "blocking_goal.py"), "--results", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "batch_invariant_matmul_blocking_tuning_3.json" in done.stderr


def test_the_readme_s_goal_count_is_the_committed_runs():
    """The README states the count this script finds in the committed runs, not one typed in."""
    score = points(standing(blocking_tunings()))
    met = len(score["met"]["from_17"])
    total = met + len(score["missed"]["from_17"])
    stated = re.search(r"met at \*\*(\d+) of (\d+) bf16 points\s+from M = 17 and at all (\d+) below\*\*",
                       (ROOT / "README.md").read_text())
    assert stated, "the README's goal count sentence"
    assert (int(stated[1]), int(stated[2])) == (met, total)
    assert int(stated[3]) == len(score["met"]["below_17"]) and not score["missed"]["below_17"]
