"""The NVTX contract, checked on a real nsys capture of `python -m engine generate`."""

import sqlite3
import sys

import pytest

from ddprof.nsys import export_sqlite, profile
from engine.stages import DOMAIN, PREFILL, STAGES, STEP, TOKENS_MARK

PUSH_POP_RANGE, MARK, DOMAIN_CREATE = 59, 34, 75
MAX_NEW = 10


def nvtx_events(folder, *flags: str) -> list[dict]:
    """The NVTX ranges and marks of a real nsys capture of two generate requests."""
    tree = [] if "ar" in flags else ["--budget", "4"]
    command = [sys.executable, "-m", "engine", "generate", "--model", "tiny", *tree, "--max-new-tokens",
               str(MAX_NEW), "--ignore-eos", "--prompt", "Hi", "--prompt", "A longer prompt", "--json", *flags]
    report = profile(command, folder / "run")
    with sqlite3.connect(export_sqlite(report)) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "NVTX_EVENTS" not in tables:  # nsys creates the table only when something was emitted
            return []
        domains = dict(db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = ?", (DOMAIN_CREATE,)))
        rows = db.execute(
            "SELECT e.start, e.end, coalesce(e.text, s.value), e.domainId, e.globalTid, e.int64Value, e.eventType "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (?, ?) ORDER BY e.start",
            (PUSH_POP_RANGE, MARK)).fetchall()
    return [dict(start=s, end=e, name=n, domain=domains.get(d), tid=g, payload=p, kind=k)
            for s, e, n, d, g, p, k in rows]


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    return nvtx_events(tmp_path_factory.mktemp("engine_nsys"), "--mode", "ddtree")


def engine_events(events: list[dict]) -> list[dict]:
    """The engine's own events; on CUDA, torch's CUB kernels add ranges of their own ("CCCL" domain)."""
    return [e for e in events if e["domain"] == DOMAIN]


def test_steps_hold_the_six_stages_then_a_tokens_mark(capture):
    names = {STEP, PREFILL, *STAGES, TOKENS_MARK}
    assert all(e["domain"] == DOMAIN for e in capture if e["name"] in names)
    ours = engine_events(capture)
    ranges = [e for e in ours if e["kind"] == PUSH_POP_RANGE]
    marks = [e for e in ours if e["kind"] == MARK]
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


def test_ar_steps_hold_verify_then_sampling(tmp_path):
    events = engine_events(nvtx_events(tmp_path, "--mode", "ar"))
    ranges = [e for e in events if e["kind"] == PUSH_POP_RANGE]
    steps = [r for r in ranges if r["name"] == STEP]
    assert len(steps) == MAX_NEW - 1  # one token per step after the prefill's, both requests in each step
    for step in steps:
        inside = [r["name"] for r in ranges if r["name"] in STAGES and step["start"] <= r["start"] <= step["end"]]
        assert inside == ["verify", "sampling"]
    assert sum(e["payload"] for e in events if e["kind"] == MARK) == 2 * (MAX_NEW - 1)


def test_no_nvtx_emits_nothing(tmp_path):
    assert engine_events(nvtx_events(tmp_path, "--no-nvtx")) == []
