"""The NVTX contract, checked on a real nsys capture of `python -m engine generate`."""

import sqlite3
import sys

import pytest

from ddprof.nsys import export_sqlite, profile
from engine.stages import DOMAIN, PREFILL, STAGES, STEP, TOKENS_MARK

PUSH_POP_RANGE, MARK, DOMAIN_CREATE = 59, 34, 75
MAX_NEW = 10


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("engine_nsys")
    command = [sys.executable, "-m", "engine", "generate", "--model", "tiny", "--mode", "ddtree", "--budget", "4",
               "--max-new-tokens", str(MAX_NEW), "--ignore-eos", "--prompt", "Hi", "--prompt", "A longer prompt",
               "--json"]
    report = profile(command, out / "run")
    with sqlite3.connect(export_sqlite(report)) as db:
        domains = dict(db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = ?", (DOMAIN_CREATE,)))
        rows = db.execute(
            "SELECT e.start, e.end, coalesce(e.text, s.value), e.domainId, e.globalTid, e.int64Value, e.eventType "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (?, ?) ORDER BY e.start",
            (PUSH_POP_RANGE, MARK)).fetchall()
    return [dict(start=s, end=e, name=n, domain=domains.get(d), tid=g, payload=p, kind=k)
            for s, e, n, d, g, p, k in rows]


def test_steps_hold_the_six_stages_then_a_tokens_mark(capture):
    assert {e["domain"] for e in capture} == {DOMAIN}
    ranges = [e for e in capture if e["kind"] == PUSH_POP_RANGE]
    marks = [e for e in capture if e["kind"] == MARK]
    assert {r["name"] for r in ranges} == {STEP, PREFILL, *STAGES}
    steps = [r for r in ranges if r["name"] == STEP]
    prefills = [r for r in ranges if r["name"] == PREFILL]
    assert len(prefills) == 2 and steps
    assert all(not (s["start"] <= p["start"] <= s["end"]) for p in prefills for s in steps)
    for step, following in zip(steps, steps[1:] + [None]):
        inside = [r for r in ranges if r["name"] in STAGES and step["start"] <= r["start"] <= step["end"]]
        assert [r["name"] for r in inside] == list(STAGES)
        assert all(r["end"] <= step["end"] and r["tid"] == step["tid"] for r in inside)
        mark = [m for m in marks if step["end"] <= m["start"] and (following is None or m["start"] <= following["start"])]
        assert len(mark) == 1 and mark[0]["name"] == TOKENS_MARK and mark[0]["payload"] >= 1
    assert len(marks) == len(steps) and all(m["name"] == TOKENS_MARK for m in marks)
    # Each request's first token comes from its prefill; the marks count all the others.
    assert sum(m["payload"] for m in marks) == 2 * (MAX_NEW - 1)
