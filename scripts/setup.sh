#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian bookworm machine (root, Python 3.11): .venv with the project,
# and what is missing of a C compiler, Nsight Systems and headless Chromium. Fast when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# Reinstall only when pyproject.toml changed since the last successful install.
stamp=.venv/.ddprof-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e . 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
  .venv/bin/python -c "import ddprof, engine, triton_kernels, torch, triton, nvtx, polars, plotly"
  touch "$stamp"
fi

# A C compiler: ddprof builds its SQLite page reader (ddprof/btree_scan.c) on first use.
if ! command -v cc >/dev/null 2>&1 && [ -z "${CC:-}" ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev
fi

if ! command -v nsys >/dev/null 2>&1 && [ -z "${NSYS:-}" ]; then
  bash scripts/install-nsys.sh
fi

# Headless Chromium: the dashboard tests open the generated HTML in a real browser.
if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
