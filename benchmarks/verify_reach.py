"""How close to the roofline floor can any call get at the small verify-attention points (H200)?

Why: verify_attention.py measures each call against a floor (the larger of FLOPs / matmul rate and
bytes / copy bandwidth) that leaves out what every call pays: a kernel launch, the ramp of a cold
read. Where the floor is a few microseconds, 50% of it may be out of reach of *any* kernel, not
only of ours. Under verify_attention's measurement (cold L2, CUDA-graph replays minus the flush
alone), per point at prefixes >= 4k (batch 1 and 8, every budget; batch 64 decode):
- `read_us`: the cheapest call that reads the cache once: a streaming kernel that loads every cache
  row of the point (bs x (prefix + T) rows x 576 x 2 bytes) and writes one word per program, the
  best of a few tile shapes. A lower bound for any kernel that reads each row once;
- `gemms_us` (budget > 0): cuBLAS doing the two products alone (q.k for every query and head
  against every row, then p.v; batched over requests, rows padded with at most 7 zero rows, no
  mask, softmax or merge): what the vendor library reaches on the same FLOPs at this shape, a
  reference rather than a bound;
- `empty_us`: one empty kernel;
- `attention_us`: tree_verify_attention itself (default kernel and split count);
and the target, 2 x floor (50% of the floor). Where read_us > target_us, no kernel that reads each
cache row once reaches 50% of the floor at that point. Run from the repo root:
    python3 benchmarks/verify_reach.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import (BUDGETS, LATENT, PREFIXES, SCALE, bench, ceilings,  # noqa: E402
                                         make_point, work)
from benchmarks.verify_fixed_cost import empty_kernel  # noqa: E402
from triton_kernels.tree_verify_attention import tree_verify_attention  # noqa: E402

# (int64 words per tile, tiles per program): one-tile programs by the thousand, or fewer longer ones.
READ_SHAPES = ((1024, 1), (2048, 1), (4096, 1), (2048, 4))


@triton.jit
def _read_once_kernel(x_ptr, out_ptr, n_words, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """Load TILES consecutive tiles of BLOCK words and store their xor (so the loads are not dropped)."""
    first = tl.program_id(0).to(tl.int64) * BLOCK * TILES
    acc = tl.zeros([BLOCK], tl.int64)
    for tile in tl.static_range(TILES):
        words = first + tile * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + words, mask=words < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, 0))


def read_us(kv: torch.Tensor) -> tuple[float, dict]:
    """The fastest of READ_SHAPES reading all of `kv` once (GPU us per call), and that shape."""
    words = kv.view(-1).view(torch.int64)
    best = None
    for block, tiles in READ_SHAPES:
        grid = triton.cdiv(words.numel(), block * tiles)
        out = torch.empty(grid, dtype=torch.int64, device=kv.device)
        us = bench(lambda: _read_once_kernel[(grid,)](words, out, words.numel(), BLOCK=block, TILES=tiles,
                                                       num_warps=8)) * 1e3
        if best is None or us < best[0]:
            best = (us, {"block_words": block, "tiles": tiles, "programs": grid})
    return best


def gemms_us(q: torch.Tensor, kv: torch.Tensor) -> float:
    """GPU us of q.k then p.v as two batched bf16 matmuls over every cache row (no mask, no softmax).
    The rows are copied into a buffer padded with zero rows to a multiple of 8, so that the scores'
    leading dimension is 16-byte aligned, as cuBLAS's fast tensor-core kernels need."""
    bs, T, H, D = q.shape
    rows = kv.shape[1]
    keys = torch.zeros(bs, triton.cdiv(rows, 8) * 8, D, dtype=kv.dtype, device=kv.device)
    keys[:, :rows] = kv
    queries = q.reshape(bs, T * H, D)
    scores = torch.empty(bs, T * H, keys.shape[1], dtype=q.dtype, device=q.device)
    out = torch.empty(bs, T * H, LATENT, dtype=q.dtype, device=q.device)
    values = keys[..., :LATENT]

    def products():
        torch.bmm(queries, keys.transpose(1, 2), out=scores)
        torch.bmm(scores, values, out=out)

    return bench(products) * 1e3


def points():
    """(prefix, bs, budget) at prefixes >= 4k: batch 1 and 8 at every budget, batch 64 decode."""
    for prefix in (p for p in PREFIXES if p >= 4096):
        for bs in (1, 8, 64):
            for budget in BUDGETS if bs < 64 else (0,):
                yield prefix, bs, budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_reach.json")
    args = parser.parse_args()
    peak = ceilings()
    dummy = torch.zeros(1, device="cuda")
    empty_us = bench(lambda: empty_kernel[(1,)](dummy)) * 1e3
    print(f"ceilings: bf16 matmul {peak['matmul_tflops']:.0f} TFLOP/s, copy {peak['copy_gbps']:.0f} GB/s; "
          f"an empty kernel {empty_us:.2f} us", flush=True)
    rows = []
    result = {"benchmark": "verify_reach", "machine": describe(), "ceilings": peak, "empty_us": empty_us,
              "rows": rows}
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'prefix':>6} {'bs':>3} {'budget':>6} {'floor us':>9} {'target us':>10} {'read us':>8} "
          f"{'gemms us':>9} {'attention us':>13}")
    for prefix, bs, budget in points():
        point = make_point(prefix, bs, budget, gen)
        flops, nbytes = work(prefix, bs, point[-1])
        floor_us = max(flops / peak["matmul_tflops"] / 1e6, nbytes / peak["copy_gbps"] / 1e3)
        read, shape = read_us(point[1])
        gemms = gemms_us(point[0], point[1]) if budget else None
        attention = bench(lambda: tree_verify_attention(*point, SCALE, LATENT)) * 1e3
        rows.append({"prefix": prefix, "bs": bs, "budget": budget, "cache_bytes": point[1].numel() * 2,
                     "floor_us": floor_us, "target_us": 2 * floor_us, "read_us": read, "read_shape": shape,
                     "gemms_us": gemms, "attention_us": attention, "read_reaches_target": read <= 2 * floor_us})
        print(f"{prefix:>6} {bs:>3} {budget:>6} {floor_us:>9.2f} {2 * floor_us:>10.2f} {read:>8.2f} "
              f"{gemms if gemms is not None else float('nan'):>9.2f} {attention:>13.2f}", flush=True)
        write_result(args.out, result)


if __name__ == "__main__":
    main()
