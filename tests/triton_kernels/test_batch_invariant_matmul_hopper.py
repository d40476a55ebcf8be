"""hopper_linear (Gluon, sm_90) vs a float64 product and, bit for bit, vs the Triton kernel's rows
of the full batch at Kimi K2's shapes, split or not. The interpreter cannot run Gluon: on the CPU the
kernel is compiled for sm_90 (its warpgroup MMAs and shared-memory ring checked), on the GPU run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import triton_kernels.batch_invariant_matmul as gemm
import triton_kernels.batch_invariant_matmul_hopper as hopper
from tests.triton_kernels.test_batch_invariant_matmul import DECODE_ROWS, K2_SHAPES, random, relative_error
from triton_kernels.batch_invariant_matmul import base_tiles, batch_invariant_linear, batch_invariant_per_head, hopper_tiles
from triton_kernels.batch_invariant_matmul_hopper import (SMEM_BYTES, HopperTiles, hopper_linear, hopper_matmul,
                                                          ping_pong_fits, ring_bytes)

CONFIGS = [HopperTiles(128, 256, 64, 3), HopperTiles(128, 128, 64, 4), HopperTiles(64, 256, 64, 4),
           HopperTiles(64, 128, 64, 6), HopperTiles(256, 128, 64, 4)]
# Swapped: the batch's rows on the MMA's N side, 128 or 256 + a 16-row tail (136, 544, 1,088 rows
# unpadded), 16 and 64 alone; the weight's 64, 128 or 256 rows on one, two or four warp groups.
SWAPPED = [HopperTiles(128, 128, 64, 4, 16, True), HopperTiles(256, 128, 64, 4, 16, True),
           HopperTiles(256, 64, 64, 5, 16, True), HopperTiles(16, 256, 64, 5, 0, True),
           HopperTiles(64, 128, 64, 6, 0, True)]
# Persistent (a program per SM over the tiles, each stored by the consumers), split in the program too.
PERSISTENT = [(CONFIGS[0], 1), (CONFIGS[1], 2), (SWAPPED[0], 1), (SWAPPED[2], 2)]
# Ping-pong (persistent, two consumer groups taking the tiles in turn): kv_b's M = 544 pick (swapped
# 256 + 16 over 64 weight rows, one warp group a group), 128 x 128 on two, 64 x 256, and 64 x 128
# split in the program (the one split tiling of these whose two accumulators fit).
PING_PONG = [(SWAPPED[2]._replace(persistent=True, ping_pong=True), 1),
             (CONFIGS[1]._replace(persistent=True, ping_pong=True), 1),
             (CONFIGS[2]._replace(persistent=True, ping_pong=True), 1),
             (CONFIGS[3]._replace(persistent=True, ping_pong=True), 2)]
# Stream-K (a program per SM over (tile, chunk) units, cut tiles through the workspace).
STREAMED = [CONFIGS[1], CONFIGS[0], SWAPPED[0], SWAPPED[1]]
UNSPLIT = (CONFIGS + SWAPPED + [tiles._replace(persistent=True) for tiles, chunks in PERSISTENT if chunks == 1]
           + [tiles for tiles, chunks in PING_PONG if chunks == 1])

COMPILE_FOR_HOPPER = """
import json
import re
import subprocess
import sys
import tempfile
import torch
import triton
from triton.backends.nvidia.compiler import get_ptxas
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from triton_kernels.batch_invariant_matmul_hopper import (HopperTiles, _matmul_kernel, consumer_warps, descriptors,
                                                          group_registers)
tiles = HopperTiles(*map(int, sys.argv[1:6]), sys.argv[6] == "True", *(flag == "True" for flag in sys.argv[9:12]))
x, w = torch.zeros(256, 512, dtype=torch.bfloat16), torch.zeros(512, 512, dtype=torch.bfloat16)
x_desc, xt_desc, w_desc = descriptors(x, w, tiles)
constants = dict(BLOCK_M=tiles.block_m, TAIL_M=tiles.tail_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                 NUM_STAGES=tiles.num_stages, CHUNKS=int(sys.argv[7]), WORKSPACE=sys.argv[8] == "True",
                 SWAP_AB=tiles.swap_ab, PERSISTENT=tiles.persistent, STREAM_K=tiles.stream_k, PING_PONG=tiles.ping_pong,
                 GROUP_REGS=group_registers(tiles)[1] if tiles.ping_pong else 0)
