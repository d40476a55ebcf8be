"""Which parts of the batch-invariant GEMM's tiling are free choices? Whether its output rows keep
their bits when only the blocking changes (BLOCK_M, BLOCK_N, warps, stages, TMA loads, a split
tiling's chunks summed in one program, a second row tile per program, a persistent grid, warp
specialization, swapped dots, stream-K, the Gluon Hopper kernel, swapped and persistent too), at
Kimi K2's projection shapes in bf16.

An output element's fp32 sum is the same sequence of K steps (BLOCK_K, split_k) whatever the
blocking is; whether the tensor cores' instructions for a 16-, 64- or 128-row tile, a 32- to
256-column tile, 4 or 8 warps and 3 or 4 pipeline stages round that sequence alike is a property of
the hardware and Triton's lowering, not of the algorithm. Where every row is bit-identical across
blockings, the GEMM may pick them by M (triton_kernels/batch_invariant_matmul.py BLOCKING_BY_M) and
stay batch-invariant; where not, that part must stay fixed by (N, K) (issue 29). Its first version
(benchmarks/block_m_invariance.py, to commit 424f9b2) varied BLOCK_M and the warps only: identical
at all ten shapes (benchmarks/results/block_m_invariance.json).

For each shape: the shape's tiling (`base_tiles`) on max(ROWS) = 4,096 random rows is the
reference; the tiling itself (the control: any difference there is M-dependence, a bug) and each
variant (`variants`: the warps, the stages, the launch pairs the tuner tries, BLOCK_M in 16, 32,
64, 128 or BLOCK_N in 32, 64, 128, 256 with each launch pair, a split tiling's chunks summed in the
program, a second row tile, a persistent grid, TMA loads, warp-specialized loops) compute every M of the tuner's table (the decode range and a batched prefill's
4,096), and the table counts their rows bit-identical to the reference's and the largest
difference. Rows are compared as the fp32
accumulators (the kernel stores them uncast into an fp32 output): a 1-ulp difference there would
flip a bf16 output only rarely. The verdict is "identical", "differs" or "incomplete" (a variant
that could not run), overall and per field varied. No timings; under a minute on the H200 at the
decode range (2026-12-02), longer with the 4,096 rows.

    python3 benchmarks/tile_invariance.py [--out benchmarks/results/tile_invariance.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_invariant_matmul import (COLUMN_BLOCKINGS, LAUNCHES, ROW_BLOCKINGS, ROWS, SHAPES,  # noqa: E402
                                                SWAP_COLUMNS, SWAP_ROWS, SWAP_UP_TO_M, TAILED_ROWS, gluon_blockings,
                                                inputs, stream_k_blockings)
from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from triton_kernels.batch_invariant_matmul import Tiles, _launch, base_tiles, blocking_of  # noqa: E402

WARPS, STAGES = (4, 8), (3, 4, 5, 6, 8)
WARP_SPECIALIZED_STAGES = 3  # the tuner's sixth run tried 3 and 4 (it no longer tries them: never picked)


def variants(tiles: Tiles) -> list[tuple[str, Tiles]]:
    """(what changed, tiling): the shape's tiling itself first (the control), then each blocking
    field `--tune-blocking` varies, one at a time from the base (the tuner also combines them; its
    own bit-for-bit check covers those): the warps alone, the stages alone, each launch pair (warps,
    stages) alone, each other BLOCK_M or BLOCK_N with each launch pair, for a split tiling its chunks
    summed in the program with each launch pair, each pair of row tiles (TAILED_ROWS) with each
    launch pair, a persistent grid with each launch pair, and TMA loads with each launch pair
    (persistent too), each BLOCK_M and each pair of row tiles, and a warp-specialized TMA loop at
    64 rows and the base's columns (a split tiling's chunks summed in the program; persistent too),
    swapped dots (swap_ab) at each of SWAP_ROWS and SWAP_COLUMNS through the TMA, through pointers,
    persistent and (split) in the program, for a split tiling the tuner's stream-K blockings, and
    the Gluon Hopper kernel at each of the tuner's Gluon blockings (a split tiling's through the
    workspace and in the program); each
    tiling once, labelled by the first field in that order that it changes. TMA comes last: a
    kernel that faults poisons the CUDA context for what follows."""
    changed = [("num_warps", tiles._replace(num_warps=warps)) for warps in WARPS]
    changed += [("num_stages", tiles._replace(num_stages=stages)) for stages in STAGES]
    changed += [("launch", tiles._replace(num_warps=warps, num_stages=stages)) for warps, stages in LAUNCHES]
    changed += [("block_m", tiles._replace(block_m=block_m, num_warps=warps, num_stages=stages))
                for block_m, warps, stages in ROW_BLOCKINGS]
    changed += [("block_n", tiles._replace(block_n=block_n, num_warps=warps, num_stages=stages))
                for block_n, warps, stages in COLUMN_BLOCKINGS]
    if tiles.split_k > 1:
        changed += [("split_in_program", tiles._replace(num_warps=warps, num_stages=stages, split_in_program=True))
                    for warps, stages in LAUNCHES]
    changed += [("tail_m", tiles._replace(block_m=block_m, tail_m=tail, num_warps=warps, num_stages=stages))
                for block_m, tail in TAILED_ROWS for warps, stages in LAUNCHES]
    changed += [("persistent", tiles._replace(num_warps=warps, num_stages=stages, persistent=True))
                for warps, stages in LAUNCHES]
    changed += [("tma", tiles._replace(num_warps=warps, num_stages=stages, tma=True)) for warps, stages in LAUNCHES]
    changed += [("tma", tiles._replace(num_warps=warps, num_stages=stages, tma=True, persistent=True))
                for warps, stages in LAUNCHES]
    changed += [("tma", tiles._replace(block_m=block_m, num_warps=warps, num_stages=stages, tma=True))
                for block_m, warps, stages in ROW_BLOCKINGS]
    changed += [("tma", tiles._replace(block_m=block_m, tail_m=tail, tma=True)) for block_m, tail in TAILED_ROWS]
    changed += [("swap_ab", tiles._replace(block_m=rows, tail_m=tail, block_n=64, num_warps=4, num_stages=4, tma=True,
                                           swap_ab=True)) for rows, tail in SWAP_ROWS]
    changed += [("swap_ab", tiles._replace(block_m=128, tail_m=16, block_n=block_n, num_warps=warps, num_stages=4, tma=True,
                                           swap_ab=True)) for block_n, warps in SWAP_COLUMNS]
    swapped = tiles._replace(block_m=64, tail_m=16, block_n=64, num_warps=4, num_stages=6, swap_ab=True)
    changed += [("swap_ab", swapped), ("swap_ab", swapped._replace(tma=True, persistent=True))]
    if tiles.split_k > 1:
        changed += [("swap_ab", swapped._replace(tma=True, split_in_program=True))]
    specialized = tiles._replace(block_m=64, num_warps=4, num_stages=WARP_SPECIALIZED_STAGES, tma=True,
                                 split_in_program=tiles.split_k > 1, warp_specialize=True)
    changed += [("warp_specialize", variant) for variant in (specialized, specialized._replace(persistent=True))]
    if tiles.split_k > 1:
        changed += [("stream_k", tiles._replace(**blocking._asdict()))
                    for blocking in stream_k_blockings(blocking_of(tiles), max(ROWS), max(ROWS))]
    gluon = [tiles._replace(**blocking._asdict()) for blocking in gluon_blockings(tiles, SWAP_UP_TO_M, max(ROWS))]
    changed += [("gluon", variant) for variant in gluon]
    changed += [("gluon_persistent", variant._replace(persistent=True)) for variant in gluon
                if variant.split_k == 1 or variant.split_in_program]
    unique = {tiles: "control"}
    for field, variant in changed:
        unique.setdefault(variant, field)
    return [(field, variant) for variant, field in unique.items()]


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


def verdict(rows: list[dict]) -> str:
    """"incomplete" if a variant could not run, else "identical" if every row kept its bits, else
    "differs". A variant whose pipeline does not fit in shared memory ("does_not_fit": 8 stages of
    128 x 128 tiles need 256 KiB, the H200 gives a program 227) is no blocking anyone can pick: it
    counts for none of the three."""
    rows = [row for row in rows if "does_not_fit" not in row]
    if any("error" in row for row in rows):
        return "incomplete"
    return "identical" if all(row["identical_rows"] == row["rows"] for row in rows) else "differs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "tile_invariance.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/tile_invariance.py: needs a CUDA GPU (torch sees none)", file=sys.stderr)
        sys.exit(2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = []
    print(f"{'shape':>22} {'changed':>10} {'BLOCK_M':>7} {'BLOCK_N':>7} {'warps':>5} {'stages':>6} "
          f"{'identical rows':>15} {'max |diff|':>10}")
    for name, n, k in SHAPES:
        x, w = inputs(n, k, gen)
        tiles = base_tiles(n, k, torch.bfloat16)
        reference = accumulators(x, w, tiles)
        rows = []
        for field, variant in variants(tiles):
            described = (f"{name:>22} {field:>10} {variant.block_m:7} {variant.block_n:7} {variant.num_warps:5} "
                         f"{variant.num_stages:6}")
            try:
                row = compare(x, w, variant, reference)
            except OutOfResources as error:
                row = {"tiles": variant._asdict(), "does_not_fit": str(error).splitlines()[0][:200]}
                print(f"{described} does not fit: {row['does_not_fit']}")
            except Exception as error:
                row = {"tiles": variant._asdict(), "error": str(error).splitlines()[0][:200]}
                print(f"{described} does not run: {row['error']}")
            else:
                print(f"{described} {row['identical_rows']:>7} of {row['rows']:<5} {row['max_abs_diff']:10.3g}")
            rows.append({"changed": field, **row})
        shapes.append({"shape": name, "n": n, "k": k, "tiles": tiles._asdict(), "variants": rows})
        outcome, by_field = write_shapes(args.out, shapes)  # after every shape, so a cut-short run keeps its shapes
    print(f"rows across blockings: {outcome} (" + ", ".join(f"{f}: {v}" for f, v in by_field.items()) + ")")


def write_shapes(out: Path, shapes: list[dict]) -> tuple[str, dict[str, str]]:
    """The result file for the shapes compared so far ("shapes_done" of all SHAPES); its verdicts,
    "incomplete" overall until every shape is done (the per-field ones cover the shapes done)."""
    every = [row for shape in shapes for row in shape["variants"]]
    by_field = {field: verdict([row for row in every if row["changed"] == field])
                for field in dict.fromkeys(row["changed"] for row in every)}
    outcome = verdict(every) if len(shapes) == len(SHAPES) else "incomplete"
    write_result(out, {"benchmark": "tile_invariance", "machine": describe(), "rows_m": ROWS, "verdict": outcome,
                       "verdict_by_field": by_field, "shapes_done": f"{len(shapes)} of {len(SHAPES)}",
                       "shapes": shapes})
    return outcome, by_field


if __name__ == "__main__":
    main()
