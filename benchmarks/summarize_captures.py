"""Summarise a folder of captures (CPU-heapq vs GPU-builder pairs): what bounds tok/s, and would
the faster builder help? Prints a table; with --out, writes the JSON (benchmarks/results/ holds the
committed H200 one).

For every run: the engine's tok/s, the stage that bounds it, the critical-path share of each stage
and tree_build's ms per step (and in the JSON: the breakdown, and `ddprof gaps` with 1 ms gaps and
the five longest). For every (model, budget, concurrency) pair of builders: the measured
tok/s ratio GPU/CPU and the CPU run's projection with tree_build at the GPU run's cost.

    python benchmarks/summarize_captures.py DIR|RESULT.json [--out benchmarks/results/NAME.json]

Pairs are of the same execution (CUDA graphs or eager). DIR holds `NAME.sqlite` (or `NAME.sqlite.gz`) with `NAME.json` from `ddprof capture`
(benchmarks/gpu_captures.sh writes such a folder on a GPU machine).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddprof.execution import execution_of  # noqa: E402
from ddprof.gaps import host_gaps  # noqa: E402
from ddprof.pipeline import analyse  # noqa: E402
from ddprof.projection import crit_ms_per_step, tok_per_s_with_stage_cost_of  # noqa: E402
from engine.stages import STAGES  # noqa: E402


def _export(path: Path, scratch: Path) -> Path:
    if path.suffix != ".gz":
        return path
    plain = scratch / path.stem
    with gzip.open(path) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return plain


def summarise(folder: Path) -> dict:
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for meta_path in sorted(folder.glob("*.json")):
            exports = [p for p in (meta_path.with_suffix(".sqlite"), meta_path.with_suffix(".sqlite.gz")) if p.exists()]
            if not exports:
                continue
            meta = json.loads(meta_path.read_text())
            trace, attribution, summary = analyse(_export(exports[0], Path(scratch)))
            runs.append({"name": meta_path.stem, "meta": meta, "breakdown": summary,
                         "host_gaps": host_gaps(trace, attribution, min_ms=1.0, top=5) if trace.runtime.height
                         else None})  # a host-only capture has no CUDA calls to find gaps between
    return {"runs": runs, "pairs": builder_pairs(runs)}


PAIR_KEY = ("model", "budget", "concurrency")


def builder_pairs(runs: list[dict]) -> list[dict]:
    """For every CPU-heapq run, the GPU-builder run of the same settings and execution: the measured
    tok/s ratio, and the CPU run's projection with tree_build at the GPU run's cost."""
    def key(run: dict) -> tuple:
        return (*(run["meta"][k] for k in PAIR_KEY), execution_of(run["meta"]))

    pairs = []
    for cpu in (r for r in runs if r["meta"]["builder"] == "cpu"):
        gpu = next((r for r in runs if r["meta"]["builder"] == "gpu" and key(r) == key(cpu)), None)
        if gpu:
            projected = tok_per_s_with_stage_cost_of(cpu["breakdown"], gpu["breakdown"], "tree_build")
            pairs.append({
                **dict(zip(PAIR_KEY, key(cpu))), "execution": execution_of(cpu["meta"]),
                "cpu_tok_per_s": cpu["breakdown"]["tok_per_s"], "gpu_tok_per_s": gpu["breakdown"]["tok_per_s"],
                "measured_ratio": gpu["breakdown"]["tok_per_s"] / cpu["breakdown"]["tok_per_s"],
                "projected_gpu_tok_per_s": projected,
                "projection_error": projected / gpu["breakdown"]["tok_per_s"] - 1,
                "cpu_tree_build_ms_per_step": crit_ms_per_step(cpu["breakdown"], "tree_build"),
                "gpu_tree_build_ms_per_step": crit_ms_per_step(gpu["breakdown"], "tree_build"),
                "cpu_gpu_busy_share": cpu["breakdown"]["gpu_busy_share"],
                "gpu_gpu_busy_share": gpu["breakdown"]["gpu_busy_share"],
                "cpu_bound_by": cpu["breakdown"]["bound_by"], "gpu_bound_by": gpu["breakdown"]["bound_by"],
            })
    return pairs


def print_tables(result: dict) -> None:
    print(f"{'run':34} {'tok/s':>8} {'GPU busy':>8} {'bound by':>10} " + " ".join(f"{s[:10]:>10}" for s in STAGES)
          + f" {'tree ms/step':>12}")
    for run in result["runs"]:
        b = run["breakdown"]
        shares = {s["stage"]: s["crit_share"] for s in b["stages"]}
        print(f"{run['name']:34} {b['tok_per_s']:8.1f} {b['gpu_busy_share']:8.1%} {b['bound_by']:>10} "
              + " ".join(f"{shares[s]:10.1%}" for s in STAGES)
              + f" {crit_ms_per_step(b, 'tree_build'):12.3f}")
    print()
    width = max([len("execution")] + [len(p["execution"]) for p in result["pairs"]])
    print(f"{'model':8} {'budget':>6} {'conc':>5} {'execution':{width}} {'cpu tok/s':>10} {'gpu tok/s':>10} {'ratio':>7} "
          f"{'projected':>10} {'error':>7} {'tree ms cpu':>12} {'tree ms gpu':>12}")
    for p in result["pairs"]:
        print(f"{p['model']:8} {p['budget']:6} {p['concurrency']:5} {p['execution']:{width}} {p['cpu_tok_per_s']:10.1f} "
              f"{p['gpu_tok_per_s']:10.1f} {p['measured_ratio']:7.3f} {p['projected_gpu_tok_per_s']:10.1f} "
              f"{p['projection_error']:7.1%} {p['cpu_tree_build_ms_per_step']:12.3f} "
              f"{p['gpu_tree_build_ms_per_step']:12.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a folder of captures, or a result file this script wrote "
                        "(its runs paired again: no exports needed)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.source.is_dir():
        result = summarise(args.source)
    else:
        runs = json.loads(args.source.read_text())["runs"]
        result = {"runs": runs, "pairs": builder_pairs(runs)}
    print_tables(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
