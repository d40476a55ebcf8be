"""Where issue 29's goal stands: each shape's ratio to cuBLAS at every M, from the committed runs.

Every `--tune-blocking` / `--tune-split` run (benchmarks/batch_invariant_matmul.py) ends with a
table timed on its own picks. A shape's standing is the table of the last run that covered it,
in the order the runs were committed (`_2` before `_10`, the unnumbered first), which is also the
order BLOCKING_BY_M takes their picks in. This prints one row per shape with the ratio at each M,
a `*` on each miss of the goal (within 1.15x of cuBLAS from M = 17 up to 1,088, 1.3x below), and the
points met; the README's count comes from here.

    python benchmarks/blocking_goal.py [--results benchmarks/results] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
GOAL_BELOW_17 = 1.3
GOAL = 1.15
GOAL_UP_TO_M = 1088  # 4,096 (a batched prefill's rows) is in the table, not in the goal


def blocking_tunings(results: Path = RESULTS) -> list[Path]:
    """The committed blocking tuning runs, earliest first (`_N` numbered in commit order)."""
    return sorted(results.glob("batch_invariant_matmul_blocking_tuning*.json"),
                  key=lambda path: (len(path.name), path.name))


def goal_of(m: int) -> float:
    return GOAL_BELOW_17 if m < 17 else GOAL


def standing(paths: list[Path]) -> dict[str, dict]:
    """Each bf16 shape's table from the last run that timed it: {name: {"run", "ratios": {M: r}}}."""
    shapes: dict[str, dict] = {}
    for path in paths:
        try:
            rows = json.loads(path.read_text())["rows"]
            tables: dict[str, dict[int, float]] = {}
            for row in rows:
                if row.get("dtype", "bfloat16") == "bfloat16":
                    tables.setdefault(row["shape"], {})[int(row["m"])] = float(row["ratio_to_cublas"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a blocking tuning run's result ({type(err).__name__}: {err})") from None
        shapes.update({name: {"run": path.name, "ratios": ratios} for name, ratios in tables.items()})
    return shapes


def points(shapes: dict[str, dict]) -> dict[str, list]:
    """The goal's points met and missed, below M = 17 and from 17 up to GOAL_UP_TO_M."""
    met: dict[str, list] = {"below_17": [], "from_17": []}
    missed: dict[str, list] = {"below_17": [], "from_17": []}
    for name, shape in shapes.items():
        for m, ratio in sorted(shape["ratios"].items()):
            if m > GOAL_UP_TO_M:
                continue
            side = "below_17" if m < 17 else "from_17"
            (met if ratio <= goal_of(m) else missed)[side].append({"shape": name, "m": m, "ratio": ratio})
    return {"met": met, "missed": missed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of result files")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    paths = blocking_tunings(args.results)
    if not paths:
        print(f"{args.results}: no batch_invariant_matmul_blocking_tuning*.json", file=sys.stderr)
        sys.exit(2)
    try:
        shapes = standing(paths)
    except ValueError as err:
        print(err, file=sys.stderr)
        sys.exit(2)
    score = points(shapes)
    counts = {side: (len(score["met"][side]), len(score["met"][side]) + len(score["missed"][side]))
              for side in ("below_17", "from_17")}
    if args.json:
        print(json.dumps({"shapes": shapes, **score, "counts": counts}, indent=1))
        return
    ms = sorted({m for shape in shapes.values() for m in shape["ratios"]})
    print(f"{'shape':<24}{'run':>8}" + "".join(f"{m:>8}" for m in ms))
    for name, shape in shapes.items():
        run = shape["run"].removeprefix("batch_invariant_matmul_blocking_tuning").removesuffix(".json") or "-"
        cells = "".join(f"{'':>8}" if m not in shape["ratios"] else
                        f"{shape['ratios'][m]:>7.2f}{'*' if m <= GOAL_UP_TO_M and shape['ratios'][m] > goal_of(m) else ' '}"
                        for m in ms)
        print(f"{name:<24}{run:>8}{cells}")
    (met, of), (met_below, of_below) = counts["from_17"], counts["below_17"]
    print(f"goal met at {met} of {of} points from M = 17 (<= {GOAL}x) and {met_below} of {of_below} below "
          f"(<= {GOAL_BELOW_17}x); * a miss")


if __name__ == "__main__":
    main()
