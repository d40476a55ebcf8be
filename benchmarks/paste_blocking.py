"""Write `--tune-blocking` runs' picks into BLOCKING_BY_M, as pasting the lines the run prints would.

A tuning run prints the BLOCKING_BY_M lines to paste into triton_kernels/batch_invariant_matmul.py
(benchmarks/batch_invariant_matmul.py); this writes them from the run's result file instead, so
that a GPU call can tune, take its picks and run the GPU tests on them in one go, and so that no
hand edit can paste a line from the wrong run. Files are applied in the order given, later over
earlier, as the test that holds BLOCKING_BY_M to the committed runs reads them. Only a shape's
one line holding `Blocking(` is replaced (TUNED's lines carry the same `# name` comments); a
`--tune-split` run's re-picked tilings ("split_tuned") replace the shape's TUNED (or TUNED_FP32)
line's `Tiles(...)` as well, its comment kept in its column.

    python3 benchmarks/paste_blocking.py RESULT.json [RESULT.json ...] [--kernel FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_invariant_matmul import blocking_picks, ranges_line, tiles_line  # noqa: E402
from triton_kernels.batch_invariant_matmul import Tiles  # noqa: E402

KERNEL = Path(__file__).resolve().parents[1] / "triton_kernels" / "batch_invariant_matmul.py"


def paste(text: str, picks: dict) -> str:
    """text (the kernel file) with each shape's BLOCKING_BY_M line holding its picks' ranges."""
    lines = text.split("\n")
    for (n, k), ranges in picks.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(f"    ({n}, {k}): (") and "Blocking(" in line]
        if len(hits) != 1:
            raise ValueError(f"{len(hits)} BLOCKING_BY_M lines for ({n}, {k}), not one")
        name = lines[hits[0]].rpartition("  # ")[2]
        lines[hits[0]] = f"    ({n}, {k}): {ranges_line(ranges)},  # {name}"
    return "\n".join(lines)


def paste_tilings(text: str, tilings: dict[tuple[int, int], Tiles]) -> str:
    """text with each shape's TUNED (or TUNED_FP32) line holding its re-picked tiling."""
    lines = text.split("\n")
    for (n, k), tiles in tilings.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(f"    ({n}, {k}): Tiles(")]
        if len(hits) != 1:
            raise ValueError(f"{len(hits)} TUNED lines for ({n}, {k}), not one")
        code, _, name = lines[hits[0]].partition("  # ")
        entry = f"    ({n}, {k}): {tiles_line(tiles)},"
        lines[hits[0]] = f"{entry:<{len(code)}}  # {name}"
    return "\n".join(lines)


def split_picks(result: dict) -> dict[tuple[int, int], Tiles]:
    """A --tune-split run's re-picked tilings, (N, K) -> Tiles."""
    return {tuple(map(int, shape.split("x"))): Tiles(**pick["tiles"])
            for shape, pick in result.get("split_tuned", {}).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path, help="--tune-blocking result files, earlier first")
    parser.add_argument("--kernel", type=Path, default=KERNEL, help="the file holding BLOCKING_BY_M")
    args = parser.parse_args()
    where = args.kernel  # the file the one line names
    try:
        text = args.kernel.read_text()
        for where in args.results:
            result = json.loads(where.read_text())
            picks = blocking_picks(result)
            if not picks:
                raise ValueError("no blocking picks in it (not a --tune-blocking run)")
            tilings = split_picks(result)
            text = paste(paste_tilings(text, tilings), picks)
            print(f"{where}: {len(picks)} shapes" + (f", {len(tilings)} tilings re-picked" if tilings else ""))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"benchmarks/paste_blocking.py: {where}: {error}", file=sys.stderr)
        sys.exit(2)
    args.kernel.write_text(text)


if __name__ == "__main__":
    main()
