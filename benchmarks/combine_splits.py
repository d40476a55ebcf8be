"""The split merge alone (combine_splits), float32 vs bfloat16 partial outputs, at the split counts
tree_verify_attention picks for K2 dims (64 heads, 512 value dims) on the H200.

Why: tree_verify_attention stores partials in the output's dtype (bf16 at K2 dims), which halves
the bytes the attention writes and the merge reads; this table says what the merge alone gains or
loses by it, per kernel. Times are GPU time per call from CUDA-graph replays with the partials warm
in L2 (the attention kernel has just written them). Run from the repo root:
    python3 benchmarks/combine_splits.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from triton_kernels.combine_splits import COMBINE_LOOP_MAX_SPLITS, combine_splits  # noqa: E402

HEADS, V_DIM = 64, 512
# (queries = bs * T, splits): the counts the earlier split rule (fewest splits filling the last wave
# >= 90%) picked at bs 1 / 8 (verify_attention.json at commit c835f6b), and 33 x 12 (more queries than
# bs 1 verify with splits for the all-splits kernel).
SHAPES = ((1, 64), (1, 119), (9, 14), (8, 15), (72, 5), (136, 7), (17, 7), (33, 12))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "combine_splits.json")
    args = parser.parse_args()
    rows = []
    result = {"benchmark": "combine_splits", "machine": describe(), "heads": HEADS, "v_dim": V_DIM, "rows": rows}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for queries, splits in SHAPES:
        lse = torch.randn(queries, splits, HEADS, device="cuda", generator=gen) * 4
        out = torch.empty(queries, HEADS, V_DIM, device="cuda", dtype=torch.bfloat16)
        times = {}
        for dtype in (torch.float32, torch.bfloat16):
            o = torch.randn(queries, splits, HEADS, V_DIM, device="cuda", generator=gen).to(dtype)
            ms = triton.testing.do_bench_cudagraph(
                lambda: combine_splits(o, lse, out, queries, splits, HEADS, V_DIM), rep=50, return_mode="median")
            times[str(dtype).removeprefix("torch.")] = ms * 1e3
        rows.append({"queries": queries, "splits": splits,
                     "kernel": "loop" if splits <= COMBINE_LOOP_MAX_SPLITS else "all_splits",
                     "float32_us": times["float32"], "bfloat16_us": times["bfloat16"]})
        print(f"queries {queries:>3} splits {splits:>3} ({rows[-1]['kernel']:>10}): float32 {times['float32']:6.1f} us"
              f"  bfloat16 {times['bfloat16']:6.1f} us", flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
