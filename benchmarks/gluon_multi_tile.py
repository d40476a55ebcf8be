"""Does the Gluon GEMM's program over several tiles finish, with the one-tile kernel's bits?

A persistent or stream-K program of `triton_kernels/batch_invariant_matmul_hopper.py` runs its
tiles (or (tile, chunk) units) one after another through one ring of shared-memory stages. On the
H200 on 2026-12-04 (commit 219e7a9) every program holding two hung, because each unit's K loop
began at step 0; a one-unit program was right. A hang cannot be caught inside the process that
launched the kernel, so each case here runs in a child process with a time limit, and the table
says per case: how many units each of the programs holds, whether it finished, and whether its
output equals the one-tile kernel's (persistent) and the Triton kernel's rows of the full batch
(both). The controls hold one unit per program. The ping-pong cases are persistent programs whose
two consumer groups take the tiles in turn (not yet run on the GPU when added, 2026-12-04): their
control holds one tile per program, so the second group has none. Writes JSON with the machine;
needs a Hopper GPU.

    python3 benchmarks/gluon_multi_tile.py [--timeout-s 45] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batch_invariant_matmul import SHAPES, inputs  # noqa: E402
from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from triton_kernels.batch_invariant_matmul import base_tiles, batch_invariant_linear, k_chunks  # noqa: E402
from triton_kernels.batch_invariant_matmul_hopper import HopperTiles, fits, hopper_linear  # noqa: E402


class Case(NamedTuple):
    """A product (a K2 shape at M rows) on one Gluon tile: `persistent` over its tiles (unsplit
    shapes; `ping_pong` too, two consumer groups) or `stream_k` over its (tile, chunk) units
    (split shapes, the base's chunks)."""
    kind: str
    shape: str
    m: int
    block_m: int
    block_n: int
    stages: int
    tail_m: int = 0
    swap_ab: bool = False


CASES = [Case("persistent", "kv_b_proj", 64, 64, 128, 6),  # control: 128 tiles, one a program
         Case("persistent", "q_b_proj", 136, 128, 128, 4, 16, True),  # control: 96 tiles
         Case("persistent", "kv_b_proj", 136, 64, 128, 6),
         Case("persistent", "q_b_proj", 544, 64, 128, 6),
         Case("persistent", "q_b_proj", 544, 128, 128, 4, 16, True),
         Case("persistent", "kv_b_proj", 1088, 128, 256, 3),
         Case("stream_k", "q_a_proj", 17, 64, 128, 3),  # control
         Case("stream_k", "q_a_proj", 1088, 64, 128, 3),
         Case("stream_k", "shared expert gate/up", 1088, 128, 128, 4, 16, True),
         Case("ping_pong", "q_b_proj", 136, 128, 128, 4, 16, True),  # control: 96 tiles, group 2 idle
         Case("ping_pong", "kv_b_proj", 136, 64, 128, 6),
         Case("ping_pong", "kv_b_proj", 544, 256, 64, 5, 16, True),  # kv_b's M = 544 pick, as ping-pong
         Case("ping_pong", "q_b_proj", 544, 128, 128, 4),
         Case("ping_pong", "kv_b_proj", 1088, 256, 64, 5, 16, True)]


def shape_of(case: Case) -> tuple[int, int]:
    """The case's (N, K), from the GEMM benchmark's K2 shapes."""
    return next((n, k) for name, n, k in SHAPES if name == case.shape)


def case_tiles(case: Case, block_k: int) -> HopperTiles:
    return HopperTiles(case.block_m, case.block_n, block_k, case.stages, case.tail_m, case.swap_ab,
                       persistent=case.kind in ("persistent", "ping_pong"), stream_k=case.kind == "stream_k",
                       ping_pong=case.kind == "ping_pong")


def units_per_program(case: Case, sms: int) -> tuple[int, int]:
    """(units, programs): the product's tiles (times its chunks, stream-K) and the grid over them."""
    n, k = shape_of(case)
    base = base_tiles(n, k, torch.bfloat16)
    units = triton.cdiv(case.m, case.block_m + case.tail_m) * triton.cdiv(n, case.block_n)
    if case.kind == "stream_k":
        units *= k_chunks(k, base.block_k, base.split_k)[1]
    return units, min(units, sms)


def run_case(case: Case) -> dict:
    """The child's work: the product, its bits against the one-tile kernel's and the Triton kernel's."""
    n, k = shape_of(case)
    x, w = inputs(n, k, torch.Generator(device="cuda").manual_seed(n + k))
    base = base_tiles(n, k, torch.bfloat16)
    triton_rows = batch_invariant_linear(x, w, base)[:case.m]
    tiles = case_tiles(case, base.block_k)
    if not fits(x[:case.m], w, tiles):
        return {"error": "does not fit the SM's shared memory (or, ping-pong, its registers)"}
    started = time.perf_counter()
    if case.kind != "stream_k":
        out = hopper_linear(x[:case.m], w, tiles)
        one_tile = torch.equal(out, hopper_linear(x[:case.m], w, tiles._replace(persistent=False, ping_pong=False)))
    else:
        warps = (case.block_n if case.swap_ab else case.block_m) // 16
        out = batch_invariant_linear(x[:case.m], w, base._replace(
            block_m=case.block_m, block_n=case.block_n, num_warps=warps, num_stages=case.stages, tail_m=case.tail_m,
            swap_ab=case.swap_ab, tma=True, gluon=True, stream_k=True))
        one_tile = None
    torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - started, "bits_as_one_tile": one_tile,
            "bits_as_triton": torch.equal(out, triton_rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, default=45.0, help="a case's limit, its compiles included")
    parser.add_argument("--out", type=Path, default=RESULTS / "gluon_multi_tile.json")
    parser.add_argument("--case", type=int, help=argparse.SUPPRESS)  # the child's: run CASES[i], print JSON
    args = parser.parse_args()
    problem = (f"--timeout-s must be positive, not {args.timeout_s}" if args.timeout_s <= 0
               else f"--case must be 0 to {len(CASES) - 1}, not {args.case}"
               if args.case is not None and not 0 <= args.case < len(CASES)
               else "needs a Hopper GPU (sm_90): the Gluon kernel is built for it"
               if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)) else None)
    if problem:
        print(f"benchmarks/gluon_multi_tile.py: {problem}", file=sys.stderr)
        sys.exit(2)
    if args.case is not None:
        print(json.dumps(run_case(CASES[args.case])), flush=True)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'kind':>10} {'shape':>22} {'M':>5} {'tile':>12} {'units':>6} {'per prog':>8} {'outcome':>9} "
          f"{'= 1-tile':>8} {'= Triton':>8}")
    for i, case in enumerate(CASES):
        units, programs = units_per_program(case, sms)
        row = {"case": case._asdict(), "units": units, "programs": programs}
        try:
            done = subprocess.run([sys.executable, __file__, "--case", str(i)], capture_output=True, text=True,
                                  timeout=args.timeout_s)
        except subprocess.TimeoutExpired:  # the child is killed: a kernel that never ends
            row["outcome"] = "hung"
        else:
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                row.update(json.loads(lines[-1]))
                row["outcome"] = "error" if "error" in row else "finished"
            else:
                row.update(outcome="error", error=(done.stderr.strip().splitlines() or ["no output"])[-1][:200])
        rows.append(row)
        tail = f"+{case.tail_m}" if case.tail_m else ""
        tile = f"{case.block_m}{tail}x{case.block_n}{' sw' if case.swap_ab else ''}"
        said = {None: "-", True: "yes", False: "NO"}
        print(f"{case.kind:>10} {case.shape:>22} {case.m:>5} {tile:>12} {units:>6} {units / programs:>8.1f} "
              f"{row['outcome']:>9} {said[row.get('bits_as_one_tile')]:>8} {said[row.get('bits_as_triton')]:>8}",
              flush=True)
    write_result(args.out, {"benchmark": "gluon_multi_tile", "machine": describe(), "timeout_s": args.timeout_s,
                            "rows": rows})


if __name__ == "__main__":
    main()
