"""ddprof on a real nsys 2025.3 export of the overlapped engine on the H200, checked with plain SQL.

The fixture: `benchmarks/gpu_captures.sh`'s graphs capture of model `small` with the engine's CUDA
defaults (graphs, overlapped steps, batched prefill), GPU builder, budget 16, chat, concurrency 64,
64 requests of 48 new tokens, decode steps 2-7 of its 27, cut by `python -m tests.ddprof.trim_export
SOURCE tests/data/h200_nsys2025_small_overlap.sqlite --first-step 2 --steps 6`. Step N+1's ranges
run on the host while step N's graphs run on the GPU: the case ddprof must not give to the wrong
step (tests/ddprof/test_overlapped_trace.py builds it by hand). The in-order fixture beside it
(test_h200_graphs_export.py) is the contrast.
"""

from collections import Counter
from pathlib import Path

import pytest

from ddprof.pipeline import analyse
from tests.ddprof.test_attribution_reference import _check_against_reference
from tests.ddprof.test_h200_export import NAMED_RANGES
from tests.ddprof.test_h200_graphs_export import GRAPH_LAUNCHES, GRAPHED, LAUNCHED, rows, step_of

DATA = Path(__file__).resolve().parents[1] / "data"
EXPORT = DATA / "h200_nsys2025_small_overlap.sqlite"
IN_ORDER = DATA / "h200_nsys2025_small_graphs.sqlite"
STEPS = 6


def step_ends(export: Path) -> list[int]:
    return [end for (end,) in rows(f"SELECT end FROM ({NAMED_RANGES}) WHERE name = 'step' ORDER BY start", export)]


def share_after_its_step(export: Path, stage: str) -> float:
    """Of the GPU time of `stage`'s ops (in steps followed by another), the part that runs after
    the step range that launched them has ended."""
    after = total = 0
    ends = step_ends(export)
    for start, end, _, launch, name, _ in rows(LAUNCHED, export):
        step = step_of(launch, export)
        if name == stage and step + 1 < len(ends):
            total += end - start
            after += max(0, end - max(start, ends[step]))
    return after / total


@pytest.fixture(scope="module")
def analysed():
    return analyse(EXPORT)


def test_each_steps_gpu_work_runs_after_its_step_range_has_ended():
    """The overlap, in the trace: draft's, verify's and sampling's GPU work runs (nearly) wholly
    after the range of the step that launched it; in order, wholly inside it."""
    for stage in ("draft", "verify", "sampling"):
        assert share_after_its_step(EXPORT, stage) > 0.85, stage
        assert share_after_its_step(IN_ORDER, stage) == 0.0, stage


def test_gpu_work_and_graphs_belong_to_the_step_that_launched_them(analysed):
    """Per step and stage: the ops, their GPU ns and the graph launches of the calls made in that
    step's range, although the ops run in the next one (by the op's own start, the middle steps
    would keep their op counts but not their ns)."""
    _, attribution, _ = analysed
    ops, gpu_ns = Counter(), Counter()
    for start, end, _, launch, stage, _ in rows(LAUNCHED, EXPORT):
        if stage:
            ops[step_of(launch, EXPORT), stage] += 1
            gpu_ns[step_of(launch, EXPORT), stage] += end - start
    launches = Counter((step_of(start, EXPORT), stage) for start, _, stage in rows(GRAPH_LAUNCHES, EXPORT))
    per_step = list(attribution.per_step.iter_rows(named=True))
    for column, expected in (("gpu_ops", ops), ("gpu_ns", gpu_ns), ("graph_launches", launches)):
        assert {(row["step_id"], row["owner"]): row[column] for row in per_step if row[column]} == expected, column
    assert launches == {(step, stage): 1 for step in range(STEPS) for stage in GRAPHED}


def test_gpu_ms_per_stage_counts_the_work_each_stage_launched(analysed):
    _, _, summary = analysed
    expected = Counter()
    for start, end, _, _, stage, _ in rows(LAUNCHED, EXPORT):
        expected[stage] += end - start
    assert {row["stage"]: row["gpu_ms"] for row in summary["stages"] if row["gpu_ms"]} == pytest.approx(
        {stage: ns / 1e6 for stage, ns in expected.items() if stage}, rel=1e-12)


def test_the_breakdown_matches_the_brute_force_reference():
    """Host, GPU, wait and critical-path ns of every stage, as the reference computes them from the
    definitions (tests/ddprof/test_attribution_reference.py), on the overlapped trace."""
    _check_against_reference(EXPORT)
