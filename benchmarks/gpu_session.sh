#!/usr/bin/env bash
# What the README reports from the H200, in two GPU-machine calls (a call returns at most 8 files of
# at most 16 MiB each, so each phase lays OUT out to fit):
#   gpu_session.sh OUT small  -> OUT/tree_build.json (benchmarks/tree_build.py),
#                                OUT/small-b16-c{8,32,64}-{cpu,gpu}.sqlite.gz, OUT/small-runs.json.tar
#   gpu_session.sh OUT k2     -> OUT/k2-layer-b16-c32-{cpu,gpu}.sqlite.gz.partNN (join with cat),
#                                OUT/k2-runs.json.tar
# Back here: untar the JSONs beside the exports (joined), then benchmarks/summarize_captures.py DIR.
# Needs NSYS and LD_LIBRARY_PATH set for nsys 2025.3 (see the README's "GPU captures").
set -euo pipefail
out=${1:?OUT}; phase=${2:?small or k2}
work=$(mktemp -d)
case "$phase" in
  small)
    python3 benchmarks/tree_build.py --out "$out/tree_build.json"
    bash benchmarks/gpu_captures.sh "$work" small 16 "8 32 64" 64 48
    mv "$work"/runs/*.sqlite.gz "$out"/ ;;
  k2)
    bash benchmarks/gpu_captures.sh "$work" k2-layer 16 "32" 32 32
    for f in "$work"/runs/*.sqlite.gz; do split -b 15M -d "$f" "$out/$(basename "$f").part"; done ;;
  *) echo "phase must be small or k2" >&2; exit 2 ;;
esac
tar -C "$work/runs" -cf "$out/$phase-runs.json.tar" $(cd "$work/runs" && ls *.json)
ls -la "$out"
