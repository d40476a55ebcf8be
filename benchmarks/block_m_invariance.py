"""Is the row tile a free choice? Whether the batch-invariant GEMM's output rows keep their bits
when only BLOCK_M and the warp count change, at Kimi K2's projection shapes in bf16.

The batch-invariant GEMM fixes its whole tiling by (N, K), so one tiling must serve M = 1 and
M = 1,088: the wide shapes that keep pace with cuBLAS at M = 1 (kv_b_proj 1.05x, lm_head 1.12x) fall
to 1.35-1.47x at M = 544-1,088 (benchmarks/results/batch_invariant_matmul.json; the narrow-N shapes'
2-2.4x at every M is split-K's question, not this one).
A row's fp32 sum is the same sequence of K steps (BLOCK_K, split_k) whatever BLOCK_M is; whether the
tensor cores' instructions for a 16-, 64- or 128-row tile (and 4 or 8 warps) round that sequence
alike is a property of the hardware and Triton's lowering, not of the algorithm. If every row is
bit-identical across row tiles, the GEMM may pick BLOCK_M and the warps by M (a bucket per range, as
the CUDA graphs do) and stay batch-invariant; if not, the row tile must stay fixed (issue 29).

For each shape: the shape's tiling (`base_tiles`) on 1,088 random rows is the reference; the
tiling itself (the control: any difference there is M-dependence, a bug) and each variant
(BLOCK_M in 16, 32, 64, 128, warps 4 and 8, BLOCK_N, BLOCK_K, stages and split_k kept) compute
every M of the decode range, and the table counts their rows bit-identical to the reference's and
the largest difference. Rows are compared as the fp32 accumulators (the kernel stores them
uncast into an fp32 output): a 1-ulp difference there would flip a bf16 output only rarely. The
verdict is "identical", "differs" or "incomplete" (a variant that could not run). No timings.

    python3 benchmarks/block_m_invariance.py [--out benchmarks/results/block_m_invariance.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_invariant_matmul import ROWS, SHAPES, inputs  # noqa: E402
from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from triton_kernels.batch_invariant_matmul import Tiles, _launch, base_tiles  # noqa: E402

ROW_TILES = (16, 32, 64, 128)
WARPS = (4, 8)


def variants(tiles: Tiles) -> list[Tiles]:
    """The shape's tiling itself first (the control), then with every other row tile and warp count."""
    return [tiles] + [tiles._replace(block_m=block_m, num_warps=warps) for block_m in ROW_TILES for warps in WARPS
                      if (block_m, warps) != (tiles.block_m, tiles.num_warps)]


def accumulators(x: torch.Tensor, w: torch.Tensor, tiles: Tiles) -> torch.Tensor:
    """x @ w.T as the kernel's fp32 accumulators, uncast (the launcher stores into any output dtype)."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    _launch(x[None], w[None], out[None], tiles)
    return out


def compare(x: torch.Tensor, w: torch.Tensor, tiles: Tiles, reference: torch.Tensor) -> dict:
    """Rows of `tiles` at every M against the reference's same rows: how many keep their bits."""
    identical = total = 0
    worst = 0.0
    for m in ROWS:
        rows = accumulators(x[:m], w, tiles)
        same = (rows == reference[:m]).all(dim=1)
        identical, total = identical + int(same.sum()), total + m
        worst = max(worst, float((rows - reference[:m]).abs().max()))
    return {"tiles": tiles._asdict(), "rows": total, "identical_rows": identical, "max_abs_diff": worst}


def verdict(shapes: list[dict]) -> str:
    """"incomplete" if a variant could not run, else "identical" if every row kept its bits, else "differs"."""
    rows = [row for shape in shapes for row in shape["variants"]]
    if any("error" in row for row in rows):
        return "incomplete"
    return "identical" if all(row["identical_rows"] == row["rows"] for row in rows) else "differs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "block_m_invariance.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/block_m_invariance.py: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        sys.exit(2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = []
    print(f"{'shape':>22} {'BLOCK_M':>7} {'warps':>5} {'identical rows':>15} {'max |diff|':>10}")
    for name, n, k in SHAPES:
        x, w = inputs(n, k, gen)
        tiles = base_tiles(n, k, torch.bfloat16)
        reference = accumulators(x, w, tiles)
        rows = []
        for variant in variants(tiles):
            try:
                row = compare(x, w, variant, reference)
            except Exception as error:  # e.g. out of shared memory for this tile shape
                row = {"tiles": variant._asdict(), "error": str(error).splitlines()[0][:200]}
                print(f"{name:>22} {variant.block_m:7} {variant.num_warps:5} does not run: {row['error']}")
            else:
                print(f"{name:>22} {variant.block_m:7} {variant.num_warps:5} "
                      f"{row['identical_rows']:>7} of {row['rows']:<5} {row['max_abs_diff']:10.3g}")
            rows.append(row)
        shapes.append({"shape": name, "n": n, "k": k, "tiles": tiles._asdict(), "variants": rows})
    outcome = verdict(shapes)
    print(f"rows across row tiles and warps: {outcome}")
    write_result(args.out, {"benchmark": "block_m_invariance", "machine": describe(), "rows_m": ROWS,
                            "verdict": outcome, "shapes": shapes})


if __name__ == "__main__":
    main()
