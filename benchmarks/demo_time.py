"""How long `make demo`'s capture takes once set up, by phase: start-up (the engine checking its
arguments, nsys starting, Python importing torch, the engine loading and warming up its model)
apart from the serving loop, and nsys writing and exporting the report after it. Runs the
capture `scripts/demo.sh` runs (chat, concurrency 32, the engine's defaults), in process, timing the phases ddprof.capture reports; the machine's load average is
recorded too (the 2-core CPU machines are shared, and the serving loop's time moves with load).

    python benchmarks/demo_time.py [--out benchmarks/results/demo_time.json] [--trace traces/demo-time/run]

Prints the phases and the breakdown's headline numbers, and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from ddprof.capture import PHASES, SERVING, WRITING, CaptureRequest, capture  # noqa: E402
from ddprof.pipeline import analyse  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "demo_time.json")
    parser.add_argument("--trace", type=Path, default=Path("traces/demo-time/run"))
    args = parser.parse_args()
    started: dict[str, float] = {}
    load_before = os.getloadavg()
    begin = time.perf_counter()

    def on_progress(phase: str, done: int | None, total: int | None) -> None:
        started.setdefault(phase, time.perf_counter() - begin)

    result = capture(CaptureRequest(workload="chat", concurrency=32, out=args.trace), on_progress=on_progress)
    total_s = time.perf_counter() - begin
    ends = [started.get(phase) for phase in PHASES[1:]] + [total_s]
    phases = {phase: end - started[phase] for phase, end in zip(PHASES, ends) if phase in started}
    _, _, summary = analyse(result.sqlite)
    row = {
        "total_s": total_s, "startup_s": started[SERVING], "serving_s": started[WRITING] - started[SERVING],
        "report_and_export_s": total_s - started[WRITING], "phases_s": phases,
        "engine_serving_loop_s": result.meta["wall_s"], "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()), "capture": {k: result.meta.get(k) for k in (
            "model", "workload", "concurrency", "builder", "budget", "requests", "generated_tokens", "steps",
            "tok_per_s", "device")},
        "breakdown": {k: summary[k] for k in ("steps", "tokens", "wall_s", "tok_per_s", "bound_by", "wall")}
                     | {"stages": [{k: s[k] for k in ("stage", "count", "cpu_ms", "cpu_share", "crit_ms", "crit_share")}
                                   for s in summary["stages"]]},
    }
    print(f"{'phase':<22} {'s':>8}")
    for phase, seconds in phases.items():
        print(f"{phase:<22} {seconds:8.1f}")
    print(f"{'total':<22} {total_s:8.1f}   (load average before/after: {load_before[0]:.2f} / {os.getloadavg()[0]:.2f})")
    print(f"breakdown: {summary['steps']} steps, {summary['tokens']} tokens, {summary['wall_s']:.3f} s wall, "
          f"{summary['tok_per_s']:.1f} tok/s, bound by {summary['bound_by']}")
    write_result(args.out, {"benchmark": "demo_time", "machine": describe() | {"cpus": os.cpu_count()},
                            "command": "ddprof capture --workload chat --concurrency 32 (scripts/demo.sh)", **row})


if __name__ == "__main__":
    main()
