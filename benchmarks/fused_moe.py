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

`--tune` first tunes each projection on its own: every candidate tiling of the gate+up GEMM
(GATE_UP_CANDIDATES) and of the down GEMM (DOWN_CANDIDATES) is timed alone (GPU time, cold L2, as
`graph_us`) at 1, 136, 544 and 1,088 tokens, and each projection takes the candidate whose worst
ratio to the best candidate over those counts is smallest; the table then runs with the two picks.
The picks and every time tried are written into the result file (its "tuned" block): that is where
`triton_kernels.fused_moe.TUNED` comes from (the run prints the lines to paste; a test checks that
they agree). The run prints each candidate's seconds and its own total.

    python3 benchmarks/fused_moe.py [--tune] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import bench, ceilings  # noqa: E402
from engine.config import preset  # noqa: E402
from engine.model import MoE, init_random, materialize  # noqa: E402
from triton_kernels.fused_moe import (MoeConfig, MoeTiles, down_projection, fused_moe, gate_up_projection,  # noqa: E402
                                      moe_config, route_to_blocks)

CONFIG = dataclasses.replace(preset("k2-layer").model)
TOKENS = [1, 8, 17, 64, 136, 544, 1088]
TUNE_TOKENS = [1, 136, 544, 1088]
# Candidates that fit an H200's 227 KB of shared memory per block: stages x (block_m x block_k + the
# weight tiles: two of block_k x block_n for gate+up, one for down) x 2 bytes. Gate+up holds two
# accumulators, so its block_n stops at 128; at 1,088 tokens an expert in use gets ~56 rows.
GATE_UP_CANDIDATES = [MoeTiles(64, 64, 64, 4, 4), MoeTiles(64, 64, 64, 4, 5), MoeTiles(64, 64, 128, 4, 3),
                      MoeTiles(64, 64, 128, 4, 4), MoeTiles(64, 64, 128, 8, 4), MoeTiles(64, 128, 64, 4, 3),
                      MoeTiles(64, 128, 64, 8, 3), MoeTiles(64, 128, 64, 8, 4), MoeTiles(32, 64, 128, 4, 4),
                      MoeTiles(32, 128, 64, 4, 4), MoeTiles(16, 64, 128, 4, 4), MoeTiles(16, 128, 128, 4, 3)]
DOWN_CANDIDATES = [MoeTiles(64, 64, 64, 4, 4), MoeTiles(64, 64, 128, 4, 4), MoeTiles(64, 128, 64, 4, 3),
                   MoeTiles(64, 128, 64, 4, 4), MoeTiles(64, 128, 64, 8, 4), MoeTiles(64, 128, 128, 8, 3),
                   MoeTiles(64, 256, 64, 8, 3), MoeTiles(64, 256, 64, 8, 4), MoeTiles(32, 128, 64, 4, 4),
                   MoeTiles(32, 64, 128, 4, 4), MoeTiles(16, 64, 128, 4, 4), MoeTiles(16, 128, 128, 4, 3)]


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


def tune(moe: MoE, cases: dict[int, tuple]) -> tuple[MoeConfig, dict]:
    """Each projection's pick (see the docstring; printed as TUNED's lines), with everything tried.
    Each GEMM runs alone on the routing its own block_m gives (in the fused call the GEMM with the
    smaller block_m walks the larger one's layout in sub-tiles, skipping those of padding alone: the
    same work, a few empty programs). The down GEMM reads random h: its time does not depend on it."""
    w13, w2 = moe.stacked()
    block_ms = {t.block_m for t in GATE_UP_CANDIDATES + DOWN_CANDIDATES}
    routing = {(n, m): route_to_blocks(cases[n][2], w13.shape[0], m) for n in TUNE_TOKENS for m in block_ms}
    h = {key: torch.randn(r.row_pair.shape[0], w2.shape[2], device="cuda").to(w2.dtype) for key, r in routing.items()}

    def gate_up(tiles: MoeTiles, n: int):
        return lambda: gate_up_projection(cases[n][0], routing[n, tiles.block_m], w13, tiles)

    def down(tiles: MoeTiles, n: int):
        return lambda: down_projection(h[n, tiles.block_m], cases[n][1], routing[n, tiles.block_m], w2, tiles)

    gate_up_tiles, gate_up_tuned = pick("gate_up", w13, GATE_UP_CANDIDATES, gate_up)
    down_tiles, down_tuned = pick("down", w2, DOWN_CANDIDATES, down)
    tuned = {"gate_up": gate_up_tuned, "down": down_tuned}
    print("triton_kernels/fused_moe.py TUNED, from this run:")
    for name, picked in tuned.items():
        print(f"    ({picked['n']}, {picked['k']}): {MoeTiles(**picked['tiles'])!r},  # {name}", flush=True)
    return MoeConfig(gate_up_tiles, down_tiles), tuned


