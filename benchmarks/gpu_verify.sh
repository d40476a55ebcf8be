#!/usr/bin/env bash
# The first GPU call of a session after CPU-only work: the CUDA tests of the code no GPU has run
# yet, then the paired A/Bs and kernel runs that measure it (each result under OUT, a file per run;
# join them back here into benchmarks/results/). Written to fit one device call (10 minutes): each
# step has its own time limit, and a step that runs out leaves the others running.
#
#   bash benchmarks/gpu_verify.sh OUT
#
# What is pending (README): the fused MoE's per-projection tiling (its `gpu` tests ran before it),
# the batch-invariant GEMM's split-K tilings (`--tune` prints the TUNED lines to paste into
# triton_kernels/batch_invariant_matmul.py; once pasted, a later call runs its `gpu` tests again and
# benchmarks/batch_invariant_ab.py, the end-to-end cost), and the two overlap A/Bs that ran before
# batched prefill became the default.
set -uo pipefail
out=${1:?OUT}
k2="--model k2-layer --max-new-tokens 32"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine tests/triton_kernels \
  > "$out/gpu_tests.txt" 2>&1
tail -8 "$out/gpu_tests.txt"
timeout 60 python3 benchmarks/overlap_ab.py --model small --concurrency 64 --builder gpu --rounds 4 \
  --out "$out/overlap_ab_small_c64_gpu.json" 2>&1 | grep -E "^median|rror"
timeout 70 python3 benchmarks/overlap_ab.py $k2 --concurrency 32 --requests 32 --builder gpu --rounds 4 \
  --out "$out/overlap_ab_k2_c32_gpu.json" 2>&1 | grep -E "^median|rror"
timeout 200 python3 benchmarks/batch_invariant_matmul.py --tune --out "$out/batch_invariant_matmul.json" \
  > "$out/batch_invariant_matmul_tune.log" 2>&1
tail -30 "$out/batch_invariant_matmul_tune.log"
ls -la "$out"
