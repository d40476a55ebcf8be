"""The batch-invariant GEMM for Hopper (sm_90) in Gluon: the same products, in the same order, as
`batch_invariant_matmul`'s bf16 tilings (split or not), with the work split between warps as
cuBLAS's Hopper kernels split it.

Why a second kernel: what is left of the GEMM goal is M = 136-1,088, where the Triton kernel's
plain pipelined `tl.dot` loop runs 1.16-1.84x cuBLAS's time. cuBLAS's nvjet kernels there have a
producer warp issue TMA loads into a ring of shared-memory stages while two consumer warp groups
run the warpgroup MMAs of a 128-row tile. triton 3.6 builds that split from `tl.range(...,
warp_specialize=True)` for one consumer group only (64 rows, 1.5-2.4x cuBLAS on the H200) and fails
to compile it for two. Gluon states it directly:
- the worker partition (one warp) waits for a stage to be free, then has the TMA copy the next
  BLOCK_K columns of the x and w tiles into it (zeros past M, N and K);
- the default partition (the consumer warps: a warp group per 64 rows, so 8 warps for 128 rows
  as in cuBLAS's tiles, 16 for 256) waits for each stage in turn, issues its MMA on the fp32
  accumulator, keeps one MMA in flight and frees the stage the one before read;
- the epilogue (all the kernel's warps again) casts and stores once at the end.
Swapped (`HopperTiles.swap_ab`, as the Triton kernel's swapped dots, whose picks hold most of
M = 136-1,088): each MMA computes w x^T, the weight's rows on its M side (a warp group per 64) and
the batch's on its N side, with a tail tile (128 + 16 rows for 136, 256 + 16 for 544 and 1,088)
as a second MMA on the same weight stage. Persistent (`HopperTiles.persistent`): a program per SM
takes tiles pid, pid + programs, ...; the consumers store each tile themselves, so the producer
loads the next tile's first steps into the stages they freed while they do (a split's chunks
summed in the program; a workspace's counters stay with one-tile programs).

Arithmetic: an output element is fp32 FMAs over its K chunk in BLOCK_K steps from zero, one
warpgroup MMA chain per step, which is what the Triton kernel's tilings do whatever their BLOCK_M,
BLOCK_N, warps or stages (`benchmarks/tile_invariance.py`). A split tiling's chunks are summed in
chunk order as the Triton kernel sums them: in the program (each chunk from a fresh accumulator,
`total + chunk`), or through the workspace (each program's fp32 partial to its plane, the last
program at a tile, by an acquire-release tile counter, adds planes 0, 1, ... S-1). Then one cast.
So a row's bits are the Triton kernel's and do not depend on M. The `gpu` tests hold it to that
at K2 shapes and to a float64 reference; the Triton interpreter cannot run Gluon, so on the CPU it
is compiled for sm_90 only.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

PRODUCER_WARPS = gl.constexpr(1)
PRODUCER_REGS = gl.constexpr(40)  # registers per thread of the producer warp: it only computes coordinates
REGISTERS = 65536  # 32-bit registers per SM on sm_90
SMEM_BYTES = 232448  # shared memory per block on sm_90
PING_PONG_SPARE_REGS = 32  # a ping-pong group's registers beside its accumulators (addresses, loop state)


class HopperTiles(NamedTuple):
    """A blocking of the Gluon kernel: rows and columns per program, the K step (the Triton
    tiling's BLOCK_K: it fixes each element's sums) and the ring's stages. Each 64 rows run on a
    consumer warp group of their own (BLOCK_M / 16 warps). Swapped (`swap_ab`, as the Triton
    kernel's Blocking.swap_ab): each 64 of the BLOCK_N weight rows on a warp group, on the MMA's M
    side, and the batch's rows on its N side, where 16 to 256 rows are one MMA; `tail_m` more rows
    after them (swapped only) run a second MMA on each weight tile loaded once, so 136 rows are
    one 128 + 16 tile. `persistent`: a program per SM looping over the tiles, its consumers storing
    each tile while the producer loads the next one's first stages (no workspace: a split's chunks
    summed in the program). `stream_k`: a program per SM over equal runs of the product's (tile,
    chunk) units, through the workspace (as the Triton kernel's Blocking.stream_k). `ping_pong`
    (persistent only): two consumer groups take the program's tiles in turn, one's MMAs after the
    other's, so that each tile's store runs under the next tile's MMAs (the ping-pong schedule of
    CUTLASS's and cuBLAS's Hopper kernels: for short K loops, kv_b's 8 steps, whose stores a single
    group cannot hide); each tile's MMAs as in one group, so the same bits."""
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    tail_m: int = 0
    swap_ab: bool = False
    persistent: bool = False
    stream_k: bool = False
    ping_pong: bool = False


