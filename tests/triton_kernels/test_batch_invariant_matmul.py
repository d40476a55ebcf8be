"""batch_invariant_linear / batch_invariant_per_head vs a float64 product, and a row's bits alone vs
inside batches of other rows, unsplit and split-K.

Where each dtype runs: in the Triton interpreter on the CPU, float32 (IEEE products: ~1e-5 against
float64) and float16 (the interpreter's bf16 `tl.dot` is broken); the `gpu` tests run bfloat16
(~1e-2) at Kimi K2's projection shapes, compiled, and check a row's bits inside batches of 1 to
1,088 rows, the decode range (bs x (1 + budget) of the serving runs).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import triton_kernels.batch_invariant_matmul as gemm
from benchmarks.batch_invariant_matmul import ROWS, blocking_picks, stream_k_blockings
from benchmarks.blocking_goal import blocking_tunings
from triton_kernels.batch_invariant_matmul import (BLOCKING_BY_M, TUNED, TUNED_FP32, Blocking, Tiles, base_tiles, batch_invariant_linear,
                                                   batch_invariant_per_head, blocking_of, k_chunks, tiles_for,
                                                   with_blocking)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SEEDS = [1, 2, int(torch.randint(2**31, ()))]  # the last drawn afresh at collection (the id replays it)
TUNING = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "batch_invariant_matmul_tuning.json"
# The committed --tune-blocking runs, later over earlier (a run may tune some shapes only): the
# unnumbered file first, then _2, _3, ... by number.
BLOCKING_TUNINGS = blocking_tunings(TUNING.parent)


def split_tiles(split_k: int) -> Tiles:
    """float32's tiling (BLOCK_K 32) with K cut into `split_k` chunks."""
    return base_tiles(1, 1, torch.float32)._replace(split_k=split_k)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def random(shape, dtype, gen, scale=1.0):
    """Drawn on the generator's device (a CUDA one for the K2 shapes: lm_head's 1.2e9 weights)."""
    return (torch.randn(shape, generator=gen, dtype=torch.float64, device=gen.device) * scale).to(dtype).to(DEVICE)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("m, n, k", [(1, 40, 70), (37, 72, 130), (65, 33, 64)])  # tails in every dim
def test_linear_matches_float64(seed, dtype, tolerance, m, n, k):
    gen = torch.Generator().manual_seed(seed)
    x, w = random((m, k), dtype, gen), random((n, k), dtype, gen, k ** -0.5)
    assert relative_error(batch_invariant_linear(x, w), x.double() @ w.double().T) < tolerance


@pytest.mark.parametrize("seed", SEEDS)
def test_per_head_matches_float64_with_strided_weights(seed):
    """MLA's absorbed query passes W_UK transposed (a non-contiguous view): any strides work."""
    gen = torch.Generator().manual_seed(seed)
    x = random((3, 5, 4, 24), torch.float32, gen)
    w = random((4, 40, 24), torch.float32, gen).transpose(1, 2).contiguous().transpose(1, 2)  # [4, 40, 24], strided
    assert not w.is_contiguous()
    want = torch.einsum("...ha,hba->...hb", x.double(), w.double())
    got = batch_invariant_per_head(x, w)
    assert got.shape == (3, 5, 4, 40) and relative_error(got, want) < 1e-5


def test_a_row_alone_equals_the_row_in_a_batch_cpu():
    """In the interpreter `tl.dot` is numpy's matmul, whose BLAS treats a tile's edge rows its own
    way, so here a row is compared at the same place in its tile (row 0 of batches of every size,
    and rows that start a tile); the `gpu` test also moves a row to another place in its tile."""
    gen = torch.Generator().manual_seed(4)
    x, w = random((70, 96), torch.float32, gen), random((48, 96), torch.float32, gen)
    block_m = base_tiles(48, 96, torch.float32).block_m
    batch = batch_invariant_linear(x, w)
    for m in (1, 2, 17, 33, 70):
        assert torch.equal(batch_invariant_linear(x[:m], w)[0], batch[0]), m
    for i in range(0, 70, block_m):
        assert torch.equal(batch_invariant_linear(x[i:i + 5], w)[0], batch[i]), i


