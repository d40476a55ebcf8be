"""`python -m engine serve`: run a workload through the continuous-batching scheduler.

This is the program `ddprof capture` profiles. It writes nothing to stdout (nsys stores the
profiled program's stdout inside the report); instead it appends a "loading" line to `--progress`
while the model loads, then "done total" lines as requests finish, and writes the run's JSON
summary to `--summary`.

Counting, so that the trace and the summary agree: `tokens` is what the decode steps committed
(the sum of the trace's `tokens` marks); each request's first token comes from its prefill and is
counted in `first_tokens`; `tok_per_s` is every generated token (`generated_tokens`) per second
of the serving loop (`wall_s`, first admission to last release; model set-up excluded).

`--ranks N` serves with expert parallelism: N processes (engine/ranks.py), each holding 1/N of
every MoE layer's routed experts (engine/expert_parallel.py), each running the same scheduler and
emitting the same NVTX steps; rank 0 writes the progress and the summary. Started by torchrun
instead (RANK and WORLD_SIZE set), the process is the rank torchrun says.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from engine import arguments, corpus, trained
from engine.config import PRESETS, preset
from engine.errors import EngineError
from engine.expert_parallel import DEFAULT_TIMEOUT_S, ExpertParallel, ExpertShard, from_environment
from engine.ranks import launch
from engine.scheduler import Request, ServeResult, serve
from engine.stages import RANK_MARK
from engine.serve_defaults import (DEFAULT_BUDGET, DEFAULT_BUILDER, DEFAULT_CONCURRENCY, DEFAULT_MAX_NEW_TOKENS,
                                   DEFAULT_MODEL, DEFAULT_PREFILL_TOKENS, DEFAULT_REQUESTS, DEFAULT_SEED,
                                   PREFILL_TOKENS_HELP)
from engine.tokenizer import load_tokenizer
from engine.workloads import WORKLOADS, generate

WEIGHT_SEED = 0  # target weights; the drafter uses WEIGHT_SEED + 1
PROMPT_SPLIT = "held-out"  # prompts from modules the tokenizer and models never trained on


def register(subcommands) -> None:
    parser = subcommands.add_parser("serve", help="Serve a workload with continuous batching (what ddprof capture profiles).",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, help=f"one of {', '.join(WORKLOADS)}")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"requests in flight at once (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"preset: {', '.join(PRESETS)} (default {DEFAULT_MODEL})")
    parser.add_argument("--builder", default=DEFAULT_BUILDER, help=f"tree builder: cpu or gpu (default {DEFAULT_BUILDER})")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET, help=f"tree nodes per step (default {DEFAULT_BUDGET})")
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS, help=f"default {DEFAULT_REQUESTS}")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                        help=f"longest answer: the workload's answer lengths are scaled to it (default {DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"workload seed (default {DEFAULT_SEED})")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0: greedy (default); > 0: lossless sampling, each request seeded by its id")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    arguments.add_dtype_option(parser)
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch threads on the CPU (default 1: on shared cores, every op with more threads "
                             "waits for whichever OpenMP thread was descheduled)")
    arguments.add_batch_invariant(parser)
    arguments.add_cuda_graphs(parser)
    arguments.add_overlap(parser)
    parser.add_argument("--prefill-tokens", type=int, default=DEFAULT_PREFILL_TOKENS, help=PREFILL_TOKENS_HELP)
    parser.add_argument("--ranks", type=int, default=None,
                        help="expert-parallel processes (default 1, or torchrun's WORLD_SIZE); each holds 1/N of "
                             "every MoE layer's routed experts")
    parser.add_argument("--moe-layers", type=int, default=None,
                        help="MoE layers after the preset's dense ones (default: the preset's; random-weight presets "
                             "only): as deep as an expert-parallel run's memory allows")
    parser.add_argument("--rank-timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help=f"seconds a rank waits on the others in a collective before it gives up "
                             f"(default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--summary", type=Path, help="write the run's JSON summary here")
    parser.add_argument("--progress", type=Path, help="append 'done total' lines here as requests finish")
    parser.add_argument("--check", action="store_true", help="validate the arguments and requests, then exit")
    parser.set_defaults(run=run)


# A prompt token held in a request's list: the list's slot and an int object (beyond the small ints).
_TOKEN_BYTES = 8 + sys.getsizeof(1 << 20)


def _check_request_count(requests: int, workload: str) -> None:
    """Requests are generated up front, each prompt a list of token ids: refuse a count whose
    prompts alone would not fit in the memory available now (a billion requests never answered)."""
    if workload not in WORKLOADS:
        return  # `generate` names the workloads
    longest = WORKLOADS[workload].prompt.hi
    available = _available_memory()
    limit = available // (longest * _TOKEN_BYTES)
    if requests > limit:
        raise EngineError(f"--requests {requests:,}: the {workload} workload's prompts (up to {longest} tokens each) "
                          f"could need {requests * longest * _TOKEN_BYTES / 2**30:,.0f} GiB; this machine has "
                          f"{available / 2**30:,.1f} GiB available, enough for at most {limit:,} requests")


def _available_memory() -> int:
    """Bytes of memory available without swapping (MemAvailable), or all of it where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def run(args: argparse.Namespace) -> int:
    import torch

    arguments.at_least_one(args, "concurrency", "budget", "requests", "max_new_tokens", "ranks")
    arguments.at_least_zero(args, "prefill_tokens")
    _check_request_count(args.requests, args.workload)
    ranks = arguments.ranks(args.ranks, args.rank_timeout)
    arguments.cpu_threads(args.cpu_threads)
    arguments.temperature(args.temperature)
    arguments.output_file(args.summary, "--summary")
    arguments.output_file(args.progress, "--progress")
    if args.moe_layers is None:
        config = preset(args.model)
    else:
        from engine.generate import preset_with_moe_layers

        config = preset_with_moe_layers(args.model, args.moe_layers)
    device = arguments.device(args.device)
    args.cuda_graphs = arguments.cuda_graphs(args.cuda_graphs, device, ranks=ranks)
    args.overlap = arguments.overlap(args.overlap, args.cuda_graphs, ranks=ranks)
    from engine.ddtree import checked_tree_builder
    from engine.engine import rows_per_slot

    # An unknown or unavailable builder, or a budget it cannot build, fails here, before any work.
    checked_tree_builder(args.builder, torch.device(device), args.budget, config.drafter.depth)
    tokenizer = load_tokenizer()
    requests = generate(args.workload, args.requests, args.seed, tokenizer, max_new_tokens=args.max_new_tokens,
                        files=corpus.files(PROMPT_SPLIT))
    max_len = rows_per_slot(((len(r.prompt_tokens), r.max_new_tokens) for r in requests), args.budget)
    limit = config.model.max_position_embeddings - config.drafter.block_size
    if max_len > limit:
        raise EngineError(f"the longest request of workload {args.workload} needs {max_len} cache rows (prompt + "
                          f"answer + 1 + budget {args.budget}); model {args.model} holds {limit} "
                          "(max_position_embeddings minus the drafter's block)")
    ExpertShard(0, ranks).require_divides(config.model.n_routed_experts)
    if args.check:
        return 0
    if ranks > 1 and "WORLD_SIZE" not in os.environ:
        return launch(args.argv, ranks, args.rank_timeout)
    parallel = from_environment(device, args.rank_timeout)
    try:
        return _serve(args, requests, max_len, device, tokenizer, parallel)
    finally:
        if parallel is not None:
            parallel.close()


