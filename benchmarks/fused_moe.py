"""The routed experts of one Kimi K2 MoE layer: fused Triton kernels vs the per-expert loop vs
`torch._grouped_mm` (PyTorch's CUTLASS grouped GEMM), on the H200.

K2 dims: hidden 7168, moe_intermediate 2048, 384 experts, top-8 (the shared expert's output is an
input here: every variant adds the same one). Token counts 1, 8, 17, 64, 136, 544, 1,088
(bs x (1 + budget) of the serving runs); routing from the engine's router (random weights) on random
hidden states. Per point and variant: time per call with a cold L2, as a decode step pays it
(`eager_us`: triton.testing.do_bench, CUDA events around the call, host launches and the loop's
wait for its group sizes included) and for the variants a CUDA graph can hold, GPU time alone
(`graph_us`, as benchmarks/verify_attention.py measures); bytes of expert weights actually touched
(experts in use x 3 x 7168 x 2048 x 2), achieved bandwidth as a fraction of the copy bandwidth
measured in the same run, TFLOP/s. Goals (issue 20): >= 75% of the copy bandwidth from 136 tokens
up; >= 10x the loop at 544 tokens; no slower than torch._grouped_mm where it runs.

`--tune` first times CANDIDATES at 1, 136 and 1,088 tokens and runs the table with the tiling whose
worst time relative to the best candidate is smallest (written into the result file: where the
bf16 tiling of `triton_kernels.fused_moe.moe_tiles` comes from).

    python3 benchmarks/fused_moe.py [--tune] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import bench, ceilings  # noqa: E402
from engine.config import preset  # noqa: E402
from engine.model import MoE, init_random, materialize  # noqa: E402
from triton_kernels.fused_moe import MoeTiles, fused_moe, moe_tiles  # noqa: E402

CONFIG = dataclasses.replace(preset("k2-layer").model)
TOKENS = [1, 8, 17, 64, 136, 544, 1088]
TUNE_TOKENS = [1, 136, 1088]
CANDIDATES = [MoeTiles(16, 64, 128, 4, 4), MoeTiles(16, 128, 128, 4, 4), MoeTiles(32, 64, 128, 4, 4),
              MoeTiles(32, 128, 64, 4, 4), MoeTiles(64, 64, 64, 4, 4), MoeTiles(64, 128, 64, 4, 3),
              MoeTiles(16, 64, 256, 4, 3), MoeTiles(32, 64, 128, 8, 4)]


def k2_moe_layer() -> MoE:
    """One MoE layer at K2 dims on the GPU (34 GB of experts, stacked as the engine stacks them)."""
    with torch.device("meta"):
        moe = MoE(CONFIG).to(torch.bfloat16)
    moe.stack_experts("cuda")
    materialize(moe, "cuda")
    moe.gate.float()
    init_random(moe, seed=0)
    return moe.eval().requires_grad_(False)


def grouped_mm(x, weights, experts, w13, w2, shared):
    """The same routed experts through torch._grouped_mm: pairs sorted by expert on the GPU, group
    ends as int32 offsets (no size read back), both projections one grouped GEMM each."""
    pairs = experts.flatten()
    order = pairs.argsort(stable=True)
    ends = torch.zeros(w13.shape[0], dtype=torch.int32, device=x.device).scatter_add_(
        0, pairs, torch.ones_like(pairs, dtype=torch.int32)).cumsum(0, dtype=torch.int32)
    rows = x[order // experts.shape[1]]
    gate_up = torch._grouped_mm(rows, w13.transpose(1, 2), offs=ends)
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=ends)
    per_pair = torch.empty_like(out).index_copy_(0, order, out).view(*experts.shape, -1)
    return MoE.combine(weights, per_pair, shared)


def timed(fn, graphable: bool) -> dict:
    eager = triton.testing.do_bench(fn, warmup=5, rep=40, return_mode="median") * 1e3
    return {"eager_us": eager, "graph_us": bench(fn) * 1e3 if graphable else None}


def tune(moe: MoE, cases: dict[int, tuple]) -> tuple[MoeTiles, list[dict]]:
    w13, w2 = moe.stacked()
    times = {}
    for tiles in CANDIDATES:
        try:
            times[tiles] = {n: bench(lambda: fused_moe(*cases[n][:3], w13, w2, cases[n][3], tiles)) for n in TUNE_TOKENS}
        except Exception as error:  # e.g. out of shared memory for this tile shape
            print(f"  {tiles}: {str(error).splitlines()[0][:120]}")
            continue
        print(f"  {tiles}: " + " ".join(f"{n} tokens {ms * 1e3:.0f} us" for n, ms in times[tiles].items()), flush=True)
    best = {n: min(t[n] for t in times.values()) for n in TUNE_TOKENS}
    worst = {tiles: max(t[n] / best[n] for n in TUNE_TOKENS) for tiles, t in times.items()}
    chosen = min(worst, key=worst.get)
    return chosen, [{"tiles": t._asdict(), "us": {n: ms * 1e3 for n, ms in times[t].items()}, "worst_vs_best": worst[t]}
                    for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "fused_moe.json")
    parser.add_argument("--tune", action="store_true", help="pick the tiling first (see the docstring)")
    args = parser.parse_args()
    peak = ceilings()
    print(f"ceilings: bf16 matmul {peak['matmul_tflops']:.0f} TFLOP/s, copy {peak['copy_gbps']:.0f} GB/s")
    moe = k2_moe_layer()
    w13, w2 = moe.stacked()
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = {}
    for n in TOKENS:
        x = torch.randn(n, CONFIG.hidden_size, device="cuda", generator=gen).to(torch.bfloat16)
        weights, experts = moe.gate(x)
        cases[n] = (x, weights, experts, moe.shared_experts(x))
    result = {"benchmark": "fused_moe", "machine": describe(), "ceilings": peak, "config": {
        "hidden": CONFIG.hidden_size, "moe_intermediate": CONFIG.moe_intermediate_size,
        "experts": CONFIG.n_routed_experts, "top_k": CONFIG.num_experts_per_tok}, "rows": []}
    tiles = moe_tiles(torch.bfloat16)
    if args.tune:
        print("tuning the fused kernels' tiling")
        tiles, tried = tune(moe, cases)
        result["tuned"] = {"tiles": tiles._asdict(), "tried": tried}
    result["tiles"] = tiles._asdict()
    expert_bytes = 3 * CONFIG.hidden_size * CONFIG.moe_intermediate_size * 2
    print(f"{'tokens':>6} {'experts':>7} {'fused us':>9} {'graph us':>9} {'of BW':>6} {'TF/s':>6} {'loop us':>9} "
          f"{'x loop':>7} {'grouped_mm us':>13}")
    for n, (x, weights, experts, shared) in cases.items():
        used = experts.unique().numel()
        fused = lambda: fused_moe(x, weights, experts, w13, w2, shared, tiles)  # noqa: E731
        want = moe.per_expert(x, weights, experts, shared)
        row = {"tokens": n, "experts_used": used, "weight_bytes": used * expert_bytes,
               "flops": 2 * n * CONFIG.num_experts_per_tok * expert_bytes // 2,
               "fused": timed(fused, graphable=True),
               "loop": timed(lambda: moe.per_expert(x, weights, experts, shared), graphable=False),
               "fused_rel_err_vs_loop": ((fused().float() - want.float()).norm() / want.float().norm()).item()}
        try:
            row["grouped_mm"] = timed(lambda: grouped_mm(x, weights, experts, w13, w2, shared), graphable=True)
        except Exception as error:  # absent or refusing these shapes on this build
            row["grouped_mm"] = {"error": str(error).splitlines()[0][:200]}
        best_us = row["fused"]["graph_us"]
        row["fused_of_copy_bandwidth"] = row["weight_bytes"] / best_us / 1e3 / peak["copy_gbps"]
        row["fused_tflops"] = row["flops"] / best_us / 1e6
        row["loop_over_fused_eager"] = row["loop"]["eager_us"] / row["fused"]["eager_us"]
        result["rows"].append(row)
        g = row["grouped_mm"]
        print(f"{n:6} {used:7} {row['fused']['eager_us']:9.1f} {best_us:9.1f} {row['fused_of_copy_bandwidth']:6.0%} "
              f"{row['fused_tflops']:6.1f} {row['loop']['eager_us']:9.1f} {row['loop_over_fused_eager']:7.1f} "
              f"{g.get('graph_us') or float('nan'):13.1f}", flush=True)
        write_result(args.out, result)


if __name__ == "__main__":
    main()