def test_empty_and_mismatched_inputs():
    w = torch.ones(8, 16, device=DEVICE)
    assert batch_invariant_linear(torch.ones(0, 16, device=DEVICE), w).shape == (0, 8)
    with pytest.raises(ValueError, match="do not chain"):
        batch_invariant_linear(torch.ones(2, 15, device=DEVICE), w)
    with pytest.raises(ValueError, match="must match"):
        batch_invariant_linear(torch.ones(2, 16, dtype=torch.float64, device=DEVICE), w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_row_count_moves_only_the_blocking(dtype):
    """What fixes an element's K loop (BLOCK_K, split_k) is base_tiles' at every M; M picks only
    Blocking's fields, from BLOCKING_BY_M's ranges (the last range's past its bound)."""
    for n, k in [*TUNED, (4096, 4096)]:
        base = base_tiles(n, k, dtype)
        seen = set()
        for m in range(1, 2200, 7):
            tiles = tiles_for(n, k, dtype, m)
            assert (tiles.block_k, tiles.split_k) == (base.block_k, base.split_k)
            seen.add(blocking_of(tiles))
        ranges = BLOCKING_BY_M.get((n, k), ()) if dtype == torch.bfloat16 else ()
        assert seen == ({blocking for _, blocking in ranges} or {blocking_of(base)})


def test_blocking_ranges_pick_by_their_bounds():
    base = Tiles(64, 128, 64, 4, 4)
    ranges = ((8, Blocking(16, 64, 4, 4)), (136, Blocking(64, 128, 8, 3)), (1088, Blocking(128, 256, 8, 3)))
    picks = {m: with_blocking(base, ranges, m)[:2] for m in (1, 8, 9, 136, 137, 1088, 5000)}
    assert picks == {1: (16, 64), 8: (16, 64), 9: (64, 128), 136: (64, 128), 137: (128, 256), 1088: (128, 256),
                     5000: (128, 256)}
    assert with_blocking(base, (), 17) == base


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("m, n, k", [(37, 40, 130), (1, 33, 200), (65, 72, 96)])  # 130, 200: not S x 32 blocks
def test_split_k_matches_float64(seed, split_k, m, n, k):
    gen = torch.Generator().manual_seed(seed)
    x, w = random((m, k), torch.float32, gen), random((n, k), torch.float32, gen, k ** -0.5)
    assert relative_error(batch_invariant_linear(x, w, split_tiles(split_k)), x.double() @ w.double().T) < 1e-5


class RecordingKernel:
    """The GEMM kernel, launched as it is, with each launch's constexprs kept."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.mark.parametrize("split_k", [1, 3])
def test_a_tiling_s_float32_products_reach_the_kernel_and_match_float64(split_k, monkeypatch):
    """Tiles.fp32_dot is what a float32 launch asks of tl.dot (the router's TF32x3; the interpreter
    runs every precision exactly, the `gpu` router test the hardware's); 16-bit inputs ask nothing."""
    kernel = RecordingKernel(gemm._matmul_kernel)
    monkeypatch.setattr(gemm, "_matmul_kernel", kernel)
    gen = torch.Generator().manual_seed(split_k)
    tiles = split_tiles(split_k)._replace(fp32_dot="tf32x3")
    for dtype, asked, tolerance in ((torch.float32, "tf32x3", 1e-5), (torch.float16, None, 2e-3)):
        x, w = random((37, 130), dtype, gen), random((40, 130), dtype, gen, 130 ** -0.5)
        assert relative_error(batch_invariant_linear(x, w, tiles), x.double() @ w.double().T) < tolerance
        assert kernel.launches[-1]["FP32_DOT"] == asked


def test_split_count_comes_from_k_alone_and_leaves_no_chunk_empty():
    """More chunks than K blocks (or a count that would leave the last chunk empty) is clamped by K:
    the same bits as the count it clamps to, and still the float64 product."""
    assert k_chunks(130, 32, 1) == (160, 1) and k_chunks(130, 32, 2) == (96, 2) and k_chunks(130, 32, 3) == (64, 3)
    assert k_chunks(130, 32, 4) == (64, 3) and k_chunks(130, 32, 8) == (32, 5) and k_chunks(20, 32, 4) == (32, 1)
    assert k_chunks(7168, 128, 8) == (896, 8)
    with pytest.raises(ValueError, match="at least 1"):
        k_chunks(130, 32, 0)
    gen = torch.Generator().manual_seed(5)
    x, w = random((9, 130), torch.float32, gen), random((24, 130), torch.float32, gen)
    eight = batch_invariant_linear(x, w, split_tiles(8))
    assert torch.equal(eight, batch_invariant_linear(x, w, split_tiles(5)))
    assert torch.equal(batch_invariant_linear(x, w, split_tiles(4)), batch_invariant_linear(x, w, split_tiles(3)))
    assert relative_error(eight, x.double() @ w.double().T) < 1e-5
    short = random((20, 24), torch.float32, gen), random((16, 24), torch.float32, gen)  # K one block: no split
    assert torch.equal(batch_invariant_linear(*short, split_tiles(4)), batch_invariant_linear(*short, split_tiles(1)))


@pytest.mark.parametrize("split_k", [2, 3])
def test_a_split_row_alone_equals_the_row_among_random_others_cpu(split_k):
    """A row's bits alone and inside batches of random other rows, split K (at the start of a tile:
    see test_a_row_alone_equals_the_row_in_a_batch_cpu)."""
    gen = torch.Generator().manual_seed(6 + split_k)
    tiles = split_tiles(split_k)
    row, w = random((1, 130), torch.float32, gen), random((40, 130), torch.float32, gen)
    alone = batch_invariant_linear(row, w, tiles)[0]
    for others in (1, 16, 40, 69):
        batch = torch.cat([row, random((others, 130), torch.float32, gen)])
        assert torch.equal(batch_invariant_linear(batch, w, tiles)[0], alone), others
        placed = torch.cat([random((tiles.block_m, 130), torch.float32, gen), batch])  # row 0 of the second tile
        assert torch.equal(batch_invariant_linear(placed, w, tiles)[tiles.block_m], alone), others


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("m, n, k", [(37, 40, 128), (5, 72, 96), (70, 48, 200)])  # 200: a partial last K tile
def test_tma_loads_give_the_pointer_loads_bits(m, n, k, split_k):
    """A TMA tiling loads the same operands (zeros past M, N and K) for the same dots. (That a TMA
    tiling really takes the descriptor path: the refusal test below.)"""
    gen = torch.Generator().manual_seed(m + n + k)
    tiles = split_tiles(split_k)
    x, w = random((m, k), torch.float32, gen), random((n, k), torch.float32, gen, k ** -0.5)
    assert torch.equal(batch_invariant_linear(x, w, tiles._replace(tma=True)), batch_invariant_linear(x, w, tiles))
    heads = random((m, 3, k), torch.float32, gen), random((3, n, k), torch.float32, gen)
    assert torch.equal(batch_invariant_per_head(*heads, tiles._replace(tma=True)), batch_invariant_per_head(*heads, tiles))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split_k, in_program, tail_m", [(1, False, 0), (3, False, 16), (3, True, 0)])
def test_a_persistent_blocking_gives_the_bits_of_a_program_per_tile(dtype, split_k, in_program, tail_m):
    """Three programs (the interpreter's count) loop over every tile, a workspace's and a tail's
    too: the same bits as one program per tile, linear and per head."""
    gen = torch.Generator().manual_seed(split_k + tail_m)
    tiles = split_tiles(split_k)._replace(split_in_program=in_program, tail_m=tail_m)
    x, w = random((70, 136), dtype, gen), random((72, 136), dtype, gen, 136 ** -0.5)
    assert torch.equal(batch_invariant_linear(x, w, tiles._replace(persistent=True)), batch_invariant_linear(x, w, tiles))
    heads = random((37, 3, 136), dtype, gen), random((3, 40, 136), dtype, gen, 136 ** -0.5)
    assert torch.equal(batch_invariant_per_head(*heads, tiles._replace(persistent=True)),
                       batch_invariant_per_head(*heads, tiles))


@pytest.mark.parametrize("split_k, in_program, persistent", [(1, False, False), (3, True, False), (3, True, True)])
def test_a_warp_specialized_blocking_gives_the_plain_loops_bits(split_k, in_program, persistent):
    """The K loop's warp specialization (a compile-time split of its warps, which the interpreter
    runs as the plain loop) reaches the kernel through every path it may take: one chunk, in-program
    chunks, a persistent grid, per head."""
    gen = torch.Generator().manual_seed(split_k)
    tiles = split_tiles(split_k)._replace(tma=True, split_in_program=in_program, persistent=persistent)
    x, w = random((70, 136), torch.float32, gen), random((72, 136), torch.float32, gen, 136 ** -0.5)
    specialized = tiles._replace(warp_specialize=True)
    assert torch.equal(batch_invariant_linear(x, w, specialized), batch_invariant_linear(x, w, tiles))
    heads = random((37, 3, 136), torch.float32, gen), random((3, 40, 136), torch.float32, gen, 136 ** -0.5)
    assert torch.equal(batch_invariant_per_head(*heads, specialized), batch_invariant_per_head(*heads, tiles))


@pytest.mark.parametrize("tiles", [Tiles(64, 64, 32, 4, 3, warp_specialize=True),
                                   Tiles(64, 64, 32, 4, 3, tma=True, tail_m=16, warp_specialize=True),
                                   Tiles(64, 64, 32, 4, 3, split_k=2, tma=True, warp_specialize=True),
                                   Tiles(64, 64, 32, 4, 3, tma=True, warp_specialize=True, swap_ab=True)])
def test_warp_specialization_without_tma_loads_with_a_tail_tile_or_a_workspace_is_refused(tiles):
    """What triton 3.6 fails to compile for sm_90 (an MLIR pass failure, no word of why), the
    workspace whose tile counts it got wrong on the H200, and swapped dots (never tried there), are
    refused with a sentence at the call."""
    x, w = torch.zeros(4, 64), torch.zeros(64, 64)
    with pytest.raises(ValueError, match="warp_specialize needs TMA loads, no tail tile, no workspace and no swap_ab"):
        batch_invariant_linear(x, w, tiles)


@pytest.mark.parametrize("tiles", [Tiles(64, 64, 32, 4, 3, tma=True), Tiles(64, 64, 32, 4, 3, split_k=2, tma=True),
                                   Tiles(64, 64, 32, 4, 3, split_k=3, tma=True, split_in_program=True),
                                   Tiles(32, 64, 32, 4, 3, split_k=2, tma=True, tail_m=16, swap_ab=True),
                                   Tiles(64, 64, 32, 4, 3, split_k=2, tma=True, split_in_program=True, persistent=True),
                                   Tiles(64, 64, 32, 4, 3, split_k=3, tma=True, stream_k=True),
                                   Tiles(32, 64, 32, 4, 3, tma=True, tail_m=16, persistent=True, swap_ab=True)])
def test_a_gluon_blocking_runs_this_kernels_same_tiles_where_the_hopper_kernel_cannot(tiles):
    """On the CPU (and for a per-head product anywhere) a gluon blocking is this kernel's own TMA
    tiling, split or not, swapped with a tail, persistent (ping-pong too: the Gluon kernel's own
    schedule, which this kernel's persistent grid stands in for) or stream-K: the same bits as
    without the flag."""
    gen = torch.Generator().manual_seed(5)
    x, w = random((70, 136), torch.float32, gen), random((72, 136), torch.float32, gen, 136 ** -0.5)
    flagged = [tiles._replace(gluon=True)] + ([tiles._replace(gluon=True, ping_pong=True)] if tiles.persistent else [])
    heads = random((37, 3, 136), torch.float32, gen), random((3, 40, 136), torch.float32, gen, 136 ** -0.5)
    for gluon in flagged:
        assert torch.equal(batch_invariant_linear(x, w, gluon), batch_invariant_linear(x, w, tiles)), gluon
        assert torch.equal(batch_invariant_per_head(*heads, gluon), batch_invariant_per_head(*heads, tiles)), gluon


@pytest.mark.parametrize("tiles", [Tiles(64, 64, 32, 4, 3, tma=True, ping_pong=True),
                                   Tiles(64, 64, 32, 4, 3, tma=True, gluon=True, ping_pong=True)])
def test_ping_pong_without_a_persistent_gluon_blocking_is_refused(tiles):
    with pytest.raises(ValueError, match="needs gluon and persistent"):
        batch_invariant_linear(torch.zeros(4, 64), torch.zeros(64, 64), tiles)


@pytest.mark.parametrize("tiles", [Tiles(64, 64, 32, 4, 3, gluon=True), Tiles(32, 64, 32, 2, 3, tma=True, gluon=True),
                                   Tiles(64, 64, 32, 8, 3, tma=True, gluon=True),
                                   Tiles(64, 64, 32, 4, 3, tma=True, tail_m=16, gluon=True),
                                   Tiles(64, 64, 32, 4, 3, split_k=2, tma=True, persistent=True, gluon=True),
                                   Tiles(64, 128, 32, 4, 3, tma=True, gluon=True, swap_ab=True),
                                   Tiles(8, 64, 32, 4, 3, tma=True, gluon=True, swap_ab=True)])
def test_a_gluon_blocking_the_hopper_kernel_could_not_run_is_refused(tiles):
    """Pointer loads, 32 rows, warps other than BLOCK_M / 16, a tail unswapped, a persistent grid
    over a workspace; swapped, warps other than BLOCK_N / 16 or fewer than 16 rows: refused at the
    call, not silently run by this kernel instead."""
    x, w = torch.zeros(4, 64), torch.zeros(64, 64)
    with pytest.raises(ValueError, match="a gluon blocking is TMA tiles"):
        batch_invariant_linear(x, w, tiles)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("split_k, in_program, tail_m, persistent", [(1, False, 0, False), (3, False, 16, False),
                                                                     (3, True, 16, False), (3, True, 0, True)])
def test_swapped_dots_match_float64_keep_a_rows_bits_in_any_batch_and_load_either_way(dtype, tolerance, split_k,
                                                                                      in_program, tail_m, persistent):
    """swap_ab: each tile computed as w x^T (the rows on the MMA's N side) and stored back as x w^T,
    split (through the workspace or in the program), with a tail tile, persistent, per head: the
    float64 product, the same bits through pointers and the TMA, and a row's bits alone and inside
    a batch. (That they are the plain dots' bits is the GPU's to say, where the tensor cores sum a
    product whichever operand holds the row: the `gpu` test below. The interpreter's OpenBLAS
    rounds w x^T and x w^T apart.)"""
    gen = torch.Generator().manual_seed(split_k + tail_m + persistent)
    tiles = split_tiles(split_k)._replace(split_in_program=in_program, tail_m=tail_m, persistent=persistent,
                                          swap_ab=True)
    x, w = random((70, 136), dtype, gen), random((72, 136), dtype, gen, 136 ** -0.5)
    swapped = batch_invariant_linear(x, w, tiles)
    assert relative_error(swapped, x.double() @ w.double().T) < tolerance
    assert torch.equal(batch_invariant_linear(x, w, tiles._replace(tma=True)), swapped)
    assert torch.equal(batch_invariant_linear(x[:1], w, tiles)[0], swapped[0])
    assert torch.equal(batch_invariant_linear(x[37:], w, tiles)[0], swapped[37])
    heads = random((37, 3, 136), dtype, gen), random((3, 40, 136), dtype, gen, 136 ** -0.5)
    per_head = batch_invariant_per_head(*heads, tiles)
    assert relative_error(per_head, torch.einsum("mha,hba->mhb", heads[0].double(), heads[1].double())) < tolerance
    assert torch.equal(batch_invariant_per_head(*heads, tiles._replace(tma=True)), per_head)


@pytest.mark.parametrize("programs", [2, 4, 7, 1000])
@pytest.mark.parametrize("split_k", [1, 2, 3, 5])
def test_stream_k_gives_the_workspace_tilings_bits_however_its_runs_cut_the_tiles(programs, split_k, monkeypatch):
    """A program per SM (`programs` of them) over equal runs of (tile, chunk) units, so that runs
    cut tiles anywhere (9 tiles x 5 chunks over 2, 4 or 7 programs; 1,000: one unit each, the
    workspace tiling's own layout): each piece folds or stores its chunks and the one completing a
    tile's count adds the prefix and the later planes in order. The workspace tiling's bits, per
    head too, swapped, through the TMA and with a tail row tile (48-row tiles of 32 + 16: other
    tiles, other cuts), and every tile counter back at zero."""
    monkeypatch.setattr(gemm, "_programs_per_device", lambda device: programs)
    gen = torch.Generator().manual_seed(programs + split_k)
    tiles = split_tiles(split_k)
    x, w = random((70, 200), torch.float32, gen), random((72, 200), torch.float32, gen, 200 ** -0.5)
    streamed = tiles._replace(stream_k=True)
    reference = batch_invariant_linear(x, w, tiles)
    assert torch.equal(batch_invariant_linear(x, w, streamed), reference)
    assert torch.equal(batch_invariant_linear(x, w, streamed._replace(tma=True)), reference)
    swapped = batch_invariant_linear(x, w, tiles._replace(swap_ab=True))
    assert torch.equal(batch_invariant_linear(x, w, streamed._replace(swap_ab=True)), swapped)
    tailed = tiles._replace(tail_m=16)  # its own reference: the interpreter's 16-row dots may round otherwise
    assert torch.equal(batch_invariant_linear(x, w, tailed._replace(stream_k=True)), batch_invariant_linear(x, w, tailed))
    assert torch.equal(batch_invariant_linear(x, w, tailed._replace(stream_k=True, tma=True, swap_ab=True)),
                       batch_invariant_linear(x, w, tailed._replace(swap_ab=True)))
    heads = random((37, 3, 200), torch.float32, gen), random((3, 40, 200), torch.float32, gen, 200 ** -0.5)
    assert torch.equal(batch_invariant_per_head(*heads, streamed), batch_invariant_per_head(*heads, tiles))
    assert torch.equal(batch_invariant_per_head(*heads, tailed._replace(stream_k=True, tma=True)),
                       batch_invariant_per_head(*heads, tailed))
    assert not any(counters.any() for counters in gemm._COUNTERS.get(x.device, []))


@pytest.mark.parametrize("tiles", [split_tiles(2)._replace(stream_k=True, persistent=True),
                                   split_tiles(2)._replace(stream_k=True, split_in_program=True),
                                   split_tiles(2)._replace(stream_k=True, tma=True, warp_specialize=True)])
def test_a_stream_k_blocking_with_a_grid_or_split_of_its_own_is_refused(tiles):
    with pytest.raises(ValueError, match="a stream_k blocking runs its own grid"):
        batch_invariant_linear(torch.zeros(4, 64), torch.zeros(64, 64), tiles)


@pytest.mark.parametrize("tail_m", [0, 16])
def test_a_workspace_product_leaves_its_tile_counters_at_zero(tail_m, monkeypatch):
    """The last program of each tile sums the workspace and zeroes the tile's counter: after a
    product every counter is 0 again, so the next product sums the right partials: the float64
    product, the same bits each time. A buffer too small for a product's tiles is replaced by a
    larger one, the old kept alive (a recorded graph may hold it)."""
    gen = torch.Generator().manual_seed(5 + tail_m)
    tiles = split_tiles(3)._replace(tail_m=tail_m)
    w = random((72, 200), torch.float32, gen, 200 ** -0.5)
    device = w.device  # cuda:0 on a GPU, the key the GEMM uses
    # Too few: the first product grows it. The module's own buffers come back after the test.
    monkeypatch.setitem(gemm._COUNTERS, device, [torch.zeros(1, dtype=torch.int32, device=device)])
    for m in (37, 37, 70):
        x = random((m, 200), torch.float32, gen)
        first = batch_invariant_linear(x, w, tiles)
        assert relative_error(first, x.double() @ w.double().T) < 1e-5
        assert not any(counters.any() for counters in gemm._COUNTERS[device])
        assert torch.equal(batch_invariant_linear(x, w, tiles), first)
    assert len(gemm._COUNTERS[device]) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split_k", [2, 3])
@pytest.mark.parametrize("m, n, k", [(37, 40, 136), (1, 72, 200), (70, 48, 96)])  # 136, 200: partial last K tiles
def test_chunks_summed_in_the_program_give_the_workspaces_bits(dtype, split_k, m, n, k):
    """split_in_program: each chunk accumulated from zero and the chunks' sums added in order, as
    the workspace and its sum kernel do: the same bits, through pointers or the TMA, per head too."""
    gen = torch.Generator().manual_seed(m + n + k + split_k)
    tiles = split_tiles(split_k)
    in_program = tiles._replace(split_in_program=True)
    x, w = random((m, k), dtype, gen), random((n, k), dtype, gen, k ** -0.5)
    assert torch.equal(batch_invariant_linear(x, w, in_program), batch_invariant_linear(x, w, tiles))
    assert torch.equal(batch_invariant_linear(x, w, in_program._replace(tma=True)), batch_invariant_linear(x, w, tiles))
    heads = random((m, 3, k), dtype, gen), random((3, n, k), dtype, gen)
    assert torch.equal(batch_invariant_per_head(*heads, in_program), batch_invariant_per_head(*heads, tiles))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("split_k, in_program", [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("m, n, k", [(37, 40, 136), (80, 72, 96), (5, 48, 200)])  # tails full, partial, empty
def test_a_tail_tile_matches_float64_through_pointers_and_the_tma(dtype, split_k, in_program, m, n, k):
    """tail_m: each program's second row tile (16 rows after its 32) over the same weight tiles:
    the float64 product, through pointers or the TMA, linear and per head. The interpreter's
    BLAS rounds a tile's rows by their place in it, so its bits against the one-tile blocking are
    the `gpu` tests' (and the tuner's) to check."""
    gen = torch.Generator().manual_seed(m + n + k + split_k)
    tiles = split_tiles(split_k)._replace(split_in_program=in_program, tail_m=16)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    x, w = random((m, k), dtype, gen), random((n, k), dtype, gen, k ** -0.5)
    want = x.double() @ w.double().T
    for loads in (tiles, tiles._replace(tma=True)):
        assert relative_error(batch_invariant_linear(x, w, loads), want) < tolerance
    heads = random((m, 3, k), dtype, gen), random((3, n, k), dtype, gen, k ** -0.5)
    want = torch.einsum("mha,hba->mhb", heads[0].double(), heads[1].double())
    assert relative_error(batch_invariant_per_head(*heads, tiles._replace(tma=True)), want) < tolerance


@pytest.mark.parametrize("tail_m", [8, 24, 48])
def test_a_tail_tile_must_be_a_power_of_two_of_at_least_16(tail_m):
    """What tl.arange and tl.dot can tile; anything else is refused before a compile fails."""
    with pytest.raises(ValueError, match="tail_m must be 0 or a power of two"):
        batch_invariant_linear(torch.ones(3, 32, device=DEVICE), torch.ones(8, 32, device=DEVICE),
                               split_tiles(1)._replace(tail_m=tail_m))


def test_a_tma_tiling_refuses_what_the_tma_cannot_load():
    tiles = split_tiles(1)._replace(tma=True)
    with pytest.raises(ValueError, match="TMA tiling cannot load"):  # rows of 130 floats: not 16-byte aligned
        batch_invariant_linear(torch.ones(3, 130, device=DEVICE), torch.ones(8, 130, device=DEVICE), tiles)
    w = torch.ones(3, 16, 24, device=DEVICE).transpose(1, 2)  # K is not the contiguous axis
    with pytest.raises(ValueError, match="TMA tiling cannot load"):
        batch_invariant_per_head(torch.ones(2, 3, 16, device=DEVICE), w, tiles)


@pytest.mark.parametrize("split_k", [2, 4])  # K 100: 4 blocks, in 2 chunks or 4 (the last one partial)
def test_per_head_split_k_matches_float64_and_is_batch_invariant(split_k):
    gen = torch.Generator().manual_seed(8)
    tiles = split_tiles(split_k)
    x = random((36, 3, 100), torch.float32, gen)
    w = random((3, 24, 100), torch.float32, gen).transpose(1, 2).contiguous().transpose(1, 2)  # strided, as W_UK^T
    full = batch_invariant_per_head(x, w, tiles)
    assert relative_error(full, torch.einsum("mha,hba->mhb", x.double(), w.double())) < 1e-5
    for m in (1, 5, 36):
        assert torch.equal(batch_invariant_per_head(x[:m], w, tiles)[0], full[0]), m


def test_tuned_tilings_are_the_committed_tuning_runs_picks():
    """TUNED and TUNED_FP32 hold the picks of `benchmarks/batch_invariant_matmul.py --tune` (the lines
    it prints): bf16 ones in batch_invariant_matmul_tuning.json, the router's in its _router file;
    a shape's split count re-picked by a later `--tune-split` (a blocking run's "split_tuned", or a
    split run's that kept every count: batch_invariant_matmul_split_tuning*.json) over them."""
    picks = {}
    for path in TUNING.parent.glob("batch_invariant_matmul_tuning*.json"):
        tuned = json.loads(path.read_text())["tuned"]
        assert tuned, f"{path} holds no tuning run"
        picks.update({(pick.get("dtype", "bfloat16"), shape): pick for shape, pick in tuned.items()})
    for path in BLOCKING_TUNINGS + sorted(TUNING.parent.glob("batch_invariant_matmul_split_tuning*.json")):
        picks.update({(pick["dtype"], shape): pick for shape, pick in json.loads(path.read_text()).get("split_tuned", {}).items()})
    for (dtype, shape), pick in picks.items():
        n, k = map(int, shape.split("x"))
        table = TUNED_FP32 if dtype == "float32" else TUNED
        assert table.get((n, k)) == Tiles(**pick["tiles"]), pick["name"]
    assert TUNED_FP32, "the router's tiling is tuned"


def test_blocking_by_m_is_the_committed_blocking_tuning_runs_picks():
    """BLOCKING_BY_M holds the picks of `--tune-blocking` (the lines it prints), each tuned on TUNED's
    tiling, and the run picked no blocking whose output differed from the base tiling's."""
    results = [json.loads(path.read_text()) for path in BLOCKING_TUNINGS]
    assert all(result.get("rows_m", ROWS) == ROWS for result in results)  # not a --rows look at some M
    assert {shape: ranges for result in results for shape, ranges in blocking_picks(result).items()} == BLOCKING_BY_M
    shapes = {shape: pick for result in results
              for shape, pick in {**result.get("row_tuned", {}), **result.get("blocking_tuned", {})}.items()}
    for shape, pick in shapes.items():
        n, k = map(int, shape.split("x"))
        assert Tiles(**pick["tiles"]) == TUNED[n, k], pick["name"]
        for tried in (t for t in pick["tried"] if t.get("not_invariant")):
            fields = tried.get("blocking") or {"block_n": pick["tiles"]["block_n"], **tried["rows"]}
            chosen = with_blocking(TUNED[n, k], BLOCKING_BY_M[n, k], tried["m"])
            assert blocking_of(chosen) != Blocking(**fields), tried



COMPILE_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_kernels.batch_invariant_matmul import _matmul_kernel
dtype, tma, chunks, fp32_dot, tail = sys.argv[1], sys.argv[2] == "tma", int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
workspace, persistent = sys.argv[6] == "workspace", sys.argv[7] == "persistent"
warps, specialize = int(sys.argv[8]), sys.argv[9] == "ws"
swap = sys.argv[10:] == ["swap"]
operand = (lambda rows: f"tensordesc<{dtype}[1,{rows},64]>") if tma else (lambda rows: f"*{dtype}")
# As a launch specializes them: the unit strides (K-major operands, a row-major output) as the
# constant 1, pointers and the other sizes and strides as multiples of 16 (what pipelines the loads).
ones = dict.fromkeys(["stride_xk", "stride_wk", "stride_pn", "stride_on"], 1)
ints = ("M N K batches k_chunk grid_m grid_n planes stride_xb stride_xm stride_wb stride_wn stride_ps stride_pb "
        "stride_pm stride_ob stride_om").split()
constants = dict(BLOCK_M=64, TAIL_M=tail, BLOCK_N=128, BLOCK_K=64, FP32_DOT=None if fp32_dot == "-" else fp32_dot,
                 TMA=tma, WARP_SPECIALIZE=specialize, CHUNKS=chunks, WORKSPACE=workspace, PERSISTENT=persistent,
                 SWAP_AB=swap, **ones)
output = "*fp32" if dtype == "fp32" else "*bf16"
signature = {"x_ptr": operand(64), "xt_ptr": operand(tail or 64), "w_ptr": operand(128),
             "partial_ptr": "*fp32" if workspace else output, "out_ptr": output,
             "counter_ptr": "*i32" if workspace else output, **dict.fromkeys(ints, "i32"),
             **dict.fromkeys(constants, "constexpr")}
aligned = ["partial_ptr", "out_ptr", "counter_ptr", *(i for i in ints if i not in ("M", "grid_m"))] + (
    [] if tma else ["x_ptr", "xt_ptr", "w_ptr"])  # M and grid_m: do_not_specialize
attrs = {(_matmul_kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
compiled = triton.compile(ASTSource(_matmul_kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": 4})
ttgir = compiled.asm["ttgir"]
print(ttgir.count("ttng.warp_group_dot "))  # Hopper's warpgroup MMAs (the dots' ops in the loops)
print(ttgir.count("ttg.warp_specialize"))  # the loops split into producer and consumer warps
"""


@pytest.mark.parametrize("dtype, loads, chunks, fp32_dot, tail, sum, grid, warps, specialized", [
    ("bf16", "pointers", 1, "-", 0, "-", "-", 4, 0), ("bf16", "tma", 4, "-", 0, "-", "-", 4, 0),
    ("bf16", "pointers", 4, "-", 0, "-", "-", 4, 0), ("fp32", "pointers", 4, "tf32x3", 0, "-", "-", 4, 0),
    ("bf16", "pointers", 1, "-", 16, "-", "-", 4, 0), ("bf16", "tma", 2, "-", 32, "-", "-", 4, 0),
    ("bf16", "pointers", 1, "-", 0, "workspace", "-", 4, 0), ("bf16", "tma", 1, "-", 16, "workspace", "-", 4, 0),
    ("fp32", "pointers", 1, "tf32x3", 0, "workspace", "-", 4, 0), ("bf16", "tma", 1, "-", 0, "-", "persistent", 4, 0),
    ("bf16", "pointers", 2, "-", 16, "-", "persistent", 4, 0), ("bf16", "tma", 1, "-", 0, "workspace", "persistent", 4, 0),
    # Warp-specialized: the K loops in one split into producer and consumer warps (4 chunks' loops
    # and the loop over them too), a persistent grid's as well; at 8 warps triton 3.6 leaves the
    # loop unspecialized (the tuner tries 4 only).
    ("bf16", "tma", 1, "-", 0, "-", "-", 4, 1), ("bf16", "tma", 4, "-", 0, "-", "-", 4, 1),
    ("bf16", "tma", 4, "-", 0, "-", "persistent", 4, 1), ("bf16", "tma", 1, "-", 0, "-", "persistent", 4, 1),
    ("bf16", "tma", 1, "-", 0, "-", "-", 8, 0)])
def test_the_kernel_compiles_for_hopper_without_a_gpu(dtype, loads, chunks, fp32_dot, tail, sum, grid, warps,
                                                      specialized):
    """What the interpreter never lowers (TMA descriptors, the chunk loop, TF32x3 dots, a tail tile's
    second dot, the workspace's tile counters: a barrier and acquire-release atomics, a persistent
    program's flattened loop over tiles, warp-specialized K loops) compiled for sm_90 here, in a
    process of its own (the tests' interpreter mode cannot compile); `specialized`: how many
    warp-specialized regions (producer and consumer warps) the compiled kernel holds."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER, dtype, loads, str(chunks), fp32_dot, str(tail), sum,
                           grid, str(warps), "ws" if specialized or warps == 8 else "-"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == specialized


@pytest.mark.parametrize("loads, chunks, tail, sum, grid, warps", [
    ("tma", 1, 16, "-", "-", 4), ("pointers", 4, 0, "-", "-", 8), ("tma", 1, 32, "workspace", "-", 4),
    ("tma", 2, 0, "-", "persistent", 4)])
def test_swapped_dots_compile_for_hopper_to_warpgroup_mmas_without_a_gpu(loads, chunks, tail, sum, grid, warps):
    """swap_ab compiled for sm_90: each dot (the tail's too, 16 or 32 rows on the MMA's N side) a
    warpgroup MMA, not the older mma.sync that a 16-row tile on the M side gets (split chunks: the
    first chunk's dots and the loop's over the others)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER, "bf16", loads, str(chunks), "-", str(tail), sum, grid,
                           str(warps), "-", "swap"],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-2]) == min(chunks, 2) * (2 if tail else 1)


COMPILE_STREAM_K_FOR_HOPPER = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton_kernels.batch_invariant_matmul import _stream_k_kernel as kernel
tma, swap, warps, tail = sys.argv[1] == "tma", sys.argv[2] == "swap", int(sys.argv[3]), int(sys.argv[4])
constants = dict(BLOCK_M=64, TAIL_M=tail, BLOCK_N=128, BLOCK_K=64, FP32_DOT=None, TMA=tma, SWAP_AB=swap,
                 **dict.fromkeys(["stride_xk", "stride_wk", "stride_pn", "stride_on"], 1))
operands = {"x_ptr": 64, "xt_ptr": tail or 64, "w_ptr": 128}  # the rows of each operand's TMA tile
outputs = {"partial_ptr": "*fp32", "out_ptr": "*bf16", "counter_ptr": "*i32"}


def kind(name):
    if name in constants:
        return "constexpr"
    if name in operands:
        return f"tensordesc<bf16[1,{operands[name]},64]>" if tma else "*bf16"
    return outputs.get(name, "i32")


signature = {name: kind(name) for name in kernel.arg_names}
aligned = [name for name, kind in signature.items() if kind.startswith("*") or name.startswith("stride_")]
attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": 4})
ttgir = compiled.asm["ttgir"]
print(ttgir.count("ttng.warp_group_dot "), ttgir.count("tt.atomic_rmw"))
"""


@pytest.mark.parametrize("loads, swap, warps, tail", [("tma", "-", 4, 0), ("pointers", "-", 8, 0), ("tma", "swap", 4, 0),
                                                      ("tma", "swap", 4, 16)])
def test_the_stream_k_kernel_compiles_for_hopper_without_a_gpu(loads, swap, warps, tail):
    """The stream-K kernel (its run of units, the pieces' stores, the counter's acquire-release add
    and reset) compiled for sm_90: one warpgroup MMA in its K loop, two with a swapped tail tile
    (16 rows on the MMA's N side), the two atomics."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_STREAM_K_FOR_HOPPER, loads, swap, str(warps), str(tail)],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2" if tail else "1", "2"]


# Kimi K2's projections (hidden 7168): q_a, q_b, kv_a, kv_b, o, the dense MLP both ways, an expert's
# gate/up and down (shared expert), lm_head over a 32,768-token slice (an untuned shape) and over
# K2's whole vocabulary (tuned, with its own blocking per M), the router (float32).
K2_SHAPES = [(1536, 7168), (64 * 192, 1536), (576, 7168), (64 * 256, 512), (7168, 64 * 128), (18432, 7168),
             (7168, 18432), (2048, 7168), (7168, 2048), (32768, 7168), (163840, 7168)]
DECODE_ROWS = [1, 8, 17, 64, 136, 544, 1088]


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", K2_SHAPES)
@pytest.mark.parametrize("tma", [False, True])
def test_k2_shapes_bf16_match_float64_and_are_batch_invariant_on_gpu(n, k, tma):
    """Each M with its own blocking (BLOCKING_BY_M), loaded through pointers or the TMA (through
    pointers, a Gluon pick runs the Triton kernel: the Gluon kernel only loads by TMA)."""
    gen = torch.Generator(device=DEVICE).manual_seed(n + k)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)

    def linear(rows):
        return batch_invariant_linear(rows, w, pointers_or_tma(tiles_for(n, k, torch.bfloat16, rows.shape[0]), tma))

    full = linear(x)
    assert relative_error(full, x.double() @ w.double().T) < 1e-2
    for m in DECODE_ROWS:  # row 0 alone and inside every batch size; the last row of each batch too
        assert torch.equal(linear(x[:m])[0], full[0]), m
        assert torch.equal(linear(x[m - 1:m])[0], full[m - 1]), m


def pointers_or_tma(tiles, tma: bool):
    return tiles._replace(tma=tma, gluon=tiles.gluon and tma)


@pytest.mark.gpu
@pytest.mark.parametrize("fp32_dot", ["ieee", "tf32x3"])
def test_router_float32_and_absorbed_heads_are_batch_invariant_on_gpu(fp32_dot):
    """The router's tuned tiling (TUNED_FP32) with either float32 product: float32-level error."""
    gen = torch.Generator().manual_seed(9)
    router = random((384, 7168), torch.float32, gen, 7168 ** -0.5)
    x = random((1088, 7168), torch.float32, gen)
    tiles = base_tiles(384, 7168, torch.float32)._replace(fp32_dot=fp32_dot)
    full = batch_invariant_linear(x, router, tiles)
    assert relative_error(full, x.double() @ router.double().T) < 1e-5
    heads = random((64, 512, 128), torch.bfloat16, gen, 128 ** -0.5)  # W_UK^T per head
    q = random((1088, 64, 128), torch.bfloat16, gen)
    full_q = batch_invariant_per_head(q, heads)
    assert relative_error(full_q, torch.einsum("mha,hba->mhb", q.double(), heads.double())) < 1e-2
    for m in DECODE_ROWS:
        assert torch.equal(batch_invariant_linear(x[:m], router, tiles)[0], full[0]), m
        assert torch.equal(batch_invariant_per_head(q[:m], heads)[0], full_q[0]), m


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", K2_SHAPES)
def test_k2_shapes_with_a_tail_tile_a_persistent_grid_or_specialized_warps_keep_the_base_tilings_bits_on_gpu(n, k):
    """A second row tile per program (tail_m), through the TMA and through pointers, a persistent
    grid (the base's own, a split one's workspace included, and 128-row TMA tiles) and
    warp-specialized K loops (64-row tiles, a split one's chunks summed in the program, persistent
    too): every row at M = 136 (where 128 + 16 saves most) and 1,088 bit-identical to the base
    tiling's."""
    gen = torch.Generator(device=DEVICE).manual_seed(n + k + 1)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    base = base_tiles(n, k, torch.bfloat16)
    full = batch_invariant_linear(x, w, base)
    specialized = base._replace(block_m=64, num_warps=4, num_stages=3, tma=True, split_in_program=base.split_k > 1,
                                warp_specialize=True)
    for tiles in (base._replace(block_m=128, tail_m=16, tma=True), base._replace(block_m=64, tail_m=32),
                  base._replace(persistent=True), base._replace(block_m=128, tma=True, persistent=True),
                  specialized, specialized._replace(persistent=True)):
        for m in (136, 1088):
            assert torch.equal(batch_invariant_linear(x[:m], w, tiles), full[:m]), (tiles, m)


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", K2_SHAPES)
def test_k2_shapes_with_swapped_dots_keep_the_base_tilings_bits_on_gpu(n, k):
    """swap_ab as the tuner tries it (16 to 256 rows on the MMA's N side, tails of 16, 64 or 128
    weight rows on 4 or 8 warps), through the TMA and through pointers, persistent, a split
    tiling's chunks through the workspace and in the program: every row at each M bit-identical
    to the base tiling's in the full 1,088-row batch. The tensor cores sum w x^T's products as
    they sum x w^T's, so the blocking may swap per M."""
    gen = torch.Generator(device=DEVICE).manual_seed(n + k + 2)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    base = base_tiles(n, k, torch.bfloat16)
    full = batch_invariant_linear(x, w, base)
    swapped = [(Blocking(16, 64, 4, 4, tma=True, swap_ab=True), (1, 8, 17)),
               (Blocking(32, 128, 8, 4, swap_ab=True), (17, 64)),
               (Blocking(128, 64, 4, 4, tma=True, tail_m=16, swap_ab=True), (136, 544)),
               (Blocking(256, 64, 4, 3, tma=True, tail_m=16, persistent=True, swap_ab=True), (544, 1088))]
    if base.split_k > 1:
        swapped.append((Blocking(128, 64, 4, 4, tma=True, split_in_program=True, tail_m=16, swap_ab=True), (136, 1088)))
    for blocking, rows in swapped:
        tiles = base._replace(**blocking._asdict())
        for m in rows:
            assert torch.equal(batch_invariant_linear(x[:m], w, tiles), full[:m]), (blocking, m)


# Split tilings of the narrow-N, long-K shapes (q_a_proj, kv_a_proj, the shared expert's gate/up,
# the dense down), one chunk count each, together the counts the benchmark tries (2, 4, 8).
K2_SPLITS = [((1536, 7168), Tiles(64, 64, 128, 4, 3, split_k=4)), ((576, 7168), Tiles(64, 32, 128, 4, 4, split_k=8)),
             ((2048, 7168), Tiles(64, 64, 128, 4, 3, split_k=2)), ((7168, 18432), Tiles(64, 128, 64, 4, 4, split_k=4))]


@pytest.mark.gpu
@pytest.mark.parametrize("shape, tiles", K2_SPLITS)
@pytest.mark.parametrize("in_program", [False, True])
def test_k2_split_k_bf16_matches_float64_and_is_batch_invariant_on_gpu(shape, tiles, in_program):
    """Through the workspace or with each program summing its own chunks: the same bits."""
    n, k = shape
    gen = torch.Generator().manual_seed(n + k + tiles.split_k)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    full = batch_invariant_linear(x, w, tiles)
    assert relative_error(full, x.double() @ w.double().T) < 1e-2
    tiles = tiles._replace(split_in_program=in_program)
    for m in DECODE_ROWS:  # row 0 alone and inside every batch size; the last row of each batch too
        assert torch.equal(batch_invariant_linear(x[:m], w, tiles)[0], full[0]), m
        assert torch.equal(batch_invariant_linear(x[m - 1:m], w, tiles)[0], full[m - 1]), m


@pytest.mark.gpu
@pytest.mark.parametrize("shape, tiles", K2_SPLITS)
def test_k2_split_tilings_run_stream_k_with_the_workspaces_bits_on_gpu(shape, tiles):
    """The tuner's stream-K blockings (its first, the base's own, through pointers; then TMA, wider,
    swapped and tailed tiles, and the Gluon kernel's) on 132 SMs: every row at each decode M
    bit-identical to the workspace tiling's in the full batch, and every tile counter back at zero.
    A blocking whose stages do not fit the SM's shared memory at this BLOCK_K is skipped, as the
    tuner skips it; the base's own always fits."""
    from triton.runtime.errors import OutOfResources
    n, k = shape
    gen = torch.Generator(device=DEVICE).manual_seed(n + k + tiles.split_k + 3)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    full = batch_invariant_linear(x, w, tiles)
    ran = []
    for blocking in stream_k_blockings(blocking_of(tiles), max(DECODE_ROWS), max(DECODE_ROWS)):
        streamed = tiles._replace(**blocking._asdict())
        try:
            batch_invariant_linear(x[:1], w, streamed)
        except OutOfResources:
            continue
        except ValueError as error:  # the Gluon kernel's ring past shared memory (hopper.fits)
            if "cannot run" not in str(error):
                raise
            continue
        ran.append(blocking)
        for m in DECODE_ROWS:
            assert torch.equal(batch_invariant_linear(x[:m], w, streamed), full[:m]), (blocking, m)
    assert ran[0] == stream_k_blockings(blocking_of(tiles), max(DECODE_ROWS), max(DECODE_ROWS))[0] and len(ran) > 1, ran
    assert not any(counters.any() for counters in gemm._COUNTERS[x.device])


@pytest.mark.gpu
def test_split_k_runs_inside_a_cuda_graph_on_gpu():
    """The workspace comes from the caching allocator, the tile counters were allocated eagerly and
    nothing waits for the host: a graph captures the split GEMM (linear, per head, and stream-K)
    and its replays, like repeated eager products, give the eager bits."""
    gen = torch.Generator().manual_seed(11)
    (n, k), tiles = K2_SPLITS[0]
    w, x = random((n, k), torch.bfloat16, gen, k ** -0.5), random((136, k), torch.bfloat16, gen)
    heads, q = random((8, 512, 256), torch.bfloat16, gen), random((17, 8, 256), torch.bfloat16, gen)
    head_tiles = Tiles(64, 64, 64, 4, 3, split_k=2)
    streamed = tiles._replace(tma=True, stream_k=True)
    eager = (batch_invariant_linear(x, w, tiles), batch_invariant_per_head(q, heads, head_tiles),
             batch_invariant_linear(x, w, streamed))
    assert torch.equal(eager[2], eager[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = (batch_invariant_linear(x, w, tiles), batch_invariant_per_head(q, heads, head_tiles),
                    batch_invariant_linear(x, w, streamed))
    for _ in range(20):  # each replay's last programs read the others' partials: a missing fence shows here
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(got, want) for got, want in zip(captured, eager))
    for _ in range(20):
        assert torch.equal(batch_invariant_linear(x, w, tiles), eager[0])


@pytest.mark.parametrize("max_rows", [1, 17, 600, 4096, 10_000])
def test_compiling_the_blockings_runs_each_blocking_an_m_up_to_max_rows_can_pick(max_rows, monkeypatch):
    """compile_blockings' launches, one per blocking, reach every blocking that tiles_for gives some
    M <= max_rows (what a later prefill or step would otherwise compile in the middle of a run)."""
    launched = []
    monkeypatch.setattr(gemm, "batch_invariant_linear", lambda x, w: launched.append(x.shape[0]))
    for (n, k), ranges in BLOCKING_BY_M.items():
        launched.clear()
        weight = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
        assert gemm.compile_blockings(weight, max_rows) == len(launched)
        run = [blocking_of(tiles_for(n, k, torch.bfloat16, m)) for m in launched]
        reachable = {blocking_of(tiles_for(n, k, torch.bfloat16, m)) for m in range(1, max_rows + 1)}
        assert len(run) == len(set(run)) and set(run) == reachable and max(launched) <= max_rows, (n, k)
    launched.clear()
    for untuned in (torch.empty(48, 96, device="meta"), torch.empty(48, 96, dtype=torch.bfloat16, device="meta")):
        assert gemm.compile_blockings(untuned, max_rows) == 0 and not launched  # one kernel at every M
