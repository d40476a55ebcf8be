"""Emit the engine's NVTX contract for a real nsys capture, and record what was emitted.

Decode steps as engine/stages.py describes them: a `step` push/pop range in domain `ddtree`, the
six stage ranges inside it on the same thread, a `tokens` mark with an integer payload after it.
Around them, what ddprof must ignore: a `prefill` range, CCCL ranges named like stages, stage-named
ranges on a worker thread that runs no steps. Each stage busy-waits a fixed time so `verify`
dominates. The program writes to RECORD (JSON) what it emitted, and each range's duration by its
own clock, from just before the push to just after the pop.

    python stage_emitter.py RECORD [--steps N] [--leave-open]
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import nvtx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script, from anywhere
from engine.stages import DOMAIN, PREFILL, STAGES, STEP, TOKENS_MARK  # noqa: E402

STAGE_US = {"draft": 1500, "tree_build": 300, "verify": 2500, "accept": 200, "kv_compact": 200, "sampling": 500}


def spin(microseconds: int) -> None:
    end = time.perf_counter_ns() + microseconds * 1000
    while time.perf_counter_ns() < end:
        pass


def timed_range(name: str, microseconds: int, domain: str = DOMAIN) -> int:
    """Push, busy-wait, pop; return the ns from just before the push to just after the pop."""
    start = time.perf_counter_ns()
    nvtx.push_range(name, domain=domain)
    spin(microseconds)
    nvtx.pop_range(domain=domain)
    return time.perf_counter_ns() - start


def worker() -> None:
    for name in STAGES:  # stage names on a thread without steps: not stage ranges
        timed_range(name, 100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("record", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--leave-open", action="store_true", help="exit inside a step and a stage")
    args = parser.parse_args()

    record = {"steps": 0, "tokens": 0, "stage_ns": {s: [] for s in STAGES}, "step_ns": [],
              "thread": threading.get_native_id()}
    timed_range(PREFILL, 2000)
    helper = threading.Thread(target=worker)
    helper.start()
    for i in range(args.steps):
        start = time.perf_counter_ns()
        nvtx.push_range(STEP, domain=DOMAIN)
        for stage in STAGES:
            record["stage_ns"][stage].append(timed_range(stage, STAGE_US[stage]))
            if stage == "draft":
                timed_range("verify", 50, domain="CCCL")  # torch's CUB ranges look like this
        nvtx.pop_range(domain=DOMAIN)
        record["step_ns"].append(time.perf_counter_ns() - start)
        tokens = 1 + i % 4
        nvtx.mark(TOKENS_MARK, payload=tokens, domain=DOMAIN)
        record["steps"] += 1
        record["tokens"] += tokens
    helper.join()
    args.record.write_text(json.dumps(record))
    if args.leave_open:
        nvtx.push_range(STEP, domain=DOMAIN)
        nvtx.push_range("sampling", domain=DOMAIN)


if __name__ == "__main__":
    main()