signature = {"x_desc": mangle_type(x_desc), "xt_desc": mangle_type(xt_desc), "w_desc": mangle_type(w_desc),
             "out_ptr": "*bf16", "partial_ptr": "*fp32", "counter_ptr": "*i32", "M": "i32", "N": "i32",
             "stride_om": "i32", "stride_ps": "i32", "k_chunk": "i32", "splits": "i32", "grid_m": "i32", "grid_n": "i32",
             **dict.fromkeys(constants, "constexpr")}
aligned = ("out_ptr", "partial_ptr", "counter_ptr", "N", "stride_om", "stride_ps", "k_chunk")
attrs = {(_matmul_kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
compiled = triton.compile(GluonASTSource(_matmul_kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": consumer_warps(tiles)})
ptx = compiled.asm["ptx"]
with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:  # ptxas -v again, for its spill count
    source.write(ptx)
    source.flush()
    log = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", source.name, "-o", source.name + ".o"],
                         capture_output=True, text=True, check=True).stderr
print(json.dumps({"from_zero": compiled.asm["ttgir"].count("scf.for %i = %c0_i32 "),
                  "mmas": ptx.count("wgmma.mma_async"), "counts": ptx.count("atom.global.gpu.acq_rel.add"),
                  "shared": compiled.metadata.shared,
                  "spill_bytes": sum(map(int, re.findall(r"(\\d+) bytes spill stores", log))),
                  "setmaxnreg": sorted({int(n) for n in re.findall(r"setmaxnreg\\.\\w+\\.sync\\.aligned\\.u32\\s+(\\d+)", ptx)})}))
"""


@pytest.mark.parametrize("tiles, chunks, workspace", [(tiles, 1, False) for tiles in CONFIGS + SWAPPED]
                         + [(HopperTiles(64, 128, 64, 6), 2, False), (HopperTiles(128, 128, 64, 4), 4, False),
                            (HopperTiles(128, 256, 64, 3), 1, True), (SWAPPED[0], 2, False), (SWAPPED[1], 1, True)]
                         + [(tiles._replace(persistent=True), chunks, False) for tiles, chunks in PERSISTENT]
                         + [(tiles._replace(stream_k=True), 1, True) for tiles in STREAMED]
                         + [(tiles, chunks, False) for tiles, chunks in PING_PONG])
def test_the_kernel_compiles_for_hopper_without_a_gpu(tiles, chunks, workspace):
    """One warpgroup MMA per 16 of BLOCK_K in each chunk's loop (the chunks of an in-program split
    unrolled), twice with a tail, one acquire-release tile count for a workspace, and the ring
    (stages x the tiles) within the H200's shared memory, compiled for sm_90 here in a process of
    its own. A program over several tiles or units (persistent, stream-K) starts each one's K loop
    at that unit's own step, never at a constant 0 (the IR's loop over `i`): on 2026-12-04 a
    counter triton did not carry left every such loop at 0, and the kernel hung on the H200.
    Ping-pong: each of its two consumer groups has the loop, so twice the MMAs; the registers
    group_registers says each group gets (the PTX's setmaxnreg), and no spills."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER, *map(str, tiles[:6]), str(chunks), str(workspace),
                           str(tiles.persistent), str(tiles.stream_k), str(tiles.ping_pong)],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = json.loads(done.stdout.splitlines()[-1])
    assert compiled["from_zero"] == (0 if tiles.persistent or tiles.stream_k else 1)
    groups = 2 if tiles.ping_pong else 1
    assert compiled["mmas"] == groups * chunks * tiles.block_k // 16 * (2 if tiles.tail_m else 1)
    assert compiled["counts"] == workspace
    assert ring_bytes(tiles) <= compiled["shared"] <= SMEM_BYTES
    if tiles.ping_pong:
        assert set(hopper.group_registers(tiles)) <= set(compiled["setmaxnreg"]) and compiled["spill_bytes"] == 0


def test_inputs_it_cannot_serve_are_refused_with_a_sentence():
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="does not fit"):
        hopper_linear(x, x, CONFIGS[0])
    with pytest.raises(ValueError, match="needs persistent"):
        hopper_matmul(x, x, torch.empty(4, 4, dtype=torch.bfloat16), CONFIGS[1]._replace(ping_pong=True))
    with pytest.raises(ValueError, match="cannot hold"):
        hopper_matmul(x, x, torch.empty(4, 4, dtype=torch.bfloat16), CONFIGS[1]._replace(persistent=True, ping_pong=True),
                      k_chunk=64, chunks=2)