def consumer_warps(tiles: HopperTiles) -> int:
    """A warp group per 64 rows of the MMA's M side: the batch's rows, or swapped the weight's."""
    return (tiles.block_n if tiles.swap_ab else tiles.block_m) // 16


def group_registers(tiles: HopperTiles) -> tuple[int, int]:
    """Registers a thread of ping-pong's (first, second) consumer group gets. Its block is two
    groups and the producer's warp, which triton pads to a warp group; triton launches it at
    65,536 registers per block split evenly over its threads (in setmaxnreg's steps of 8), gives
    the producer PRODUCER_REGS and the second group what the kernel asks (this split of the SM's
    registers over two groups), and the first group what is left: 232 and 232 for groups of one
    warp group, 104 and 112 for two (the PTX's setmaxnreg, compiled for sm_90 here)."""
    warps = consumer_warps(tiles)
    threads = 32 * (2 * warps + 4)
    producer = 128 * PRODUCER_REGS.value
    second = (REGISTERS - producer) // (2 * 32 * warps) // 8 * 8
    pool = REGISTERS // threads // 8 * 8 * threads
    return (pool - producer - 32 * warps * second) // (32 * warps) // 8 * 8, second


def ping_pong_fits(tiles: HopperTiles, chunks: int = 1) -> bool:
    """Whether ping-pong can run this tiling: two groups and the padded producer within a block's
    1,024 threads, and each group's fp32 accumulators (twice over for a split summed in the
    program, whose running total and next chunk are both live) in its registers with
    PING_PONG_SPARE_REGS to spare. ptxas refuses 128 x 256 on two groups of two warp groups (128
    values a thread in 104 registers) and spills where a split's two accumulators pass the
    registers (compiled for sm_90 here)."""
    warps = consumer_warps(tiles)
    values = (tiles.block_m + tiles.tail_m) * tiles.block_n // (32 * warps) * (2 if chunks > 1 else 1)
    return 32 * (2 * warps + 4) <= 1024 and values + PING_PONG_SPARE_REGS <= min(group_registers(tiles))


def ring_bytes(tiles: HopperTiles, element_size: int = 2) -> int:
    """The shared memory of the ring: per stage a row tile, its tail and a weight tile of BLOCK_K."""
    return tiles.num_stages * (tiles.block_m + tiles.tail_m + tiles.block_n) * tiles.block_k * element_size


def fits(x: torch.Tensor, weight: torch.Tensor, tiles: HopperTiles) -> bool:
    """Whether this kernel serves these inputs: a Hopper GPU, 16-bit 2-D rows the TMA can address
    (none empty: a descriptor needs every size positive), tile shapes the warpgroup MMA allows, and
    a ring of two stages or more (a step's stage is freed after the next step's MMA is issued)
    that fits in shared memory (beside the barriers); for ping-pong, groups that fit the block and
    accumulators their registers (ping_pong_fits: of one chunk; hopper_matmul checks its own)."""
    mma_shapes = (tiles.block_n in (64, 128, 256)
                  and (tiles.block_m in (16, 32, 64, 128, 256) and tiles.tail_m in (0, 16, 32, 64) if tiles.swap_ab
                       else tiles.block_m in (64, 128, 256) and tiles.tail_m == 0))
    return (x.is_cuda and _is_hopper(x.device) and x.dim() == weight.dim() == 2 and x.numel() > 0
            and weight.numel() > 0 and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)
            and x.stride(-1) == 1 and weight.stride(-1) == 1
            and all((t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (x, weight))
            and mma_shapes and tiles.num_stages >= 2 and ring_bytes(tiles, x.element_size()) <= SMEM_BYTES - 1024
            and (not tiles.ping_pong or ping_pong_fits(tiles)))


@functools.lru_cache(maxsize=None)
def _is_hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) == (9, 0)


