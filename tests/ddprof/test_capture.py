"""`ddprof capture` for real: the tiny model serving a few chat requests under nsys.

The export is read with sqlite3 directly, so these tests check the capture, not ddprof.load.
"""

import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid

import pytest

from ddprof.capture import PHASES, SERVING, CaptureRequest, _count_steps, capture
from ddprof.errors import DdprofError
from engine.serve_defaults import DEFAULT_PREFILL_TOKENS
from engine.stages import DOMAIN, PREFILL, RANK_MARK, STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export

PUSH_POP_RANGE, MARK, DOMAIN_CREATE = 59, 34, 75
REQUESTS = 5
SECRET = f"ddprof-test-secret-{uuid.uuid4().hex}"
PATH_MARKER = f"/nonexistent/ddprof-path-marker-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One capture, made from a shell that holds a secret (and a marked PATH, which must get through)."""
    out_dir = tmp_path_factory.mktemp("capture")
    progress = []
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DDPROF_TEST_TOKEN", SECRET)
        env.setenv("PATH", f"{PATH_MARKER}:{os.environ['PATH']}")
        # `--out X.nsys-rep` names the capture X, like `--out X`
        result = capture(CaptureRequest(workload="chat", concurrency=4, out=out_dir / "run.nsys-rep", model="tiny",
                                        requests=REQUESTS, max_new_tokens=32, seed=3),
                         on_progress=lambda phase, done, total: progress.append((phase, done, total)))
    return out_dir, result, progress


