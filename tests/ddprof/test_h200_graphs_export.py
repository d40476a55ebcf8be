"""ddprof on a real nsys 2025.3 export of the CUDA-graphed engine on the H200, checked with plain SQL.

The fixture: `benchmarks/gpu_captures.sh`'s graphs capture of model `small`, GPU builder, budget 16,
chat, concurrency 64, 64 requests of 48 new tokens (`--cuda-graphs`, so `ddprof capture` ran nsys
2025.3.1 with `--cuda-graph-trace=node`), decode steps 2-7 of its 26, cut by `python -m tests.ddprof.trim_export
SOURCE tests/data/h200_nsys2025_small_graphs.sqlite --first-step 2 --steps 6`. Each step replays one
graph per stage but sampling (the commit: eager kernels, one async copy, one event wait); the host
runs ahead: a stage's range ends as its cudaGraphLaunch returns, and its graph runs later, over
other stages' ranges. The expected numbers here come from the SQLite tables, not from ddprof.
"""

import bisect
import sqlite3
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from ddprof.dashboards.runs import load_runs
from ddprof.dashboards.timeline import GPU_LANE, timeline_figure
from ddprof.gaps import host_gaps
from ddprof.graphs import GraphTrace, graph_trace
from ddprof.pipeline import analyse
from engine.stages import STAGES
from tests.ddprof.test_attribution_reference import _check_against_reference
from tests.ddprof.test_breakdown_cli import ddprof
from tests.ddprof.test_gaps import NS, brute_force
from tests.ddprof.test_h200_export import GPU_TABLES, NAMED_RANGES

EXPORT = Path(__file__).resolve().parents[1] / "data" / "h200_nsys2025_small_graphs.sqlite"
STEPS = 6
GRAPHED = tuple(stage for stage in STAGES if stage != "sampling")
OPS = " UNION ALL ".join(f"SELECT start, end, correlationId, globalPid, graphNodeId FROM {table}" for table in GPU_TABLES)
# Every CUDA call with its name and the stage range (of the engine's domain, same thread) holding its start.
CALLS = f"""
    SELECT c.start, c."end", c.correlationId, c.globalTid, s.value AS api, r.name AS stage, r."end" AS range_end
    FROM CUPTI_ACTIVITY_KIND_RUNTIME c JOIN StringIds s ON s.id = c.nameId
    LEFT JOIN ({NAMED_RANGES}) r
      ON r.globalTid = c.globalTid AND c.start >= r.start AND c.start < r.end
     AND r.name IN ({", ".join(f"'{stage}'" for stage in STAGES)})"""
GRAPH_LAUNCHES = f"SELECT start, \"end\", stage FROM ({CALLS}) WHERE api LIKE 'cudaGraphLaunch%'"
# Every GPU op with its launching call: the stage it belongs to (null: launched outside every stage).
LAUNCHED = f"""
    SELECT o.start, o.end, o.graphNodeId, c.start AS launch, c.stage, c.range_end
    FROM ({OPS}) o JOIN ({CALLS}) c ON c.correlationId = o.correlationId AND (c.globalTid & -16777216) = o.globalPid"""


@cache
def rows(sql: str, export: Path = EXPORT) -> list[tuple]:
    with sqlite3.connect(export) as db:
        return db.execute(sql).fetchall()


def step_starts(export: Path = EXPORT) -> list[int]:
    return [start for (start,) in rows(f"SELECT start FROM ({NAMED_RANGES}) WHERE name = 'step' ORDER BY start",
                                       export)]


def step_of(time: int, export: Path = EXPORT) -> int:
    """The index (by start) of the last step range starting at or before `time` (in `export`)."""
    return bisect.bisect_right(step_starts(export), time) - 1


@pytest.fixture(scope="module")
def analysed():
    return analyse(EXPORT)


