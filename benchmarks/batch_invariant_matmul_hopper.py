"""The Gluon Hopper GEMM (`triton_kernels/batch_invariant_matmul_hopper.py`) against cuBLAS and the
Triton kernel's table at the unsplit Kimi K2 shapes, where the GEMM goal is missed (M = 136-1,088).

For each shape whose base tiling is unsplit (its K loop is one chain of BLOCK_K steps, which the
Gluon kernel repeats): cuBLAS (`F.linear`), the Triton kernel as served (`batch_invariant_linear`,
BLOCKING_BY_M's pick at that M) and each of the tuner's GLUON_TILES, GPU time per call with a cold L2
(benchmarks/verify_attention.py's `bench`), each Gluon output checked bit for bit against the Triton
kernel's rows of the full 4,096-row batch (a config that differs is reported and never counted).
Prints a table (ratio to cuBLAS: the table's pick, the best Gluon config) and writes JSON with every
timing and the machine.

    python3 benchmarks/batch_invariant_matmul_hopper.py [--rows 136,544,1088] [--shapes NAME,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_invariant_matmul import GLUON_TILES, SHAPES, TUNE_REP_MS, inputs  # noqa: E402
from benchmarks.batch_invariant_matmul import ROWS as TABLE_ROWS  # noqa: E402
from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import bench  # noqa: E402
from triton_kernels.batch_invariant_matmul import base_tiles, batch_invariant_linear  # noqa: E402
from triton_kernels.batch_invariant_matmul_hopper import HopperTiles, fits, hopper_linear  # noqa: E402

ROWS = [136, 544, 1088]


def time_shape(name: str, n: int, k: int, rows: list[int], gen: torch.Generator) -> list[dict]:
    """The shape's rows of the table: one per M, with every config's timing."""
    x, w = inputs(n, k, gen)
    base = base_tiles(n, k, torch.bfloat16)
    reference = batch_invariant_linear(x, w, base)
    results = []
    for m in rows:
        cublas = bench(lambda: F.linear(x[:m], w), rep_ms=TUNE_REP_MS)
        table = bench(lambda: batch_invariant_linear(x[:m], w), rep_ms=TUNE_REP_MS)
        tried = []
        for block_m, block_n, stages in GLUON_TILES:
            tiles = HopperTiles(block_m, block_n, base.block_k, stages)
            entry = {"tiles": tiles._asdict()}
            if not fits(x[:m], w, tiles):
                entry["error"] = "does not fit"
            else:
                try:
                    entry["bits_as_triton"] = torch.equal(hopper_linear(x[:m], w, tiles), reference[:m])
                    entry["ratio_to_cublas"] = bench(lambda: hopper_linear(x[:m], w, tiles), rep_ms=TUNE_REP_MS) / cublas
                except Exception as error:  # a compile or launch failure: recorded, the others still run
                    entry["error"] = str(error).splitlines()[0][:200]
            tried.append(entry)
        kept = [e for e in tried if e.get("bits_as_triton")]
        best = min(kept, key=lambda e: e["ratio_to_cublas"], default=None)
        results.append({"shape": name, "n": n, "k": k, "m": m, "cublas_us": cublas * 1e3,
                        "table_ratio_to_cublas": table / cublas, "best": best, "tried": tried})
        gluon = f"{best['ratio_to_cublas']:.2f} {tuple(best['tiles'].values())}" if best else "-"
        differ = sum(e.get("bits_as_triton") is False for e in tried)
        print(f"{name:>22} {m:>5} {cublas * 1e3:>9.1f} {table / cublas:>6.2f}  {gluon}"
              + (f"  ({differ} configs with other bits)" if differ else ""), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M")
    parser.add_argument("--shapes", help="comma-separated shape names (default: every unsplit one)")
    parser.add_argument("--out", type=Path, default=RESULTS / "batch_invariant_matmul_hopper.json")
    args = parser.parse_args()
    unsplit = [(name, n, k) for name, n, k in SHAPES if base_tiles(n, k, torch.bfloat16).split_k == 1]
    wanted = args.shapes.split(",") if args.shapes else [name for name, _, _ in unsplit]
    unknown = sorted(set(wanted) - {name for name, _, _ in unsplit})
    rows = [int(m) for m in args.rows.split(",") if m.strip().isdigit() and 0 < int(m) <= max(TABLE_ROWS)]
    problems = []
    if unknown:
        problems.append(f"not an unsplit shape: {', '.join(unknown)} (these are: {', '.join(n for n, _, _ in unsplit)})")
    if len(rows) != len(args.rows.split(",")):
        problems.append(f"--rows must be integers from 1 to {max(TABLE_ROWS)} (the rows `inputs` draws), not {args.rows!r}")
    if not torch.cuda.is_available():
        problems.append("needs a CUDA GPU (Hopper)")
    if problems:
        print(f"benchmarks/batch_invariant_matmul_hopper.py: {problems[0]}", file=sys.stderr)
        sys.exit(2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    result = {"benchmark": "batch_invariant_matmul_hopper", "machine": describe(), "configs": GLUON_TILES, "rows": []}
    print(f"{'shape':>22} {'M':>5} {'cuBLAS us':>9} {'table':>6}  best Gluon (block_m, block_n, block_k, stages)")
    for name, n, k in unsplit:
        if name in wanted:
            result["rows"] += time_shape(name, n, k, rows, gen)
            write_result(args.out, result)  # after every shape, so a cut-short run keeps its rows


if __name__ == "__main__":
    main()
