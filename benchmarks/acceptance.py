"""Acceptance of the trained DDTree pairs on held-out text: tokens committed per decode step, and the
target forwards DDTree saves against autoregressive decoding.

For each preset with a committed trained pair (engine/trained.py), each workload whose requests fit
the preset's positions, and budgets 8, 16 and 32: `--requests` requests of the workload
(engine/workloads.py, seed 0, its own prompt and answer lengths) whose prompts come only from the
corpus's held-out modules (engine/corpus.py), decoded greedily together in one batch by the
engine, with DDTree (cpu tree builder) and with AR.

- tokens/step: tokens the decode steps committed / decode steps. A step commits the draft tokens it
  accepted plus the bonus token (1 .. L + 1); a request's first token comes from its prefill and is
  not a step's.
- accepted/step: draft tokens accepted per step (0 .. L).
- target forwards: prefill + steps, summed over requests; AR needs one per generated token.
  saved = 1 - DDTree / AR.
- lossless: DDTree's tokens equal AR's, request by request.

`check` is a small fixed set (tiny, 4 held-out code prompts of 64 tokens, budget 16, 32 new tokens)
that tests/engine/test_train_acceptance.py re-runs against the committed weights.

    python benchmarks/acceptance.py [--presets tiny small] [--requests 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.machine import RESULTS, describe, write_result  # noqa: E402
from engine import corpus  # noqa: E402
from engine.config import preset  # noqa: E402
from engine.engine import Engine, rows_per_slot  # noqa: E402
from engine.scheduler import Request  # noqa: E402
from engine.tokenizer import load_tokenizer  # noqa: E402
from engine.trained import has_pair, load_pair  # noqa: E402
from engine.workloads import WORKLOADS  # noqa: E402
from engine.workloads import generate as workload_requests  # noqa: E402

BUDGETS = (8, 16, 32)
SEED = 0
CHECK = {"preset": "tiny", "workload": "code", "requests": 4, "prompt_tokens": 64, "budget": 16,
         "max_new_tokens": 32}


def decode(target, drafter, requests, mode: str, budget: int = 8):
    """Every request in one batch (its own cache slot and answer length), to the end."""
    max_len = rows_per_slot(((len(r.prompt_tokens), r.max_new_tokens) for r in requests), budget)
    engine = Engine(target, drafter, budget=budget, builder="cpu", mode=mode, n_slots=len(requests),
                    max_len=max_len, nvtx=False)
    for r in requests:
        engine.admit(r.request_id, r.prompt_tokens, r.max_new_tokens)
    while engine.active:
        engine.step()
    return [engine.result(r.request_id) for r in requests]


def acceptance(results) -> dict:
    """tokens/step and friends over the decode steps of `results` (one RequestResult per request)."""
    steps = sum(len(r.accept_lengths) for r in results)
    step_tokens = sum(len(r.tokens) - 1 for r in results)
    accepted = [n for r in results for n in r.accept_lengths]
    return {"steps": steps, "tokens_per_step": round(step_tokens / steps, 3),
            "accepted_per_step": round(statistics.mean(accepted), 3),
            "target_forwards": sum(r.target_forwards for r in results)}


def run_check(target, drafter) -> dict:
    """The fixed set the test re-runs: short prompts, so it takes seconds."""
    tokenizer = load_tokenizer()
    requests = workload_requests(CHECK["workload"], CHECK["requests"], SEED, tokenizer,
                                 files=corpus.files("held-out"))
    requests = [Request(r.request_id, r.prompt_tokens[:CHECK["prompt_tokens"]], CHECK["max_new_tokens"])
                for r in requests]
    results = decode(target, drafter, requests, "ddtree", CHECK["budget"])
    return {**CHECK, **acceptance(results), "accept_lengths": [r.accept_lengths for r in results]}


def run_workload(target, drafter, name: str, workload: str, n_requests: int) -> dict:
    tokenizer = load_tokenizer()
    requests = workload_requests(workload, n_requests, SEED, tokenizer, files=corpus.files("held-out"))
    chosen = preset(name)
    rows = max(len(r.prompt_tokens) + r.max_new_tokens for r in requests) + 1 + max(BUDGETS)
    limit = chosen.model.max_position_embeddings - chosen.drafter.block_size
    entry = {"preset": name, "workload": workload, "requests": n_requests, "block_depth_L": chosen.drafter.depth,
             "prompt_tokens": sum(len(r.prompt_tokens) for r in requests)}
    if rows > limit:
        return {**entry, "skipped": f"needs {rows} positions, the preset holds {limit}"}
    started = time.perf_counter()
    ar_tokens = [r.tokens for r in decode(target, drafter, requests, "ar")]
    entry["generated_tokens"] = sum(len(t) for t in ar_tokens)
    entry["budgets"] = {}
    for budget in BUDGETS:
        dd = decode(target, drafter, requests, "ddtree", budget)
        stats = acceptance(dd)
        ar_forwards = entry["generated_tokens"]
        entry["budgets"][str(budget)] = {**stats, "ar_forwards": ar_forwards,
                                         "forwards_saved": round(1 - stats["target_forwards"] / ar_forwards, 3),
                                         "lossless": [r.tokens for r in dd] == ar_tokens}
    entry["wall_s"] = round(time.perf_counter() - started, 1)
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, see engine/train.py)")
    parser.add_argument("--out", type=Path, default=RESULTS / "acceptance.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    payload = {"benchmark": "acceptance", "machine": describe(), "threads": args.threads, "budgets": list(BUDGETS),
               "seed": SEED, "corpus": corpus.describe("held-out"), "results": []}
    from rich.console import Console
    from rich.table import Table

    table = Table(title="DDTree acceptance, held-out prompts")
    for column in ("preset", "workload", "L", "budget", "tok/step", "acc/step", "fwd DD/AR", "saved", "exact"):
        table.add_column(column, justify="left" if column in ("preset", "workload") else "right")
    for name in args.presets:
        if not has_pair(name):
            print(f"{name}: no trained pair (python -m engine train-target/train-drafter --model {name})")
            continue
        target, drafter = load_pair(name)
        if name == CHECK["preset"]:
            payload["check"] = run_check(target, drafter)
        for workload in args.workloads:
            entry = run_workload(target, drafter, name, workload, args.requests)
            payload["results"].append(entry)
            write_result(args.out, payload)
            if "skipped" in entry:
                table.add_row(name, workload, str(entry["block_depth_L"]), "-", "skipped (too long)", "", "", "",
                              "")
                continue
            for budget, b in entry["budgets"].items():
                table.add_row(name, workload, str(entry["block_depth_L"]), budget, f"{b['tokens_per_step']:.2f}",
                              f"{b['accepted_per_step']:.2f}", f"{b['target_forwards']}/{b['ar_forwards']}",
                              f"{b['forwards_saved']:.0%}", str(b["lossless"]))
    Console().print(table)
    write_result(args.out, payload)


if __name__ == "__main__":
    main()
