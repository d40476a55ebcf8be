#!/usr/bin/env bash
# The first GPU call of a session after CPU-only work: the CUDA tests of the code no GPU has run
# yet, then the paired A/Bs that measure it (each result under OUT, a file per run; join them back
# here into benchmarks/results/). Written to fit one device call (10 minutes): each step has its
# own time limit, and a step that runs out leaves the others running.
#
#   bash benchmarks/gpu_verify.sh OUT
#
# What is pending (README): overlap scheduling and batched prefill (off by default until these
# tests pass), the static step's device-side slot state, the fused MoE's per-projection tiling
# (its --tune run prints the TUNED lines to paste into triton_kernels/fused_moe.py).
set -uo pipefail
out=${1:?OUT}
k2="--model k2-layer --max-new-tokens 32"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/engine/test_overlap.py \
  tests/engine/test_static_step.py tests/engine/test_batched_prefill.py tests/engine/test_host_to_device.py \
  tests/triton_kernels/test_fused_moe.py > "$out/gpu_tests.txt" 2>&1
tail -15 "$out/gpu_tests.txt"
timeout 60 python3 benchmarks/overlap_ab.py --model small --concurrency 64 --builder gpu --rounds 4 \
  --out "$out/overlap_ab_small_c64_gpu.json" 2>&1 | grep -E "^median|rror"
timeout 60 python3 benchmarks/overlap_ab.py $k2 --concurrency 32 --requests 32 --builder gpu --rounds 4 \
  --out "$out/overlap_ab_k2_c32_gpu.json" 2>&1 | grep -E "^median|rror"
timeout 60 python3 benchmarks/prefill_ab.py --model small --concurrency 64 --rounds 4 \
  --out "$out/prefill_ab_small_c64.json" 2>&1 | grep -E "^median|rror"
timeout 150 python3 benchmarks/fused_moe.py --tune --out "$out/fused_moe.json" > "$out/fused_moe_tune.log" 2>&1
tail -12 "$out/fused_moe_tune.log"
ls -la "$out"
