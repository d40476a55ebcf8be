"""How a run executed its decode steps: replayed as CUDA graphs or launched eagerly.

A capture's NAME.json and an A/B's `settings` both record it as `cuda_graphs` (true: graphs;
false or absent: eager, as every file before graphs existed). An A/B measured one way says nothing
about runs made the other way (on the H200 graphs made decode steps several times faster),
so the dashboard matches evidence to runs by it.
"""

from __future__ import annotations

from ddprof.errors import DdprofError

GRAPHS, EAGER = "CUDA graphs", "eager"


def execution_of(settings: dict) -> str:
    """GRAPHS or EAGER from a settings object's `cuda_graphs` (checked to be a bool or absent by its reader)."""
    return GRAPHS if settings.get("cuda_graphs") is True else EAGER


def check_cuda_graphs(settings: dict, what: str) -> None:
    """One line (`what`, e.g. "FILE: capture metadata", then the problem) when `cuda_graphs` is there
    but not true, false or null: a file that cannot say how it ran."""
    value = settings.get("cuda_graphs")
    if value is not None and not isinstance(value, bool):
        raise DdprofError(f"{what} `cuda_graphs` must be true, false or null, not {value!r}")
