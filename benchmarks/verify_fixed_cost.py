"""Fixed and per-chunk cost of a tree_verify_attention program, measured on the call itself (H200).

Why: the points under 50% of the roofline floor (benchmarks/results/verify_attention.json: batch 1
and 8 at 4k keys, batch-1 decode) give each (query, split) program 2-10 chunks of 64 keys. This says
how much of such a call is paid once per program (launch, loading the query, the first chunk's
latency, writing the output or partial) and how much per chunk: at a fixed split count the prefix
grows by one chunk per program at a time, the attention kernel alone is timed, and
time = fixed + chunks * per_chunk is fitted by least squares. Also timed: the whole call (attention
+ merge) and one empty kernel under the same measurement (cold L2, CUDA-graph replays, as in
verify_attention.py), the floor any call pays. Run from the repo root:
    python3 benchmarks/verify_fixed_cost.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from benchmarks.verify_attention import HEADS, LATENT, SCALE, bench, make_point  # noqa: E402
from triton_kernels import tree_verify_attention_hopper as hopper  # noqa: E402
from triton_kernels.tree_verify_attention import DEFAULT_CONFIG, tree_verify_attention  # noqa: E402

# (bs, budget, splits): the misses at 4k keys at their default split counts, or the largest count that
# keeps one wave of programs (bs 1 budget 16: 7, where the default 8 starts 4 of 136 programs late).
SHAPES = ((1, 0, 65), (8, 0, 13), (1, 8, 13), (1, 16, 7))
CHUNKS = (1, 2, 3, 4, 6, 8)  # per program
BLOCK_N = DEFAULT_CONFIG[2][0]


@triton.jit
def empty_kernel(x_ptr):
    tl.store(x_ptr + tl.program_id(0), 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "verify_fixed_cost.json")
    args = parser.parse_args()
    x = torch.zeros(1, device="cuda")
    empty_us = bench(lambda: empty_kernel[(1,)](x)) * 1e3
    print(f"an empty kernel: {empty_us:.2f} us", flush=True)
    rows = []
    result = {"benchmark": "verify_fixed_cost", "machine": describe(), "block_n": BLOCK_N,
              "empty_kernel_us": empty_us, "rows": rows}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for bs, budget, splits in SHAPES:
        T = budget + 1
        attention, call = [], []
        for chunks in CHUNKS:
            # n_keys = prefix + visible block columns (1..T): ceil(n_keys / splits) rounds up to chunks whole chunks
            point = make_point(splits * BLOCK_N * chunks - T, bs, budget, gen)
            ws_o = torch.empty(bs * T * splits * HEADS * LATENT, dtype=point[0].dtype, device="cuda")
            ws_lse = torch.empty(bs * T * splits * HEADS, dtype=torch.float32, device="cuda")
            attention.append(bench(lambda: hopper.launch(*point, ws_o, ws_lse, SCALE, LATENT, splits, BLOCK_N)) * 1e3)
            call.append(bench(lambda: tree_verify_attention(*point, SCALE, LATENT, num_splits=splits)) * 1e3)
        per_chunk, fixed = np.polyfit(CHUNKS, attention, 1)
        rows.append({"bs": bs, "budget": budget, "splits": splits, "programs": bs * T * splits, "chunks": list(CHUNKS),
                     "attention_us": attention, "call_us": call, "fixed_us": fixed, "per_chunk_us": per_chunk})
        print(f"bs {bs} budget {budget:>2} splits {splits:>3} ({bs * T * splits} programs): fixed {fixed:5.1f} us + "
              f"{per_chunk:4.2f} us per chunk | attention by chunks {' '.join(f'{t:.1f}' for t in attention)} | "
              f"call {' '.join(f'{t:.1f}' for t in call)}", flush=True)
        write_result(args.out, result)


if __name__ == "__main__":
    main()
