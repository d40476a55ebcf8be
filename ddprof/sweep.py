"""`ddprof sweep`: capture every point of a concurrency x builder x budget grid, then one dashboard of all of them.

Defaults depend on the machine: on a CPU the grid is sized to finish in minutes on two cores
(tiny model, few short requests), on a GPU it spans the concurrencies and budgets where the
builder's cost matters. Without CUDA the GPU builder's Triton kernel runs in Triton's
interpreter (ddprof.capture sets TRITON_INTERPRET=1 for it): real, but far slower than on a GPU,
and the dashboard says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddprof.ab_results import ABResult
from ddprof.capture import Capture, CaptureRequest, ProgressCallback, capture, cuda_available
from ddprof.dashboards.page import prepare_dashboard_path, write_dashboard
from ddprof.dashboards.runs import BUILDER_NAMES, Run, load_runs
from ddprof.errors import DdprofError
from ddprof.sweep_defaults import CPU_DEFAULTS, GPU_DEFAULTS


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
    cuda_graphs: bool | None = None  # None: the engine's default (on for DDTree on CUDA)
    overlap: bool | None = None  # None: the engine's default (on with CUDA graphs, one rank)
    prefill_tokens: int | None = None  # None: the engine's default (DEFAULT_PREFILL_TOKENS prompt tokens)
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
        if self.prefill_tokens is not None and self.prefill_tokens < 0:
            raise DdprofError(f"sweep: --prefill-tokens must be at least 0 (got {self.prefill_tokens})")

    def title(self) -> str:
        """The page's title: what was swept, e.g. "ddprof sweep: chat on tiny, concurrency 1,2,4 x builder cpu,gpu x budget 8"."""
        return (f"ddprof sweep: {self.workload} on {self.model}, concurrency {','.join(map(str, self.concurrency))} x "
                f"builder {','.join(self.builders)} x budget {','.join(map(str, self.budgets))}")

    def capture_name(self, concurrency: int, builder: str, budget: int) -> str:
        return f"{self.workload}-{self.model}-c{concurrency}-{builder}-b{budget}"

    def points(self) -> list[CaptureRequest]:
        """One capture request per grid point: budget-major, then concurrency, then the builders as listed."""
        return [CaptureRequest(workload=self.workload, concurrency=concurrency, model=self.model, builder=builder,
                               budget=budget, requests=self.requests, max_new_tokens=self.max_new_tokens,
                               seed=self.seed, batch_invariant=self.batch_invariant, cuda_graphs=self.cuda_graphs,
                               overlap=self.overlap, prefill_tokens=self.prefill_tokens,
                               out=self.out_dir / self.capture_name(concurrency, builder, budget))
                for budget, concurrency, builder in itertools.product(self.budgets, self.concurrency, self.builders)]


def defaults(cuda: bool | None = None) -> dict:
    """The grid's defaults for this machine (CUDA or not)."""
    return dict(GPU_DEFAULTS if (cuda_available() if cuda is None else cuda) else CPU_DEFAULTS)


@dataclass(frozen=True)
class SweepResult:
    captures: list[Capture]
    runs: list[Run]
    dashboard: Path
    interpreted: bool  # the GPU builder ran in Triton's interpreter


def run_sweep(grid: Grid, dashboard: Path, *,
              on_capture: Callable[[int, int, CaptureRequest], None] = lambda index, total, request: None,
              on_requests: ProgressCallback | None = None,
              advance: Callable[[str], None] = lambda label: None,
              evidence: Sequence[ABResult] = (), plotly_js: str = "inline") -> SweepResult:
    """Capture every grid point in turn (`on_capture` before each, `on_requests` with each capture's
    phases), then write one dashboard of all of them and the A/B `evidence` (`advance` per phase)."""
    points = grid.points()
    prepare_dashboard_path(dashboard)  # before the captures: a bad --dashboard must not cost a whole sweep
    captures = []
    for index, request in enumerate(points):
        on_capture(index, len(points), request)
        try:
            captures.append(capture(request, on_progress=on_requests))
        except DdprofError as exc:
            raise DdprofError(f"sweep point {index + 1}/{len(points)} ({request.out.name}): {exc}") from None
    runs = load_runs([c.sqlite for c in captures], advance=advance)
    advance(f"writing {dashboard}")
    page = write_dashboard(runs, dashboard, evidence=evidence, title=grid.title(), plotly_js=plotly_js)
    return SweepResult(captures, runs, page, interpreted="gpu" in grid.builders and not cuda_available())
