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