@functools.lru_cache(maxsize=None)
def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@gluon.jit
def _tile_origin(tile, grid_m, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Tile `tile`'s first row and column (M fastest: tiles after each other share a weight tile)."""
    return (tile % grid_m) * (BLOCK_M + TAIL_M), (tile // grid_m) * BLOCK_N


@gluon.jit
def _load_stages(x_desc, xt_desc, w_desc, x_smem, xt_smem, w_smem, ready, free, first_unit, units, unit_step,
                 per_tile, grid_m, k_start, k_chunk, steps, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The producer: for each of the program's units (first_unit, + unit_step, ... below units;
    unit u is chunk u % per_tile of tile u // per_tile, its columns from k_start + that chunk times
    k_chunk), its steps' x, tail (TAIL_M > 0) and w tiles, the program's i-th step into stage
    i % NUM_STAGES once its last reader freed it (a fresh barrier passes the first round's wait).
    Past M, N or K the TMA fills zeros, as the Triton kernel's masked loads do."""
    if TAIL_M > 0:
        nbytes: gl.constexpr = x_desc.block_type.nbytes + xt_desc.block_type.nbytes + w_desc.block_type.nbytes
    else:
        nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
    i = 0
    for u in range(first_unit, units, unit_step):
        row0, col0 = _tile_origin(u // per_tile, grid_m, BLOCK_M, TAIL_M, BLOCK_N)
        k_first = k_start + (u % per_tile) * k_chunk
        for s in range(steps):
            stage = i % NUM_STAGES
            mbarrier.wait(free.index(stage), ((i // NUM_STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(stage), nbytes)
            k = k_first + s * BLOCK_K
            tma.async_copy_global_to_shared(x_desc, [row0, k], ready.index(stage), x_smem.index(stage))
            if TAIL_M > 0:
                tma.async_copy_global_to_shared(xt_desc, [row0 + BLOCK_M, k], ready.index(stage),
                                                xt_smem.index(stage))
            tma.async_copy_global_to_shared(w_desc, [col0, k], ready.index(stage), w_smem.index(stage))
            i += 1


@gluon.jit
def _zeros(layout: gl.constexpr, tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr,
           BLOCK_N: gl.constexpr, SWAP_AB: gl.constexpr):
    """A tile's and its tail's fp32 accumulators at zero (swapped: [BLOCK_N, rows]; no tail: the
    tile's twice)."""
    if SWAP_AB:
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout)
    else:
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout)
    if TAIL_M > 0:
        acc_tail = gl.zeros([BLOCK_N, TAIL_M], gl.float32, tail_layout)
    else:
        acc_tail = acc
    return acc, acc_tail


@gluon.jit
def _multiply_chunk(x_smem, xt_smem, w_smem, ready, free, first, steps, layout: gl.constexpr,
                    tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    NUM_STAGES: gl.constexpr, SWAP_AB: gl.constexpr, FREE_OWN: gl.constexpr):
    """Steps first .. first + steps - 1 on fp32 accumulators from zero, one MMA per step and tile
    in step order (swapped: w x^T, [BLOCK_N, rows]); returned once all are done, as (tile, tail)
    (no tail: the tile twice). Each step's stage is freed once its MMAs are done, after the next
    step's are issued: the step before's stage here, this call's last by the consumer's next step.
    FREE_OWN (ping-pong, whose next step may be the other group's): the last once all are done,
    and none before `first`, so a call frees exactly the stages it read."""
    acc, acc_tail = _zeros(layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, SWAP_AB)
    for i in range(first, first + steps):
        stage = i % NUM_STAGES
        mbarrier.wait(ready.index(stage), (i // NUM_STAGES) & 1)
        if SWAP_AB:
            acc = warpgroup_mma(w_smem.index(stage), x_smem.index(stage).permute((1, 0)), acc, is_async=True)
        else:
            acc = warpgroup_mma(x_smem.index(stage), w_smem.index(stage).permute((1, 0)), acc, is_async=True)
        if TAIL_M > 0:
            acc_tail = warpgroup_mma(w_smem.index(stage), xt_smem.index(stage).permute((1, 0)), acc_tail,
                                     is_async=True)
            acc, acc_tail = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc_tail))  # step i - 1's are done
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))  # step i - 1's MMA is done
        mbarrier.arrive(free.index((i + NUM_STAGES - 1) % NUM_STAGES), pred=i > (first if FREE_OWN else 0))
    if TAIL_M > 0:
        acc, acc_tail = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_tail))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc_tail = acc
    if FREE_OWN:
        mbarrier.arrive(free.index((first + steps - 1) % NUM_STAGES))
    return acc, acc_tail


@gluon.jit
def _multiply_tile(x_smem, xt_smem, w_smem, ready, free, first, chunk_steps, layout: gl.constexpr,
                   tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   NUM_STAGES: gl.constexpr, CHUNKS: gl.constexpr, SWAP_AB: gl.constexpr, FREE_OWN: gl.constexpr):
    """One tile from the program's step `first` on: CHUNKS chunks of chunk_steps steps, each
    accumulated from zero, their sums added in chunk order (the Triton kernel's `acc += more`):
    the fp32 tile and tail, before any cast."""
    total, tail = _multiply_chunk(x_smem, xt_smem, w_smem, ready, free, first, chunk_steps, layout, tail_layout,
                                  BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, SWAP_AB, FREE_OWN)
    for c in gl.static_range(1, CHUNKS):
        more, more_tail = _multiply_chunk(x_smem, xt_smem, w_smem, ready, free, first + c * chunk_steps, chunk_steps,
                                          layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, SWAP_AB,
                                          FREE_OWN)
        total = total + more
        if TAIL_M > 0:
            tail = tail + more_tail
    return total, tail


@gluon.jit
def _tile_index(row0, col0, M, N, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr,
                SWAP_AB: gl.constexpr):
    """An accumulator's rows and columns (int64 rows, broadcastable against the columns: rows down
    its first axis, swapped across its second) and which of them lie inside the [M, N] output."""
    if SWAP_AB:
        rows = gl.expand_dims(row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(0, layout)), 0)
        cols = gl.expand_dims(col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout)), 1)
    else:
        rows = gl.expand_dims(row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)), 1)
        cols = gl.expand_dims(col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout)), 0)
    return rows.to(gl.int64), cols, (rows < M) & (cols < N)


