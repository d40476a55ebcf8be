"""Split counts of tree_verify_attention at the points that stay under 50% of the roofline floor
(benchmarks/results/verify_attention.json), on the H200.

Why: `default_num_splits` picks a split count from a cost model; this measures other counts end
to end (attention + merge), so the rule can be checked against numbers.
For each point: GPU time per call (cold L2, CUDA-graph replays, as in verify_attention.py) at
several split counts, the default marked. Run from the repo root:
    python3 benchmarks/verify_splits.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import LATENT, SCALE, bench, make_point  # noqa: E402
from triton_kernels.tree_verify_attention import default_num_splits, tree_verify_attention  # noqa: E402

# (prefix, bs, budget, split counts to try besides the default)
POINTS = ((4096, 8, 16, (3, 4, 5, 6, 8, 10)), (4096, 8, 8, (2, 3, 4, 6, 8)), (4096, 1, 8, (7, 10, 12, 16, 20)),
          (4096, 1, 16, (4, 5, 6, 8, 10)), (4096, 8, 0, (8, 10, 12, 16, 24)), (4096, 1, 0, (16, 32, 48)),
          (16384, 1, 0, (48, 64, 96, 132)), (32768, 1, 0, (64, 96, 132)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_splits.json")
    args = parser.parse_args()
    rows = []
    result = {"benchmark": "verify_splits", "machine": describe(), "rows": rows}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for prefix, bs, budget, tries in POINTS:
        point = make_point(prefix, bs, budget, gen)
        default = default_num_splits(bs, budget + 1, point[1].shape[1], point[0].device)
        for splits in sorted(set(tries) | {default}):
            ms = bench(lambda: tree_verify_attention(*point, SCALE, LATENT, num_splits=splits), rep_ms=40)
            rows.append({"prefix": prefix, "bs": bs, "budget": budget, "splits": splits, "default": splits == default,
                         "us": ms * 1e3})
        line = " | ".join(f"{r['splits']}{'*' if r['default'] else ''}: {r['us']:.1f}"
                          for r in rows if (r["prefix"], r["bs"], r["budget"]) == (prefix, bs, budget))
        print(f"P={prefix} bs={bs} B={budget} (us by splits, * = default): {line}", flush=True)
        write_result(args.out, result)


if __name__ == "__main__":
    main()