def test_the_trace_says_it_was_captured_in_node_mode(analysed):
    trace, attribution, summary = analysed
    (mode,), = rows("SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE'")
    assert mode == "Node"  # nsys's record of --cuda-graph-trace=node
    launches = len(rows(GRAPH_LAUNCHES))
    nodes = sum(node is not None for _, _, node, *_ in rows(LAUNCHED))
    assert launches == STEPS * len(GRAPHED) and nodes > 3000
    assert graph_trace(trace) == attribution.graphs == GraphTrace("node", launches, 0, nodes)
    assert summary["cuda_graphs"] == {"mode": "node", "launches": launches, "graph_records": 0, "node_ops": nodes}


def test_each_stage_but_sampling_launches_one_graph_per_step(analysed):
    _, attribution, summary = analysed
    launches = Counter((step_of(start), stage) for start, _, stage in rows(GRAPH_LAUNCHES))
    assert launches == {(step, stage): 1 for step in range(STEPS) for stage in GRAPHED}
    per_step = {(row["step_id"], row["owner"]): row["graph_launches"]
                for row in attribution.per_step.iter_rows(named=True) if row["graph_launches"]}
    assert per_step == launches
    assert {row["stage"]: row["graph_launches"] for row in summary["stages"]} == {
        **{stage: STEPS for stage in GRAPHED}, "sampling": 0}


def test_graph_nodes_count_as_gpu_ops_of_the_launching_stage_per_step(analysed):
    _, attribution, _ = analysed
    ops = Counter((step_of(launch), stage) for _, _, _, launch, stage, _ in rows(LAUNCHED) if stage)
    nodes = Counter((step_of(launch), stage) for _, _, node, launch, stage, _ in rows(LAUNCHED)
                    if stage and node is not None)
    per_step = {(row["step_id"], row["owner"]): row["gpu_ops"]
                for row in attribution.per_step.iter_rows(named=True) if row["gpu_ops"]}
    assert per_step == ops
    # Every op of a graphed stage is a graph node (hundreds in draft and verify); sampling's are eager.
    assert all(nodes[key] == ops[key] for key in ops if key[1] in GRAPHED)
    assert all(ops[step, "verify"] > ops[step, "draft"] > 100 for step in range(STEPS))
    assert all(nodes[step, "sampling"] == 0 < ops[step, "sampling"] for step in range(STEPS))
    # sync_calls counts the one call that waits (sampling's event), never a cudaGraphLaunch.
    waits = {(row["step_id"], row["owner"]): row["sync_calls"]
             for row in attribution.per_step.iter_rows(named=True) if row["sync_calls"]}
    assert waits == {(step, "sampling"): 1 for step in range(STEPS)}


def test_the_host_runs_ahead_of_its_graphs():
    """The case the timeline and gaps tests below are about: draft's and verify's graph nodes run
    almost wholly after their stage's range has ended."""
    for stage in ("draft", "verify"):
        spans = [(start, end, range_end) for start, end, node, _, name, range_end in rows(LAUNCHED)
                 if name == stage and node is not None]
        inside = sum(max(0, min(end, range_end) - start) for start, end, range_end in spans)
        assert inside < 0.01 * sum(end - start for start, end, _ in spans), stage


def test_gpu_busy_share_is_the_union_of_gpu_work_over_step_time(analysed):
    """Every GPU op of the trace, clipped to the steps, merged where they overlap."""
    _, _, summary = analysed
    steps = rows(f"SELECT start, end FROM ({NAMED_RANGES}) WHERE name = 'step'")
    ops = rows(f"SELECT start, end FROM ({OPS})")
    busy = 0
    for step_start, step_end in steps:
        reach = step_start
        for start, end in sorted((max(s, step_start), min(e, step_end)) for s, e in ops
                                 if s < step_end and e > step_start):
            busy += max(0, end - max(start, reach))
            reach = max(reach, end)
    share = busy / sum(end - start for start, end in steps)
    assert summary["gpu_busy_share"] == pytest.approx(share, rel=1e-12)
    assert 0.75 < share < 0.9  # graphs: the GPU busy most of the step (12% in the eager H200 export)
    headline = ddprof("breakdown", EXPORT).stdout.splitlines()[1]
    assert headline.endswith(f"GPU busy {share:.1%} of step time")


