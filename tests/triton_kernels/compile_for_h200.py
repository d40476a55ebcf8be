"""Compile each `benchmarks/fused_moe.py --tune` candidate for the H200 (sm_90) on a machine without
one, and print its resources as JSON lines (used by test_fused_moe_candidates.py, in a process of
its own: Triton's interpreter, which the CPU tests run under, cannot compile).

The kernels are specialized as Triton's launcher specializes them at K2 shapes: pointers and the
sizes and strides divisible by 16, the unit stride along K a constant. Registers and spills come
from ptxas's report.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.fused_moe import DOWN_CANDIDATES, GATE_UP_CANDIDATES  # noqa: E402
from triton_kernels.fused_moe import MoeTiles, _down_kernel, _gate_up_kernel  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
POINTERS = {"x_ptr": "*bf16", "w13_ptr": "*bf16", "h_ptr": "*bf16", "w2_ptr": "*bf16", "y_ptr": "*bf16",
            "weight_ptr": "*fp32", "row_pair_ptr": "*i64", "block_expert_ptr": "*i64"}
MULTIPLES_OF_16 = {"H", "I", "stride_we", "stride_wn"}  # 7168, 2048 and their products


def compile_for_h200(kernel, tiles: MoeTiles, route_m: int, **constants):
    constants |= dict(stride_wk=1, ROUTE_M=route_m, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
                      BLOCK_K=tiles.block_k, IEEE=False)
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        signature[name] = "constexpr" if name in constants else POINTERS.get(name, "i32")
        if name in POINTERS or name in MULTIPLES_OF_16:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(kernel, signature, constants, attrs), target=H200,
                          options=dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages))


def ptxas_report(ptx: str, folder: Path) -> str:
    (folder / "kernel.ptx").write_text(ptx)
    return subprocess.run([triton.knobs.nvidia.ptxas.path, "-arch=sm_90a", "-v", str(folder / "kernel.ptx"),
                           "-o", str(folder / "kernel.cubin")], capture_output=True, text=True, check=True).stderr


def main(folder: Path) -> None:
    route_m = max(t.block_m for t in GATE_UP_CANDIDATES + DOWN_CANDIDATES)  # the largest layout: every sub-tiling
    for projection, kernel, candidates, constants in (("gate_up", _gate_up_kernel, GATE_UP_CANDIDATES, {"TOP_K": 8}),
                                                      ("down", _down_kernel, DOWN_CANDIDATES, {})):
        for tiles in candidates:
            compiled = compile_for_h200(kernel, tiles, route_m, **constants)
            report = ptxas_report(compiled.asm["ptx"], folder)
            print(json.dumps({"projection": projection, "tiles": tiles._asdict(), "shared": compiled.metadata.shared,
                              "registers": int(re.search(r"Used (\d+) registers", report).group(1)),
                              "spill_bytes": int(re.search(r"(\d+) bytes spill stores", report).group(1))}),
                  flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
