"""Where a serve's prefill time goes, per numerics (vendor: cuBLAS; invariant: the batch-invariant
GEMMs and norms): batch_invariant_ab.py found the invariant engine's serving tok/s behind the
vendor's by its prefills' host seconds alone, with no cudaMalloc and no synchronizing call in them.

For each numerics one engine (graphed and overlapped as batch_invariant_ab.py runs it) serves the
workload once untimed, then three times:
- plain: each admit_many's wall time, as ServeResult.prefill_s counts it (the host's own work);
- synced: the GPU drained before each admit_many and again after it, so each prefill's time holds
  its own GPU work and nothing queued before it (the overlap is lost: this serve's tok/s is not one
  to compare);
- profiled: cProfile on inside each admit_many only, its functions ranked by own time and by
  cumulative time (cProfile's overhead inflates Python-heavy calls: read it for where, not how much).

    python benchmarks/prefill_host.py [--model k2-layer] [--concurrency 32] [--top 25]

Prints the three prefill totals per numerics and each profile's top functions; writes JSON (default
benchmarks/results/prefill_host.json).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.batch_invariant_ab import INVARIANT, VENDOR, numerics  # noqa: E402
from benchmarks.serving_ab import Workload, checked_arguments, run_ab, workload_arguments, write_result  # noqa: E402


@contextmanager
def wrapped_admissions(engine, around: Callable[[Callable[[], None]], None]):
    """Inside the block engine.admit_many runs as around(the call)."""
    admit = engine.admit_many
    engine.admit_many = lambda admissions: around(lambda: admit(admissions))
    try:
        yield
    finally:
        del engine.admit_many  # back to the class's method


def synced_prefill_s(workload: Workload, engine, variant: str) -> float:
    """One serve's prefill seconds, each prefill timed from a drained GPU to its own work's end."""
    total = 0.0

    def drain():
        if workload.device == "cuda":
            torch.cuda.synchronize()

    def synced(call):
        nonlocal total
        drain()
        start = time.perf_counter()
        call()
        drain()
        total += time.perf_counter() - start

    with wrapped_admissions(engine, synced):
        workload.serve(engine, variant)
    return total


def profile_rows(profile: cProfile.Profile, key: str, top: int) -> list[dict]:
    """The profile's `top` functions by `key` ("tottime": own time; "cumtime": with callees)."""
    stats = pstats.Stats(profile).stats
    rows = [{"function": f"{Path(file).name}:{line}({name})" if line else name, "calls": calls,
             "own_s": own, "cumulative_s": cumulative}
            for (file, line, name), (_, calls, own, cumulative, _) in stats.items()]
    return sorted(rows, key=lambda row: row["own_s" if key == "tottime" else "cumulative_s"], reverse=True)[:top]


def profiled(workload: Workload, engine, variant: str, top: int) -> dict:
    profile = cProfile.Profile()

    def on(call):
        profile.enable()
        try:
            call()
        finally:
            profile.disable()

    with wrapped_admissions(engine, on):
        row = workload.serve(engine, variant)
    return {"profiled_prefill_s": row["prefill_s"], "by_own_time": profile_rows(profile, "tottime", top),
            "by_cumulative_time": profile_rows(profile, "cumtime", top)}


def main() -> None:
    parser = workload_arguments(__doc__.splitlines()[0], "prefill_host.json", overlap=True)
    parser.add_argument("--top", type=int, default=25, help="functions kept per profile ranking (default 25)")
    parser.set_defaults(model="k2-layer", concurrency=32, rounds=1)
    args = checked_arguments(parser)
    workload = Workload(args)
    rows = []
    for variant in (VENDOR, INVARIANT):
        with numerics(variant):
            engine = workload.engine(args.builder, cuda_graphs=args.cuda_graphs, overlap=args.overlap)
            workload.serve(engine, variant)  # untimed: compiles every prefill shape
            plain = workload.serve(engine, variant)
            row = {"numerics": variant, "prefills": plain["prefills"],
                   "prefill_token_budget": plain["prefill_token_budget"], "prefill_s": plain["prefill_s"],
                   "synced_prefill_s": synced_prefill_s(workload, engine, variant),
                   **profiled(workload, engine, variant, args.top)}
        rows.append(row)
        print(f"{variant}: {row['prefills']} prefills, host {row['prefill_s']:.3f} s, with their GPU work "
              f"{row['synced_prefill_s']:.3f} s, profiled {row['profiled_prefill_s']:.3f} s")
        for ranking in ("by_own_time", "by_cumulative_time"):
            print(f"  {ranking.replace('_', ' ')}:  {'calls':>7} {'own s':>7} {'cum s':>7}")
            for entry in row[ranking]:
                print(f"    {entry['function'][:70]:70} {entry['calls']:7} {entry['own_s']:7.3f} {entry['cumulative_s']:7.3f}")
    write_result("prefill_host", workload, rows, {})


if __name__ == "__main__":
    run_ab("prefill_host", main)
