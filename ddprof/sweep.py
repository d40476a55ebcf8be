"""`ddprof sweep`: capture every point of a concurrency x builder x budget grid, then one dashboard of all of them.

Defaults depend on the machine: on a CPU the grid is sized to finish in minutes on two cores
(tiny model, few short requests), on a GPU it spans the concurrencies and budgets where the
builder's cost matters. Without CUDA the GPU builder's Triton kernel runs in Triton's
interpreter (TRITON_INTERPRET=1): real, but far slower than on a GPU, and the dashboard says so.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ddprof.capture import Capture, CaptureRequest, capture, cuda_available
from ddprof.dashboards.page import prepare_dashboard_path, write_dashboard
from ddprof.dashboards.runs import BUILDER_NAMES, Run, load_runs
from ddprof.errors import DdprofError


@dataclass(frozen=True)
class Grid:
    """The sweep: every (budget, concurrency, builder) of the three lists, with the same workload settings."""

    concurrency: tuple[int, ...]
    builders: tuple[str, ...]
    budgets: tuple[int, ...]
    model: str
    requests: int
    max_new_tokens: int
    workload: str = "chat"
    seed: int = 0
    batch_invariant: bool = True
    out_dir: Path = field(default=Path("traces/sweep"))

    def __post_init__(self) -> None:
        for flag, values in (("concurrency", self.concurrency), ("builder", self.builders), ("budget", self.budgets)):
            if not values:
                raise DdprofError(f"sweep: --{flag} needs at least one value")
            if len(set(values)) != len(values):
                raise DdprofError(f"sweep: --{flag} lists a value twice ({','.join(map(str, values))})")
        unknown = [b for b in self.builders if b not in BUILDER_NAMES]
        if unknown:
            raise DdprofError(f"sweep: unknown tree builder {unknown[0]!r}; choose from {', '.join(BUILDER_NAMES)}")
        for flag, values in (("concurrency", self.concurrency), ("budget", self.budgets),
                             ("requests", (self.requests,)), ("max-new-tokens", (self.max_new_tokens,))):
            small = [v for v in values if v < 1]
            if small:
                raise DdprofError(f"sweep: --{flag} must be at least 1 (got {small[0]})")

    def capture_name(self, concurrency: int, builder: str, budget: int) -> str:
        return f"{self.workload}-{self.model}-c{concurrency}-{builder}-b{budget}"

    def points(self) -> list[CaptureRequest]:
        """One capture request per grid point: budget-major, then concurrency, then the builders as listed."""
        return [CaptureRequest(workload=self.workload, concurrency=concurrency, model=self.model, builder=builder,
                               budget=budget, requests=self.requests, max_new_tokens=self.max_new_tokens,
                               seed=self.seed, batch_invariant=self.batch_invariant,
                               out=self.out_dir / self.capture_name(concurrency, builder, budget))
                for budget, concurrency, builder in itertools.product(self.budgets, self.concurrency, self.builders)]


# Machine-sized defaults: CPU runs the GPU builder interpreted, so its grid stays small.
CPU_DEFAULTS = dict(concurrency=(1, 2, 4), builders=("cpu", "gpu"), budgets=(8,), model="tiny", requests=8,
                    max_new_tokens=16)
GPU_DEFAULTS = dict(concurrency=(1, 8, 32), builders=("cpu", "gpu"), budgets=(8, 32), model="small", requests=64,
                    max_new_tokens=64)


def defaults(cuda: bool | None = None) -> dict:
    """The grid's defaults for this machine (CUDA or not)."""
    return dict(GPU_DEFAULTS if (cuda_available() if cuda is None else cuda) else CPU_DEFAULTS)


@dataclass(frozen=True)
class SweepResult:
    captures: list[Capture]
    runs: list[Run]
    dashboard: Path
    interpreted: bool  # the GPU builder ran in Triton's interpreter


@contextmanager
def _gpu_builder_environment(grid: Grid) -> Iterator[bool]:
    """Without CUDA, let the engine run the GPU builder in Triton's interpreter; yields whether it does."""
    interpret = "gpu" in grid.builders and not cuda_available()
    previous = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield interpret
    finally:
        if interpret and previous is None:
            del os.environ["TRITON_INTERPRET"]
        elif interpret:
            os.environ["TRITON_INTERPRET"] = previous


def run_sweep(grid: Grid, dashboard: Path, *,
              on_capture: Callable[[int, int, CaptureRequest], None] = lambda index, total, request: None,
              on_requests: Callable[[int, int], None] | None = None,
              advance: Callable[[str], None] = lambda label: None) -> SweepResult:
    """Capture every grid point in turn (`on_capture` before each, `on_requests` as requests finish),
    then write one dashboard of all of them (`advance` per dashboard phase)."""
    points = grid.points()
    prepare_dashboard_path(dashboard)  # before the captures: a bad --dashboard must not cost a whole sweep
    captures = []
    with _gpu_builder_environment(grid) as interpreted:
        for index, request in enumerate(points):
            on_capture(index, len(points), request)
            try:
                captures.append(capture(request, on_progress=on_requests))
            except DdprofError as exc:
                raise DdprofError(f"sweep point {index + 1}/{len(points)} ({request.out.name}): {exc}") from None
    runs = load_runs([c.sqlite for c in captures], advance=advance)
    advance(f"writing {dashboard}")
    return SweepResult(captures, runs, write_dashboard(runs, dashboard, title=f"ddprof sweep: {grid.out_dir.name}"),
                       interpreted)
