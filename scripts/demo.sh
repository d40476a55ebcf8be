#!/usr/bin/env bash
# The README's main job. The capture command (issue 3) is not built yet, so this only shows the
# toolchain ddprof found; it does not pretend to capture anything.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ddprof doctor
echo "ddprof capture is not implemented yet: the main job (a captured chat run) arrives with the capture issue."