@gluon.jit
def _store_out(out_ptr, acc, acc_tail, row0, col0, M, N, stride_om, layout: gl.constexpr, tail_layout: gl.constexpr,
               BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr, SWAP_AB: gl.constexpr):
    """A finished tile (and tail) cast and stored into out."""
    rows, cols, inside = _tile_index(row0, col0, M, N, BLOCK_M, BLOCK_N, layout, SWAP_AB)
    gl.store(out_ptr + rows * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)
    if TAIL_M > 0:
        rows, cols, inside = _tile_index(row0 + BLOCK_M, col0, M, N, TAIL_M, BLOCK_N, tail_layout, True)
        gl.store(out_ptr + rows * stride_om + cols, acc_tail.to(out_ptr.dtype.element_ty), mask=inside)


@gluon.jit
def _multiply_stages(x_smem, xt_smem, w_smem, ready, free, turns, out_ptr, M, N, stride_om, first_tile, tiles,
                     tile_step, grid_m, chunk_steps, layout: gl.constexpr, tail_layout: gl.constexpr,
                     BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                     CHUNKS: gl.constexpr, SWAP_AB: gl.constexpr, PERSISTENT: gl.constexpr, GROUP: gl.constexpr,
                     GROUPS: gl.constexpr):
    """The consumers. One tile (not PERSISTENT): its fp32 tile and tail, returned for the kernel's
    epilogue (warp_specialize returns the default partition's results as one tuple). PERSISTENT:
    each of the program's tiles multiplied and stored here, while the producer fills the stages
    its MMAs freed with the next tile's first steps; nothing returned. A tile's first step is
    computed from the loop index: a `first = 0` counter added to in the loop was not carried by
    triton 3.6 (the IR's inner loops all began at step 0), so a program's second tile waited on
    barrier phases already passed, and on the H200 every program holding two tiles hung.
    GROUPS = 2 (ping-pong): group GROUP takes the program's tiles GROUP, GROUP + 2, ...; a tile's
    MMAs start once the other group's on the tile before are done (turns: group g waits on its
    own barrier, which the other arrives on), so one group stores a tile while the other
    multiplies the next, and no group waits on a stage the producer has not reached."""
    if PERSISTENT:
        for tile in range(first_tile + GROUP * tile_step, tiles, GROUPS * tile_step):
            j = (tile - first_tile) // tile_step  # the program's j-th tile
            if GROUPS > 1:  # tile j - 1 is the other group's ((j - 1 - (1 - GROUP)) // 2)-th
                mbarrier.wait(turns.index(GROUP), ((j - 2 + GROUP) // 2) & 1, pred=j > 0)
            acc, acc_tail = _multiply_tile(x_smem, xt_smem, w_smem, ready, free, j * (CHUNKS * chunk_steps),
                                           chunk_steps, layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES,
                                           CHUNKS, SWAP_AB, GROUPS > 1)
            if GROUPS > 1:
                mbarrier.arrive(turns.index(1 - GROUP))
            row0, col0 = _tile_origin(tile, grid_m, BLOCK_M, TAIL_M, BLOCK_N)
            _store_out(out_ptr, acc, acc_tail, row0, col0, M, N, stride_om, layout, tail_layout, BLOCK_M, TAIL_M,
                       BLOCK_N, SWAP_AB)
        return ()
    else:
        return _multiply_tile(x_smem, xt_smem, w_smem, ready, free, 0, chunk_steps, layout, tail_layout, BLOCK_M,
                              TAIL_M, BLOCK_N, NUM_STAGES, CHUNKS, SWAP_AB, False)


@gluon.jit
def _sum_planes(partial_ptr, out_ptr, rows, cols, inside, N, stride_om, stride_ps, splits):
    """out's tile = plane 0 + plane 1 + ... + plane splits - 1 in that order, in fp32, then one cast;
    loaded from L2 (.cg): the other planes were stored from other SMs."""
    planes = partial_ptr + rows * N + cols
    total = gl.load(planes, mask=inside, other=0.0, cache_modifier=".cg")
    for _ in range(1, splits):
        planes += stride_ps
        total += gl.load(planes, mask=inside, other=0.0, cache_modifier=".cg")
    gl.store(out_ptr + rows * stride_om + cols, total.to(out_ptr.dtype.element_ty), mask=inside)


@gluon.jit
def _store_partial(plane_ptr, acc, acc_tail, row0, col0, M, N, layout: gl.constexpr, tail_layout: gl.constexpr,
                   BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr, SWAP_AB: gl.constexpr):
    """A tile's (and tail's) fp32 partial into its workspace plane (rows of N floats)."""
    rows, cols, inside = _tile_index(row0, col0, M, N, BLOCK_M, BLOCK_N, layout, SWAP_AB)
    gl.store(plane_ptr + rows * N + cols, acc, mask=inside)
    if TAIL_M > 0:
        rows, cols, inside = _tile_index(row0 + BLOCK_M, col0, M, N, TAIL_M, BLOCK_N, tail_layout, True)
        gl.store(plane_ptr + rows * N + cols, acc_tail, mask=inside)


@gluon.jit
def _sum_tiles(partial_ptr, out_ptr, row0, col0, M, N, stride_om, stride_ps, planes, layout: gl.constexpr,
               tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr,
               SWAP_AB: gl.constexpr):
    """_sum_planes for a tile and its tail: `planes` planes from partial_ptr's, in order, into out."""
    rows, cols, inside = _tile_index(row0, col0, M, N, BLOCK_M, BLOCK_N, layout, SWAP_AB)
    _sum_planes(partial_ptr, out_ptr, rows, cols, inside, N, stride_om, stride_ps, planes)
    if TAIL_M > 0:
        rows, cols, inside = _tile_index(row0 + BLOCK_M, col0, M, N, TAIL_M, BLOCK_N, tail_layout, True)
        _sum_planes(partial_ptr, out_ptr, rows, cols, inside, N, stride_om, stride_ps, planes)


@gluon.jit
def _prefix_end(first, splits, units, programs):
    """How many of a tile's chunks (units first .. first + splits - 1) the program holding its first
    unit holds, the programs' runs being [p * units // programs, (p + 1) * units // programs): the
    Triton kernel's _prefix_end, which a Gluon function cannot call."""
    holder = ((first + 1) * programs + units - 1) // units - 1
    return gl.minimum(((holder + 1) * units) // programs, first + splits) - first


@gluon.jit
def _finish_tile(results, out_ptr, partial_ptr, counter_ptr, M, N, stride_om, stride_ps, splits, tile, grid_m,
                 layout: gl.constexpr, tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, WORKSPACE: gl.constexpr, SWAP_AB: gl.constexpr):
    """A one-tile program's epilogue (all its warps again): the tile stored, or (WORKSPACE) its
    partial stored in its plane, and the program completing the tile's count sums the planes."""
    acc, acc_tail = results
    row0, col0 = _tile_origin(tile, grid_m, BLOCK_M, TAIL_M, BLOCK_N)
    if WORKSPACE:
        _store_partial(partial_ptr + gl.program_id(2).to(gl.int64) * stride_ps, acc, acc_tail, row0, col0, M, N,
                       layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, SWAP_AB)
        counter = counter_ptr + tile  # the Triton kernel's order: (pid_n, pid_m)
        gl.thread_barrier()  # every thread's share of the partial stored before the count says it is
        if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == splits - 1:
            _sum_tiles(partial_ptr, out_ptr, row0, col0, M, N, stride_om, stride_ps, splits, layout, tail_layout,
                       BLOCK_M, TAIL_M, BLOCK_N, SWAP_AB)
            gl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next product
    else:
        _store_out(out_ptr, acc, acc_tail, row0, col0, M, N, stride_om, layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N,
                   SWAP_AB)


@gluon.jit
def _stream_k_units(x_smem, xt_smem, w_smem, ready, free, out_ptr, partial_ptr, counter_ptr, M, N, stride_om,
                    stride_ps, start, end, total_units, splits, grid_m, chunk_steps, layout: gl.constexpr,
                    tail_layout: gl.constexpr, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    NUM_STAGES: gl.constexpr, SWAP_AB: gl.constexpr):
    """The consumers of a stream-K program: units start .. end - 1 (unit u: chunk u % splits of tile
    u // splits), each chunk from zero, as the Triton kernel's _stream_k_kernel takes them. A tile
    whose chunks all fall here is folded in chunk order and stored; a cut one: the piece holding
    its first chunks stores their fold in the plane of its last chunk, every other piece each
    chunk in its own plane, and the piece completing the tile's count (acquire-release) adds the
    prefix and the later planes in order. The same fp32 operations as the workspace tiling's.
    (A barrier in a partition syncs its own warps only: triton lowers it to a named barrier.)"""
    total, total_tail = _zeros(layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, SWAP_AB)
    for u in range(start, end):
        tile, c = u // splits, u % splits
        acc, acc_tail = _multiply_chunk(x_smem, xt_smem, w_smem, ready, free, (u - start) * chunk_steps, chunk_steps,
                                        layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, SWAP_AB, False)
        if c == 0:
            total = acc
            if TAIL_M > 0:
                total_tail = acc_tail
        else:
            total = total + acc
            if TAIL_M > 0:
                total_tail = total_tail + acc_tail
        row0, col0 = _tile_origin(tile, grid_m, BLOCK_M, TAIL_M, BLOCK_N)
        holds_first = tile * splits >= start
        piece_ends = (c == splits - 1) | (u == end - 1)
        if holds_first and c == splits - 1:  # the whole tile in this program
            _store_out(out_ptr, total, total_tail, row0, col0, M, N, stride_om, layout, tail_layout, BLOCK_M, TAIL_M,
                       BLOCK_N, SWAP_AB)
        else:
            plane = partial_ptr + c.to(gl.int64) * stride_ps
            if not holds_first:
                _store_partial(plane, acc, acc_tail, row0, col0, M, N, layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N,
                               SWAP_AB)
            elif piece_ends:
                _store_partial(plane, total, total_tail, row0, col0, M, N, layout, tail_layout, BLOCK_M, TAIL_M,
                               BLOCK_N, SWAP_AB)
            if piece_ends:
                counted = gl.where(holds_first, c + 1, u - start + 1)
                gl.thread_barrier()  # every thread's share stored before the count says it is
                if gl.atomic_add(counter_ptr + tile, counted, sem="acq_rel", scope="gpu") == splits - counted:
                    prefix = _prefix_end(tile * splits, splits, total_units, gl.num_programs(0))
                    _sum_tiles(partial_ptr + (prefix - 1).to(gl.int64) * stride_ps, out_ptr, row0, col0, M, N,
                               stride_om, stride_ps, splits - prefix + 1, layout, tail_layout, BLOCK_M, TAIL_M,
                               BLOCK_N, SWAP_AB)
                    gl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next product
    return ()


# One compile a tiling serves every M, as the Triton kernel's do: left to specialize, M and grid_m
# would pick among up to five compiles by their values (1, a multiple of 16, other), each compile
# seconds long in the tuner, the tests and a serving engine's first steps. They place the tiles and
# mask the stores, never order the MMAs: the bits do not depend on the compile.
@gluon.jit(do_not_specialize=["M", "grid_m"])
def _matmul_kernel(x_desc, xt_desc, w_desc, out_ptr, partial_ptr, counter_ptr, M, N, stride_om, stride_ps, k_chunk,
                   splits, grid_m, grid_n, BLOCK_M: gl.constexpr, TAIL_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   BLOCK_K: gl.constexpr, NUM_STAGES: gl.constexpr, CHUNKS: gl.constexpr, WORKSPACE: gl.constexpr,
                   SWAP_AB: gl.constexpr, PERSISTENT: gl.constexpr, STREAM_K: gl.constexpr, PING_PONG: gl.constexpr,
                   GROUP_REGS: gl.constexpr):
    """out = x @ w^T in (BLOCK_M + TAIL_M, BLOCK_N) tiles of a grid_m x grid_n grid, M fastest
    (programs launched together share a weight tile in L2, as in the Triton kernel): one per
    program along axes 0 and 1, or (PERSISTENT, a program per SM on axis 0) tiles pid, pid +
    programs, ... each. K comes in chunks of k_chunk columns (a BLOCK_K multiple): CHUNKS of them
    in each program, or (WORKSPACE, never PERSISTENT) one per program along axis 2, its fp32
    partial stored in partial_ptr's plane (rows of N floats, planes stride_ps apart); the program
    whose partial arrives last at its tile (counter_ptr: one int32 per tile, zero between products)
    adds the planes in order 0 .. splits - 1, casts, stores and zeroes the counter, as the Triton
    kernel's workspace tilings do. STREAM_K (a program per SM on axis 0, WORKSPACE): equal runs of
    the product's (tile, chunk) units instead (_stream_k_units). PING_PONG (PERSISTENT): a second
    consumer group, a worker partition of as many warps with GROUP_REGS registers a thread, takes
    every other tile (_multiply_stages).
    xt_desc: the tail's rows (x_desc where TAIL_M = 0)."""
    chunk_steps = k_chunk // BLOCK_K
    dtype: gl.constexpr = x_desc.dtype
    x_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    if TAIL_M > 0:
        xt_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, TAIL_M, BLOCK_K], xt_desc.layout)
    else:
        xt_smem = x_smem
    w_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, BLOCK_K], w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)  # the producer's expect; the TMA's bytes complete it
        mbarrier.init(free.index(i), count=1)  # the consumers, once their MMAs on it are done
    if PING_PONG:
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turns.index(i), count=1)  # the other group, its MMAs on a tile done
    else:
        turns = free  # unread with one consumer group
    fence_async_shared()
    n_side: gl.constexpr = BLOCK_M if SWAP_AB else BLOCK_N  # the MMA's N: the rows swapped, else the columns
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, n_side, 16])
    tail_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                          instr_shape=[16, TAIL_M if TAIL_M > 0 else 16, 16])
    if STREAM_K:
        total_units = grid_m * grid_n * splits
        start = (gl.program_id(0) * total_units) // gl.num_programs(0)
        end = ((gl.program_id(0) + 1) * total_units) // gl.num_programs(0)
        gl.warp_specialize([
            (_stream_k_units, (x_smem, xt_smem, w_smem, ready, free, out_ptr, partial_ptr, counter_ptr, M, N, stride_om,
                               stride_ps, start, end, total_units, splits, grid_m, chunk_steps, layout, tail_layout,
                               BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, SWAP_AB)),
            (_load_stages, (x_desc, xt_desc, w_desc, x_smem, xt_smem, w_smem, ready, free, start, end, 1, splits,
                            grid_m, 0, k_chunk, chunk_steps, BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, NUM_STAGES)),
        ], [PRODUCER_WARPS], [PRODUCER_REGS])
    elif PERSISTENT:
        # (a partition's arguments are spelled out in each call: a tuple of them bound to a name
        # turns its functions and layouts into values, which triton refuses)
        if PING_PONG:  # the second group, then the producer (triton puts each on a warp group of its own)
            gl.warp_specialize([
                (_multiply_stages, (x_smem, xt_smem, w_smem, ready, free, turns, out_ptr, M, N, stride_om,
                                    gl.program_id(0), grid_m * grid_n, gl.num_programs(0), grid_m, chunk_steps, layout,
                                    tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, CHUNKS, SWAP_AB, True, 0, 2)),
                (_multiply_stages, (x_smem, xt_smem, w_smem, ready, free, turns, out_ptr, M, N, stride_om,
                                    gl.program_id(0), grid_m * grid_n, gl.num_programs(0), grid_m, chunk_steps, layout,
                                    tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, CHUNKS, SWAP_AB, True, 1, 2)),
                (_load_stages, (x_desc, xt_desc, w_desc, x_smem, xt_smem, w_smem, ready, free, gl.program_id(0),
                                grid_m * grid_n, gl.num_programs(0), 1, grid_m, 0, k_chunk, CHUNKS * chunk_steps,
                                BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, NUM_STAGES)),
            ], [gl.num_warps(), PRODUCER_WARPS], [GROUP_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_multiply_stages, (x_smem, xt_smem, w_smem, ready, free, turns, out_ptr, M, N, stride_om,
                                    gl.program_id(0), grid_m * grid_n, gl.num_programs(0), grid_m, chunk_steps, layout,
                                    tail_layout, BLOCK_M, TAIL_M, BLOCK_N, NUM_STAGES, CHUNKS, SWAP_AB, True, 0, 1)),
                (_load_stages, (x_desc, xt_desc, w_desc, x_smem, xt_smem, w_smem, ready, free, gl.program_id(0),
                                grid_m * grid_n, gl.num_programs(0), 1, grid_m, 0, k_chunk, CHUNKS * chunk_steps,
                                BLOCK_M, TAIL_M, BLOCK_N, BLOCK_K, NUM_STAGES)),
            ], [PRODUCER_WARPS], [PRODUCER_REGS])
    else:
        first_tile = gl.program_id(1) * grid_m + gl.program_id(0)
        results = gl.warp_specialize([
            (_multiply_stages, (x_smem, xt_smem, w_smem, ready, free, turns, out_ptr, M, N, stride_om, first_tile,
                                first_tile + 1, 1, grid_m, chunk_steps, layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N,
                                NUM_STAGES, CHUNKS, SWAP_AB, False, 0, 1)),
            (_load_stages, (x_desc, xt_desc, w_desc, x_smem, xt_smem, w_smem, ready, free, first_tile, first_tile + 1,
                            1, 1, grid_m, gl.program_id(2) * k_chunk, k_chunk, CHUNKS * chunk_steps, BLOCK_M, TAIL_M,
                            BLOCK_N, BLOCK_K, NUM_STAGES)),  # axis 2 is one program wide unless WORKSPACE
        ], [PRODUCER_WARPS], [PRODUCER_REGS])
        _finish_tile(results, out_ptr, partial_ptr, counter_ptr, M, N, stride_om, stride_ps, splits, first_tile, grid_m,
                     layout, tail_layout, BLOCK_M, TAIL_M, BLOCK_N, WORKSPACE, SWAP_AB)