def _serve(args: argparse.Namespace, requests: list[Request], max_len: int, device: str, tokenizer,
           parallel: ExpertParallel | None) -> int:
    """Load, warm up and serve in this process (one rank of `parallel`, or the only one)."""
    import torch

    from engine.engine import Engine
    from engine.generate import load_models
    from engine.model import set_batch_invariant

    if device == "cpu":
        torch.set_num_threads(args.cpu_threads)
    set_batch_invariant(args.batch_invariant)

    rank = parallel.shard.rank if parallel else 0
    progress = _Progress(args.progress if rank == 0 else None, len(requests))  # "loading" until serving starts
    with _memory_errors(f"model {args.model} with {min(args.concurrency, len(requests))} cache slots of {max_len} "
                        f"rows on {device}"):
        target, drafter = load_models(args.model, seed=WEIGHT_SEED, device=device, dtype=arguments.dtype(args.dtype),
                                      parallel=parallel, moe_layers=args.moe_layers)
        # No more slots than requests: a cache sized by a huge --concurrency would hold nothing.
        engine = Engine(target, drafter, budget=args.budget, builder=args.builder,
                        n_slots=min(args.concurrency, len(requests)), max_len=max_len, device=device,
                        temperature=args.temperature, cuda_graphs=args.cuda_graphs, overlap=args.overlap)
    longest = max(requests, key=lambda r: r.max_new_tokens)  # its rows fit; a 1-token answer decodes no step
    warm_up(engine, longest.prompt_tokens, min(8, longest.max_new_tokens),
            max_rows(engine, requests, args.prefill_tokens))
    engine.nvtx.mark(RANK_MARK, rank)  # which rank this process is, for a report holding several
    progress.start()
    start = time.perf_counter()
    result = serve(engine, requests, args.concurrency, eos_id=tokenizer.eos_id,
                   on_finished=lambda request_id, tokens: progress.advance(), prefill_tokens=args.prefill_tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    wall_s = time.perf_counter() - start
    if args.summary and rank == 0:
        _write_json(args.summary, {**_summary(args, requests, result, wall_s, device,
                                              str(target.dtype).removeprefix("torch."), engine.graphs),
                                   "ranks": parallel.shard.world if parallel else 1,
                                   "moe_layers": target.config.num_hidden_layers - target.config.first_k_dense_replace})
    return 0


def _drafter(engine):
    """The engine's drafter, None for AR decoding (which has none)."""
    return getattr(engine.decoder, "drafter", None)


def max_rows(engine, requests: list[Request], prefill_tokens: int) -> int:
    """The most rows one forward of `engine` serving `requests` can hold: a batched prefill's
    prompt tokens (a longer prompt alone), or a step's rows in every slot (verify's 1 + budget, the
    drafter's 1 + depth)."""
    drafter = _drafter(engine)
    per_slot = max(engine.block_rows, 1 + drafter.config.depth if drafter is not None else 1)
    return max(prefill_tokens, max(len(r.prompt_tokens) for r in requests), engine.cache.n_slots * per_slot)


def warm_up(engine, prompt_tokens: list[int], max_new_tokens: int, rows: int = 0) -> None:
    """Decode one short request before the measured run, with NVTX off, after compiling the
    batch-invariant GEMM's kernels for every row count up to `rows` (engine.model.compile_linears).

    The first CUDA calls (cuBLAS handles, Triton's JIT compile of the GPU builder and of each GEMM
    blocking) cost hundreds of ms to seconds once; without this they would land in the first
    step's or prefill's stages and skew every comparison.
    """
    from engine.model import compile_linears

    compile_linears([engine.model] + ([_drafter(engine)] if _drafter(engine) is not None else []), rows)
    engine.nvtx.enabled = False
    try:
        engine.admit("warm-up", prompt_tokens, max_new_tokens)
        while engine.active:
            engine.step()
        engine.release("warm-up")
    finally:
        engine.nvtx.enabled = True


def _summary(args: argparse.Namespace, requests: list[Request], result: ServeResult, wall_s: float,
             device: str, dtype: str, graphs=None) -> dict:
    """The run's JSON summary (see the module docstring for how tokens are counted); `graphs`: the
    engine's GraphRecording (engine/cuda_graphs.py) when --cuda-graphs recorded some."""
    import torch

    return {
        "model": args.model, "workload": args.workload, "concurrency": args.concurrency,
        "slots": min(args.concurrency, len(requests)),  # requests in flight at most
        "builder": args.builder, "budget": args.budget, "mode": "ddtree", "seed": args.seed,
        "temperature": args.temperature, "batch_invariant": args.batch_invariant,
        "cuda_graphs": args.cuda_graphs, "graph_buckets": list(graphs.buckets) if graphs else None,
        "graph_record_s": round(graphs.record_s, 6) if graphs else None,
        "graph_pool_bytes": graphs.pool_bytes if graphs else None,
        "overlap": args.overlap, "overlap_scope": arguments.overlap_scope(args.overlap, args.builder),
        "prefill_token_budget": args.prefill_tokens, "prefills": result.prefills,
        "requests": len(requests), "max_new_tokens": args.max_new_tokens, "prompt_split": PROMPT_SPLIT,
        "weights": trained.describe(args.model, seed=WEIGHT_SEED), "dtype": dtype,
        "prompt_tokens": sum(len(r.prompt_tokens) for r in requests),
        "tokens": result.step_tokens, "first_tokens": result.first_tokens,
        "generated_tokens": result.generated_tokens, "steps": result.steps,
        "target_forwards": result.target_forwards,
        "wall_s": round(wall_s, 6), "tok_per_s": round(result.generated_tokens / wall_s, 2),
        "device": _device_name(device), "cpu_threads": torch.get_num_threads() if device == "cpu" else None,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "triton": _triton_version()},
    }


@contextmanager
def _memory_errors(what: str):
    """An allocation that cannot succeed (weights or KV cache larger than the device) as one line."""
    import torch

    try:
        yield
    except torch.OutOfMemoryError:
        raise EngineError(f"{what}: does not fit in GPU memory; lower --concurrency or use a smaller model") from None
    except RuntimeError as error:
        if "can't allocate memory" not in str(error):
            raise
        raise EngineError(f"{what}: does not fit in memory; lower --concurrency or use a smaller model") from None


class _Progress:
    """Appends lines that a watching process can tail (each line written whole): "loading" while the
    model loads and warms up, then "done total" from the start of the serving loop."""

    def __init__(self, path: Path | None, total: int):
        self._path, self._done, self._total = path, 0, total
        self._write("loading")

    def start(self) -> None:
        self._write(f"{self._done} {self._total}")

    def advance(self) -> None:
        self._done += 1
        self.start()

    def _write(self, line: str) -> None:
        if self._path:
            with open(self._path, "a") as progress:
                progress.write(f"{line}\n")


def _write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader never sees half a summary."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, path)


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu: {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__
