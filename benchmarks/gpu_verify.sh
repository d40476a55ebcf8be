#!/usr/bin/env bash
# The batch-invariant GEMM's GPU session, one device call per part (10 minutes each; every step
# has its own time limit, and a step that runs out leaves the others running). Results go under OUT,
# a file per run; join them back into benchmarks/results/. The device's copy of the tree held a git
# directory at the commit the session started from (2026-12-02): prefix the command with
# DDPROF_COMMIT=<what `git rev-parse HEAD; git diff --quiet HEAD || echo +changes` says here>
# (required) so that each result file's machine block names the code that ran. Every part needs the
# nvtx wheel carried (.whl1: the engine imports nvtx; ../shared/nsys/README.md), part 5 .devlibs too.
# Limits: 220-580 s per part, 2,440 s for parts 1-5, more than one session's 30 device-minutes:
# take part 1 and the parts whose code changed first. Parts 6, 7, 15 and 16 re-pick split counts:
# where a count changes, commit the file as a blocking tuning run and paste it
# (benchmarks/paste_blocking.py writes both its TUNED and its BLOCKING_BY_M lines); where every
# count stands, commit it as benchmarks/results/batch_invariant_matmul_split_tuning_<shapes>.json
# (a test holds TUNED to its counts) or, as parts 15 and 16 do, as a blocking tuning run too.
# Runs: 2026-12-02 at 69c7370, part 6 and part 7's shared gate/up (every count stood).
#
#   bash benchmarks/gpu_verify.sh OUT 1   # which blocking fields keep rows' bits (swapped, stream-K and split Gluon too)
#   bash benchmarks/gpu_verify.sh OUT 2   # --tune-blocking, the attention's unsplit shapes (with their table)
#   bash benchmarks/gpu_verify.sh OUT 3   # --tune-blocking, the MLP's unsplit shapes and lm_head
#   bash benchmarks/gpu_verify.sh OUT 4   # after pasting BLOCKING_BY_M: gpu tests again, the end-to-end A/B
#   bash benchmarks/gpu_verify.sh OUT 5   # both numerics served under nsys, as part 4's A/B serves them
#   bash benchmarks/gpu_verify.sh OUT 6   # --tune-split: o_proj and the dense gate/up (their M = 136 misses)
#   bash benchmarks/gpu_verify.sh OUT 7   # --tune-split: q_b_proj and the shared expert both ways
#   bash benchmarks/gpu_verify.sh OUT 8   # the Gluon GEMM alone: its gpu tests, then it against cuBLAS and the table
#   bash benchmarks/gpu_verify.sh OUT 9   # its gpu tests, then --tune-blocking: q_a, kv_a, the shared gate/up (split)
#   bash benchmarks/gpu_verify.sh OUT 10  # --tune-blocking, the dense down (split); then part 4's gpu tests
#   bash benchmarks/gpu_verify.sh OUT 11  # swapped dots' gpu tests, then --tune-blocking --passes swap,persistent: the attention's five
#   bash benchmarks/gpu_verify.sh OUT 12  # --tune-blocking --passes swap,persistent: the MLP's five and lm_head
#   bash benchmarks/gpu_verify.sh OUT 13  # the same on five shapes with misses at M = 544-1,088, pasted, then the gpu tests
#   bash benchmarks/gpu_verify.sh OUT 14  # --tune-blocking --passes stream_k: the four split shapes (Gluon's too); its gpu tests
#   bash benchmarks/gpu_verify.sh OUT 15  # --tune-split with more chunks, stream-K among the passes: q_a (2, 4, 8), kv_a (4, 8, 16)
#   bash benchmarks/gpu_verify.sh OUT 16  # --tune-split 1, 2, 4 with stream-K (tails too): the dense gate/up (its M = 136 waves; o_proj's half ran as _36)
#   bash benchmarks/gpu_verify.sh OUT 17  # --passes gluon: kv_b, lm_head, q_b; then the Gluon kernel's gpu tests
#   bash benchmarks/gpu_verify.sh OUT 18  # --passes gluon: the other four shapes with M = 544-1,088 misses
#   bash benchmarks/gpu_verify.sh OUT 19  # the Gluon kernel's programs over several tiles (gluon_multi_tile.py), then its gpu tests
#   bash benchmarks/gpu_verify.sh OUT 20  # part 19 (ping-pong among its cases), then --passes gluon on the six shapes with M = 544-1,088 misses: first
#
# Part 5 runs nsys itself, with the trace flags `ddprof capture` uses on a GPU (not its private
# session and TMPDIR), because ddprof's polars wheels do not fit beside the tree in one call's
# carry; it fails where nsys wrote no report or no export. `ddprof compare vendor invariant` here
# reads the two exports (per-stage GPU time per step).
#
# Parts 2 and 3 print the BLOCKING_BY_M lines to paste into triton_kernels/batch_invariant_matmul.py
# for the six unsplit shapes, the ones the tuner's Gluon pass (its last) can change: the four split
# ones (q_a, kv_a, the dense down, the shared gate/up) were last tuned in the fifth run, and
# `--shapes` with theirs re-tunes them (first five and other five until 2026-12-03); commit their files under
# the next free numbers, benchmarks/results/batch_invariant_matmul_blocking_tuning_N.json (a test
# requires BLOCKING_BY_M to equal the picks of those files, later over earlier). Runs: 2026-12-01
# (BLOCK_M, warps, stages: the unnumbered file), 2026-12-02 (and BLOCK_N, TMA: _2 and _3; then
# M = 4,096 and split_in_program: _4 and _5; then tail_m: part 3 as _6, part 2 as _7; then
# DEEP_STAGES, for q_a_proj, o_proj and the shared expert's down only: _8; then all ten shapes with
# split products summed in one launch: part 2 as _9, part 3 as _10), 2026-12-03 (warp-specialized
# loops and persistent grids: q_b_proj, o_proj and the dense gate/up only, --shapes in one call
# after part 2's first try ran out of time, as _11; then the Gluon kernel's tiles on the six unsplit shapes,
# part 2 as _12, part 3 as _13; then the Gluon kernel's split tiles on the four split shapes, parts 9
# and 10), 2026-12-04 (swapped dots, parts 11-13: _16 to _20; then stream-K, part 14: _21; q_a's and
# kv_a's split counts, part 15: _22, _23; a full run on q_a, kv_b and the shared down: _24; then,
# at 219e7a9, part 17: its one process ran out of time at q_b's M = 544 and its tests at their
# 37th, and probes found every Gluon program holding two tiles or units hung (persistent and
# stream-K, swapped or not), one-tile ones bit-identical: fixed at 82a9b87 (the K loops' start
# was not carried); at 8d50c20 part 19 (every multi-tile program finished, bit-identical), part
# 17: _25-_27, part 14: _28-_31, part 18: _32-_35; at a581c67 part 4 (its tests' 300 s, now 400,
# ran out on cold compiles; they passed when run again) and part 16's o_proj alone: _36; the
# dense gate/up's half of part 16 not yet run).
set -uo pipefail
out=${1:?OUT} part=${2:?PART (1-20)}
if [ -z "${DDPROF_COMMIT:-}" ]; then
  echo "benchmarks/gpu_verify.sh: set DDPROF_COMMIT (the commit this tree is, +changes if edited): the device's git directory may be an older commit's, so results would name the wrong one" >&2
  exit 2
