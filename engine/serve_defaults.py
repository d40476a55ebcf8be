"""`python -m engine serve`'s defaults, in a module that imports nothing, so `ddprof capture --help`
can show the values themselves (ddprof passes only the options the user gave)."""

# Sized so `make demo` (chat, concurrency 32, small model, CPU) captures in minutes on 2 cores.
DEFAULT_CONCURRENCY = 32
DEFAULT_MODEL = "small"
DEFAULT_BUILDER = "cpu"
DEFAULT_BUDGET = 8
DEFAULT_REQUESTS = 128
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_SEED = 0
# Prompt tokens one batched prefill may hold (engine/scheduler.py); 0 prefills one request at a time.
# 4096: 1.72x serving tok/s on the H200 (benchmarks/prefill_ab.py, small, c=64); on the CPU within the
# noise (1.01x), so one default for both.
DEFAULT_PREFILL_TOKENS = 4096

# The help of the engine options ddprof capture / sweep pass on, shown by both (one text each).
CUDA_GRAPHS_HELP = ("run the static-shape DDTree step as CUDA graphs, one per stage and batch bucket, recorded "
                    "before serving (default: on for DDTree on CUDA with one rank, off elsewhere)")
PREFILL_TOKENS_HELP = ("prompt tokens one batched prefill may hold: the requests admitted before a step are "
                       "prefilled together, one forward per batch; a longer prompt alone; 0 prefills one "
                       f"request at a time (default {DEFAULT_PREFILL_TOKENS})")

# `--overlap`'s help, shown by `engine serve --help` and by `ddprof capture` / `sweep`, which pass it on.
OVERLAP_HELP = ("launch step N+1 before step N's tokens reach the host, its inputs from the device buffers step N "
                "wrote; the host commits step N, applies the stop rules and admits and evicts while the GPU runs "
                "(default: on where the step runs as CUDA graphs, with one rank; on the CPU --overlap runs the static "
                "step eagerly, the same work reordered). With --builder cpu the "
                "overlap stops at draft: tree_build needs the same step's draft on the host")
