#!/usr/bin/env bash
# The first GPU call of a session after CPU-only kernel work: the CUDA tests of the kernels on a
# token's path, then the runs that measure the batch-invariant GEMM (each result under OUT, a file
# per run; join them back into benchmarks/results/). Written to fit one device call (10 minutes):
# each step has its own time limit, and a step that runs out leaves the others running.
#
#   bash benchmarks/gpu_verify.sh OUT
#
# `--tune-rows` prints the ROW_TUNED lines to paste into triton_kernels/batch_invariant_matmul.py
# (a test requires them to equal the committed run's picks); `--tune` (about 6.5 min, its own call)
# re-picks the (N, K) side first. Last run: 2026-12-01 (README "Batch-invariant numerics").
set -uo pipefail
out=${1:?OUT}
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_fused_moe.py \
  tests/triton_kernels/test_batch_invariant_matmul.py tests/engine/test_lossless_k2_bf16.py > "$out/gpu_tests.txt" 2>&1
tail -3 "$out/gpu_tests.txt"
# The row side per M with the table (about 4 min), whether rows keep their bits across row tiles
# (1-2 min), and the end-to-end cost on the graphed engine (about 1 min).
timeout 270 python3 benchmarks/batch_invariant_matmul.py --tune-rows --out "$out/batch_invariant_matmul_row_tuning.json" \
  > "$out/batch_invariant_matmul_rows.log" 2>&1
tail -14 "$out/batch_invariant_matmul_rows.log"
timeout 100 python3 benchmarks/block_m_invariance.py --out "$out/block_m_invariance.json" > "$out/block_m.log" 2>&1
tail -1 "$out/block_m.log"
timeout 70 python3 benchmarks/batch_invariant_ab.py --model k2-layer --concurrency 32 --rounds 5 \
  --out "$out/batch_invariant_ab_k2_c32_graphs.json" > "$out/batch_invariant_ab.log" 2>&1
tail -2 "$out/batch_invariant_ab.log"
ls -la "$out"
