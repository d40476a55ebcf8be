"""The batch-invariant GEMM against cuBLAS (`F.linear`) at Kimi K2's projection shapes, decode to prefill M.

For each shape (N, K) and M in 1, 8, 17, 64, 136, 544, 1,088 (bs x (1 + budget) of the serving runs)
and 4,096 (a batched prefill's rows at the default --prefill-tokens) both run on the same inputs:
GPU time per call with a cold L2 and no host launch cost (median CUDA-graph replays of [flush the
L2, call] minus [flush] alone, as benchmarks/verify_attention.py measures), TFLOP/s, and the fraction of the copy bandwidth measured in the same run (bytes: the
weight, x and the output once; what bounds the decode range). Goal (issue 29): within 1.15x of
cuBLAS from M = 17 up, within 1.3x below.

`--tune` first times each shape's candidate tilings at M = 1, 1,088, 17, 544 and 136 (CANDIDATES;
the narrow-N, long-K shapes, K >= 2N, also SPLIT_CANDIDATES: split-K by a fixed count, which keeps
batch invariance) and runs the table with the one whose worst ratio to cuBLAS (over the goal there)
is smallest. The shape's current tiling goes first, and a candidate stops at the first M that puts
it past the best worst ratio so far (it cannot win any more). The picks and everything tried go
into the result file's "tuned" block, and the run prints the TUNED lines to paste into
`triton_kernels/batch_invariant_matmul.py` (split_k where not 1); the committed tuning run is
`--tune --out benchmarks/results/batch_invariant_matmul_tuning.json`.

The router (`FLOAT32_SHAPES`, float32 as the engine computes its scores) is tuned the same way over
FLOAT32_CANDIDATES, IEEE and TF32x3 products (`Tiles.fp32_dot`), into TUNED_FP32 (its committed run:
`--tune --shapes router --out benchmarks/results/batch_invariant_matmul_tuning_router.json`); its
blocking stays its tiling's at every M.

`--tune-blocking` then picks the blocking (Blocking: BLOCK_M, BLOCK_N, warps, stages, TMA loads,
a split tiling's chunks summed in the program) of each
shape's tiling per M: at each M of the table, the fastest blocking whose output is bit-identical
to the base tiling's on the same rows (one that is not is recorded as "not_invariant" and never
picked), searched in passes: BLOCK_M x (warps, stages) at the base's BLOCK_N (ROW_BLOCKINGS),
then BLOCK_N x (warps, stages) at the first pass's BLOCK_M (COLUMN_BLOCKINGS), then the best so far
with its tiles loaded by the TMA (`tma`), with each launch pair, for a split tiling the best so
far with each program summing its own chunks (`split_in_program`: no workspace), with each pair,
then the best so far with a second row tile per program (`tail_m`, TAILED_ROWS), with each
pair, where it leaves fewer padded rows than the best's row tile and the tail can hold a row
(M = 136: 128 + 16 computes 144 rows, 64 three times 192), then the best so far with a deeper pipeline (DEEP_STAGES at its
warps: where a program streams a narrow weight tile, as at small M, the loads in flight bound
its bandwidth), then up to M = 1,088 swapped tiles (`swap_ab`, SWAP_ROWS x SWAP_COLUMNS: each
program computes w x^T, the rows on the MMA's N side, which steps by 8 rows where the M side's
steps by 64, so that M = 136 runs as 128 + 16 rows; then the best of them with other stages and,
split, its chunks in the program), then the best so far made persistent (`persistent`: a
program per SM looping over the tiles, one tile's loads pipelined under the last one's dots), then
for a split tiling stream-K (`stream_k`, STREAM_K_BLOCKINGS: a program per SM over equal runs of
(tile, chunk) units, so that no last wave runs part empty), and last the Gluon Hopper kernel's
blockings (`gluon`, GLUON_TILES: a producer warp and one or two
consumer warp groups, triton_kernels/batch_invariant_matmul_hopper.py; a split tiling's with
its chunks through the workspace and, at tiles up to 128 x 128, in the program; swapped ones,
GLUON_SWAPPED_TILES, up to M = 1,088; then its fastest that needs no workspace as a persistent
grid, and the fastest whose accumulators fit two consumer groups' registers as a persistent
ping-pong grid, one group storing a tile while the other multiplies the next), from
M = GLUON_FROM_M up. Beside the base's own
blocking, the one BLOCKING_BY_M serves at M today is timed first (`incumbent`), so a re-run keeps
it unless it finds a faster one.
Picks at consecutive M that agree merge into one range; the run prints the BLOCKING_BY_M lines to
paste. `--passes` runs some passes only (PASSES), beside the base's and the table's blockings: a
new pass tried against the table in a fraction of the time, its picks as pasteable as a full
run's. It times 8 x (cuBLAS + at most 20 candidates) per shape, about 45 s with the compiles at 7
M (the runs of 2026-12-02, before 4,096 and the last pass), so all ten shapes with their table take
two device calls (`--shapes`, benchmarks/gpu_verify.sh parts 2 and 3). The
committed runs are benchmarks/results/batch_invariant_matmul_blocking_tuning*.json, a later name's
picks over an earlier's (the first, 2026-12-01, searched BLOCK_M, warps and stages only: its
"row_tuned" block).

`--tune-split` (instead of `--tune`) re-picks only each bf16 shape's split count, SPLIT_COUNTS at
its TUNED tile and BLOCK_K, by what `--tune-blocking` then makes of each: the count whose blocking
per M meets the goal at the most table points (ties: the smaller sum of log(ratio / goal)). The
count fixes every element's K loop, so it stays one per shape; `--tune`'s pick scored each tiling
with one blocking for every M, which no longer runs. The run records each count's points
("split_tuned") and the chosen count's blocking search ("blocking_tuned", as `--tune-blocking`
does), and prints both the TUNED and the BLOCKING_BY_M lines to paste. `--split-counts` names
other counts (q_a's 24 weight tiles of 64 at M = 136 in 2 chunks left SMs idle: of 2, 4 and 8, 4
won, 1.28x -> 1.09x there: _22.json), and `--passes` shortens each count's search. It
costs one blocking search per count: 33-79 s per shape in the fifth blocking run (the "seconds" of
benchmarks/results/batch_invariant_matmul_blocking_tuning_9.json and _10.json).

How long on the H200: a timing (two graph timings of TUNE_REP_MS x 10 replays) takes about 0.25 s,
a fresh tiling's compile a second or two. Tuning all ten bf16 shapes is at most 10 x 5 cuBLAS
timings + 10 x 12 x 5 + 4 x 9 x 5 candidate timings = 830, about 4 minutes with the compiles (less
as candidates stop early; the four split-K shapes alone, `--shapes "q_a_proj,kv_a_proj,shared
expert gate/up,dense down"`: at most 440, about 2 minutes); the router adds 5 + 40 x 5 (22 s on
2026-12-02); the table then adds 11 x 8 x 2 timings of about 1 s (rep 50 ms): about 3 minutes for
all shapes. The run prints each shape's tuning time.

    python3 benchmarks/batch_invariant_matmul.py [--tune] [--tune-blocking | --tune-split [--split-counts S,...]]
        [--passes NAME,...] [--shapes NAME,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import bench, ceilings  # noqa: E402
from triton_kernels.batch_invariant_matmul import (BLOCKING_BY_M, TUNED, TUNED_FP32, Blocking, Tiles, base_tiles,  # noqa: E402
                                                   batch_invariant_linear, blocking_of, hopper_tiles, k_chunks,
                                                   with_blocking)
from triton_kernels.batch_invariant_matmul_hopper import ping_pong_fits  # noqa: E402

# (name, N, K): Kimi K2's projections (hidden 7168, 64 heads).
SHAPES = [("q_a_proj", 1536, 7168), ("q_b_proj", 64 * 192, 1536), ("kv_a_proj", 576, 7168),
          ("kv_b_proj", 64 * 256, 512), ("o_proj", 7168, 64 * 128), ("dense gate/up", 18432, 7168),
          ("dense down", 7168, 18432), ("shared expert gate/up", 2048, 7168), ("shared expert down", 7168, 2048),
          ("lm_head", 163840, 7168)]
# (name, N, K) in float32: the router (384 experts over hidden 7168), its scores kept in float32 as
# the reference keeps them. `--tune` picks its tiling too (TUNED_FP32); its blocking is not searched.
FLOAT32_SHAPES = [("router", 384, 7168)]
ROWS = [1, 8, 17, 64, 136, 544, 1088, 4096]
TUNE_ROWS = [1, 1088, 17, 544, 136]  # the ends first: they rule most candidates out
TUNE_REP_MS = 10
GOAL = {1: 1.3, 8: 1.3}  # ratio to cuBLAS allowed below 17 rows; 1.15 from 17 up
CANDIDATES = [Tiles(64, 16, 128, 4, 4), Tiles(64, 16, 256, 4, 3), Tiles(64, 32, 128, 4, 4), Tiles(64, 32, 256, 4, 3),
              Tiles(64, 64, 64, 4, 4), Tiles(64, 64, 128, 4, 3), Tiles(64, 128, 64, 4, 4), Tiles(64, 128, 64, 8, 3),
              Tiles(128, 128, 64, 8, 3), Tiles(128, 128, 64, 4, 4), Tiles(128, 256, 64, 8, 3), Tiles(64, 256, 64, 4, 3)]
# float32 over the router's 7,168-long K: split-K by up to 14 chunks, as 12 x cdiv(M, 32) programs
# cannot fill 132 SMs; IEEE products (CUDA-core FMAs) and TF32x3 ones (tensor cores, float32-level error).
FLOAT32_CANDIDATES = ([Tiles(block_m, block_n, block_k, 4, 2, split_k)
                       for block_m, block_n, block_k in [(32, 32, 32), (64, 32, 32), (32, 64, 32), (32, 32, 64)]
                       for split_k in (1, 2, 4, 7, 8, 14)]
                      + [Tiles(block_m, block_n, block_k, warps, stages, split_k, fp32_dot="tf32x3")
                         for block_m, block_n, block_k, warps, stages in [(32, 32, 32, 4, 3), (64, 64, 32, 4, 3),
                                                                          (64, 32, 64, 4, 3), (64, 128, 32, 8, 3)]
                         for split_k in (1, 4, 8, 14)])
# Narrow N, long K: cdiv(N, BLOCK_N) x cdiv(M, 64) programs leave most of the 132 SMs idle at small M
# (q_a_proj: 24), so the K loop is also cut into 2, 4 or 8 chunks.
SPLIT_CANDIDATES = [Tiles(64, block_n, block_k, warps, stages, split_k)
                    for block_n, block_k, warps, stages in [(32, 128, 4, 4), (64, 128, 4, 3), (128, 64, 4, 4)]
                    for split_k in (2, 4, 8)]

# The blocking per M, first pass: BLOCK_M (no wider than M needs, rounded up to a power of two, at
# least 16) with the warps and stages; second pass: BLOCK_N at the first pass's BLOCK_M.
LAUNCHES = ((4, 4), (8, 3))
ROW_BLOCKINGS = [(block_m, warps, stages) for block_m in (16, 32, 64, 128) for warps, stages in LAUNCHES]
COLUMN_BLOCKINGS = [(block_n, warps, stages) for block_n in (32, 64, 128, 256) for warps, stages in LAUNCHES]
# Last pass: (BLOCK_M, tail_m), a program's two row tiles (Blocking.tail_m).
TAILED_ROWS = [(64, 16), (64, 32), (128, 16), (128, 32), (128, 64)]
DEEP_STAGES = (5, 6, 8)  # the pass before the last: more stages at the best's warps
# Not tried: Triton's warp-specialized loops (Blocking.warp_specialize), 1.5-2.4x cuBLAS and never
# picked in the sixth run (q_b, o_proj, the dense gate/up at every M from 64, 2026-12-03: `_11.json`,
# README "Batch-invariant numerics"); the Gluon kernel below is that split of the work, built by hand.
# The Gluon kernel's (BLOCK_M, BLOCK_N, stages), at BLOCK_M / 16 warps: two consumer warp groups on
# 128 rows (cuBLAS's nvjet tiles in a k2-layer capture: 256 x 160, 192 x 192), one on 64. Not tried:
# 256 rows on four groups (M = 136 in one row tile, the weight streamed once), bit-identical but
# never the fastest config, 1.49-2.23x cuBLAS at M = 136 (H200, commit e0760c6:
# benchmarks/results/batch_invariant_matmul_hopper_256_rows.json).
GLUON_TILES = [(128, 256, 3), (128, 256, 4), (128, 128, 4), (128, 128, 6), (64, 256, 4), (64, 128, 6)]
# Its swapped tiles (BLOCK_M rows + tail_m, BLOCK_N weight rows, stages), at BLOCK_N / 16 warps, up
# to SWAP_UP_TO_M: the Triton swapped pass's picks at M = 136-1,088 (128 + 16 and 256 + 16 rows
# over 64 or 128 weight rows, 4-6 stages), with a producer warp and a warp group per 64 weight
# rows. Not tried: 256 + 16 rows over 256 weight rows on four groups, whose accumulators ptxas
# cannot fit in the registers (compiled for sm_90 here).
GLUON_SWAPPED_TILES = [(128, 16, 64, 6), (128, 16, 128, 4), (256, 16, 64, 5), (256, 16, 128, 4)]
# The first M the Gluon kernel's blockings are tried at (the Gluon pass, and its stream-K tiles):
# below it every pick is the Triton kernel's (its swapped 16-64-row tiles since `_17.json` beat the
# Gluon picks `_13.json` had made at M = 17 on the shared down and lm_head; the Gluon MMA's M side
# pads to 64 rows), every point there meets the goal, and each Gluon compile costs seconds of
# device time.
GLUON_FROM_M = 136
# The swapped pass (Blocking.swap_ab): the rows on the MMA's N side, whose width steps by 8 where
# the M side's steps by 64 rows a warp group (a 16-row tile there runs the older mma.sync), so
# 136 rows run as 128 + 16 at the cost of 144, 544 and 1,088 as 2 and 4 tiles of 256 + 16, none
# padded. (row tile, tail): the two with the fewest padded rows at M, each row tile counted as 16
# rows more (each streams the whole weight again; ties: the larger tile);
# (weight rows, warps): a warp group per 64, 128 on one, or 64 on two, which split the rows' side
# (a program's MMA work doubled where M fills few programs: 1,088 rows of the shared gate/up in
# 128 programs of 64 x (256 + 16), one wave); 4 stages, then SWAP_STAGES for the best (in the
# first swapped run, H200 at 3fe0aa2: _16.json, _17.json, 6 stages beat 4 at M = 136 by 1.43x ->
# 1.18x cuBLAS on o_proj, so deeper ones are tried too). Up to the decode range's end only.
SWAP_ROWS = [(16, 0), (32, 0), (64, 0), (128, 0), (256, 0), (64, 16), (128, 16), (256, 16)]
SWAP_COLUMNS = [(64, 4), (128, 8), (128, 4), (64, 8)]
SWAP_STAGES = (3, 5, 6, 8)
SWAP_UP_TO_M = 1088
# The stream-K pass (Blocking.stream_k, split tilings only): the best so far as a program per SM
# over equal runs of (tile, chunk) units, and these (BLOCK_M, BLOCK_N, warps, stages, swap_ab,
# tail_m) with TMA loads: where a split shape's tiles end in a part-empty wave (the shared gate/up's
# 2,048 columns at M = 544 made 80 tiles of 128 x 128 for 132 SMs; in units of its 4 chunks, 320).
# The tailed ones are the swapped pass's M = 136-1,088 row tiles, 128 + 16 and 256 + 16 (the first
# stream-K run, H200 at a7bb9bd, _21.json, had no tails: 64-row tiles, 1.15x at kv_a's M = 136),
# over 64 weight rows and over 128 and 256: where the runs keep every SM busy whatever the tile
# count, a wider weight tile reads the rows from L2 fewer times (o_proj at M = 136 in 80 x 64 tiles,
# the tenth run's pick: 224 programs each reading 80 rows of x over all of K, against 56 of 144
# rows in 144 x 128 tiles; a count of tiles, which the pass measures).
STREAM_K_BLOCKINGS = [(64, 128, 4, 4, False, 0), (128, 128, 8, 3, False, 0), (64, 64, 4, 6, False, 0),
                      (128, 64, 4, 6, True, 0), (256, 64, 4, 4, True, 0), (128, 64, 4, 6, True, 16),
                      (256, 64, 4, 5, True, 16), (128, 128, 8, 4, True, 16), (128, 256, 8, 3, True, 16),
                      (256, 128, 8, 4, True, 16)]
# And the Gluon kernel's stream-K tiles (BLOCK_M, tail_m, BLOCK_N, stages, swap_ab), a warp group per
# 64 rows of the MMA's M side: its split tiles of 128 x 128 and 128 x 256, and its swapped 128 + 16
# and 256 + 16 rows over 128 weight rows (the swapped ones up to SWAP_UP_TO_M).
GLUON_STREAM_K_TILES = [(128, 0, 128, 4, False), (128, 0, 256, 3, False), (128, 16, 128, 4, True),
                        (256, 16, 128, 4, True)]
PASSES = ("rows", "columns", "tma", "split", "tail", "deep", "swap", "persistent", "stream_k", "gluon")  # in the order run
SPLIT_COUNTS = (1, 2, 4)  # --tune-split: the K chunk counts tried, each with its own blocking per M


def padded_rows(m: int, rows_per_program: int) -> int:
    """The rows M's programs compute, padding included."""
    return -(-m // rows_per_program) * rows_per_program


def candidates(n: int, k: int, dtype: torch.dtype) -> list[Tiles]:
    """The tilings `--tune` tries for an [M, k] x [k, n] product, the current one first."""
    if dtype == torch.float32:
        tried = FLOAT32_CANDIDATES
    else:
        tried = CANDIDATES + (SPLIT_CANDIDATES if k >= 2 * n else [])
    current = base_tiles(n, k, dtype)
    return [current] + [tiles for tiles in tried if tiles != current]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spelled(fields: Tiles | Blocking, positional: int) -> str:
    """A Tiles or Blocking as the kernel file spells it: the first `positional` fields by position,
    the others named where not their defaults."""
    named = [f"{name}={value!r}".replace("'", '"') for name, value in zip(fields._fields[positional:], fields[positional:])
             if value != fields._field_defaults[name]]
    return f"{type(fields).__name__}({', '.join([*map(str, fields[:positional]), *named])})"


def tiles_line(tiles: Tiles) -> str:
    """A Tiles as TUNED spells it: the five tile sizes positional."""
    return spelled(tiles, 5)


def inputs(n: int, k: int, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    w = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(dtype)
    x = torch.randn(max(ROWS), k, device="cuda", generator=gen).to(dtype)
    return x, w


def tune(x: torch.Tensor, w: torch.Tensor) -> tuple[Tiles, list[dict]]:
    """The candidate whose worst ratio to cuBLAS over TUNE_ROWS, measured against the goal at each M,
    is smallest: one tiling serves every M, so the worst point is what it must bound. A candidate
    stops at the first M past the best worst so far (its worst can only grow: "ruled_out")."""
    cublas = {m: bench(lambda: F.linear(x[:m], w), rep_ms=TUNE_REP_MS) for m in TUNE_ROWS}
    tried, best = [], float("inf")
    for tiles in candidates(w.shape[0], w.shape[1], w.dtype):
        ratios = {}
        try:
            for m in TUNE_ROWS:
                ratios[m] = bench(lambda: batch_invariant_linear(x[:m], w, tiles), rep_ms=TUNE_REP_MS) / cublas[m]
                if ratios[m] / GOAL.get(m, 1.15) >= best:
                    break
        except Exception as error:  # e.g. out of shared memory for this tile shape
            tried.append({"tiles": tiles._asdict(), "error": str(error).splitlines()[0][:200]})
            continue
        worst = max(r / GOAL.get(m, 1.15) for m, r in ratios.items())
        done = len(ratios) == len(TUNE_ROWS)
        tried.append({"tiles": tiles._asdict(), "ratio_to_cublas": ratios, "worst": worst, "ruled_out": not done})
        best = min(best, worst) if done else best
        print(f"  {tiles_line(tiles)}: " + " ".join(f"M={m}: {r:.2f}x" for m, r in ratios.items())
              + ("" if done else " (ruled out)"), flush=True)
    pick = min((t for t in tried if "worst" in t and not t["ruled_out"]), key=lambda t: t["worst"])
    return Tiles(**pick["tiles"]), tried


def incumbent(base: Tiles, shape: tuple[int, int], m: int) -> list[Blocking]:
    """The blocking BLOCKING_BY_M serves M rows of this shape today, where it can run on base (an
    in-program split sum needs a split): timed beside the passes, so a re-run's pick is never one
    its own greedy path happened to miss (the split run at 69c7370 picked 64 x 128 for o_proj at
    M = 544, 137 us, where the table's 64 x 256 had run 103 in the fifth run)."""
    blocking = blocking_of(with_blocking(base, BLOCKING_BY_M.get(shape, ()), m))
    return [] if blocking.split_in_program and base.split_k == 1 else [blocking]


def gluon_blockings(base: Tiles, m: int, widest: int) -> list[Blocking]:
    """The Gluon kernel's blockings at M (GLUON_TILES), no more rows than M needs (64 always), and
    up to SWAP_UP_TO_M its swapped ones whose row tile M passes (GLUON_SWAPPED_TILES); for a split
    tiling each with its chunks through the workspace and, where two fp32 accumulators fit the
    consumers' registers (BLOCK_M x BLOCK_N <= 128 x 128), summed in the program."""
    tiles = [Blocking(block_m, block_n, block_m // 16, stages, tma=True, gluon=True)
             for block_m, block_n, stages in GLUON_TILES if block_m <= max(64, widest)]
    if m <= SWAP_UP_TO_M:
        tiles += [Blocking(block_m, block_n, block_n // 16, stages, tma=True, tail_m=tail, gluon=True, swap_ab=True)
                  for block_m, tail, block_n, stages in GLUON_SWAPPED_TILES if block_m < m]
    if base.split_k == 1:
        return tiles
    return tiles + [b._replace(split_in_program=True) for b in tiles if b.block_m * b.block_n <= 128 * 128]


def swapped_blockings(m: int, widest: int) -> list[Blocking]:
    """The swapped pass's first blockings at M (SWAP_ROWS x SWAP_COLUMNS, TMA loads, 4 stages)."""
    fitting = [(rows, tail) for rows, tail in SWAP_ROWS if (rows < m if tail else rows <= widest)]
    fewest = sorted(fitting, key=lambda tile: (padded_rows(m, sum(tile)) + 16 * -(-m // sum(tile)), -sum(tile)))[:2]
    return [Blocking(rows, block_n, warps, 4, tma=True, tail_m=tail, swap_ab=True)
            for rows, tail in fewest for block_n, warps in SWAP_COLUMNS]


def stream_k_blockings(best: Blocking, m: int, widest: int) -> list[Blocking]:
    """The stream-K pass at M: `best` as stream-K in the Triton kernel (what it cannot keep dropped:
    its persistent flag, in-program split, warp specialization, Gluon kernel), then
    STREAM_K_BLOCKINGS and (from GLUON_FROM_M) GLUON_STREAM_K_TILES no wider than M needs (64 rows
    always), the tailed ones where M passes their row tile (and, in the Gluon kernel, up to
    SWAP_UP_TO_M)."""
    own = best._replace(persistent=False, split_in_program=False, warp_specialize=False, gluon=False, stream_k=True)
    triton_tiles = [Blocking(block_m, block_n, warps, stages, tma=True, tail_m=tail, swap_ab=swap, stream_k=True)
                    for block_m, block_n, warps, stages, swap, tail in STREAM_K_BLOCKINGS
                    if (block_m < m if tail else block_m <= max(64, widest))]
    gluon_tiles = [Blocking(block_m, block_n, (block_n if swap else block_m) // 16, stages, tma=True, tail_m=tail,
                            gluon=True, swap_ab=swap, stream_k=True)
                   for block_m, tail, block_n, stages, swap in GLUON_STREAM_K_TILES
                   if m >= GLUON_FROM_M and (block_m < m <= SWAP_UP_TO_M if tail else block_m <= max(64, widest))]
    return [own] + triton_tiles + gluon_tiles


def tune_blocking(x: torch.Tensor, w: torch.Tensor, base: Tiles, rows: list[int] = ROWS,
                  passes: tuple[str, ...] = PASSES) -> tuple[tuple[tuple[int, Blocking], ...], list[dict]]:
    """BLOCKING_BY_M's entry for this shape: at each M the fastest blocking that keeps the base
    tiling's bits (the docstring's passes; `passes` names those run, the base's and the table's
    own blocking always timed), then consecutive M with the same pick merged; with everything
    tried."""
    reference = batch_invariant_linear(x, w, base)
    tried, picks = [], []
    for m in rows:
        cublas = bench(lambda: F.linear(x[:m], w), rep_ms=TUNE_REP_MS)
        widest = max(16, 1 << (m - 1).bit_length())
        best: dict[Blocking, float | None] = {}  # each blocking tried at this M: its ratio if invariant

        def time_each(blockings: list[Blocking]) -> None:
            for blocking in blockings:
                if blocking in best:
                    continue
                tiles = base._replace(**blocking._asdict())
                entry = {"m": m, "blocking": blocking._asdict()}
                try:
                    invariant = torch.equal(batch_invariant_linear(x[:m], w, tiles), reference[:m])
                    ratio = bench(lambda: batch_invariant_linear(x[:m], w, tiles), rep_ms=TUNE_REP_MS) / cublas
                except Exception as error:  # e.g. out of shared memory for this tile shape
                    entry["error"] = str(error).splitlines()[0][:200]
                    best[blocking] = None
                else:
                    entry.update(ratio_to_cublas=ratio, not_invariant=not invariant)
                    best[blocking] = ratio if invariant else None
                tried.append(entry)

        def fastest(among=lambda blocking: True) -> Blocking | None:
            return min((b for b, ratio in best.items() if ratio is not None and among(b)), key=best.get, default=None)

        time_each([blocking_of(base)] + incumbent(base, tuple(w.shape), m))

        def run(name: str, blockings: list[Blocking]) -> None:
            if name in passes:
                time_each(blockings)

        run("rows", [Blocking(block_m, base.block_n, warps, stages) for block_m, warps, stages in ROW_BLOCKINGS
                     if block_m <= widest])
        rows_pick = fastest() or blocking_of(base)
        run("columns", [Blocking(rows_pick.block_m, block_n, warps, stages) for block_n, warps, stages in COLUMN_BLOCKINGS])
        so_far = fastest() or blocking_of(base)
        run("tma", [so_far._replace(num_warps=warps, num_stages=stages, tma=True) for warps, stages in LAUNCHES])
        if base.split_k > 1:
            so_far = fastest() or blocking_of(base)
            run("split", [so_far._replace(num_warps=warps, num_stages=stages, split_in_program=True)
                          for warps, stages in LAUNCHES])
        so_far = fastest() or blocking_of(base)
        run("tail", [so_far._replace(block_m=block_m, tail_m=tail, num_warps=warps, num_stages=stages)
                     for block_m, tail in TAILED_ROWS for warps, stages in LAUNCHES
                     if block_m < m and padded_rows(m, block_m + tail) < padded_rows(m, so_far.block_m + so_far.tail_m)])
        so_far = fastest() or blocking_of(base)
        run("deep", [so_far._replace(num_stages=stages) for stages in DEEP_STAGES])
        if m <= SWAP_UP_TO_M:
            run("swap", swapped_blockings(m, widest))
            if fastest(lambda b: b.swap_ab) is not None:
                run("swap", [fastest(lambda b: b.swap_ab)._replace(num_stages=stages) for stages in SWAP_STAGES])
                if base.split_k > 1:
                    run("swap", [fastest(lambda b: b.swap_ab)._replace(split_in_program=True)])
        run("persistent", [(fastest() or blocking_of(base))._replace(persistent=True)])
        if base.split_k > 1:
            run("stream_k", stream_k_blockings(fastest() or blocking_of(base), m, widest))
        if m >= GLUON_FROM_M:
            run("gluon", gluon_blockings(base, m, widest))
        def no_workspace(b: Blocking) -> bool:
            return b.gluon and not b.persistent and (base.split_k == 1 or b.split_in_program)

        def two_groups(b: Blocking) -> Blocking | None:
            """b as ping-pong, where two consumer groups' registers hold its accumulators."""
            b = b._replace(persistent=True, ping_pong=True)
            chunks = base.split_k if b.split_in_program else 1
            return b if ping_pong_fits(hopper_tiles(base._replace(**b._asdict())), chunks) else None

        gluon_pick = fastest(no_workspace)
        if gluon_pick is not None:
            run("gluon", [gluon_pick._replace(persistent=True)])  # its tiles' epilogues under the next loads
        # ... and under the next tile's MMAs: the fastest whose accumulators two groups can hold
        ping_pong = fastest(lambda b: no_workspace(b) and two_groups(b) is not None)
        if ping_pong is not None:
            run("gluon", [two_groups(ping_pong)])
        pick = fastest()
        if pick is None:  # not even the base tiling kept its own bits: the kernel depends on M
            raise RuntimeError(f"{tuple(w.shape)}: no blocking at M = {m}, not even the base tiling's, "
                               "gives the base tiling's bits on the full batch")
        print(f"  M={m}: {pick} {best[pick]:.2f}x", flush=True)
        picks.append((m, pick))
    merged = [pick for i, pick in enumerate(picks) if i + 1 == len(picks) or picks[i + 1][1] != pick[1]]
    return tuple(merged), tried


def pick_ratios(base: Tiles, ranges: tuple[tuple[int, Blocking], ...], tried: list[dict]) -> dict[int, float]:
    """M -> the ratio to cuBLAS that tune_blocking measured for its pick at M."""
    ratios = {}
    for entry in tried:
        picked = blocking_of(with_blocking(base, ranges, entry["m"]))
        if Blocking(**entry["blocking"]) == picked and "ratio_to_cublas" in entry:
            ratios[entry["m"]] = entry["ratio_to_cublas"]
    return ratios


def goal_score(ratios: dict[int, float]) -> tuple[int, float]:
    """(the goal's points met, minus the sum of log(ratio / goal)) over the goal's M (up to 1,088):
    larger is better; the sum breaks ties between split counts that meet the same points."""
    points = {m: r for m, r in ratios.items() if m <= 1088}
    return (sum(r <= GOAL.get(m, 1.15) for m, r in points.items()),
            -sum(math.log(r / GOAL.get(m, 1.15)) for m, r in points.items()))


def tune_split(x: torch.Tensor, w: torch.Tensor, base: Tiles, passes: tuple[str, ...] = PASSES,
               counts: tuple[int, ...] = SPLIT_COUNTS) -> tuple[Tiles, tuple, list[dict], list[dict]]:
    """The split count (`counts`, SPLIT_COUNTS unless told; base's BLOCK_K and tile kept) whose tuned blocking per M meets
    the goal at the most table points: the count fixes every element's K loop, so it is TUNED's
    (one per shape, never per M), but which count serves a shape best depends on the blocking each
    M then gets (a split's workspace costs little once its sum runs in the same launch, and
    split_in_program drops it where M fills the GPU). Returns the pick, its BLOCKING_BY_M ranges and
    tried blockings, and each count's summary. Counts that k_chunks clamps to another are skipped."""
    summaries, best = [], None
    chunk_counts = set()
    for split_k in counts:
        tiles = base._replace(split_k=split_k)
        chunks = k_chunks(w.shape[1], tiles.block_k, split_k)[1]
        if chunks in chunk_counts:
            continue
        chunk_counts.add(chunks)
        print(f"  split_k={split_k}:", flush=True)
        ranges, tried = tune_blocking(x, w, tiles, passes=passes)
        ratios = pick_ratios(tiles, ranges, tried)
        score = goal_score(ratios)
        summaries.append({"split_k": split_k, "met": score[0], "ratio_to_cublas": ratios})
        if best is None or score > best[0]:
            best = (score, tiles, ranges, tried)
    _, tiles, ranges, tried = best
    return tiles, ranges, tried, summaries


def blocking_picks(result: dict) -> dict[tuple[int, int], tuple[tuple[int, Blocking], ...]]:
    """A tuning file's BLOCKING_BY_M entries, (N, K) -> ranges. Its first run (block "row_tuned")
    searched BLOCK_M, warps and stages at the base's BLOCK_N, recorded in each shape's "tiles"."""
    picks = {}
    for shape, pick in result.get("row_tuned", {}).items():
        picks[shape] = tuple((r["up_to_m"], Blocking(block_n=pick["tiles"]["block_n"], **r["rows"]))
                             for r in pick["ranges"])
    for shape, pick in result.get("blocking_tuned", {}).items():
        picks[shape] = tuple((r["up_to_m"], Blocking(**r["blocking"])) for r in pick["ranges"])
    return {tuple(map(int, shape.split("x"))): ranges for shape, ranges in picks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "batch_invariant_matmul.json")
    parser.add_argument("--tune", action="store_true", help="pick each shape's tiling first (see the docstring)")
    parser.add_argument("--tune-blocking", action="store_true", help="then pick each shape's blocking per M (the docstring)")
    parser.add_argument("--tune-split", action="store_true",
                        help="pick each bf16 shape's split count by the blocking it then gets per M (the docstring)")
    parser.add_argument("--rows", help="comma-separated M to tune and time (default: "
                        + ",".join(map(str, ROWS)) + "; at most the largest): a look at some M only, whose "
                        "picks are not BLOCKING_BY_M's (its lines to paste are not printed)")
    parser.add_argument("--passes", help="comma-separated --tune-blocking passes to run (default: all, in the "
                        "order " + ", ".join(PASSES) + "; the base's and the table's blockings are always timed): "
                        "a new pass against the table alone")
    parser.add_argument("--split-counts", help="comma-separated split counts --tune-split tries (default: "
                        + ",".join(map(str, SPLIT_COUNTS)) + "): more chunks, where stream-K can spread them")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all): "
                        + ", ".join(name for name, _, _ in SHAPES + FLOAT32_SHAPES))
    args = parser.parse_args()
    every = [(shape, torch.bfloat16) for shape in SHAPES] + [(shape, torch.float32) for shape in FLOAT32_SHAPES]
    names = args.shapes.split(",") if args.shapes else [name for (name, _, _), _ in every]
    chosen = [(shape, dtype) for shape, dtype in every if shape[0] in names]
    unknown = sorted(set(names) - {name for (name, _, _), _ in chosen})
    passes = tuple(args.passes.split(",")) if args.passes else PASSES
    unknown_passes = sorted(set(passes) - set(PASSES))
    try:
        rows_m = sorted({int(m) for m in args.rows.split(",")}) if args.rows else ROWS  # ranges ascend
        bad_rows = [m for m in rows_m if not 1 <= m <= max(ROWS)]
    except ValueError:
        bad_rows = [args.rows]
    try:
        counts = tuple(int(c) for c in args.split_counts.split(",")) if args.split_counts else SPLIT_COUNTS
        bad_counts = [c for c in counts if c < 1]
    except ValueError:
        bad_counts = [args.split_counts]
    clash = ("--tune-split picks the split count itself: not with --tune" if args.tune_split and args.tune
             else "--tune-split tunes at the table's M: not with --rows" if args.tune_split and args.rows
             else "--split-counts is --tune-split's: not without it" if args.split_counts and not args.tune_split
             else f"--split-counts must be positive integers, not {', '.join(map(str, bad_counts))}" if bad_counts
             else None)
    if unknown or unknown_passes or bad_rows or clash or not torch.cuda.is_available():
        problem = (f"no shape named {', '.join(map(repr, unknown))}" if unknown
                   else f"no pass named {', '.join(map(repr, unknown_passes))} (passes: {', '.join(PASSES)})"
                   if unknown_passes
                   else f"--rows must be integers 1..{max(ROWS)}, not {', '.join(map(str, bad_rows))}" if bad_rows
                   else clash or "needs a CUDA GPU (torch sees none)")
        print(f"benchmarks/batch_invariant_matmul.py: {problem}", file=sys.stderr)
        sys.exit(2)
    gen = torch.Generator(device="cuda").manual_seed(0)
    peak = ceilings()
    print(f"ceilings: bf16 matmul {peak['matmul_tflops']:.0f} TFLOP/s, copy {peak['copy_gbps']:.0f} GB/s")
    rows, tuned, blocking_tuned, split_tuned = [], {}, {}, {}
    result = {"benchmark": "batch_invariant_matmul", "machine": describe(), "ceilings": peak, "rows_m": rows_m, "tuned": tuned,
              "blocking_tuned": blocking_tuned, "split_tuned": split_tuned, "rows": rows}
    print(f"{'shape':>22} {'N':>6} {'K':>6} {'M':>5} {'ours us':>8} {'cuBLAS us':>9} {'x':>5} {'TF/s':>6} {'of BW':>6}")
    for (name, n, k), dtype in chosen:
        x, w = inputs(n, k, gen, dtype)
        if args.tune:
            print(f"tuning {name} ({n} x {k}, {dtype_name(dtype)}): {len(candidates(n, k, dtype))} candidates x "
                  f"{len(TUNE_ROWS)} row counts")
            started = time.perf_counter()
            tiles, tried = tune(x, w)
            tuned[f"{n}x{k}"] = {"name": name, "dtype": dtype_name(dtype), "tiles": tiles._asdict(), "tried": tried,
                                 "seconds": time.perf_counter() - started}
            print(f"  {name}: {tiles_line(tiles)} ({tuned[f'{n}x{k}']['seconds']:.0f} s)", flush=True)
        else:
            tiles = base_tiles(n, k, dtype)
        bf16_base = dtype == torch.bfloat16 and tiles == base_tiles(n, k, dtype)
        ranges = BLOCKING_BY_M.get((n, k), ()) if bf16_base else ()
        if (args.tune_blocking or args.tune_split) and dtype != torch.bfloat16:
            print(f"{name} ({dtype_name(dtype)}) keeps its tiling's blocking at every M: not tuned")
        elif args.tune_blocking or args.tune_split:
            started = time.perf_counter()
            if args.tune_split:
                print(f"tuning {name}'s split count and blocking on {tiles_line(tiles)}")
                tiles, ranges, tried, splits = tune_split(x, w, tiles, passes, counts)
                split_tuned[f"{n}x{k}"] = {"name": name, "dtype": dtype_name(dtype), "tiles": tiles._asdict(),
                                           "splits": splits}
                print("  " + ", ".join(f"split_k={s['split_k']}: {s['met']} points" for s in splits)
                      + f" -> {tiles_line(tiles)}")
            else:
                print(f"tuning {name}'s blocking on {tiles_line(tiles)}")
                ranges, tried = tune_blocking(x, w, tiles, rows_m, passes)
            blocking_tuned[f"{n}x{k}"] = {"name": name, "tiles": tiles._asdict(), "passes": list(passes), "tried": tried,
                                          "ranges": [{"up_to_m": bound, "blocking": b._asdict()} for bound, b in ranges],
                                          "seconds": time.perf_counter() - started}
            print(f"  {name}: {ranges_line(ranges)} ({blocking_tuned[f'{n}x{k}']['seconds']:.0f} s)", flush=True)
        full = batch_invariant_linear(x, w, tiles)
        for m in rows_m:
            at_m = with_blocking(tiles, ranges, m)
            ours = bench(lambda: batch_invariant_linear(x[:m], w, at_m)) * 1e3
            vendor = bench(lambda: F.linear(x[:m], w)) * 1e3
            flops, nbytes = 2 * m * n * k, x.element_size() * (n * k + m * k + m * n)
            row = {"shape": name, "dtype": dtype_name(dtype), "n": n, "k": k, "m": m, "tiles": at_m._asdict(), "us": ours, "cublas_us": vendor,
                   "ratio_to_cublas": ours / vendor, "tflops": flops / ours / 1e6, "gbps": nbytes / ours / 1e3,
                   "of_copy_bandwidth": nbytes / ours / 1e3 / peak["copy_gbps"],
                   "row_bits_as_in_the_full_batch": bool(torch.equal(batch_invariant_linear(x[:m], w, at_m)[0],
                                                                     full[0]))}
            rows.append(row)
            print(f"{name:>22} {n:6} {k:6} {m:5} {ours:8.1f} {vendor:9.1f} {row['ratio_to_cublas']:5.2f} "
                  f"{row['tflops']:6.1f} {row['of_copy_bandwidth']:6.0%}", flush=True)
        write_result(args.out, result)  # after every shape, so a cut-short run keeps its rows
    if args.tune or args.tune_split:
        print_tuned({**tuned, **split_tuned})
    if (args.tune_blocking or args.tune_split) and rows_m == ROWS:
        print_blocking_by_m(result)


def print_tuned(tuned: dict) -> None:
    """TUNED and TUNED_FP32 as they read with this run's picks (shapes this run did not tune keep
    their lines); a table this run tuned nothing of is not printed."""
    for table, current, dtype, shapes in (("TUNED", TUNED, torch.bfloat16, SHAPES),
                                          ("TUNED_FP32", TUNED_FP32, torch.float32, FLOAT32_SHAPES)):
        mine = {shape: pick for shape, pick in tuned.items() if pick["dtype"] == dtype_name(dtype)}
        if not mine:
            continue
        picks = {**current, **{tuple(map(int, shape.split("x"))): Tiles(**pick["tiles"]) for shape, pick in mine.items()}}
        names = {(n, k): name for name, n, k in shapes}
        print(f"triton_kernels/batch_invariant_matmul.py {table}, from this run:")
        for shape, tiles in picks.items():
            print(f"    {shape}: {tiles_line(tiles)},  # {names[shape]}")


def ranges_line(ranges: tuple[tuple[int, Blocking], ...]) -> str:
    """A BLOCKING_BY_M entry as the kernel file spells it: each blocking's tile sizes, warps and stages positional."""
    return "(" + " ".join(f"({bound}, {spelled(b, 4)})," for bound, b in ranges) + ")"


def print_blocking_by_m(result: dict) -> None:
    """BLOCKING_BY_M as it reads with this run's picks (shapes this run did not tune keep their lines)."""
    picks = {**BLOCKING_BY_M, **blocking_picks(result)}
    names = {(n, k): name for name, n, k in SHAPES}
    print("triton_kernels/batch_invariant_matmul.py BLOCKING_BY_M, from this run:")
    for shape, ranges in picks.items():
        print(f"    {shape}: {ranges_line(ranges)},  # {names[shape]}")


if __name__ == "__main__":
    main()
