"""The NVTX contract between the engine and ddprof: domain, range and mark names.

Both sides import these names (this module imports nothing heavy), so they cannot drift apart.
"""

DOMAIN = "ddtree"
STEP = "step"
PREFILL = "prefill"
TOKENS_MARK = "tokens"
# The six stages of one decode step, in the order they run.
STAGES = ("draft", "tree_build", "verify", "accept", "kv_compact", "sampling")