def descriptors(x: torch.Tensor, weight: torch.Tensor,
                tiles: HopperTiles) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of x's (BLOCK_M, BLOCK_K) tiles, its tail's (TAIL_M, BLOCK_K; x's own where
    there is no tail) and the weight's (BLOCK_N, BLOCK_K)."""
    dtype = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    def tile(t: torch.Tensor, rows: int) -> TensorDescriptor:
        layout = gl.NVMMASharedLayout.get_default_for([rows, tiles.block_k], dtype)
        return TensorDescriptor.from_tensor(t, [rows, tiles.block_k], layout)
    x_desc = tile(x, tiles.block_m)
    return x_desc, tile(x, tiles.tail_m) if tiles.tail_m else x_desc, tile(weight, tiles.block_n)


def hopper_matmul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, tiles: HopperTiles,
                  k_chunk: int | None = None, chunks: int = 1,
                  workspace: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """out (M, N, row-major) = x (M, K) @ weight (N, K)^T, where `fits` allows it. K in chunks of
    k_chunk columns (a BLOCK_K multiple; default: all of K in one): `chunks` of them summed in each
    program, or with a workspace (partials: S contiguous fp32 [M, N] planes; counters: int32, one
    per output tile, zero) one chunk per program and S programs per tile."""
    m, k = x.shape
    n = weight.shape[0]
    k_chunk = k_chunk or triton.cdiv(k, tiles.block_k) * tiles.block_k
    if k_chunk % tiles.block_k:
        raise ValueError(f"hopper_matmul: a K chunk of {k_chunk} is not a multiple of BLOCK_K {tiles.block_k}")
    partials, counters = workspace or (out, out)  # unread without a workspace
    if workspace is not None and (partials.dtype != torch.float32 or partials.shape[1:] != (m, n)
                                  or partials.stride()[1:] != (n, 1) or counters.dtype != torch.int32):
        raise ValueError(f"hopper_matmul: a workspace is fp32 [S, {m}, {n}] planes and int32 counters, not "
                         f"{partials.dtype} {tuple(partials.shape)} and {counters.dtype}")
    if (workspace is not None and tiles.persistent) or (workspace is None and tiles.stream_k):
        raise ValueError("hopper_matmul: a persistent blocking sums a split's chunks in the program, a stream-K one "
                         "through a workspace, not the other way")
    if tiles.ping_pong and not tiles.persistent:
        raise ValueError(f"hopper_matmul: ping-pong is two consumer groups taking a persistent program's tiles in "
                         f"turn, so it needs persistent: {tiles}")
    if tiles.ping_pong and not ping_pong_fits(tiles, chunks):
        raise ValueError(f"hopper_matmul: two ping-pong groups cannot hold {tiles}'s accumulators over {chunks} "
                         f"chunks in their registers (ping_pong_fits)")
    splits = partials.shape[0] if workspace is not None else 1
    x_desc, xt_desc, w_desc = descriptors(x, weight, tiles)
    grid_m, grid_n = triton.cdiv(m, tiles.block_m + tiles.tail_m), triton.cdiv(n, tiles.block_n)
    grid = ((min(grid_m * grid_n * (splits if tiles.stream_k else 1), _sms(x.device)), 1, 1)
            if tiles.persistent or tiles.stream_k else (grid_m, grid_n, splits))
    _matmul_kernel[grid](x_desc, xt_desc, w_desc, out, partials, counters, m, n, out.stride(0), partials.stride(0),
                         k_chunk, splits, grid_m, grid_n, BLOCK_M=tiles.block_m, TAIL_M=tiles.tail_m,
                         BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages, CHUNKS=chunks,
                         WORKSPACE=workspace is not None, SWAP_AB=tiles.swap_ab, PERSISTENT=tiles.persistent,
                         STREAM_K=tiles.stream_k, PING_PONG=tiles.ping_pong,
                         GROUP_REGS=group_registers(tiles)[1] if tiles.ping_pong else 0, num_warps=consumer_warps(tiles))


def hopper_linear(x: torch.Tensor, weight: torch.Tensor, tiles: HopperTiles) -> torch.Tensor:
    """x @ weight^T for 2-D x (M, K) and weight (N, K) with this kernel itself (never another):
    refused where `fits` says it cannot run."""
    if not fits(x, weight, tiles):
        raise ValueError(f"hopper_linear: {tuple(x.shape)} x {tuple(weight.shape)} {x.dtype} on {x.device} "
                         f"does not fit {tiles} (fits() says why not)")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    hopper_matmul(x, weight, out, tiles)
    return out
