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
# benchmarks/batch_invariant_ab.py, the end-to-end cost; see the end of this file).
set -uo pipefail
out=${1:?OUT}
# The kernels that changed, and the K2-shape bf16 lossless tests that run through them.
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_fused_moe.py \
  tests/triton_kernels/test_batch_invariant_matmul.py tests/engine/test_lossless_k2_bf16.py > "$out/gpu_tests.txt" 2>&1
tail -8 "$out/gpu_tests.txt"
# Every shape tuned (the committed tuning file must hold every pick), then the table: about 6.5 min.
timeout 420 python3 benchmarks/batch_invariant_matmul.py --tune --out "$out/batch_invariant_matmul_tuning.json" \
  > "$out/batch_invariant_matmul_tune.log" 2>&1
tail -30 "$out/batch_invariant_matmul_tune.log"
ls -la "$out"
# The next call, after pasting TUNED: `pytest -m gpu tests/engine tests/triton_kernels`, the overlap
# A/Bs of small c=64 and k2-layer c=32 with the GPU builder (benchmarks/overlap_ab.py; the committed
# ones prefilled one request at a time), benchmarks/batch_invariant_matmul.py (the table with the
# pasted tilings), benchmarks/batch_invariant_ab.py --model k2-layer --concurrency 32, and
# benchmarks/block_m_invariance.py (whether the row tile could follow M and stay invariant; ~1-2 min).
