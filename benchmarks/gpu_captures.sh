#!/usr/bin/env bash
# Capture the serving loop on a CUDA machine over a grid of builders x concurrency, with nsys
# tracing CUDA + NVTX; export each report to SQLite there (a newer nsys writes reports an older one
# cannot read) and gzip each export (one file per run comes back from the GPU machine).
#
#   benchmarks/gpu_captures.sh OUT_DIR MODEL BUDGET "CONCURRENCIES" [REQUESTS] [MAX_NEW_TOKENS] ["EXECUTIONS"] [PREFILL_TOKENS]
#
# EXECUTIONS, any of: "graphs" (the engine's default: CUDA graphs, steps overlapped), "in-order"
# (CUDA graphs, --no-overlap), "eager" (--no-cuda-graphs); a run's name ends in -in-order or -eager.
# PREFILL_TOKENS: --prefill-tokens (default: the engine's batches; 0, one request per prefill, as
# the captures made before batched prefill was the default).
#
# On the lent H200: NSYS=<nsys 2025.3 path>, LD_LIBRARY_PATH including the libdw/libelf it needs
# (see the README's "GPU captures" section for the exact command).
set -euo pipefail
out=${1:?OUT_DIR}; model=${2:?MODEL}; budget=${3:?BUDGET}; concurrencies=${4:?CONCURRENCIES}
requests=${5:-128}; max_new=${6:-64}; executions=${7:-graphs}
prefill=${8:+--prefill-tokens $8}
mkdir -p "$out/runs"
python3 -c 'import torch; print(torch.cuda.get_device_name(), torch.__version__)'
for execution in $executions; do
  case "$execution" in
    graphs) flag="--cuda-graphs --overlap"; suffix= ;;
    in-order) flag="--cuda-graphs --no-overlap"; suffix=-in-order ;;
    eager) flag=--no-cuda-graphs; suffix=-eager ;;
    *) echo "an execution is graphs, in-order or eager, not $execution" >&2; exit 2 ;;
  esac
  for c in $concurrencies; do
    for builder in cpu gpu; do
      name="$model-b$budget-c$c-$builder$suffix"
      python3 -m ddprof capture --workload chat --concurrency "$c" --model "$model" --builder "$builder" \
        --budget "$budget" --requests "$requests" --max-new-tokens "$max_new" $flag $prefill --out "$out/runs/$name"
      rm -f "$out/runs/$name.nsys-rep"  # the SQLite export is what travels; the report is large
      gzip -f "$out/runs/$name.sqlite"
    done
  done
done
ls -la "$out/runs"
