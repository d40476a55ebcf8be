"""What a second (and a fourth) expert-parallel rank costs, and where: captures at 1, 2 and 4 ranks
(gloo on the CPU, NCCL with one GPU per rank on CUDA), each broken down by ddprof (per rank, the
critical path over the ranks, stragglers, the all-reduce's host time per stage), for each
concurrency and builder asked.

    python benchmarks/expert_parallel_captures.py [--ranks 1,2,4] [--requests 32] [--model small]
        [--concurrency 8] [--builders cpu] [--budget B] [--max-new-tokens M]
        [--out benchmarks/results/expert_parallel_cpu.json]

On a machine of several H200s (issue 28): `--model k2-layer --concurrency 32,64 --builders cpu,gpu
--budget 16 --max-new-tokens 32 --requests 64 --ranks 1,2` (or 1,2,4,8) with `--moe-layers` as many
as one rank's memory holds at the fewest ranks (a k2-layer MoE layer's 384 experts are 33.8 GB of
bf16, split over the ranks), the traces under --trace-dir exported there.

On the 2-core CPU machines the ranks share the cores (4 ranks: two processes per core), so a
rank's all-reduce waits for the other ranks' compute as well as moving the bytes: read the
communication column as "waiting in the collective", not as wire time. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from ddprof.capture import CaptureRequest, capture  # noqa: E402
from ddprof.errors import DdprofError  # noqa: E402
from ddprof.ranks import analyse_ranks, processes  # noqa: E402

WORKLOAD = "chat"
BUILDERS = ("cpu", "gpu")


def _stages(rows: list[dict]) -> dict:
    return {row["stage"]: {"crit_ms": row["crit_ms"], "comm_ms": row["comm_ms"]} for row in rows}


def _whole_numbers(text: str, flag: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",")]
    except ValueError:
        raise DdprofError(f"{flag} takes comma-separated whole numbers (got {text!r})") from None


def measure(ranks: int, concurrency: int, builder: str, args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()
    result = capture(CaptureRequest(workload=WORKLOAD, concurrency=concurrency,
                                    out=args.trace_dir / f"ranks{ranks}-c{concurrency}-{builder}",
                                    model=args.model, builder=builder, budget=args.budget, requests=args.requests,
                                    max_new_tokens=args.max_new_tokens, ranks=ranks, moe_layers=args.moe_layers))
    s = analyse_ranks(processes([result.sqlite])).summary
    crit = s["critical_path"]
    return {
        "ranks": ranks, "concurrency": concurrency, "builder": builder, "trace": str(result.sqlite),
        "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
        "capture": {k: result.meta.get(k) for k in ("generated_tokens", "steps", "tokens", "wall_s", "tok_per_s")},
        "critical_path": {"steps": crit["steps"], "tokens": crit["tokens"], "tok_per_s": crit["tok_per_s"],
                          "step_ms_mean": crit["step_ms"]["total"] / crit["steps"], "bound_by": crit["bound_by"],
                          "stages": _stages(crit["stages"])},
        "ranks_detail": [{"rank": r["rank"], "step_ms_mean": r["step_ms"]["total"] / r["steps"],
                          "comm_ms": r["comm_ms"], "stages": _stages(r["stages"])} for r in s["ranks"]],
        "stragglers": s["stragglers"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,4")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--model", default="small")
    parser.add_argument("--concurrency", default="8", help="comma-separated (default 8)")
    parser.add_argument("--builders", default="cpu", help="comma-separated: cpu, gpu (default cpu)")
    parser.add_argument("--budget", type=int, help="the tree budget (default: the engine's)")
    parser.add_argument("--max-new-tokens", type=int, help="(default: the engine's)")
    parser.add_argument("--moe-layers", type=int, help="MoE layers of a random-weight preset (default: the preset's)")
    parser.add_argument("--trace-dir", type=Path, default=Path("traces/expert-parallel"))
    parser.add_argument("--out", type=Path, default=RESULTS / "expert_parallel_cpu.json")
    args = parser.parse_args()
    try:  # every list checked before the first capture: a bad item last would waste the others
        ranks, concurrencies = _whole_numbers(args.ranks, "--ranks"), _whole_numbers(args.concurrency, "--concurrency")
        builders = args.builders.split(",")
        if unknown := sorted(set(builders) - set(BUILDERS)):
            raise DdprofError(f"--builders: no builder {', '.join(map(repr, unknown))}; "
                              f"choose from {', '.join(BUILDERS)}")
        # A capture the engine refuses (its `serve --check`: e.g. a --moe-layers a preset cannot take)
        # says so in one line too, as `ddprof capture` does.
        rows = [measure(n, c, builder, args) for c in concurrencies for builder in builders for n in ranks]
    except DdprofError as error:
        print(f"benchmarks/expert_parallel_captures.py: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"{'conc':>4} {'builder':>7} {'ranks':>5} {'steps':>6} {'tok/s':>8} {'step ms':>8} {'verify ms':>10} "
          f"{'comm ms':>8} {'draft ms':>9}")
    for row in rows:
        crit = row["critical_path"]
        verify, draft = crit["stages"]["verify"], crit["stages"]["draft"]
        print(f"{row['concurrency']:>4} {row['builder']:>7} {row['ranks']:>5} {crit['steps']:>6} "
              f"{crit['tok_per_s']:>8.1f} {crit['step_ms_mean']:>8.2f} "
              f"{verify['crit_ms'] / crit['steps']:>10.2f} {verify['comm_ms'] / crit['steps']:>8.2f} "
              f"{draft['crit_ms'] / crit['steps']:>9.2f}")
    write_result(args.out, {"benchmark": "expert_parallel_captures", "machine": describe() | {"cpus": os.cpu_count()},
                            "command": f"ddprof capture --workload {WORKLOAD} --concurrency C --model {args.model} "
                                       f"--builder B --requests {args.requests} --ranks N"
                                       + (f" --moe-layers {args.moe_layers}" if args.moe_layers else ""), "settings": vars(args)
                            | {"trace_dir": str(args.trace_dir), "out": str(args.out)}, "runs": rows})


if __name__ == "__main__":
    main()
