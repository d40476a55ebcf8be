"""DDTree tree-build stage per decode step: CPU heapq (as the engine pays it) vs the GPU builder.

CPU: `engine.tree.build_tree_cpu` on top-k tensors that live on the GPU, so the time includes the
device-to-host copy of the top-k (one copy for the batch), the Python heapq search, the visibility
mask, and the host-to-device copy of the finished tree (`TreeBatch.to`), up to a synchronize.
Wall clock: the best of three medians of many calls (host noise must not flatter the GPU).

GPU: `triton_kernels.tree_build.build_tree_gpu` (one launch for the batch, visibility included)
captured in a CUDA graph. `gpu_ms` is the median GPU time of one replay measured with CUDA events
while the stream is kept busy in front of it, so host launch latency is not hidden in it nor
added to it; `gpu_b2b_ms` is the time per replay of 200 replays back to back; `gpu_eager_ms` is
the wall clock of one plain Python call plus a synchronize (host launch overhead included).

Inputs: drafter-like top-k log-probs of random logits, L = block_size - 1 = 15 and K = budget
(the DDTree paper's choice), one fresh set per point. Run from the repo root:
    python3 benchmarks/tree_build.py [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from engine.tree import build_tree_cpu  # noqa: E402
from triton_kernels.tree_build import build_tree_gpu  # noqa: E402

BATCHES = (1, 8, 32, 64)
BUDGETS = (8, 16, 32)
DEPTH = 15
VOCAB = 32768


def drafter_topk(bs: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(bs, DEPTH, VOCAB, device="cuda", generator=gen) * 3
    top = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
    return top.values.contiguous(), top.indices.contiguous()


def cpu_step_ms(lq: torch.Tensor, ids: torch.Tensor, budget: int, rounds: int = 3, min_seconds: float = 0.3) -> float:
    """The best of `rounds` medians: a busy host can only make a median slower, and a baseline
    slowed by noise would flatter the GPU builder."""
    medians = []
    for _ in range(rounds):
        times = []
        deadline = time.perf_counter() + min_seconds
        while len(times) < 10 or (time.perf_counter() < deadline and len(times) < 2000):
            torch.cuda.synchronize()
            start = time.perf_counter()
            build_tree_cpu(lq, ids, budget).to("cuda")
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
    return min(medians) * 1e3


def gpu_step_ms(lq: torch.Tensor, ids: torch.Tensor, budget: int, reps: int = 300) -> dict:
    for _ in range(3):  # compile, then warm the allocator outside the capture
        build_tree_gpu(lq, ids, budget)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        build_tree_gpu(lq, ids, budget)
    for _ in range(10):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        torch.cuda._sleep(100_000)  # keep the GPU busy so the replay is queued, not waited for
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    queued = statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))

    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(100_000)
    first.record()
    for _ in range(200):
        graph.replay()
    last.record()
    torch.cuda.synchronize()
    back_to_back = first.elapsed_time(last) / 200

    eager = []
    for _ in range(200):
        torch.cuda.synchronize()
        start = time.perf_counter()
        build_tree_gpu(lq, ids, budget)
        torch.cuda.synchronize()
        eager.append(time.perf_counter() - start)
    return {"gpu_ms": queued, "gpu_b2b_ms": back_to_back, "gpu_eager_ms": statistics.median(eager) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "tree_build.json")
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for bs in BATCHES:
        for budget in BUDGETS:
            lq, ids = drafter_topk(bs, budget, gen)
            want = build_tree_cpu(lq, ids, budget)
            got = build_tree_gpu(lq, ids, budget)
            identical = all(torch.equal(getattr(got, f).cpu(), getattr(want, f))
                            for f in ("token_ids", "depths", "parents", "visibility"))
            if not identical:
                raise SystemExit(f"GPU tree differs from the CPU reference at bs={bs} budget={budget}")
            row = {"bs": bs, "budget": budget, "depth": DEPTH, "k": budget,
                   "cpu_ms": cpu_step_ms(lq, ids, budget), **gpu_step_ms(lq, ids, budget)}
            row["speedup"] = row["cpu_ms"] / row["gpu_ms"]
            rows.append(row)
    print(f"{'bs':>4} {'budget':>6} {'cpu_ms':>9} {'gpu_ms':>9} {'gpu_us':>7} {'b2b_us':>7} "
          f"{'eager_us':>8} {'speedup':>8}")
    for r in rows:
        print(f"{r['bs']:>4} {r['budget']:>6} {r['cpu_ms']:>9.3f} {r['gpu_ms']:>9.4f} "
              f"{r['gpu_ms'] * 1e3:>7.2f} {r['gpu_b2b_ms'] * 1e3:>7.2f} {r['gpu_eager_ms'] * 1e3:>8.1f} "
              f"{r['speedup']:>7.0f}x")
    write_result(args.out, {"benchmark": "tree_build", "machine": describe(),
                            "identical_to_cpu": True, "rows": rows})


if __name__ == "__main__":
    main()