def test_ping_pong_takes_only_tiles_whose_groups_fit_the_block_and_accumulators_their_registers():
    """One warp group a group: 232 registers a thread, so 256 + 16 rows over 64 weight rows (136
    accumulator values) fit; two: 104 for the first, so 128 x 128 and 128 + 16 x 128 swapped (64
    and 72 values) fit and 128 x 256 (128) does not, which ptxas refuses to compile; four (256 rows,
    or 256 weight rows swapped) make a block of 36 warps, past 1,024 threads. A split summed in the
    program holds two accumulators: only 64 x 128 (64 values twice in 232) still fits. Every
    tiling here that fits compiles for sm_90 with no spills (checked here)."""
    tilings = [tiles._replace(persistent=True, ping_pong=True) for tiles in CONFIGS + SWAPPED]
    assert [ping_pong_fits(tiles) for tiles in tilings] == [False, True, True, True, False, True, False, True, False,
                                                            True]
    assert [ping_pong_fits(tiles, chunks=4) for tiles in tilings] == [False, False, False, True, False, False, False,
                                                                      False, False, True]
    assert hopper.group_registers(CONFIGS[1]) == (104, 112) and hopper.group_registers(SWAPPED[2]) == (232, 232)


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", UNSPLIT)
@pytest.mark.parametrize("m, n, k", [(1, 200, 512), (37, 72, 1024), (300, 520, 192)])  # partial tiles in M and N
def test_matches_float64_on_gpu(tiles, m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    x, w = random((m, k), torch.bfloat16, gen), random((n, k), torch.bfloat16, gen, k ** -0.5)
    assert relative_error(hopper_linear(x, w, tiles), x.double() @ w.double().T) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", [shape for shape in K2_SHAPES if base_tiles(*shape, torch.bfloat16).split_k == 1])
def test_k2_rows_have_the_triton_kernels_bits_at_every_m_on_gpu(n, k):
    """Every row at every decode M equals the Triton kernel's same row inside the full batch,
    swapped or not, persistent or not."""
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    full = batch_invariant_linear(x, w, base_tiles(n, k, torch.bfloat16))
    for tiles in UNSPLIT:
        for m in DECODE_ROWS:
            assert torch.equal(hopper_linear(x[:m], w, tiles), full[:m]), (tiles, m)


SPLIT_BLOCKINGS = [dict(block_m=64, block_n=128, num_warps=4, num_stages=6),
                   dict(block_m=128, block_n=128, num_warps=8, num_stages=4),
                   dict(block_m=128, block_n=256, num_warps=8, num_stages=3),
                   dict(block_m=128, tail_m=16, block_n=128, num_warps=8, num_stages=4, swap_ab=True),
                   dict(block_m=256, tail_m=16, block_n=64, num_warps=4, num_stages=5, swap_ab=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("n, k", [shape for shape in K2_SHAPES if base_tiles(*shape, torch.bfloat16).split_k > 1])
def test_k2_split_rows_have_the_triton_kernels_bits_at_every_m_on_gpu(n, k, monkeypatch):
    """A split tiling run by the Gluon kernel (swapped with a tail too), its chunks summed through the
    workspace or (tiles up to 128 x 128) in the program, persistent too (ping-pong where its
    accumulators fit), or stream-K on 132 SMs and
    on 7: every row at every decode M equals the Triton kernel's same row inside the full batch,
    which is a float64 product to bf16's error; the tile counters end at 0."""
    runs = []
    monkeypatch.setattr(gemm, "hopper_matmul", lambda *args: (runs.append(args[3]), hopper_matmul(*args)))
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    base = base_tiles(n, k, torch.bfloat16)
    full = batch_invariant_linear(x, w, base)
    assert relative_error(full, x.double() @ w.double().T) < 1e-2
    variants = [base._replace(**blocking, tma=True, gluon=True, split_in_program=in_program)
                for blocking in SPLIT_BLOCKINGS for in_program in (False, True)
                if not in_program or blocking["block_m"] * blocking["block_n"] <= 128 * 128]
    in_program = [tiles._replace(persistent=True) for tiles in variants if tiles.split_in_program]
    variants += in_program + [tiles._replace(ping_pong=True) for tiles in in_program
                              if ping_pong_fits(hopper_tiles(tiles._replace(ping_pong=True)), tiles.split_k)]
    variants += [base._replace(**blocking, tma=True, gluon=True, stream_k=True) for blocking in SPLIT_BLOCKINGS]
    for tiles in variants:
        for m in DECODE_ROWS:
            assert torch.equal(batch_invariant_linear(x[:m], w, tiles), full[:m]), (tiles, m)
    streamed = [tiles for tiles in variants if tiles.stream_k]
    monkeypatch.setattr(hopper, "_sms", lambda device: 7)  # runs that cut most tiles, at odd places
    for tiles in streamed:
        for m in DECODE_ROWS:
            assert torch.equal(batch_invariant_linear(x[:m], w, tiles), full[:m]), (tiles, m, "7 programs")
    assert len(runs) == (len(variants) + len(streamed)) * len(DECODE_ROWS)
    assert not gemm._COUNTERS[x.device][-1].any()


@pytest.mark.gpu
def test_a_gluon_blocking_runs_the_hopper_kernel_for_a_linear_and_this_kernel_per_head_on_gpu(monkeypatch):
    """batch_invariant_linear hands a gluon blocking's product to the Hopper kernel (the same bits
    as the Triton tiling it names), swapped with its tail too; a per-head product, which it cannot
    run, keeps the Triton one."""
    runs = []
    monkeypatch.setattr(gemm, "hopper_matmul", lambda *args: (runs.append(args[3]), hopper_matmul(*args)))
    n, k = 7168, 8192
    gen = torch.Generator(device="cuda").manual_seed(1)
    w = random((n, k), torch.bfloat16, gen, k ** -0.5)
    x = random((max(DECODE_ROWS), k), torch.bfloat16, gen)
    full = batch_invariant_linear(x, w, base_tiles(n, k, torch.bfloat16))
    tiles = base_tiles(n, k, torch.bfloat16)._replace(block_m=128, block_n=256, num_warps=8, num_stages=3, tma=True,
                                                      gluon=True)
    swapped = tiles._replace(block_m=128, tail_m=16, block_n=128, num_stages=4, swap_ab=True)
    for m in DECODE_ROWS:
        assert torch.equal(batch_invariant_linear(x[:m], w, tiles), full[:m]), m
        assert torch.equal(batch_invariant_linear(x[:m], w, swapped), full[:m]), m
    hopper = [HopperTiles(128, 256, tiles.block_k, 3), HopperTiles(128, 128, tiles.block_k, 4, 16, True)]
    assert runs == hopper * len(DECODE_ROWS)
    heads = random((37, 4, 512), torch.bfloat16, gen), random((4, 128, 512), torch.bfloat16, gen, 512 ** -0.5)
    assert torch.equal(batch_invariant_per_head(*heads, tiles), batch_invariant_per_head(*heads, tiles._replace(gluon=False)))
    assert len(runs) == 2 * len(DECODE_ROWS)


@pytest.mark.gpu
def test_a_gluon_blocking_the_hopper_kernel_cannot_hold_is_refused_on_gpu():
    """A ring past the H200's shared memory (4 stages of 256 + 256 rows x 64): a sentence, never the
    Triton kernel timed in its place."""
    x = torch.zeros(300, 512, dtype=torch.bfloat16, device="cuda")
    tiles = base_tiles(7168, 8192, torch.bfloat16)._replace(block_m=256, block_n=256, num_warps=16, num_stages=4,
                                                            tma=True, gluon=True)
    with pytest.raises(ValueError, match="cannot run"):
        batch_invariant_linear(x, torch.zeros(512, 512, dtype=torch.bfloat16, device="cuda"), tiles)


@pytest.mark.parametrize("args, problem", [(["--shapes", "q_a_proj"], "not an unsplit shape: q_a_proj"),
                                           (["--rows", "136,x"], "--rows must be integers"),
                                           (["--rows", "5000"], "--rows must be integers from 1 to 4096"),
                                           ([], "needs a CUDA GPU")])
def test_the_benchmark_refuses_bad_input_with_one_line(args, problem):
    if problem.startswith("needs") and torch.cuda.is_available():
        pytest.skip("this machine has the GPU the benchmark needs")
    done = subprocess.run([sys.executable, "benchmarks/batch_invariant_matmul_hopper.py", *args],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and problem in done.stderr, done.stderr
