"""A GEMM whose result for a row does not depend on how many rows share the call.

cuBLAS picks its kernel (tile shape, split-K) from the row count M, so a token's product inside a
verify block of bs * (1 + budget) rows differs in the last bits from the same token's product in an
autoregressive step of bs rows, and greedy DDTree stops equalling AR (issue 29's probe at K2 shapes
in bf16: 0 of 16 root rows bit-identical). Here the K loop (BLOCK_K, split-K) is chosen from (N, K)
and the dtype alone: every output element is the same sequence of fp32 MMA steps whatever M is,
and a row's place inside its tile does not change them. A batch axis (one matrix per head: MLA's
absorbed projections) rides on the grid's third axis.

What may follow M is the blocking (`Blocking`: BLOCK_M, BLOCK_N, warps, pipeline stages, TMA loads,
where a split tiling's chunks are summed, a tail row tile, a persistent grid, swapped dots,
stream-K, the Gluon kernel): it changes which
outputs share a program and how they are loaded and added up, not an element's K loop (BLOCK_K
steps, split-K chunks). On the H200 every row kept its fp32 accumulator bits across BLOCK_M
16..128, BLOCK_N 32..256, 4 or 8 warps, 3 to 8 stages, tail tiles, TMA loads and the persistent
grid at all ten K2 shapes (benchmarks/tile_invariance.py ->
benchmarks/results/tile_invariance.json), and the tuner keeps a blocking only if its bf16 output is
bit-identical to the base tiling's on the same rows. So one tiling no longer has to
serve M = 1 (memory-bound) and M = 1,088 (compute-bound) at once: BLOCKING_BY_M picks the
blocking per M range.

Split-K (`Tiles.split_k` S > 1) fills the GPU where N is narrow and K long (q_a_proj: 12 programs
of 128 columns for 132 SMs at M <= 64 without it). cuBLAS splits too, but picks its count from M;
here S is part of the tiling, so fixed by (N, K), and the chunk boundaries come from K, BLOCK_K and
S alone. Each chunk's fp32 partial goes to a workspace, and the program whose partial arrives last
at its output tile (a per-tile counter, acquire-release) adds the tile's partials in the order s =
0, 1, ..., S-1 before the one cast: still one fixed sequence of fp32 operations per element,
whatever M is, and whichever program is last. No atomic adds of values (their order would vary
from run to run), and no second launch (a separate sum kernel was one more launch per split
product, on every decode step). Where M alone fills the GPU the blocking may keep the chunks in one
program (`split_in_program`): each chunk is still accumulated from zero and the chunks' sums added
in the same order, the same fp32 operations without the workspace (S x M x N floats written and
read).

A blocking may give each program a second, smaller row tile (`tail_m`): the BLOCK_M rows and the
tail_m rows after them, two dots on each weight tile it loads once. Row tiles are powers of two, so
136 rows (8 requests x (1 + budget 16)) fill 3 tiles of 64 (192 rows' work) or 2 of 128 (256);
128 + 16 computes 144. A row's K loop is the same in either tile, so its bits are too (the tuner
checks them like any blocking's).

A blocking may swap the dots' operands (`swap_ab`): each program computes its tile as w x^T, the
weight's BLOCK_N rows on the MMA's M side and the BLOCK_M (+ tail_m) rows on its N side, and
stores it back as x w^T. Hopper's warpgroup MMA takes 64 rows a warp group on its M side but any
multiple of 8 on its N side, so a swapped 16-row tile still runs warpgroup MMAs (unswapped it
runs the older mma.sync), and 136 rows run as 128 + 16 with no 64-row tail tile. The products
and their K order are the same; whether the tensor cores sum them to the same bits is the GPU's
to say (the `gpu` test and the tuner's check: the interpreter's OpenBLAS rounds w x^T and x w^T
apart).

A split tiling's blocking may be stream-K (`stream_k`): a program per SM, each over an equal run
of the product's (tile, chunk) units, so that 80 tiles of 4 chunks (the shared gate/up at M = 544
in 128 x 128 tiles) keep 132 SMs busy as 320 units rather than leave 52 idle. A tile whose chunks
all fall in one program is summed there; one that a run boundary cuts goes through the workspace,
its first piece's chunks summed in order into one plane, the other pieces' each in its own, and
the piece that completes the tile's count adds them in chunk order (_stream_k_kernel): the same
fp32 operations per element as the workspace tiling's. Its tiles may carry a tail row tile
(136 rows as one swapped 128 + 16 tile), as the other kernel's do. On the H200 its rows were the
workspace tiling's bits at the four split shapes and every decode M (without tails, a7bb9bd).

A blocking may load its tiles with the TMA (`tma`: Hopper's tensor-memory accelerator, through
tensor descriptors) instead of masked pointer loads: the same operands (zeros past M, N and K) for
the same dots, so the same bits by construction of the algorithm, and on the H200 the same bits in
fact (benchmarks/tile_invariance.py); `--tune-blocking` picks it per M under the same bit-for-bit
check.

A blocking may be persistent (`persistent`): one program per SM, each looping over the output
tiles in launch order (M fastest) with its loop flattened, so that the compiler may pipeline a
tile's first loads under the previous tile's last dots and its store, as a grid of one program
per tile cannot. Each tile's operations are unchanged, so are its bits (the tuner checks them).

A blocking may be warp-specialized (`warp_specialize`, with TMA loads and no tail tile): triton 3.6
splits the K loop's warps into a producer that issues the TMA loads and consumers that run the
dots, as cuBLAS's Hopper kernels do, instead of each warp waiting on its own loads between its
dots (compiled for sm_90 at 4 warps, the kernel runs 12). It takes effect at 4 warps and BLOCK_M
>= 64 only (elsewhere triton leaves the loop as it was). The dots, their operands and their order
are those of the plain loop, so are the bits (the tuner checks them). Not with a workspace: on the
H200 (2026-12-03, q_a_proj) a warp-specialized split product's tile counts went wrong, so its sums
and every later workspace launch's came out with other bits (most likely its tile counters were
left miscounted; not traced further); a split
tiling specializes with its chunks summed in the program. At BLOCK_M = 128 (two consumer warp
groups) triton 3.6's data partitioning fails to compile a chunked K loop (WSDataPartition).

A blocking may hand the product to the Gluon Hopper kernel (`gluon`;
triton_kernels/batch_invariant_matmul_hopper.py: a producer warp and a consumer warp group per 64
rows, which triton 3.6's own warp specialization cannot build): the same BLOCK_K steps on fp32
accumulators from zero, a split tiling's chunks summed in the same order, in the program or
through the same workspace and tile counters, so the same bits (the `gpu` tests, at every K2
shape and decode M, swapped, persistent and stream-K too). It serves 2-D 16-bit products on a
Hopper GPU at BLOCK_M 64, 128 or 256 with BLOCK_M / 16 warps and TMA loads, or swapped (a tail
too) at BLOCK_M 16 to 256 with BLOCK_N / 16 warps, persistent where no workspace sums the split
(the consumers store each tile while the producer loads the next; `ping_pong`: two consumer
groups taking the tiles in turn, one storing while the other multiplies; not yet run on the GPU)
or stream-K; a per-head product, or any on the CPU, runs the same tiles
in this kernel, with the same bits; on a GPU a 2-D product the Gluon kernel cannot run
(hopper.fits) is refused.

float32 (the router) may run its products on the tensor cores as TF32x3 (`Tiles.fp32_dot`) instead
of IEEE FMAs: part of the tiling, fixed by (N, K) like BLOCK_K, so still one sequence per element.

Reference: a float64 product (tests/triton_kernels/test_batch_invariant_matmul.py). The engine's
CPU path keeps its row-by-row products (engine.model.linear).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from triton_kernels.batch_invariant_matmul_hopper import HopperTiles, fits, hopper_matmul


class Tiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    split_k: int = 1  # K cut into this many chunks (see the docstring); 1: one K loop, no workspace
    tma: bool = False  # tiles loaded by the Hopper tensor-memory accelerator (see the docstring)
    # How a float32 product runs (ignored for 16-bit inputs): "ieee", CUDA-core FMAs, or "tf32x3",
    # three TF32 tensor-core products per tile pair (float32-level error, not IEEE's bits; still one
    # fixed sequence per element, so as batch-invariant as any fixed tiling).
    fp32_dot: str = "ieee"
    split_in_program: bool = False  # split_k's chunks summed inside each program, no workspace (a blocking)
    tail_m: int = 0  # rows past BLOCK_M that each program also computes, in a second tile (a blocking)
    persistent: bool = False  # a program per SM looping over the tiles (a blocking; see the docstring)
    warp_specialize: bool = False  # TMA loads and dots in separate warps (a blocking; see the docstring)
    gluon: bool = False  # run by the Gluon Hopper kernel where it can (a blocking; see the docstring)
    swap_ab: bool = False  # each tile computed as w x^T, rows on the MMA's narrow side (a blocking; the docstring)
    stream_k: bool = False  # a program per SM over equal runs of (tile, chunk) units (a blocking; the docstring)
    ping_pong: bool = False  # a persistent Gluon blocking's tiles taken in turn by two consumer groups (a blocking)


class Blocking(NamedTuple):
    """How a tiling cuts the output into programs and runs each: never an element's K loop (BLOCK_K,
    split_k), so M may choose it (see the docstring)."""
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    tma: bool = False
    split_in_program: bool = False
    tail_m: int = 0
    persistent: bool = False
    warp_specialize: bool = False
    gluon: bool = False
    swap_ab: bool = False
    stream_k: bool = False
    ping_pong: bool = False


# bf16 tilings of Kimi K2's projections, (N, K) -> Tiles: the picks of `benchmarks/batch_invariant_matmul.py
# --tune` on the H200 (it prints these lines to paste), recorded with everything it tried in
# benchmarks/results/batch_invariant_matmul_tuning.json (its "tuned" block), split counts re-picked by
# --tune-split since (a blocking run's "split_tuned": q_a_proj's 4 chunks, _22.json; a test checks that they agree).
TUNED: dict[tuple[int, int], Tiles] = {
    (1536, 7168): Tiles(64, 128, 64, 4, 4, split_k=4),   # q_a_proj
    (12288, 1536): Tiles(128, 128, 64, 8, 3),            # q_b_proj
    (576, 7168): Tiles(64, 128, 64, 4, 4, split_k=4),    # kv_a_proj
    (16384, 512): Tiles(128, 128, 64, 8, 3),             # kv_b_proj
    (7168, 8192): Tiles(64, 128, 64, 4, 4),              # o_proj
    (18432, 7168): Tiles(64, 128, 64, 4, 4),             # dense gate/up
    (7168, 18432): Tiles(64, 128, 64, 4, 4, split_k=4),  # dense down
    (2048, 7168): Tiles(64, 128, 64, 4, 4, split_k=4),   # shared expert gate/up
    (7168, 2048): Tiles(64, 128, 64, 4, 4),              # shared expert down
    (163840, 7168): Tiles(128, 128, 64, 8, 3),           # lm_head
}


# float32 tilings, (N, K) -> Tiles, picked by the same `--tune` (its "dtype": "float32" entries):
# the router, 384 experts over hidden 7168, whose scores stay float32 as the reference keeps them.
# Unsplit, with IEEE products on CUDA cores, its 32 x 32 tiles made only 12 x cdiv(M, 32) programs,
# each over all of K: 432-440 us per launch at every M up to 288 on the H200 in a k2-layer serving
# capture, 0.87 ms per verify step against cuBLAS's 0.08
# (benchmarks/results/capture_kernels_k2_b8_c32_ieee_router.json); IEEE dots stayed at 1.8-6.1x
# cuBLAS's time at best, split 14 ways (benchmarks/results/batch_invariant_matmul_tuning_router.json).
TUNED_FP32: dict[tuple[int, int], Tiles] = {
    (384, 7168): Tiles(64, 32, 64, 4, 3, split_k=14, fp32_dot="tf32x3"),  # router
}


# bf16, (N, K) -> ((largest M, Blocking), ...) by ascending M: the blocking of TUNED[N, K] per M
# range (an M past the last bound takes the last), the picks of `benchmarks/batch_invariant_matmul.py
# --tune-blocking` (today: its fifth run, which searched BLOCK_M, BLOCK_N, TMA loads, in-program
# split sums, tail row tiles and deeper pipelines per M up to 4,096 rows:
# benchmarks/results/batch_invariant_matmul_blocking_tuning_9.json for the first five shapes,
# _10.json for the other five; then its sixth, which added warp-specialized loops and persistent
# grids, for q_b_proj, o_proj and the dense gate/up: _11.json; then its seventh, which added the
# Gluon Hopper kernel's tiles, for the six unsplit shapes: _12.json for q_b_proj, kv_b_proj and
# o_proj, _13.json for the dense gate/up, the shared expert's down and lm_head; then its eighth,
# which added the Gluon kernel's split tiles, for q_a_proj, kv_a_proj and the shared gate/up:
# _14.json, and the dense down: _15.json; then its ninth, the swapped pass alone (--passes swap)
# beside the table, for all ten shapes: _16.json, _17.json, and again with deeper stages and the
# persistent pass: _18.json, _19.json, then for q_b_proj, kv_b_proj, the dense down and the shared
# gate/up with 64 weight rows on two warp groups too: _20.json; then the stream-K pass on the four
# split shapes: _21.json, q_a's and kv_a's split counts re-picked (q_a now 4 chunks): _22.json,
# _23.json, a full run on q_a, kv_b and the shared down: _24.json, then, with the Gluon kernel's
# multi-tile programs fixed, its pass on kv_b, lm_head and q_b (_25-_27), stream-K on the four split
# shapes (_28-_31), the Gluon pass on them (_32-_35) and o_proj's split counts 1, 2, 4 with every
# later pass (_36); a test checks that they agree).
# Shapes missing here keep TUNED's blocking at every M.
BLOCKING_BY_M: dict[tuple[int, int], tuple[tuple[int, Blocking], ...]] = {
    (1536, 7168): ((17, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 8, tma=True, swap_ab=True)), (136, Blocking(128, 64, 4, 8, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(64, 128, 4, 8, tma=True, split_in_program=True, gluon=True)), (1088, Blocking(128, 128, 8, 6, tma=True, split_in_program=True, persistent=True, gluon=True)), (4096, Blocking(128, 128, 8, 6, tma=True, split_in_program=True, gluon=True)),),  # q_a_proj
    (12288, 1536): ((8, Blocking(16, 32, 4, 6)), (17, Blocking(16, 64, 4, 5, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 6, tma=True, swap_ab=True)), (136, Blocking(64, 64, 4, 4, tma=True, tail_m=16, swap_ab=True)), (1088, Blocking(256, 64, 4, 5, tma=True, tail_m=16, swap_ab=True)), (4096, Blocking(128, 128, 8, 3, tma=True)),),  # q_b_proj
    (576, 7168): ((17, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 8, tma=True, swap_ab=True)), (136, Blocking(64, 64, 4, 6, tma=True, stream_k=True)), (544, Blocking(64, 64, 4, 4, tma=True)), (1088, Blocking(64, 128, 8, 3)), (4096, Blocking(128, 128, 8, 6, tma=True, split_in_program=True, gluon=True)),),  # kv_a_proj
    (16384, 512): ((1, Blocking(16, 64, 4, 5)), (8, Blocking(16, 64, 4, 5, tma=True, swap_ab=True)), (17, Blocking(16, 128, 4, 4, tma=True, swap_ab=True)), (64, Blocking(32, 128, 4, 4, tma=True, swap_ab=True)), (136, Blocking(128, 64, 4, 4, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(256, 64, 4, 5, tma=True, tail_m=16, persistent=True, gluon=True, swap_ab=True)), (4096, Blocking(128, 128, 8, 3, tma=True)),),  # kv_b_proj
    (7168, 8192): ((8, Blocking(16, 32, 4, 8)), (17, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 8, tma=True, swap_ab=True)), (136, Blocking(128, 64, 4, 6, tma=True, tail_m=16, gluon=True, swap_ab=True)), (544, Blocking(64, 256, 4, 5, tma=True, persistent=True)), (4096, Blocking(128, 256, 8, 3, tma=True, gluon=True)),),  # o_proj
    (18432, 7168): ((1, Blocking(16, 32, 4, 5)), (8, Blocking(16, 64, 4, 5, tma=True, swap_ab=True)), (17, Blocking(32, 64, 4, 4, tma=True, swap_ab=True)), (64, Blocking(64, 128, 4, 4, tma=True, swap_ab=True)), (136, Blocking(128, 64, 4, 8, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(256, 64, 4, 5, tma=True, tail_m=16, swap_ab=True)), (4096, Blocking(128, 256, 8, 3, tma=True, gluon=True)),),  # dense gate/up
    (7168, 18432): ((1, Blocking(16, 128, 4, 4, tma=True, swap_ab=True)), (8, Blocking(16, 64, 4, 5, tma=True, swap_ab=True)), (17, Blocking(32, 128, 4, 4, tma=True, swap_ab=True)), (64, Blocking(64, 128, 4, 3, tma=True, swap_ab=True)), (136, Blocking(128, 64, 4, 6, tma=True, split_in_program=True, tail_m=16, gluon=True, swap_ab=True)), (544, Blocking(256, 64, 4, 5, tma=True, tail_m=16, swap_ab=True)), (1088, Blocking(128, 128, 8, 4, tma=True, split_in_program=True, persistent=True, gluon=True)), (4096, Blocking(128, 128, 8, 6, tma=True, split_in_program=True, gluon=True)),),  # dense down
    (2048, 7168): ((8, Blocking(16, 32, 4, 8)), (17, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 8, tma=True, swap_ab=True)), (136, Blocking(64, 64, 4, 6, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(128, 64, 4, 6, tma=True, split_in_program=True, tail_m=16, persistent=True, gluon=True, swap_ab=True)), (1088, Blocking(128, 128, 8, 4, tma=True, split_in_program=True, tail_m=16, gluon=True, swap_ab=True)), (4096, Blocking(128, 128, 8, 6, tma=True, split_in_program=True, persistent=True, gluon=True)),),  # shared expert gate/up
    (7168, 2048): ((1, Blocking(16, 32, 4, 8)), (17, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (64, Blocking(32, 64, 4, 8, tma=True, swap_ab=True)), (136, Blocking(64, 64, 4, 6, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(256, 64, 4, 5, tma=True, tail_m=16, swap_ab=True)), (4096, Blocking(128, 128, 8, 3, tma=True)),),  # shared expert down
    (163840, 7168): ((1, Blocking(16, 64, 4, 8, tma=True, swap_ab=True)), (8, Blocking(16, 64, 4, 5, tma=True, swap_ab=True)), (17, Blocking(32, 128, 8, 5, tma=True, swap_ab=True)), (64, Blocking(64, 128, 4, 5, tma=True, persistent=True)), (136, Blocking(128, 128, 4, 3, tma=True, tail_m=16, swap_ab=True)), (544, Blocking(256, 128, 8, 4, tma=True, tail_m=16, gluon=True, swap_ab=True)), (1088, Blocking(256, 128, 8, 4, tma=True, tail_m=16, persistent=True, gluon=True, swap_ab=True)), (4096, Blocking(128, 256, 8, 4, tma=True, persistent=True, gluon=True)),),  # lm_head
}


def base_tiles(n: int, k: int, dtype: torch.dtype) -> Tiles:
    """The tiling of an [M, k] x [k, n] product from (n, k) and the dtype alone: what fixes each
    element's K loop (BLOCK_K, split_k), with a blocking tuned to serve every M.
    float32 (the router, the CPU tests) runs IEEE products where TUNED_FP32 holds no tiling."""
    if dtype == torch.float32:
        return TUNED_FP32.get((n, k), Tiles(32, 32, 32, 4, 2))
    if (n, k) in TUNED:
        return TUNED[n, k]
    # Untuned shapes: the tiling that did best at large M among the tuned shapes of their kind.
    return Tiles(128, 128, 64, 8, 3) if n >= 7168 else Tiles(64, 64, 128, 4, 3)


def blocking_of(tiles: Tiles) -> Blocking:
    return Blocking(tiles.block_m, tiles.block_n, tiles.num_warps, tiles.num_stages, tiles.tma, tiles.split_in_program,
                    tiles.tail_m, tiles.persistent, tiles.warp_specialize, tiles.gluon, tiles.swap_ab,
                    tiles.stream_k, tiles.ping_pong)


def hopper_tiles(tiles: Tiles) -> HopperTiles:
    """The Gluon kernel's blocking for a gluon tiling."""
    return HopperTiles(tiles.block_m, tiles.block_n, tiles.block_k, tiles.num_stages, tiles.tail_m, tiles.swap_ab,
                       tiles.persistent, tiles.stream_k, tiles.ping_pong)


