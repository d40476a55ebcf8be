"""Two hand-built runs with known breakdowns, for the dashboard tests.

Both runs: two back-to-back steps of 10 ms, 3 tokens each, the six stages in order. Times in
units of U = 10 us. Per step:

    CPU heapq:   draft 0-100, tree_build 100-600, verify 600-900, accept 900-950,
                 kv_compact 950-970, sampling 970-990, other 10
    GPU builder: as above, but tree_build 100-200 launches (at 110) a kernel running 150-400, and
                 verify is 200-900: the kernel owns 150-400, so tree_build's critical path is
                 100-400 (30%) and verify's 400-900 (50%)

So the CPU heapq run is bound by tree_build (50% of step time), the GPU builder run by verify (50%).
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.stages import TOKENS_MARK
from tests.ddprof.exports import Export

U = 10_000  # ns
STEP = 1000 * U
TOKENS_PER_STEP = 3
STEPS = 2

SHARES = {
    "cpu": {"draft": 0.1, "tree_build": 0.5, "verify": 0.3, "accept": 0.05, "kv_compact": 0.02, "sampling": 0.02,
            "other": 0.01},
    "gpu": {"draft": 0.1, "tree_build": 0.3, "verify": 0.5, "accept": 0.05, "kv_compact": 0.02, "sampling": 0.02,
            "other": 0.01},
}
KERNEL = (150 * U, 400 * U)  # within each step
KERNEL_NAME = "build_tree_kernel"


def export(builder: str) -> Export:
    trace = Export()
    for step in range(STEPS):
        t = step * STEP
        trace.range("step", t, t + STEP)
        tree_end, verify_start = (600, 600) if builder == "cpu" else (200, 200)
        stages = (("draft", 0, 100), ("tree_build", 100, tree_end), ("verify", verify_start, 900),
                  ("accept", 900, 950), ("kv_compact", 950, 970), ("sampling", 970, 990))
        for name, start, end in stages:
            trace.range(name, t + start * U, t + end * U)
        if builder == "gpu":
            trace.kernel(t + KERNEL[0], t + KERNEL[1], launch=(t + 110 * U, t + 120 * U), name=KERNEL_NAME)
        trace.mark(TOKENS_MARK, t + 995 * U, TOKENS_PER_STEP)
    return trace


def write(folder: Path, builder: str, *, name: str | None = None, meta: dict | None = None,
          with_meta: bool = True) -> Path:
    """NAME.sqlite (and NAME.json, capture-style metadata) of the known run for `builder`."""
    name = name or f"known-{builder}"
    path = export(builder).write(Path(folder) / f"{name}.sqlite")
    if with_meta:
        meta = {"model": "tiny", "workload": "chat", "concurrency": 2, "builder": builder, "budget": 8,
                "requests": 2, "max_new_tokens": 6, "seed": 0, "device": "cuda: hand-built", "trace_steps": STEPS,
                "tok_per_s": 1.0, **(meta or {})}
        path.with_suffix(".json").write_text(json.dumps(meta))
    return path