def _events(sqlite_path):
    with sqlite3.connect(sqlite_path) as db:
        domains = dict(db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = ?", (DOMAIN_CREATE,)))
        rows = db.execute(
            "SELECT e.start, e.end, coalesce(e.text, s.value), e.domainId, e.globalTid, e.int64Value, e.eventType "
            "FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN (?, ?) "
            "ORDER BY e.start", (PUSH_POP_RANGE, MARK)).fetchall()
    return [dict(start=s, end=e, name=n, domain=domains.get(d), tid=g, payload=p, kind=k)
            for s, e, n, d, g, p, k in rows]


def test_capture_writes_the_three_files_and_nothing_else(run):
    out_dir, result, _ = run
    assert sorted(p.name for p in out_dir.iterdir()) == ["run.json", "run.nsys-rep", "run.sqlite"]
    assert (result.report, result.sqlite, result.json_path) == (
        out_dir / "run.nsys-rep", out_dir / "run.sqlite", out_dir / "run.json")
    assert all(p.stat().st_size > 0 for p in out_dir.iterdir())


def test_json_holds_the_run_metadata(run):
    _, result, _ = run
    meta = json.loads(result.json_path.read_text())
    assert meta == result.meta
    assert {k: meta[k] for k in ("model", "workload", "concurrency", "builder", "seed", "requests")} == dict(
        model="tiny", workload="chat", concurrency=4, builder="cpu", seed=3, requests=REQUESTS)
    assert meta["budget"] >= 1 and meta["device"].startswith("cpu")
    assert meta["generated_tokens"] == meta["tokens"] + meta["first_tokens"]
    assert meta["first_tokens"] == REQUESTS and meta["generated_tokens"] <= REQUESTS * 32
    assert meta["slots"] == min(4, REQUESTS)
    # both from one clock reading: wall_s keeps microseconds (rounded to ms, a short run's tok/s was 4% off)
    assert meta["wall_s"] > 0 and meta["tok_per_s"] == pytest.approx(meta["generated_tokens"] / meta["wall_s"], rel=1e-4)
    assert set(meta["versions"]) >= {"nsys", "torch", "triton", "ddprof"}
    assert meta["versions"]["nsys"].startswith("20")


def test_every_step_range_holds_the_six_stage_ranges(run):
    _, result, _ = run
    events = [e for e in _events(result.sqlite) if e["domain"] == DOMAIN]
    ranges = [e for e in events if e["kind"] == PUSH_POP_RANGE]
    steps = [r for r in ranges if r["name"] == STEP]
    assert len(steps) == result.meta["steps"] == result.meta["trace_steps"] > 0
    # One range per prefill forward: the default budget batches the requests admitted together.
    assert len([r for r in ranges if r["name"] == PREFILL]) == result.meta["prefills"] < REQUESTS
    for step in steps:
        inside = {r["name"] for r in ranges if r["tid"] == step["tid"] and r is not step
                  and step["start"] <= r["start"] and r["end"] <= step["end"]}
        assert inside == set(STAGES)


def test_tokens_marks_sum_to_the_tokens_in_the_json(run):
    _, result, _ = run
    marks = [e for e in _events(result.sqlite) if e["kind"] == MARK and e["domain"] == DOMAIN]
    assert {m["name"] for m in marks} == {TOKENS_MARK, RANK_MARK}
    assert [m["payload"] for m in marks if m["name"] == RANK_MARK] == [0]  # one process: rank 0
    marks = [m for m in marks if m["name"] == TOKENS_MARK]
    assert len(marks) == result.meta["steps"]
    assert sum(m["payload"] for m in marks) == result.meta["tokens"] > 0


def test_no_secret_from_the_callers_environment_lands_in_the_trace(run):
    _, result, _ = run
    for path in (result.report, result.sqlite):
        data = path.read_bytes()
        assert PATH_MARKER.encode() in data  # the environment is stored: allowlisted PATH got through
        assert SECRET.encode() not in data and b"DDPROF_TEST_TOKEN" not in data


def test_progress_names_each_phase_and_counts_requests_up_to_the_total(run):
    _, _, progress = run
    phases = [phase for phase, _, _ in progress]
    # each phase once, in order (loading is short on the tiny model, but the engine writes it before any request)
    assert list(dict.fromkeys(phases)) == list(PHASES)
    assert phases == sorted(phases, key=PHASES.index)  # nsys writes its report after the last request
    serving = [(done, total) for phase, done, total in progress if phase == SERVING]
    assert serving[0] == (0, REQUESTS) and serving[-1] == (REQUESTS, REQUESTS)
    assert [done for done, _ in serving] == sorted(done for done, _ in serving)
    assert all(done is None and total is None for phase, done, total in progress if phase != SERVING)


def test_a_capture_that_times_out_leaves_no_files(tmp_path):
    with pytest.raises(DdprofError, match="timed out"):
        capture(CaptureRequest(workload="chat", concurrency=4, out=tmp_path / "run", model="tiny", requests=3,
                               timeout_s=1))
    assert list(tmp_path.iterdir()) == []


def test_a_run_too_short_to_decode_says_so_and_leaves_no_files(tmp_path):
    with pytest.raises(DdprofError, match="the engine ran no decode step") as error:
        capture(CaptureRequest(workload="chat", concurrency=1, out=tmp_path / "run", model="tiny", requests=1,
                               max_new_tokens=4))
    assert list(tmp_path.iterdir()) == []
    assert str(error.value).startswith(f"{tmp_path / 'run.sqlite'}: ")  # the capture asked for, not its staging


def test_only_the_engines_step_ranges_are_counted(tmp_path):
    """A profiled program may use `step` in its own NVTX domain (or none): the capture's count is the
    one every analysis makes, the engine's domain only."""
    export = Export()
    for n in range(3):
        export.range(STEP, 100 * n, 100 * n + 50)
    export.range(STEP, 0, 10, domain="someone-else")
    export.range(STEP, 0, 10, domain=None)
    assert _count_steps(export.write(tmp_path / "run.sqlite"), engine_steps=3) == 3


def test_the_cli_prints_how_the_run_ran(tmp_path):
    """The table after a capture says how the steps ran (graphs, overlap, prefill batches), beside
    what they produced: the same values as the JSON."""
    done = subprocess.run([sys.executable, "-m", "ddprof", "capture", "--workload", "chat", "--concurrency", "4",
                           "--model", "tiny", "--requests", "4", "--max-new-tokens", "6",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "run.json").read_text())
    rows = dict(re.findall(r"│ (\w+)\s+│ (.*?)\s+│", done.stdout))
    for key in ("cuda_graphs", "overlap", "prefill_token_budget", "prefills", "generated_tokens", "steps"):
        assert rows[key] == str(meta[key]), key
    assert rows["cuda_graphs"] in ("True", "False") and rows["prefill_token_budget"] == str(DEFAULT_PREFILL_TOKENS)
