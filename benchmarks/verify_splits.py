"""Split count and partial dtype of tree_verify_attention at the batch-1/8 points that stay under
50% of the roofline floor (benchmarks/results/verify_attention.json), on the H200.

Why: `default_num_splits` picks the fewest splits that fill the GPU's last wave >= 90% and
`combine_splits.partial_dtype` picks bf16 or float32 partials; this measures the alternatives end
to end (attention + merge), so a better rule can be argued from numbers. For each point: GPU time
per call (cold L2, CUDA-graph replays, as in verify_attention.py) at several split counts, and at
the default count with partials forced to float32 and to bf16 (by replacing the module's
`partial_dtype`). Run from the repo root:
    python3 benchmarks/verify_splits.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton_kernels.tree_verify_attention as tva  # noqa: E402
from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import LATENT, SCALE, bench, make_point  # noqa: E402

# (prefix, bs, budget, split counts to try besides the default)
POINTS = ((4096, 8, 16, (2, 3, 4, 5, 6, 8, 10)), (4096, 8, 8, (1, 2, 3, 4, 6, 8)),
          (4096, 1, 8, (7, 10, 12, 16, 20)), (4096, 1, 16, (4, 5, 6, 8, 10)), (4096, 8, 0, (8, 10, 12, 16, 24)))
PARTIALS = {"float32": lambda splits, out_dtype: torch.float32, "bfloat16": lambda splits, out_dtype: out_dtype}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_splits.json")
    args = parser.parse_args()
    rows = []
    result = {"benchmark": "verify_splits", "machine": describe(), "rows": rows}
    gen = torch.Generator(device="cuda").manual_seed(0)
    chosen_dtype = tva.partial_dtype
    for prefix, bs, budget, tries in POINTS:
        point = make_point(prefix, bs, budget, gen)
        default = tva.default_num_splits(bs, budget + 1, prefix + budget + 1, point[0].device)
        runs = [(s, "auto") for s in sorted(set(tries) | {default})] + [(default, name) for name in PARTIALS]
        for splits, partials in runs:
            tva.partial_dtype = PARTIALS.get(partials, chosen_dtype)
            try:
                ms = bench(lambda: tva.tree_verify_attention(*point, SCALE, LATENT, num_splits=splits), rep_ms=40)
            finally:
                tva.partial_dtype = chosen_dtype
            rows.append({"prefix": prefix, "bs": bs, "budget": budget, "splits": splits, "default": splits == default,
                         "partials": partials if partials != "auto" else
                         str(chosen_dtype(splits, point[0].dtype)).removeprefix("torch."), "forced": partials != "auto",
                         "us": ms * 1e3})
        line = " | ".join(f"{r['splits']}{'*' if r['default'] else ''}{'/' + r['partials'] if r['forced'] else ''}: "
                          f"{r['us']:.1f}" for r in rows if (r["prefix"], r["bs"], r["budget"]) == (prefix, bs, budget))
        print(f"P={prefix} bs={bs} B={budget} (us by splits, * = default): {line}", flush=True)
        write_result(args.out, result)


if __name__ == "__main__":
    main()
