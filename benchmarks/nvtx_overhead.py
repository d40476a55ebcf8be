"""What the engine's NVTX instrumentation costs: decode steps with NVTX on vs off.

Each DDTree step emits 7 ranges (step + 6 stages) and 1 mark. Two settings, each in a fresh
process: plain (no profiler attached: the nvtx calls find no tool and return) and under
`nsys profile --trace=nvtx` (every call is recorded). In each: the per-call cost of a push/pop pair
and of a mark (tight loop), and the median CPU time of a DDTree decode step with NVTX on and off
(alternate steps of the same engine, several fresh engines, one torch thread), for a few presets
and batch sizes. Step-level differences of a few microseconds sit inside the step-to-step noise;
the per-call numbers say what the instrumentation itself costs. Run from the repo root:
    .venv/bin/python benchmarks/nvtx_overhead.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402

POINTS = (("tiny", 1), ("tiny", 16), ("small", 1), ("small", 16))
BUDGET = 8
STEPS = 12
REPEATS = 5
CALLS = 20000


def per_call_ns() -> dict:
    import nvtx

    from engine.stages import DOMAIN

    start = time.perf_counter_ns()
    for _ in range(CALLS):
        nvtx.push_range("bench", domain=DOMAIN)
        nvtx.pop_range(domain=DOMAIN)
    pair = (time.perf_counter_ns() - start) / CALLS
    start = time.perf_counter_ns()
    for i in range(CALLS):
        nvtx.mark("bench", payload=i, domain=DOMAIN)
    return {"push_pop_ns": pair, "mark_ns": (time.perf_counter_ns() - start) / CALLS}


def step_cpu_ms(models, batch: int) -> tuple[list[float], list[float]]:
    """CPU time of 2 * STEPS decode steps of a fresh engine, NVTX switched on and off on alternate
    steps (paired, so the growing prefix affects both alike). Process CPU time, not wall time:
    the instrumentation is CPU work, and other processes on a shared machine do not inflate it."""
    from engine.engine import Engine

    target, drafter = models
    engine = Engine(target, drafter, budget=BUDGET, n_slots=batch, max_len=400, nvtx=True)
    for i in range(batch):
        engine.admit(i, [256] + [65 + (i * 7 + j) % 26 for j in range(20 + 3 * i)], 2 * STEPS * (drafter.config.depth + 1))
    on, off = [], []
    for k in range(2 * STEPS):
        engine.nvtx.enabled = k % 2 == 0
        start = time.process_time()
        engine.step()
        (on if engine.nvtx.enabled else off).append((time.process_time() - start) * 1e3)
    return on, off


def measure(points) -> dict:
    """One setting's numbers (run inside the measured process)."""
    import torch

    from engine.config import preset
    from engine.drafter import build_drafter
    from engine.model import build_target

    torch.set_num_threads(1)  # one thread: CPU time is then the step's own critical path
    rows = []
    for name, batch in points:
        chosen = preset(name)
        models = build_target(chosen.model, seed=0), build_drafter(chosen.drafter, chosen.model, seed=1)
        step_cpu_ms(models, batch)  # warm-up
        on, off = [], []
        for _ in range(REPEATS):
            a, b = step_cpu_ms(models, batch)
            on += a
            off += b
        rows.append({"preset": name, "batch": batch, "budget": BUDGET, "steps_each": len(on),
                     "step_cpu_ms_nvtx_on": statistics.median(on), "step_cpu_ms_nvtx_off": statistics.median(off)})
    return {"calls": per_call_ns(), "steps": rows}


def run_setting(under_nsys: bool, quick: bool) -> dict:
    from ddprof.nsys import profile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        command = [sys.executable, __file__, "--child", str(out)] + (["--quick"] if quick else [])
        if under_nsys:
            profile(command, Path(tmp) / "capture")
        else:
            import subprocess

            subprocess.run(command, check=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "nvtx_overhead.json")
    parser.add_argument("--quick", action="store_true", help="tiny preset only")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    points = POINTS[:2] if args.quick else POINTS
    if args.child:
        args.child.write_text(json.dumps(measure(points)))
        return
    result = {"benchmark": "nvtx_overhead", "machine": describe(), "steps_timed": STEPS, "repeats": REPEATS,
              "settings": {}}
    print(f"{'setting':<8} {'preset':<6} {'bs':>3} {'CPU ms/step NVTX on':>20} {'off':>8} {'overhead':>9} {'us/step':>8}")
    for setting, under_nsys in (("plain", False), ("nsys", True)):
        measured = run_setting(under_nsys, args.quick)
        result["settings"][setting] = measured
        calls = measured["calls"]
        for row in measured["steps"]:
            on, off = row["step_cpu_ms_nvtx_on"], row["step_cpu_ms_nvtx_off"]
            row["overhead_fraction"] = (on - off) / off
            print(f"{setting:<8} {row['preset']:<6} {row['batch']:>3} {on:>20.3f} {off:>8.3f} "
                  f"{row['overhead_fraction']:>+9.1%} {(on - off) * 1e3:>8.1f}")
        print(f"{setting:<8} per call: push+pop {calls['push_pop_ns']:.0f} ns, mark {calls['mark_ns']:.0f} ns "
              f"-> 7 ranges + 1 mark = {(7 * calls['push_pop_ns'] + calls['mark_ns']) / 1e3:.1f} us per step")
    write_result(args.out, result)


if __name__ == "__main__":
    main()
