"""Summarise a folder of captures (CPU-heapq vs GPU-builder pairs): what bounds tok/s, and would
the faster builder help? Prints a table; with --out, writes the JSON (benchmarks/results/ holds the
committed H200 one).

For every run: the engine's tok/s, the stage that bounds it, the critical-path share of each stage
and tree_build's ms per step (and in the JSON: the breakdown, and `ddprof gaps` with 1 ms gaps and
the five longest). For every (model, budget, concurrency) pair of builders: the measured
tok/s ratio GPU/CPU and the CPU run's projection with tree_build at the GPU run's cost.

    python benchmarks/summarize_captures.py DIR [--out benchmarks/results/NAME.json]

DIR holds `NAME.sqlite` (or `NAME.sqlite.gz`) with `NAME.json` from `ddprof capture`
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
    pairs = []
    for cpu in (r for r in runs if r["meta"]["builder"] == "cpu"):
        key = tuple(cpu["meta"][k] for k in ("model", "budget", "concurrency"))
        gpu = next((r for r in runs if r["meta"]["builder"] == "gpu"
                    and tuple(r["meta"][k] for k in ("model", "budget", "concurrency")) == key), None)
        if gpu:
            pairs.append({
                "model": key[0], "budget": key[1], "concurrency": key[2],
                "cpu_tok_per_s": cpu["breakdown"]["tok_per_s"], "gpu_tok_per_s": gpu["breakdown"]["tok_per_s"],
                "measured_ratio": gpu["breakdown"]["tok_per_s"] / cpu["breakdown"]["tok_per_s"],
                "projected_gpu_tok_per_s": tok_per_s_with_stage_cost_of(cpu["breakdown"], gpu["breakdown"],
                                                                        "tree_build"),
                "cpu_tree_build_ms_per_step": crit_ms_per_step(cpu["breakdown"], "tree_build"),
                "gpu_tree_build_ms_per_step": crit_ms_per_step(gpu["breakdown"], "tree_build"),
                "cpu_bound_by": cpu["breakdown"]["bound_by"], "gpu_bound_by": gpu["breakdown"]["bound_by"],
            })
    return {"runs": runs, "pairs": pairs}


def print_tables(result: dict) -> None:
    print(f"{'run':28} {'tok/s':>8} {'bound by':>10} " + " ".join(f"{s[:10]:>10}" for s in STAGES)
          + f" {'tree ms/step':>12}")
    for run in result["runs"]:
        b = run["breakdown"]
        shares = {s["stage"]: s["crit_share"] for s in b["stages"]}
        print(f"{run['name']:28} {b['tok_per_s']:8.1f} {b['bound_by']:>10} "
              + " ".join(f"{shares[s]:10.1%}" for s in STAGES)
              + f" {crit_ms_per_step(b, 'tree_build'):12.3f}")
    print()
    print(f"{'model':8} {'budget':>6} {'conc':>5} {'cpu tok/s':>10} {'gpu tok/s':>10} {'ratio':>7} "
          f"{'projected':>10} {'tree ms cpu':>12} {'tree ms gpu':>12}")
    for p in result["pairs"]:
        print(f"{p['model']:8} {p['budget']:6} {p['concurrency']:5} {p['cpu_tok_per_s']:10.1f} "
              f"{p['gpu_tok_per_s']:10.1f} {p['measured_ratio']:7.3f} {p['projected_gpu_tok_per_s']:10.1f} "
              f"{p['cpu_tree_build_ms_per_step']:12.3f} {p['gpu_tree_build_ms_per_step']:12.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = summarise(args.folder)
    print_tables(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