def pick(name: str, weight: torch.Tensor, candidates: list[MoeTiles], call) -> tuple[MoeTiles, dict]:
    """The candidate whose worst ratio to the best candidate over TUNE_TOKENS is smallest: one tiling
    serves every token count (batch invariance), so its worst point is what it must bound."""
    n, k = weight.shape[1:]
    print(f"tuning {name} (N {n}, K {k}): {len(candidates)} candidates x {len(TUNE_TOKENS)} token counts", flush=True)
    times, tried = {}, []
    for i, tiles in enumerate(candidates, 1):
        started = time.perf_counter()
        try:
            times[tiles] = {tokens: bench(call(tiles, tokens), rep_ms=25) for tokens in TUNE_TOKENS}
        except Exception as error:  # e.g. out of shared memory for this tile shape
            tried.append({"tiles": tiles._asdict(), "error": str(error).splitlines()[0][:200]})
            print(f"  [{i}/{len(candidates)}] {tiles}: {tried[-1]['error'][:120]}", flush=True)
            continue
        print(f"  [{i}/{len(candidates)}] {tiles}: " + " ".join(
            f"{tokens} tokens {ms * 1e3:.0f} us" for tokens, ms in times[tiles].items())
            + f" ({time.perf_counter() - started:.0f} s)", flush=True)
    best = {tokens: min(t[tokens] for t in times.values()) for tokens in TUNE_TOKENS}
    worst = {tiles: max(t[tokens] / best[tokens] for tokens in TUNE_TOKENS) for tiles, t in times.items()}
    chosen = min(worst, key=worst.get)
    tried += [{"tiles": t._asdict(), "us": {tokens: ms * 1e3 for tokens, ms in times[t].items()},
               "worst_vs_best": worst[t]} for t in times]
    print(f"  {name}: {chosen}, at most {worst[chosen] - 1:.0%} behind the best of each token count", flush=True)
    return chosen, {"n": n, "k": k, "tiles": chosen._asdict(), "tried": tried}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "fused_moe.json")
    parser.add_argument("--tune", action="store_true", help="pick each projection's tiling first (see the docstring)")
    args = parser.parse_args()
    started = time.perf_counter()
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
    config = moe_config(w13, w2)
    if args.tune:
        config, result["tuned"] = tune(moe, cases)
    result["tiles"] = {name: tiles._asdict() for name, tiles in config._asdict().items()}
    if args.tune:
        write_result(args.out, result)  # the picks survive a table cut short
    expert_bytes = 3 * CONFIG.hidden_size * CONFIG.moe_intermediate_size * 2
    print(f"{'tokens':>6} {'experts':>7} {'fused us':>9} {'graph us':>9} {'of BW':>6} {'TF/s':>6} {'loop us':>9} "
          f"{'x loop':>7} {'grouped_mm us':>13}")
    for n, (x, weights, experts, shared) in cases.items():
        used = experts.unique().numel()
        fused = lambda: fused_moe(x, weights, experts, w13, w2, shared, config)  # noqa: E731
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
    print(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
