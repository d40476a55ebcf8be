#!/usr/bin/env bash
# Everything the README reports from the H200, in one GPU-machine call (its files land in OUT):
#   1. benchmarks/tree_build.py            -> OUT/tree_build.json
#   2. small model (trained pair), budget 16, concurrency 8/32/64, CPU heapq vs GPU builder
#                                           -> OUT/small-b16-c*-{cpu,gpu}.sqlite.gz
#   3. k2-layer (Kimi K2 per-layer shapes, random weights), concurrency 32, both builders
#                                           -> OUT/captures.tar (k2 exports + every run's JSON)
# Needs NSYS and LD_LIBRARY_PATH set for nsys 2025.3 (see the README's "GPU captures").
set -uo pipefail
out=${1:?OUT}
work=$(mktemp -d)
python3 benchmarks/tree_build.py --out "$out/tree_build.json"
bash benchmarks/gpu_captures.sh "$work/small" small 16 "8 32 64" 64 48
mv "$work"/small/runs/*.sqlite.gz "$out"/
tar -C "$work" -cf "$out/captures.tar" small/runs
timeout 300 bash benchmarks/gpu_captures.sh "$work/k2" k2-layer 16 "32" 32 32 || echo "k2-layer captures failed"
tar -C "$work" -cf "$out/captures.tar" small/runs k2
ls -la "$out"