def with_blocking(tiles: Tiles, ranges: tuple[tuple[int, Blocking], ...], m: int) -> Tiles:
    """tiles with the blocking that `ranges` (a BLOCKING_BY_M entry) gives M rows."""
    for bound, blocking in ranges:
        tiles = tiles._replace(**blocking._asdict())
        if m <= bound:
            break
    return tiles


def tiles_for(n: int, k: int, dtype: torch.dtype, m: int) -> Tiles:
    """base_tiles with its blocking for M rows (BLOCKING_BY_M): M never picks BLOCK_K or split_k."""
    return with_blocking(base_tiles(n, k, dtype), BLOCKING_BY_M.get((n, k), ()) if dtype == torch.bfloat16 else (), m)


@triton.jit
def _dot(a, b, acc, FP32_DOT: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc + a @ b; SWAP_AB: acc^T + b^T @ a^T, the same products and sums with the rows on the
    MMA's N side (acc transposed, [BLOCK_N, rows])."""
    if SWAP_AB:
        left = tl.trans(b)
        right = tl.trans(a)
    else:
        left = a
        right = b
    if FP32_DOT is None:  # 16-bit inputs
        acc = tl.dot(left, right, acc)
    else:
        acc = tl.dot(left, right, acc, input_precision=FP32_DOT)
    return acc


@triton.jit
def _chunk_product(x_ptr, xt_ptr, w_ptr, matrix, row0, col0, M, N, K, k_start, k_chunk,
                   stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                   BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   FP32_DOT: tl.constexpr, TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, SWAP_AB: tl.constexpr):
    """The tiles of x[matrix] @ w[matrix]^T at column col0 over the K chunk [k_start, k_start +
    k_chunk), accumulated in fp32 from zero: rows row0 .. row0 + BLOCK_M and (TAIL_M > 0) the
    TAIL_M rows after them, both dots on each weight tile loaded once (TAIL_M = 0: the tail stays
    zeros, never stored). Every chunk runs the same steps; past K (the last chunk's tail) they load
    zeros and add 0. xt_ptr: the tail's descriptor (TMA; x_ptr otherwise). SWAP_AB: the dots run
    transposed (_dot) and the tiles come back as the plain loop's, [rows, BLOCK_N]."""
    TAIL: tl.constexpr = TAIL_M if TAIL_M > 0 else 16
    batch = matrix.to(tl.int64)
    rows = row0 + tl.arange(0, BLOCK_M)
    tail_rows = row0 + BLOCK_M + tl.arange(0, TAIL)
    cols = col0 + tl.arange(0, BLOCK_N)
    k_offset = k_start.to(tl.int64)  # times a stride: a K-major weight's offset can pass 2**31
    k_left = K - k_start
    ks = tl.arange(0, BLOCK_K)
    if not TMA:
        x = x_ptr + batch * stride_xb + rows[:, None].to(tl.int64) * stride_xm + (k_offset + ks[None, :]) * stride_xk
        xt = x_ptr + batch * stride_xb + tail_rows[:, None].to(tl.int64) * stride_xm + (k_offset + ks[None, :]) * stride_xk
        w = w_ptr + batch * stride_wb + cols[None, :].to(tl.int64) * stride_wn + (k_offset + ks[:, None]) * stride_wk
    if SWAP_AB:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_tail = tl.zeros([BLOCK_N, TAIL], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_tail = tl.zeros([TAIL, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, k_chunk, BLOCK_K, warp_specialize=WARP_SPECIALIZE):
        if TMA:
            a = x_ptr.load([matrix, row0, k_start + k]).reshape(BLOCK_M, BLOCK_K)
            b = w_ptr.load([matrix, col0, k_start + k]).reshape(BLOCK_N, BLOCK_K).T
            if TAIL_M > 0:
                a_tail = xt_ptr.load([matrix, row0 + BLOCK_M, k_start + k]).reshape(TAIL, BLOCK_K)
        else:
            k_in = (k + ks) < k_left
            a = tl.load(x, mask=(rows[:, None] < M) & k_in[None, :], other=0.0)
            b = tl.load(w, mask=(cols[None, :] < N) & k_in[:, None], other=0.0)
            if TAIL_M > 0:
                a_tail = tl.load(xt, mask=(tail_rows[:, None] < M) & k_in[None, :], other=0.0)
            x += BLOCK_K * stride_xk
            xt += BLOCK_K * stride_xk
            w += BLOCK_K * stride_wk
        acc = _dot(a, b, acc, FP32_DOT, SWAP_AB)
        if TAIL_M > 0:
            acc_tail = _dot(a_tail, b, acc_tail, FP32_DOT, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
        acc_tail = tl.trans(acc_tail)
    return acc, acc_tail


@triton.jit
def _store_tile(plane_ptr, acc, row0, col0, M, N, stride_m, stride_n, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc (ROWS x BLOCK_N at row0, col0) into an [M, N] plane, cast to the plane's dtype."""
    rows = row0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, BLOCK_N)
    out = plane_ptr + rows[:, None].to(tl.int64) * stride_m + cols[None, :] * stride_n
    tl.store(out, acc.to(plane_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _sum_partials(partial_ptr, out_ptr, splits, row0, col0, M, N, stride_ps, stride_pm, stride_pn, stride_om,
                  stride_on, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """out's tile = partial[0] + partial[1] + ... + partial[splits - 1] in that order, in fp32, then
    one cast (partial_ptr and out_ptr at the tile's matrix). Loaded from L2 (.cg): the other
    programs' partials were stored from other SMs."""
    rows = row0 + tl.arange(0, ROWS)
    cols = col0 + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < M) & (cols[None, :] < N)
    partial = partial_ptr + rows[:, None].to(tl.int64) * stride_pm + cols[None, :] * stride_pn
    acc = tl.load(partial, mask=inside, other=0.0, cache_modifier=".cg")
    for _ in range(1, splits):
        partial += stride_ps
        acc += tl.load(partial, mask=inside, other=0.0, cache_modifier=".cg")
    _store_tile(out_ptr, acc, row0, col0, M, N, stride_om, stride_on, ROWS, BLOCK_N)


@triton.jit
def _store_tiles(plane_ptr, acc, acc_tail, row0, col0, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr,
                 TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A program's row tile at row0 and (TAIL_M > 0) its tail tile after it (_chunk_product's two)."""
    _store_tile(plane_ptr, acc, row0, col0, M, N, stride_m, stride_n, BLOCK_M, BLOCK_N)
    if TAIL_M > 0:
        _store_tile(plane_ptr, acc_tail, row0 + BLOCK_M, col0, M, N, stride_m, stride_n, TAIL_M, BLOCK_N)


@triton.jit
def _sum_tiles(partial_ptr, out_ptr, splits, row0, col0, M, N, stride_ps, stride_pm, stride_pn, stride_om,
               stride_on, BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """_sum_partials for a program's row tile and (TAIL_M > 0) its tail tile."""
    _sum_partials(partial_ptr, out_ptr, splits, row0, col0, M, N, stride_ps, stride_pm, stride_pn, stride_om,
                  stride_on, BLOCK_M, BLOCK_N)
    if TAIL_M > 0:
        _sum_partials(partial_ptr, out_ptr, splits, row0 + BLOCK_M, col0, M, N, stride_ps, stride_pm, stride_pn,
                      stride_om, stride_on, TAIL_M, BLOCK_N)


@triton.jit
def _output_tile(x_ptr, xt_ptr, w_ptr, partial_ptr, out_ptr, counter_ptr, pid_m, pid_n, axis2, grid_m, grid_n, planes,
                 M, N, K, batches, k_chunk, stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                 stride_ps, stride_pb, stride_pm, stride_pn, stride_ob, stride_om, stride_on,
                 BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 FP32_DOT: tl.constexpr, TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, CHUNKS: tl.constexpr,
                 WORKSPACE: tl.constexpr, SWAP_AB: tl.constexpr):
    """The output tile (pid_m, pid_n) of plane axis2 = s * batches + b, of a grid_m x grid_n x planes
    grid: its K chunks each [c * k_chunk, (c + 1) * k_chunk) accumulated from zero and then added
    in the order c = 0, 1, ....
    WORKSPACE: one chunk per tile (s), its partial to the workspace plane partial[s, b]; the
    program whose partial arrives last at a tile (counter_ptr: one int32 per tile, zero between
    products) adds the tile's planes in order into out and zeroes the counter. Otherwise all CHUNKS
    chunks in one program (CHUNKS = 1: unsplit), the same fp32 operations in the same order, summed
    straight into out. A tile's rows: BLOCK_M + TAIL_M from pid_m * (BLOCK_M + TAIL_M)
    (_chunk_product's two tiles).
    TMA: x_ptr, xt_ptr and w_ptr are tensor descriptors of [B, M, K] (tiles of BLOCK_M and of the
    tail's rows) and [B, N, K], whose loads fill what lies past M, N or K with zeros, as the masked
    loads do: the same operands for the same dots."""
    split, matrix = axis2 // batches, axis2 % batches  # matrix: the descriptors' int32 coordinate
    row0, col0 = pid_m * (BLOCK_M + TAIL_M), pid_n * BLOCK_N
    # k_chunk is a BLOCK_K multiple (it specializes as one of 16: aligned loads).
    acc, acc_tail = _chunk_product(x_ptr, xt_ptr, w_ptr, matrix, row0, col0, M, N, K, split * CHUNKS * k_chunk,
                                   k_chunk, stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                                   BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, FP32_DOT, TMA, WARP_SPECIALIZE, SWAP_AB)
    for c in range(1, CHUNKS):  # the first chunk's sum is the start, as in _sum_partials
        more, more_tail = _chunk_product(x_ptr, xt_ptr, w_ptr, matrix, row0, col0, M, N, K,
                                         (split * CHUNKS + c) * k_chunk, k_chunk, stride_xb, stride_xm, stride_xk,
                                         stride_wb, stride_wn, stride_wk, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K,
                                         FP32_DOT, TMA, WARP_SPECIALIZE, SWAP_AB)
        acc += more
        acc_tail += more_tail
    out = out_ptr + matrix.to(tl.int64) * stride_ob
    if WORKSPACE:
        partial = partial_ptr + matrix.to(tl.int64) * stride_pb
        plane = partial + split.to(tl.int64) * stride_ps
        _store_tiles(plane, acc, acc_tail, row0, col0, M, N, stride_pm, stride_pn, BLOCK_M, TAIL_M, BLOCK_N)
        splits = planes // batches
        tile = counter_ptr + (matrix * grid_n + pid_n) * grid_m + pid_m
        tl.debug_barrier()  # every thread's share of the partial stored before the count says it is
        if tl.atomic_add(tile, 1, sem="acq_rel", scope="gpu") == splits - 1:
            _sum_tiles(partial, out, splits, row0, col0, M, N, stride_ps, stride_pm, stride_pn, stride_om, stride_on,
                       BLOCK_M, TAIL_M, BLOCK_N)
            tl.atomic_xchg(tile, 0, sem="relaxed", scope="gpu")  # ready for the next product
    else:
        _store_tiles(out, acc, acc_tail, row0, col0, M, N, stride_om, stride_on, BLOCK_M, TAIL_M, BLOCK_N)


@triton.jit(do_not_specialize=["M", "grid_m"])
def _matmul_kernel(x_ptr, xt_ptr, w_ptr, partial_ptr, out_ptr, counter_ptr, M, N, K, batches, k_chunk,
                   grid_m, grid_n, planes, stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                   stride_ps, stride_pb, stride_pm, stride_pn, stride_ob, stride_om, stride_on,
                   BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   FP32_DOT: tl.constexpr, TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, CHUNKS: tl.constexpr,
                   WORKSPACE: tl.constexpr, PERSISTENT: tl.constexpr, SWAP_AB: tl.constexpr):
    """out[b] = x[b] @ w[b]^T, tile by tile (_output_tile) over a grid_m x grid_n x planes grid.
    Not PERSISTENT: one program per tile, launched on that grid. PERSISTENT: a program per SM,
    each taking tiles pid, pid + programs, ... in the same order, M fastest; the loop is flattened
    so that the compiler can pipeline one tile's loads under the last one's dots and stores (not
    with a workspace, whose tile counters' branch triton 3.6 fails to flatten, nor around a
    warp-specialized K loop, which flattening leaves unspecialized). A tile's operations are the
    same either way, so are its bits."""
    if PERSISTENT:
        tiles = grid_m * grid_n * planes
        for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=not (WORKSPACE or WARP_SPECIALIZE)):
            _output_tile(x_ptr, xt_ptr, w_ptr, partial_ptr, out_ptr, counter_ptr, tile % grid_m,
                         (tile // grid_m) % grid_n, tile // (grid_m * grid_n), grid_m, grid_n, planes, M, N, K,
                         batches, k_chunk, stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                         stride_ps, stride_pb, stride_pm, stride_pn, stride_ob, stride_om, stride_on,
                         BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, FP32_DOT, TMA, WARP_SPECIALIZE, CHUNKS, WORKSPACE,
                         SWAP_AB)
    else:
        # Axis 0 walks M fastest: programs launched together share an N tile of the weight (read once into L2).
        _output_tile(x_ptr, xt_ptr, w_ptr, partial_ptr, out_ptr, counter_ptr, tl.program_id(0), tl.program_id(1),
                     tl.program_id(2), grid_m, grid_n, planes, M, N, K, batches, k_chunk, stride_xb, stride_xm,
                     stride_xk, stride_wb, stride_wn, stride_wk, stride_ps, stride_pb, stride_pm, stride_pn,
                     stride_ob, stride_om, stride_on, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, FP32_DOT, TMA,
                     WARP_SPECIALIZE, CHUNKS, WORKSPACE, SWAP_AB)


@triton.jit
def _prefix_end(first, splits, units, programs):
    """How many of a tile's chunks (its units first .. first + splits - 1) the program holding its
    first unit holds: the programs' runs are [p * units // programs, (p + 1) * units // programs)."""
    holder = ((first + 1) * programs + units - 1) // units - 1
    return tl.minimum(((holder + 1) * units) // programs, first + splits) - first


@triton.jit(do_not_specialize=["M", "grid_m"])
def _stream_k_kernel(x_ptr, xt_ptr, w_ptr, partial_ptr, out_ptr, counter_ptr, M, N, K, batches, k_chunk,
                     grid_m, grid_n, splits, stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                     stride_ps, stride_pb, stride_pm, stride_pn, stride_ob, stride_om, stride_on,
                     BLOCK_M: tl.constexpr, TAIL_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     FP32_DOT: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr):
    """out[b] = x[b] @ w[b]^T over units (tile, chunk), tile-major (M fastest, as everywhere), each
    program taking the run [pid * units // programs, (pid + 1) * units // programs): the same
    units per program to within one, so no last wave runs half empty. Each chunk is accumulated
    from zero as in every tiling. A tile whose chunks all fall in one program is folded there, c0 +
    c1 + ... in order, and stored. A tile cut between programs: the piece holding its first chunks
    folds them likewise and stores that prefix sum in the plane of its last chunk; every other
    piece stores each chunk's sum in its own plane; each piece then counts its chunks on the
    tile's counter (acquire-release), and the piece that completes the count adds the prefix and
    the later planes in order (_sum_partials) and zeroes the counter. The same fp32 operations per
    element as the workspace tiling's, whichever piece is last. A tile is BLOCK_M rows and (TAIL_M >
    0) the TAIL_M after them, both dots on each weight tile loaded once, as in _output_tile."""
    TAIL: tl.constexpr = TAIL_M if TAIL_M > 0 else 16
    units = grid_m * grid_n * batches * splits
    programs = tl.num_programs(0)
    start = (tl.program_id(0) * units) // programs
    end = ((tl.program_id(0) + 1) * units) // programs
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    total_tail = tl.zeros([TAIL, BLOCK_N], dtype=tl.float32)
    for u in tl.range(start, end):
        tile, c = u // splits, u % splits
        first = tile * splits
        pid_m, pid_n, matrix = tile % grid_m, (tile // grid_m) % grid_n, tile // (grid_m * grid_n)
        row0, col0 = pid_m * (BLOCK_M + TAIL_M), pid_n * BLOCK_N
        acc, acc_tail = _chunk_product(x_ptr, xt_ptr, w_ptr, matrix, row0, col0, M, N, K, c * k_chunk, k_chunk,
                                       stride_xb, stride_xm, stride_xk, stride_wb, stride_wn, stride_wk,
                                       BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, FP32_DOT, TMA, False, SWAP_AB)
        if c == 0:
            total = acc
            if TAIL_M > 0:
                total_tail = acc_tail
        else:
            total = total + acc
            if TAIL_M > 0:
                total_tail = total_tail + acc_tail
        out = out_ptr + matrix.to(tl.int64) * stride_ob
        partial = partial_ptr + matrix.to(tl.int64) * stride_pb
        holds_first = first >= start
        piece_ends = (c == splits - 1) | (u == end - 1)
        if holds_first and c == splits - 1:  # the whole tile in this program
            _store_tiles(out, total, total_tail, row0, col0, M, N, stride_om, stride_on, BLOCK_M, TAIL_M, BLOCK_N)
        else:
            plane = partial + c.to(tl.int64) * stride_ps
            if not holds_first:
                _store_tiles(plane, acc, acc_tail, row0, col0, M, N, stride_pm, stride_pn, BLOCK_M, TAIL_M, BLOCK_N)
            elif piece_ends:
                _store_tiles(plane, total, total_tail, row0, col0, M, N, stride_pm, stride_pn, BLOCK_M, TAIL_M,
                             BLOCK_N)
            if piece_ends:
                counted = tl.where(holds_first, c + 1, u - start + 1)
                counter = counter_ptr + tile
                tl.debug_barrier()  # every thread's share stored before the count says it is
                if tl.atomic_add(counter, counted, sem="acq_rel", scope="gpu") == splits - counted:
                    prefix = _prefix_end(first, splits, units, programs)
                    _sum_tiles(partial + (prefix - 1).to(tl.int64) * stride_ps, out, splits - prefix + 1, row0, col0,
                               M, N, stride_ps, stride_pm, stride_pn, stride_om, stride_on, BLOCK_M, TAIL_M, BLOCK_N)
                    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next product


def k_chunks(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(chunk length, chunk count) of a K loop cut into at most `split_k` chunks of whole BLOCK_K
    blocks: from K and the tiling alone, never M. The count is clamped so that no chunk is empty
    (5 blocks in 4 chunks would be 2 + 2 + 1 + 0: 3 chunks; a K of 3 blocks splits at most 3 ways)."""
    if split_k < 1:
        raise ValueError(f"split_k must be at least 1, not {split_k}")
    blocks = triton.cdiv(k, block_k)
    per_chunk = max(1, triton.cdiv(blocks, split_k))
    return per_chunk * block_k, max(1, triton.cdiv(blocks, per_chunk))


@functools.lru_cache(maxsize=1 << 14)
def _plan(n: int, k: int, m: int, dtype: torch.dtype, tiles: Tiles | None):
    """How _launch runs an [m, k] x [k, n] product: the tiling (`tiles`, else tiles_for's), the K
    chunks, whether their partials go through the workspace, the (M, N) programs and the kernel's
    options. Cached: a function of constants (TUNED, BLOCKING_BY_M), and an eager prefill asks for
    the same few shapes thousands of times (benchmarks/prefill_host.py, profiled before the cache:
    23 of the invariant linears' 288 ms went to with_blocking's lookups, 1,392 calls in one serve;
    README "Batch-invariant numerics")."""
    t = tiles or tiles_for(n, k, dtype, m)
    if t.tail_m and (t.tail_m < 16 or t.tail_m & (t.tail_m - 1)):
        raise ValueError(f"batch_invariant_matmul: tail_m must be 0 or a power of two of at least 16, not {t.tail_m}")
    chunk, splits = k_chunks(k, t.block_k, t.split_k)
    workspace = splits > 1 and not t.split_in_program
    if t.gluon and ((t.persistent and workspace) or t.warp_specialize or not t.tma or (t.tail_m and not t.swap_ab)
                    or t.block_m not in ((16, 32, 64, 128, 256) if t.swap_ab else (64, 128, 256))
                    or t.num_warps != (t.block_n if t.swap_ab else t.block_m) // 16):
        raise ValueError(f"batch_invariant_matmul: a gluon blocking is TMA tiles of 64, 128 or 256 rows at BLOCK_M / 16 "
                         f"warps or, swapped, of 16 to 256 rows (and a tail) at BLOCK_N / 16; no warp_specialize, and "
                         f"persistent only with a split summed in the program, not {t}")
    if t.ping_pong and not (t.gluon and t.persistent):
        raise ValueError(f"batch_invariant_matmul: ping_pong is the Gluon kernel's two consumer groups taking a "
                         f"persistent program's tiles in turn: it needs gluon and persistent, not {t}")
    if t.stream_k and (t.persistent or t.split_in_program or t.warp_specialize):
        raise ValueError(f"batch_invariant_matmul: a stream_k blocking runs its own grid of a program per SM over "
                         f"(tile, chunk) units: no persistent flag, in-program split or warp_specialize, not {t}")
    if t.warp_specialize and (not t.tma or t.tail_m or workspace or t.swap_ab):
        raise ValueError("batch_invariant_matmul: warp_specialize needs TMA loads, no tail tile, no workspace and no "
                         "swap_ab (triton 3.6 cannot split pointer loads or a second dot into their own warps, and the "
                         "workspace's tile counts go wrong: the docstring; swapped dots were never tried there)")
    options = dict(BLOCK_M=t.block_m, TAIL_M=t.tail_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                   FP32_DOT=t.fp32_dot if dtype == torch.float32 else None, TMA=t.tma, WARP_SPECIALIZE=t.warp_specialize,
                   CHUNKS=1 if workspace else splits, WORKSPACE=workspace, PERSISTENT=t.persistent, SWAP_AB=t.swap_ab,
                   num_warps=t.num_warps, num_stages=t.num_stages)
    return t, chunk, splits, workspace, (triton.cdiv(m, t.block_m + t.tail_m), triton.cdiv(n, t.block_n)), options


def _launch(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tiles: Tiles | None) -> None:
    """x [B, M, K], w [B, N, K], out [B, M, N] (any strides). With more than one K chunk the partials
    go to a workspace [S, B, M, N] (fp32, from the caching allocator: no host sync, CUDA graphs
    capture it) that the last program of each tile sums into out, in the same launch. It grows with
    M: 4 bytes x S x M x N, e.g. 470 MB for the dense down (N 7168) split 4 ways over a 4,096-row
    prefill. A blocking with split_in_program has each program sum its own chunks instead (no
    workspace, S times fewer programs: for an M that fills the GPU anyway)."""
    batch, m, k = x.shape
    n = w.shape[1]
    if m == 0 or n == 0:
        return
    t, chunk, splits, workspace, programs, options = _plan(n, k, m, x.dtype, tiles)
    if workspace:
        partials = torch.empty(splits, batch, m, n, dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device, programs[0] * programs[1] * batch)
    else:
        partials, counters = out, out  # unread: the kernel's non-workspace branch stores into out
    if t.gluon and batch == 1 and x.is_cuda:
        hopper = hopper_tiles(t)
        if not (fits(x[0], w[0], hopper) and out.stride(-1) == 1):
            raise ValueError(f"batch_invariant_matmul: the Gluon Hopper kernel cannot run {hopper} on "
                             f"{tuple(x.shape[1:])} x {tuple(w.shape[1:])} {x.dtype} here (batch_invariant_matmul_hopper.fits)")
        hopper_matmul(x[0], w[0], out[0], hopper, chunk, options["CHUNKS"],
                      (partials[:, 0], counters) if workspace else None)
        return
    planes = (splits if workspace else 1) * batch
    if t.tma:
        x_arg, w_arg = _descriptor(x, t.block_m, t.block_k), _descriptor(w, t.block_n, t.block_k)
        xt_arg = _descriptor(x, t.tail_m, t.block_k) if t.tail_m else x_arg
    else:
        x_arg, xt_arg, w_arg = x, x, w
    partial_strides = partials.stride() if workspace else (0, *out.stride())
    if t.stream_k:
        units = programs[0] * programs[1] * batch * splits
        _stream_k_kernel[(min(units, _programs_per_device(x.device)),)](
            x_arg, xt_arg, w_arg, partials, out, counters, m, n, k, batch, chunk, *programs, splits, *x.stride(),
            *w.stride(), *partial_strides, *out.stride(),
            **{name: options[name] for name in ("BLOCK_M", "TAIL_M", "BLOCK_N", "BLOCK_K", "FP32_DOT", "TMA",
                                                "SWAP_AB", "num_warps", "num_stages")})
        return
    grid = (min(programs[0] * programs[1] * planes, _programs_per_device(x.device)),) if t.persistent else (*programs, planes)
    _matmul_kernel[grid](x_arg, xt_arg, w_arg, partials, out, counters, m, n, k, batch, chunk, *programs, planes,
                         *x.stride(), *w.stride(), *partial_strides, *out.stride(), **options)


@functools.lru_cache(maxsize=None)
def _programs_per_device(device: torch.device) -> int:
    """A persistent blocking's program count: one per SM (the interpreter's CPU: 3, so that its
    programs loop over several tiles each)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 3


# One int32 per tile of a workspace product, per device: zero between products (the last program of
# a tile zeroes its own), so a product needs no fill launch. A larger need allocates a larger
# buffer and keeps the old one alive (a recorded CUDA graph holds its address). Products on one
# stream at a time share it, as the engine runs them (two streams at once would mix their counts).
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    grown = _COUNTERS.setdefault(device, [])
    if not grown or grown[-1].numel() < tiles:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"batch_invariant_matmul: a product of {tiles} split tiles needs more tile counters "
                               "than were allocated before this CUDA graph capture: run it once eagerly first")
        grown.append(torch.zeros(max(tiles, 1 << 12), dtype=torch.int32, device=device))
    return grown[-1]


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    """A [B, R, K] operand as a tensor descriptor of [1, rows, cols] tiles. The TMA needs the K axis
    contiguous and a 16-byte-aligned base and strides; a tiling that asks for it on other inputs is
    refused, never silently loaded the other way."""
    size = t.element_size()
    if t.stride(-1) != 1 or t.data_ptr() % 16 or any(stride * size % 16 for stride in t.stride()[:-1]):
        raise ValueError(f"batch_invariant_matmul: a TMA tiling cannot load {tuple(t.shape)} with strides "
                         f"{t.stride()}: it needs K contiguous and a 16-byte-aligned base and strides")
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, rows, cols])


def _check(x: torch.Tensor, w: torch.Tensor, where: str) -> None:
    if x.dtype != w.dtype or x.device != w.device:
        raise ValueError(f"{where}: x ({x.dtype}, {x.device}) and weight ({w.dtype}, {w.device}) must match")


def batch_invariant_linear(x: torch.Tensor, weight: torch.Tensor, tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., K] times weight [N, K]^T -> [..., N] in x's dtype, fp32 accumulation (F.linear's contract)."""
    _check(x, weight, "batch_invariant_linear")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"batch_invariant_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not chain")
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    _launch(rows[None], weight[None], out[None], tiles)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def compile_blockings(weight: torch.Tensor, max_rows: int) -> int:
    """Run the product by `weight` ([N, K]) once at the first M of each of its BLOCKING_BY_M ranges
    up to max_rows, on zeros: Triton compiles a kernel per blocking the first time an M picks it
    (a second or two each), which would otherwise stall whichever prefill or step first has that
    many rows (a cold process's first batched prefill took 2.49 s against cuBLAS's 0.51: README
    "Batch-invariant numerics"). Returns the products run. M is not specialized, and K2's N and K
    are multiples of 16, so one M per blocking compiles what every M of its range runs. A shape
    without ranges runs one kernel at every M, which any forward compiles: none is run for it."""
    n, k = weight.shape
    ranges = BLOCKING_BY_M.get((n, k), ()) if weight.dtype == torch.bfloat16 else ()
    if not ranges:
        return 0
    firsts = {}  # blocking -> the first M that picks it (ranges may repeat a blocking)
    for m in [1] + [bound + 1 for bound, _ in ranges[:-1]]:
        if m <= max_rows:
            firsts.setdefault(blocking_of(tiles_for(n, k, weight.dtype, m)), m)
    for m in firsts.values():
        batch_invariant_linear(torch.zeros(m, k, dtype=weight.dtype, device=weight.device), weight)
    return len(firsts)


def batch_invariant_per_head(x: torch.Tensor, weight: torch.Tensor, tiles: Tiles | None = None) -> torch.Tensor:
    """x [..., H, a] times each head's matrix weight [H, b, a] -> [..., H, b] (engine.model.per_head)."""
    _check(x, weight, "batch_invariant_per_head")
    heads, b, a = weight.shape
    if x.shape[-2:] != (heads, a):
        raise ValueError(f"batch_invariant_per_head: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    rows = x.reshape(-1, heads, a)
    out = torch.empty(rows.shape[0], heads, b, dtype=x.dtype, device=x.device)
    _launch(rows.transpose(0, 1), weight, out.transpose(0, 1), tiles)
    return out.reshape(*x.shape[:-1], b)
