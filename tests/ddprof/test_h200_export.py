"""breakdown on a real nsys 2025.3 export from the H200 (CUDA + NVTX), checked with plain SQL.

The fixture is the first six decode steps of `benchmarks/gpu_captures.sh` (model `small`, GPU
builder, concurrency 8), trimmed by time; every table and column is as nsys 2025.3 wrote it.
"""

import sqlite3
from pathlib import Path

import pytest

from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.load import load
from engine.stages import STAGES

EXPORT = Path(__file__).parents[1] / "data" / "h200_nsys2025_small_gpu_builder.sqlite"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
NAMED_RANGES = """
    SELECT n.start, n.end, n.globalTid, coalesce(n.text, s.value) AS name
    FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
    WHERE n.eventType = 59 AND n.domainId = (SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'ddtree')
"""


@pytest.fixture(scope="module")
def summary():
    return breakdown(attribute(load(EXPORT)))


def test_steps_and_tokens_match_sql(summary):
    with sqlite3.connect(EXPORT) as db:
        steps = db.execute(f"SELECT count(*) FROM ({NAMED_RANGES}) WHERE name = 'step'").fetchone()[0]
        tokens = db.execute("SELECT sum(n.int64Value) FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                            "WHERE n.eventType = 34 AND s.value = 'tokens'").fetchone()[0]
    assert summary["steps"] == steps == 6
    assert summary["tokens"] == tokens > 0


def test_gpu_ms_per_stage_matches_an_independent_sql_join(summary):
    """A GPU op belongs to the stage range (same thread) in which its launching runtime call started."""
    with sqlite3.connect(EXPORT) as db:
        ops = " UNION ALL ".join(f"SELECT start, end, correlationId, globalPid FROM {t}" for t in GPU_TABLES
                                 if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone())
        rows = db.execute(f"""
            SELECT r.name, sum(o.end - o.start)
            FROM ({ops}) o
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME c
              ON c.correlationId = o.correlationId AND (c.globalTid & -16777216) = o.globalPid
            JOIN ({NAMED_RANGES}) r
              ON r.globalTid = c.globalTid AND c.start >= r.start AND c.start < r.end
            WHERE r.name IN ({', '.join('?' * len(STAGES))})
            GROUP BY r.name""", STAGES).fetchall()
    expected = {name: ns / 1e6 for name, ns in rows}
    got = {s["stage"]: s["gpu_ms"] for s in summary["stages"]}
    assert set(expected) == set(STAGES)
    for stage in STAGES:
        assert got[stage] == pytest.approx(expected[stage], rel=1e-9), stage


def test_critical_path_shares_cover_every_step(summary):
    assert summary["gpu_activity"]
    shares = [s["crit_share"] for s in summary["stages"]] + [summary["other_crit_share"]]
    assert sum(shares) == pytest.approx(1.0)
    for stage in summary["stages"]:
        assert stage["count"] == summary["steps"]
        assert stage["crit_ms"] > 0 and stage["wait_ms"] <= stage["cpu_ms"]


def test_async_copies_into_pageable_memory_block_the_host():
    """Why ddprof counts them as waiting on the GPU (attribution.ASYNC_COPY_APIS): in this real
    capture every cudaMemcpyAsync device -> pageable host returns only after its copy has ended,
    while most into pinned memory return before."""
    with sqlite3.connect(EXPORT) as db:
        rows = db.execute(
            "SELECT m.dstKind, count(*), sum(r.end >= m.end) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId) JOIN StringIds s ON s.id = r.nameId "
            "WHERE m.copyKind = 2 AND s.value LIKE 'cudaMemcpyAsync%' GROUP BY m.dstKind").fetchall()
    by_kind = {kind: (calls, returned_after) for kind, calls, returned_after in rows}
    pageable, pinned = by_kind[0], by_kind[1]  # ENUM_CUDA_MEM_KIND
    assert pageable[0] > 0 and pageable[1] == pageable[0]
    assert pinned[1] < pinned[0] / 2
