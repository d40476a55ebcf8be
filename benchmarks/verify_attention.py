"""Tree-verify attention at K2 dims (64 heads, 576-wide latent rows, 512 for values) vs its roofline.

For each point (prefix length P, batch bs, budget B; T = 1 + B queries per request, B = 0 is plain
decode) `tree_verify_attention` runs on bf16 inputs with real DDTree masks (L = 15, K = B): its
default kernel (`kernel`: the Hopper kernel on an H200) gives `ms` and the achieved fraction of the
floor; the portable Triton kernel, at the best of CONFIGS for decode and for verify, gives
`triton_ms`. Counted work: FLOPs = sum over queries of 2 * H * keys_seen * (576 + 512);
bytes = the cache rows of each request read once + q read + o written. The two ceilings are
measured in the same run (a large bf16 matmul on random data, a large device-to-device copy
counting bytes read and written); floor = max(FLOPs / matmul rate, bytes / copy bandwidth) and
`of_floor` = floor / measured time. `torch_ms` is a plain PyTorch version of the same masked
attention (bf16 matmuls, float32 softmax over materialised scores). Times are GPU time per call
with a cold L2 and no host launch cost (a decode loop replays CUDA graphs): median CUDA-graph
replays of [flush the L2, call] minus those of [flush the L2] alone. Run from the repo root:
    python3 benchmarks/verify_attention.py [--out FILE] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from engine.tree import build_tree_cpu  # noqa: E402
from triton_kernels import tree_verify_attention_hopper as hopper  # noqa: E402
from triton_kernels.tree_verify_attention import DEFAULT_CONFIG, default_num_splits, tree_verify_attention  # noqa: E402

HEADS, LATENT, ROPE = 64, 512, 64
DIM = LATENT + ROPE
SCALE = (128 + 64) ** -0.5
DEPTH = 15
PREFIXES = (1024, 4096, 16384, 32768)
BATCHES = (1, 8, 64)
BUDGETS = (0, 8, 16, 32)
# Portable-kernel configurations tried once per mode (decode / verify) before the table: (block_n, warps, stages).
CONFIGS = ((64, 8, 2), (32, 8, 3), (32, 8, 2), (64, 8, 1), (128, 8, 1))
DEFAULT_N = DEFAULT_CONFIG[2][0]  # keys per chunk of the default kernels on 16-bit rows


def ceilings() -> dict:
    """Measured bf16 matmul rate (TFLOP/s, random data) and device copy bandwidth (GB/s, read + write)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
    src = torch.randn(2 ** 30 // 4, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=100, rep=500, return_mode="median")
    return {"matmul_tflops": 2 * 8192 ** 3 / mm_ms / 1e9, "copy_gbps": 2 * src.numel() * 4 / copy_ms / 1e6}


def make_point(prefix: int, bs: int, budget: int, gen: torch.Generator):
    T = budget + 1
    q = torch.randn(bs, T, HEADS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    kv = torch.randn(bs, prefix + T, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    slots = torch.randperm(bs, device="cuda", generator=gen)
    prefix_lens = torch.full((bs,), prefix, device="cuda", dtype=torch.int64)
    mask = torch.ones(bs, T, T, dtype=torch.bool)
    if budget:
        cpu_gen = torch.Generator().manual_seed(prefix + bs + budget)
        lq = torch.log_softmax(torch.randn(bs, DEPTH, budget, generator=cpu_gen), -1).sort(-1, True).values
        vis = build_tree_cpu(lq, torch.zeros(bs, DEPTH, budget, dtype=torch.int64), budget).visibility
        mask[:, 1:, 0] = True
        mask[:, 0, 1:] = False
        mask[:, 1:, 1:] = vis
    return q, kv, slots, prefix_lens, mask.cuda()


def torch_attention(q, kv, slots, prefix: int, mask):
    """Plain PyTorch: per group of requests, scores for every (query, head) x cache row, masked
    softmax. Every request has `prefix` cache rows before its tree block (one length per point)."""
    bs, T = q.shape[:2]
    n = prefix + T
    visible = torch.cat([torch.ones(bs, T, prefix, dtype=torch.bool, device=q.device), mask], -1)
    out = torch.empty(bs, T, HEADS, LATENT, dtype=q.dtype, device=q.device)
    group = max(1, 2 ** 31 // (T * HEADS * n * 4))  # keep the float32 scores under 2 GiB
    for start in range(0, bs, group):
        sl = slice(start, start + group)
        keys = kv[slots[sl], :n]  # [g, n, D]
        scores = (q[sl].reshape(-1, T * HEADS, DIM) @ keys.transpose(1, 2)).float() * SCALE
        scores = scores.view(-1, T, HEADS, n).masked_fill(~visible[sl, :, None, :], float("-inf"))
        probs = torch.softmax(scores, -1).to(q.dtype).view(-1, T * HEADS, n)
        out[sl] = (probs @ keys[..., :LATENT]).view(-1, T, HEADS, LATENT)
    return out


def work(prefix: int, bs: int, mask: torch.Tensor) -> tuple[float, float]:
    keys_seen = (prefix + mask.sum(-1)).sum().item()  # over requests and queries
    flops = 2 * HEADS * keys_seen * (DIM + LATENT)
    T = mask.shape[1]
    nbytes = 2 * bs * ((prefix + T) * DIM + T * HEADS * (DIM + LATENT))
    return flops, nbytes


_FLUSH = None  # 256 MiB, larger than the L2


def bench(fn, rep_ms: int = 50) -> float:
    """GPU ms of one call of `fn` with a cold L2, without host launch cost (see the docstring)."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 2 ** 20, dtype=torch.int8, device="cuda")
    both = triton.testing.do_bench_cudagraph(lambda: (_FLUSH.zero_(), fn()), rep=rep_ms, return_mode="median")
    flush = triton.testing.do_bench_cudagraph(_FLUSH.zero_, rep=rep_ms, return_mode="median")
    return both - flush


def pick_config(point, label: str) -> tuple[tuple[int, int, int], list[dict]]:
    tried = []
    for block_n, warps, stages in CONFIGS:
        try:
            ms = bench(lambda: tree_verify_attention(*point, SCALE, LATENT, block_n=block_n, num_warps=warps,
                                                     num_stages=stages, kernel="triton"))
        except Exception as error:  # e.g. out of shared memory for this tile shape
            tried.append({"mode": label, "block_n": block_n, "num_warps": warps, "num_stages": stages,
                          "error": str(error).splitlines()[0][:200]})
            continue
        tried.append({"mode": label, "block_n": block_n, "num_warps": warps, "num_stages": stages, "ms": ms})
        print(f"config {label}: block_n={block_n} warps={warps} stages={stages}: {ms:.3f} ms")
    best = min((t for t in tried if "ms" in t), key=lambda t: t["ms"])
    return (best["block_n"], best["num_warps"], best["num_stages"]), tried


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_attention.json")
    parser.add_argument("--quick", action="store_true", help="fewer points (prefix 4k only)")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    peak = ceilings()
    print(f"ceilings: bf16 matmul {peak['matmul_tflops']:.0f} TFLOP/s, copy {peak['copy_gbps']:.0f} GB/s")
    decode_cfg, tried = pick_config(make_point(4096, 64, 0, gen), "decode")
    verify_cfg, tried_verify = pick_config(make_point(4096, 8, 32, gen), "verify")
    rows = []
    result = {"benchmark": "verify_attention", "machine": describe(), "ceilings": peak,
              "config_decode": dict(zip(("block_n", "num_warps", "num_stages"), decode_cfg)),
              "config_verify": dict(zip(("block_n", "num_warps", "num_stages"), verify_cfg)),
              "config_sweep": tried + tried_verify, "rows": rows}
    for prefix in ((4096,) if args.quick else PREFIXES):
        for bs in BATCHES:
            for budget in BUDGETS:
                point = make_point(prefix, bs, budget, gen)
                block_n, warps, stages = decode_cfg if budget == 0 else verify_cfg
                run = lambda: tree_verify_attention(*point, SCALE, LATENT)  # noqa: E731
                portable = lambda: tree_verify_attention(*point, SCALE, LATENT, block_n=block_n,  # noqa: E731
                                                         num_warps=warps, num_stages=stages, kernel="triton")
                got = run()
                plain = torch_attention(*point[:3], prefix, point[4])
                err = ((got.float() - plain.float()).norm() / plain.float().norm()).item()
                flops, nbytes = work(prefix, bs, point[-1])
                ms = bench(run)
                triton_ms = bench(portable)
                torch_ms = bench(lambda: torch_attention(*point[:3], prefix, point[4]))
                floor_ms = max(flops / peak["matmul_tflops"] / 1e9, nbytes / peak["copy_gbps"] / 1e6)
                rows.append({"prefix": prefix, "bs": bs, "budget": budget, "T": budget + 1,
                             "kernel": "hopper" if hopper.fits(point[0], point[1], LATENT, DEFAULT_N) else "triton",
                             "triton_ms": triton_ms,
                             "splits": default_num_splits(bs, budget + 1, prefix + budget + 1, got.device),
                             "ms": ms, "tflops": flops / ms / 1e9, "gbps": nbytes / ms / 1e6,
                             "floor_ms": floor_ms, "bound": "compute" if flops / peak["matmul_tflops"] / 1e9
                             >= nbytes / peak["copy_gbps"] / 1e6 else "memory",
                             "of_floor": floor_ms / ms, "torch_ms": torch_ms, "vs_torch": torch_ms / ms,
                             "rel_err_vs_torch": err, "flops": flops, "bytes": nbytes})
                r = rows[-1]
                print(f"P={prefix:>5} bs={bs:>2} B={budget:>2}: {r['kernel']} {ms:8.3f} ms (triton {triton_ms:7.3f}) "
                      f"{r['tflops']:6.1f} TF/s "
                      f"{r['gbps']:6.0f} GB/s floor {floor_ms:7.3f} ({r['bound'][:3]}) {r['of_floor']:5.0%} "
                      f"torch {torch_ms:8.3f} ms x{r['vs_torch']:5.1f} err {err:.1e}", flush=True)
                write_result(args.out, result)  # after every point, so a cut-short run keeps its rows


if __name__ == "__main__":
    main()