def test_gpu_ms_per_stage_matches_the_sql_join(analysed):
    _, _, summary = analysed
    expected = Counter()
    for start, end, _, _, stage, _ in rows(LAUNCHED):
        expected[stage] += end - start
    assert {row["stage"]: row["gpu_ms"] for row in summary["stages"]} == pytest.approx(
        {stage: expected[stage] / 1e6 for stage in STAGES}, rel=1e-12)


def test_the_breakdown_matches_the_brute_force_reference():
    """Host, GPU, wait and critical-path ns, ops, graph launches and waits of every stage, as the
    reference computes them from the definitions (tests/ddprof/test_attribution_reference.py)."""
    _check_against_reference(EXPORT)


def test_the_timeline_draws_every_graph_node_in_the_stage_that_launched_it():
    """All six steps shown: the window runs from the first step's start to the end of the last
    step or of the work its steps launched; each GPU-lane bar of a stage's trace is an op whose
    launch lies in that stage's range, its hover names the step of that launch, and every op
    running in the window is drawn once."""
    figure = timeline_figure(load_runs([EXPORT]), steps=STEPS)
    origin, last_end = rows(f"SELECT min(start), max(end) FROM ({NAMED_RANGES}) WHERE name = 'step'")[0]
    drawn = Counter()
    for trace in figure.data:
        for lane, base, length, hover in zip(trace.y, trace.base if trace.base is not None else [], trace.x,
                                             trace.hovertext or []):
            if lane == GPU_LANE:
                start = origin + round(base * 1e6)
                step = int(hover.rsplit(" ", 1)[1]) if trace.name in STAGES else None
                drawn[trace.name, step, start, start + round(length * 1e6)] += 1
    launched = rows(LAUNCHED)
    window_end = max([last_end] + [end for _, end, _, launch, stage, _ in launched if stage and launch < last_end])
    expected = Counter((stage or "other", step_of(launch) if stage else None, start, end)
                       for start, end, _, launch, stage, _ in launched if end > origin and start < window_end)
    assert drawn == expected
    nodes = sum(node is not None for _, _, node, *_ in launched)
    assert sum(n for (stage, *_), n in drawn.items() if stage in GRAPHED) == nodes


def test_gaps_count_graph_launches_as_calls_and_name_the_graphs_first_node(analysed):
    trace, attribution, summary = analysed
    result = host_gaps(trace, attribution, min_ms=0.0, top=100_000)
    want, lengths = brute_force(trace, attribution, 1)
    for row, stage in zip(result["stages"], summary["stages"]):
        assert row["host_ms"] == pytest.approx(stage["cpu_ms"], rel=1e-12)
        assert (round(row["in_calls_ms"] / NS), round(row["outside_calls_ms"] / NS)) == tuple(want[row["stage"]][:2])
    assert sorted((round(g["ms"] / NS) for g in result["longest"]), reverse=True) == lengths
    # A graphed stage's host time is mostly its cudaGraphLaunch calls: time in calls, not gaps.
    launch_ns = Counter()
    for start, end, stage in rows(GRAPH_LAUNCHES):
        launch_ns[stage] += end - start
    for row in result["stages"]:
        if row["stage"] in GRAPHED:
            assert row["host_ms"] / 2 < launch_ns[row["stage"]] * NS <= row["in_calls_ms"], row
    # The gap before each cudaGraphLaunch names the kernel node its graph ran first.
    first_kernel = dict(rows("""
        SELECT c.start, (SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
                         JOIN StringIds s ON s.id = coalesce(k.shortName, k.demangledName)
                         WHERE k.correlationId = c.correlationId AND k.globalPid = (c.globalTid & -16777216)
                         ORDER BY k.start LIMIT 1)
        FROM CUPTI_ACTIVITY_KIND_RUNTIME c JOIN StringIds n ON n.id = c.nameId
        WHERE n.value LIKE 'cudaGraphLaunch%'"""))
    before_launch = {step_starts()[g["step_id"]] + round((g["at_ms"] + g["ms"]) * 1e6): g["next_kernel"]
                     for g in result["longest"] if g["next_call"] == "cudaGraphLaunch"}
    assert before_launch == first_kernel
