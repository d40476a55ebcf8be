"""The NVTX contract between the engine and ddprof: domain, range and mark names.

Both sides import these names (this module imports nothing heavy), so they cannot drift apart.
"""

DOMAIN = "ddtree"
STEP = "step"
PREFILL = "prefill"
TOKENS_MARK = "tokens"
# The six stages of one decode step, in the order they run.
STAGES = ("draft", "tree_build", "verify", "accept", "kv_compact", "sampling")
# Nested inside a stage: the expert-parallel all-reduce of the routed MoE outputs (engine/expert_parallel.py).
# Not a stage of its own: its time stays its stage's, and ddprof reports it as that stage's communication.
MOE_ALL_REDUCE = "moe_all_reduce"
COMMUNICATION = (MOE_ALL_REDUCE,)
# Emitted once per process before serving, payload = the process's rank: tells a multi-process trace's ranks apart.
RANK_MARK = "rank"
