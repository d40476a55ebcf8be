#!/usr/bin/env bash
# The README's main job: serve the chat workload, 32 requests at a time, on the default model under
# Nsight Systems, then say where the trace is. Writes traces/run.{nsys-rep,sqlite,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ddprof capture --workload chat --concurrency 32 --out traces/run
echo
echo "Trace: $PWD/traces/run.nsys-rep (open it in the Nsight Systems GUI)"
echo "SQLite export: $PWD/traces/run.sqlite; run summary: $PWD/traces/run.json"
echo "Next: .venv/bin/ddprof breakdown traces/run.sqlite"
