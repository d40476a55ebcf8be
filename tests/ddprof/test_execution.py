"""ddprof/execution.py: how a run executed, from its settings, absent keys read as before they existed."""

from ddprof.execution import EAGER, GRAPHS, execution_of


def test_graphs_overlap_and_batched_prefill_each_tell_runs_apart():
    assert execution_of({}) == EAGER and execution_of({"cuda_graphs": None}) == EAGER
    assert execution_of({"cuda_graphs": True}) == GRAPHS
    assert execution_of({"cuda_graphs": True, "overlap": True}) == f"{GRAPHS}, overlapped"
    assert execution_of({"cuda_graphs": True, "overlap": False, "prefill_token_budget": 0}) == GRAPHS
    assert execution_of({"cuda_graphs": False, "prefill_token_budget": 4096}) == f"{EAGER}, batched prefill"
    assert execution_of({"prefill_token_budget": True}) == EAGER  # not a budget
