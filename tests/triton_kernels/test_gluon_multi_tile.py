"""benchmarks/gluon_multi_tile.py on the CPU: its cases hold what its table claims, and bad input
gets one line. (Its GPU run is the benchmark itself: a hang is what it measures.)"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gluon_multi_tile import CASES, case_tiles, shape_of, units_per_program
from triton_kernels.batch_invariant_matmul import base_tiles
from triton_kernels.batch_invariant_matmul_hopper import SMEM_BYTES, ping_pong_fits, ring_bytes

H200_SMS = 132


def test_the_controls_hold_one_unit_a_program_and_every_other_case_several():
    """A case whose programs each hold one unit does not run the loop over units: only the controls
    (marked in CASES) may; every other case gives the H200's programs two or more."""
    controls = {("kv_b_proj", 64), ("q_b_proj", 136), ("q_a_proj", 17)}
    for case in CASES:
        units, programs = units_per_program(case, H200_SMS)
        assert (units <= programs) == ((case.shape, case.m) in controls), (case, units, programs)
    assert {case.kind for case in CASES} == {"persistent", "stream_k", "ping_pong"}


@pytest.mark.parametrize("args, problem", [(["--timeout-s", "0"], "--timeout-s must be positive"),
                                           (["--case", "99"], "--case must be 0 to"),
                                           ([], "needs a Hopper GPU")])
def test_the_benchmark_refuses_bad_input_with_one_line(args, problem):
    if problem.startswith("needs") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = subprocess.run([sys.executable, "benchmarks/gluon_multi_tile.py", *args],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and problem in done.stderr, done.stderr


def test_every_cases_ring_fits_the_h200s_shared_memory_at_its_shapes_block_k():
    """A case that did not fit would come back as an error, not as an answer about its loop (nor a
    ping-pong case whose accumulators two consumer groups' registers cannot hold)."""
    for case in CASES:
        tiles = case_tiles(case, base_tiles(*shape_of(case), torch.bfloat16).block_k)
        assert ring_bytes(tiles) <= SMEM_BYTES - 1024, case
        assert tiles.ping_pong == (case.kind == "ping_pong") and (not tiles.ping_pong or ping_pong_fits(tiles)), case
