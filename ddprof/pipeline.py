"""One export to its breakdown: load -> attribute -> summarise (plus where the wall goes, ddprof.wall). Every command that reads traces
(breakdown, compare, dashboard, sweep) and the capture summaries take this one path, so they all
refuse the same bad input and agree on every number."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddprof.analysis import breakdown, require_stage_ranges
from ddprof.attribution import Attribution, attribute
from ddprof.load import Trace, load
from ddprof.stage_map import StageMap
from ddprof.wall import names_prefills, prefills, wall_split

PHASES = 3  # calls of `advance` per export


def analyse(path: Path, stage_map: StageMap | None = None, *, drop_incomplete: bool = False,
            advance: Callable[[str], None] = lambda label: None) -> tuple[Trace, Attribution, dict]:
    """(trace, attribution, breakdown summary) of one `.sqlite` export or `.nsys-rep` report."""
    path = Path(path)
    advance(f"loading {path.name}")
    return analyse_trace(load(path), stage_map, drop_incomplete=drop_incomplete, advance=advance)


def analyse_trace(trace: Trace, stage_map: StageMap | None = None, *, drop_incomplete: bool = False,
                  advance: Callable[[str], None] = lambda label: None) -> tuple[Trace, Attribution, dict]:
    """`analyse` of a trace already loaded (or one process of it: ddprof.ranks)."""
    path = trace.source
    advance(f"attributing {path.name}")
    attribution = attribute(trace, stage_map, drop_incomplete=drop_incomplete)
    require_stage_ranges(attribution, stage_map)
    advance(f"summarising {path.name}")
    summary = breakdown(attribution, stage_map)
    named = prefills(trace, stage_map) if names_prefills(stage_map) else None
    return trace, attribution, {**summary, "wall": wall_split(attribution, named)}
