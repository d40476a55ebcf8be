"""How a run executed its decode steps: replayed as CUDA graphs or launched eagerly, overlapped
with the host or in order, its prefills batched or one at a time.

A capture's NAME.json and an A/B's `settings` record it as `cuda_graphs` (true: graphs; false or
absent: eager, as every file before graphs existed), `overlap` (true, else in order) and
`prefill_token_budget` (above 0: batched prefills). An A/B measured one way says nothing about runs
made another way (on the H200 graphs made decode steps several times faster), so the dashboard
matches evidence to runs, and runs to each other, by it.
"""

from __future__ import annotations

from ddprof.errors import DdprofError

GRAPHS, EAGER = "CUDA graphs", "eager"


def execution_of(settings: dict) -> str:
    """GRAPHS or EAGER from a settings object's `cuda_graphs` (checked to be a bool or absent by its
    reader), with ", overlapped" and ", batched prefill" where the run did those."""
    parts = [GRAPHS if settings.get("cuda_graphs") is True else EAGER]
    if settings.get("overlap") is True:
        parts.append("overlapped")
    budget = settings.get("prefill_token_budget")
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        parts.append("batched prefill")
    return ", ".join(parts)


def check_cuda_graphs(settings: dict, what: str) -> None:
    """One line (`what`, e.g. "FILE: capture metadata", then the problem) when `cuda_graphs` is there
    but not true, false or null: a file that cannot say how it ran."""
    value = settings.get("cuda_graphs")
    if value is not None and not isinstance(value, bool):
        raise DdprofError(f"{what} `cuda_graphs` must be true, false or null, not {value!r}")
