"""Every tiling `benchmarks/fused_moe.py --tune` tries fits an H200: compiled for sm_90 here (no GPU
needed), each stays within the 227 KB of shared memory a block may take, spills no register, and
its K loop is software-pipelined (at least two stages in shared memory), so the one tuning run
on the H200 spends its minutes on candidates that run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fused_moe import DOWN_CANDIDATES, GATE_UP_CANDIDATES

H200_SHARED_PER_BLOCK = 227 * 1024
HELPER = Path(__file__).with_name("compile_for_h200.py")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton_cache"))
    out = subprocess.run([sys.executable, str(HELPER), str(tmp_path_factory.mktemp("ptx"))], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def stage_bytes(projection: str, tiles: dict) -> int:
    """One K step's tiles in shared memory: x's (or h's) rows, and one weight tile per product."""
    products = 2 if projection == "gate_up" else 1
    return 2 * tiles["block_k"] * (tiles["block_m"] + products * tiles["block_n"])


def test_every_candidate_fits_an_h200_and_is_pipelined(compiled):
    assert [(c["projection"], tuple(c["tiles"].values())) for c in compiled] == (
        [("gate_up", tuple(t)) for t in GATE_UP_CANDIDATES] + [("down", tuple(t)) for t in DOWN_CANDIDATES])
    for c in compiled:
        assert c["shared"] <= H200_SHARED_PER_BLOCK, c
        assert c["spill_bytes"] == 0, c
        assert c["shared"] >= 2 * stage_bytes(c["projection"], c["tiles"]), c