fi
tests="tests/triton_kernels/test_fused_moe.py tests/triton_kernels/test_batch_invariant_matmul.py tests/triton_kernels/test_batch_invariant_matmul_hopper.py tests/engine/test_lossless_k2_bf16.py"
first="q_b_proj,kv_b_proj,o_proj"
second="dense gate/up,shared expert down,lm_head"
# The GEMM's gpu tests that -k selects (in TEST_FILE, the Triton kernel's unless named), into
# $out/FILE; the part stops here unless they all passed (a new blocking whose bits differ is no
# blocking the tuning after them may pick).
gate_on_gpu_tests() {  # LIMIT_S KEYWORDS FILE [TEST_FILE]
  timeout "$1" python3 -m pytest -q -x -p no:cacheprovider -m gpu -rfE \
    "${4:-tests/triton_kernels/test_batch_invariant_matmul.py}" -k "$2" > "$out/$3" 2>&1
  tail -3 "$out/$3"
  grep -q " passed" "$out/$3" && ! grep -q "failed\|error" "$out/$3" || exit 1
}
# A --tune-blocking run of PASSES per shape, a process and a file each (as parts 14, 17, 18 and 20
# run them): a kernel that hangs (as the Gluon kernel's persistent and stream-K programs over two
# tiles did on 2026-12-04) costs that shape's limit, not the others' results. The tuner checks every
# blocking's rows against the base tiling's in the full batch (one that differs is "not_invariant",
# never picked).
tune_each_shape() {  # PASSES LIMIT_S PART SHAPE...
  local passes=$1 limit=$2 part=$3 shape name
  shift 3
  for shape in "$@"; do
    name=${shape//[ \/]/_}
    timeout "$limit" python3 benchmarks/batch_invariant_matmul.py --tune-blocking --passes "$passes" --shapes "$shape" \
      --out "$out/batch_invariant_matmul_blocking_tuning_part${part}_$name.json" > "$out/blocking_${part}_$name.log" 2>&1
    echo "$shape: rc=$?"
    grep "^  M=" "$out/blocking_${part}_$name.log" | sed 's/Blocking(//; s/, warp_specialize=False//; s/, ping_pong=False//'
  done
}
case $part in
  1) timeout 560 python3 benchmarks/tile_invariance.py --out "$out/tile_invariance.json" > "$out/tile_invariance.log" 2>&1
     tail -1 "$out/tile_invariance.log" ;;
  2|3) shapes=$([ "$part" = 2 ] && echo "$first" || echo "$second")
     timeout 580 python3 benchmarks/batch_invariant_matmul.py --tune-blocking --shapes "$shapes" \
       --out "$out/batch_invariant_matmul_blocking_tuning_part$part.json" > "$out/blocking_$part.log" 2>&1
     tail -20 "$out/blocking_$part.log" ;;
  4) timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $tests > "$out/gpu_tests.txt" 2>&1
     tail -3 "$out/gpu_tests.txt"
     timeout 150 python3 benchmarks/batch_invariant_ab.py --model k2-layer --concurrency 32 --rounds 7 \
       --out "$out/batch_invariant_ab_k2_c32_graphs.json" > "$out/batch_invariant_ab.log" 2>&1
     tail -2 "$out/batch_invariant_ab.log" ;;
  5) nsys_host=/opt/nvidia/nsight-compute/2025.3.1/host
     export LD_LIBRARY_PATH=$PWD/.devlibs:$nsys_host/linux-desktop-glibc_2_11_3-x64:${LD_LIBRARY_PATH:-}
     for numerics in invariant vendor; do
       flag=$([ "$numerics" = invariant ] && echo --batch-invariant || echo --no-batch-invariant)
       report=/tmp/k2-layer-b16-c32-gpu-$numerics
       timeout 120 $nsys_host/target-linux-x64/nsys profile --trace=cuda,nvtx --cuda-graph-trace=node --sample=none \
         --cpuctxsw=none --wait=primary -f true -o "$report" python3 -m engine serve --workload chat \
         --concurrency 32 --model k2-layer --builder gpu --budget 16 --device cuda --requests 64 --max-new-tokens 48 \
         "$flag" --summary "$out/$numerics.json" > "$out/$numerics.log" 2>&1
       timeout 60 $nsys_host/target-linux-x64/nsys export --type sqlite -q true -f true -o "$report.sqlite" \
         "$report.nsys-rep" > /dev/null 2>&1
       if [ ! -s "$report.sqlite" ]; then
         echo "benchmarks/gpu_verify.sh: nsys wrote no export for $numerics ($out/$numerics.log)" >&2; exit 1
       fi
       gzip -c "$report.sqlite" > "$out/${report#/tmp/}.sqlite.gz"
     done ;;
  6|7) shapes=$([ "$part" = 6 ] && echo "o_proj,dense gate/up" || echo "q_b_proj,shared expert gate/up,shared expert down")
     timeout 580 python3 benchmarks/batch_invariant_matmul.py --tune-split --shapes "$shapes" \
       --out "$out/batch_invariant_matmul_blocking_tuning_split$part.json" > "$out/split_$part.log" 2>&1
     tail -30 "$out/split_$part.log" ;;
  8) timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_batch_invariant_matmul_hopper.py \
       > "$out/gpu_tests_hopper.txt" 2>&1
     tail -3 "$out/gpu_tests_hopper.txt"
     timeout 240 python3 benchmarks/batch_invariant_matmul_hopper.py --rows 17,64,136,544,1088,4096 \
       --out "$out/batch_invariant_matmul_hopper.json" > "$out/hopper.log" 2>&1
     tail -40 "$out/hopper.log" ;;
  9) timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_batch_invariant_matmul_hopper.py \
       > "$out/gpu_tests_hopper.txt" 2>&1
     tail -3 "$out/gpu_tests_hopper.txt"
     timeout 420 python3 benchmarks/batch_invariant_matmul.py --tune-blocking --shapes "q_a_proj,kv_a_proj,shared expert gate/up" \
       --out "$out/batch_invariant_matmul_blocking_tuning_part9.json" > "$out/blocking_9.log" 2>&1
     tail -24 "$out/blocking_9.log" ;;
  10) timeout 240 python3 benchmarks/batch_invariant_matmul.py --tune-blocking --shapes "dense down" \
       --out "$out/batch_invariant_matmul_blocking_tuning_part10.json" > "$out/blocking_10.log" 2>&1
     tail -12 "$out/blocking_10.log"
     timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $tests > "$out/gpu_tests.txt" 2>&1
     tail -3 "$out/gpu_tests.txt" ;;
  11|12) shapes=$([ "$part" = 11 ] && echo "q_a_proj,q_b_proj,kv_a_proj,kv_b_proj,o_proj" \
       || echo "dense gate/up,dense down,shared expert gate/up,shared expert down,lm_head")
     if [ "$part" = 11 ]; then  # the swapped dots' bits first: where they differ, no pass can pick one
       gate_on_gpu_tests 150 swapped gpu_tests_swapped.txt
     fi
     timeout 480 python3 benchmarks/batch_invariant_matmul.py --tune-blocking --passes swap,persistent --shapes "$shapes" \
       --out "$out/batch_invariant_matmul_blocking_tuning_part$part.json" > "$out/blocking_$part.log" 2>&1
     tail -40 "$out/blocking_$part.log" ;;
  13) timeout 280 python3 benchmarks/batch_invariant_matmul.py --tune-blocking --passes swap,persistent \
       --shapes "shared expert gate/up,kv_b_proj,dense down,q_b_proj,shared expert down" \
       --out "$out/batch_invariant_matmul_blocking_tuning_part13.json" > "$out/blocking_13.log" 2>&1
     tail -12 "$out/blocking_13.log"
     # Its picks written into this tree's BLOCKING_BY_M (what pasting them here will commit), then
     # the GPU tests on them: the result names DDPROF_COMMIT plus these picks.
     python3 benchmarks/paste_blocking.py "$out/batch_invariant_matmul_blocking_tuning_part13.json" || exit 1
     timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE $tests > "$out/gpu_tests.txt" 2>&1
     tail -3 "$out/gpu_tests.txt" ;;
  14) tune_each_shape stream_k 110 14 "q_a_proj" "kv_a_proj" "dense down" "shared expert gate/up"
     timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_batch_invariant_matmul.py \
       -k "stream_k or cuda_graph" > "$out/gpu_tests_stream_k.txt" 2>&1
     tail -3 "$out/gpu_tests_stream_k.txt" ;;
  15|16) if [ "$part" = 15 ]; then picks=("q_a_proj|2,4,8" "kv_a_proj|4,8,16") passes=tma,split,swap,stream_k,gluon
     else picks=("dense gate/up|1,2,4") passes=split,swap,stream_k,gluon; fi
     for pick in "${picks[@]}"; do  # M = 136 units: q_a 24 x 2, kv_a 9 x 4; o_proj 112, the dense gate/up 288 tiles
       shape=${pick%|*} counts=${pick#*|}
       name=${shape//[ \/]/_}
       timeout 285 python3 benchmarks/batch_invariant_matmul.py --tune-split --split-counts "$counts" \
         --passes "$passes" --shapes "$shape" \
         --out "$out/batch_invariant_matmul_blocking_tuning_part${part}_$name.json" > "$out/split_${part}_$name.log" 2>&1
       grep "points ->\|^ *$shape " "$out/split_${part}_$name.log"
     done ;;
  17|18) # The pass first (the tuner checks the bits), the Gluon kernel's gpu tests (which outgrew a
     # 250 s gate) in the time left.
     if [ "$part" = 17 ]; then tune_each_shape gluon 150 17 "kv_b_proj" "lm_head" "q_b_proj"
     else tune_each_shape gluon 140 18 "dense down" "shared expert gate/up" "q_a_proj" "kv_a_proj"; fi
     if [ "$part" = 17 ]; then
       timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_batch_invariant_matmul_hopper.py \
         > "$out/gpu_tests_hopper.txt" 2>&1
       tail -3 "$out/gpu_tests_hopper.txt"
     fi ;;
  19|20) timeout 300 python3 benchmarks/gluon_multi_tile.py --out "$out/gluon_multi_tile.json" > "$out/gluon_multi_tile.log" 2>&1
     probe=$?
     cat "$out/gluon_multi_tile.log"
     [ "$probe" = 0 ] || exit 1  # no table (a hang is a row of it, not a failure of the script)
     grep -qE " (hung|NO|error)( |$)" "$out/gluon_multi_tile.log" && exit 1  # the tests would hang on the same programs
     timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu -rfE tests/triton_kernels/test_batch_invariant_matmul_hopper.py \
       > "$out/gpu_tests_hopper.txt" 2>&1
     tail -3 "$out/gpu_tests_hopper.txt"
     grep -q " passed" "$out/gpu_tests_hopper.txt" && ! grep -q "failed\|error" "$out/gpu_tests_hopper.txt" || exit 1
     if [ "$part" = 20 ]; then  # ping-pong finished and kept the bits: the Gluon pass tries it where it fits
       tune_each_shape gluon 70 20 "kv_b_proj" "q_b_proj" "q_a_proj" "kv_a_proj" "dense down" "shared expert gate/up"
     fi ;;
  *) echo "benchmarks/gpu_verify.sh: PART must be 1 to 20, not $part" >&2; exit 2 ;;
esac
ls -la "$out"
