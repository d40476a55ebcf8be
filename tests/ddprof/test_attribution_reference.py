"""The fast attribution against a brute-force reference on random small exports.

The reference reads the SQLite file with plain sqlite3 and walks every nanosecond of every step in
plain Python, straight from the definitions in issue 4. It shares no code with ddprof. It walks
the nanoseconds a piece at a time (`pieces`), so that it also runs on a real export's milliseconds.
"""

import sqlite3
from collections import defaultdict

import numpy as np
import pytest

import ddprof.attribution as attribution_module
from ddprof.analysis import breakdown
from ddprof.attribution import attribute
from ddprof.load import load
from engine.stages import DOMAIN, STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import DTOH, HTOD, NAME_ENCODINGS, Export

SYNC = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}


def pieces(lo: int, hi: int, bounds) -> list[tuple[int, int]]:
    """[lo, hi) cut at every bound inside it, as (first ns, length): every test `a <= t < b` whose
    a and b are bounds has one answer over a piece, so a walk of the pieces, each weighed by its
    length, sums what a walk of every ns sums."""
    cuts = sorted({lo, hi, *(b for b in bounds if lo < b < hi)})
    return list(zip(cuts, [b - a for a, b in zip(cuts, cuts[1:])]))


def _api(name: str) -> str:
    for suffix in ("_v3020", "_v7000", "_v10000", "_ptsz"):
        name = name.replace(suffix, "")
    return name


def reference(path) -> dict:
    """steps, tokens, and per stage count/cpu/gpu/crit/wait in ns, and the GPU ops launched, the
    graph replays launched and the waiting calls made inside each stage's innermost range, by the
    definitions (a whole-graph record is GPU work of its launch, not an op)."""
    db = sqlite3.connect(path)
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    trace_end = db.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    events = db.execute("SELECT start, end, eventType, text, textId, domainId, globalTid, endGlobalTid, "
                        "int64Value, uint64Value FROM NVTX_EVENTS").fetchall()
    domains = {}
    for start, end, kind, text, text_id, domain_id, g, end_g, *payload in events:
        if kind == 75:
            domains[(g >> 24) & 0xFFFFFF, domain_id] = text
    ranges, tokens = [], 0
    for start, end, kind, text, text_id, domain_id, g, end_g, i64, u64 in events:
        pid, tid = (g >> 24) & 0xFFFFFF, g & 0xFFFFFF
        name = text if text is not None else strings.get(text_id)
        if domains.get((pid, domain_id)) != DOMAIN:
            continue
        if kind == 34 and name == TOKENS_MARK:
            tokens += i64 if i64 is not None else u64
        if kind in (59, 60) and end is not None and end < trace_end and end_g in (None, g):
            ranges.append(dict(name=name, pid=pid, tid=tid, start=start, end=end))
    steps = [r for r in ranges if r["name"] == STEP]
    stages = [r for r in ranges if r["name"] in STAGES and any(
        s["pid"] == r["pid"] and s["tid"] == r["tid"] and s["start"] <= r["start"] and r["end"] <= s["end"]
        for s in steps)]

    runtime = {}
    for start, end, g, corr, name_id in db.execute(
            "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables else "SELECT 1, 1, 1, 1, 1 WHERE 0"):
        runtime[(g >> 24) & 0xFFFFFF, corr] = dict(tid=g & 0xFFFFFF, start=start, end=end, api=_api(strings[name_id]))
    ops = []
    for table in ("KERNEL", "MEMCPY", "MEMSET", "GRAPH_TRACE"):
        if f"CUPTI_ACTIVITY_KIND_{table}" not in tables:
            continue
        extra = {"MEMCPY": ", copyKind, dstKind, graphNodeId", "GRAPH_TRACE": ", NULL, NULL, NULL"}.get(
            table, ", NULL, NULL, graphNodeId")
        for start, end, corr, gp, copy_kind, dst_kind, node in db.execute(
                f"SELECT start, end, correlationId, globalPid{extra} FROM CUPTI_ACTIVITY_KIND_{table}"):
            pid = (gp >> 24) & 0xFFFFFF
            launch = runtime.get((pid, corr))
            # device -> host copies block: always with cudaMemcpy, into pageable memory (0) with the async one
            if launch and copy_kind == DTOH and (launch["api"] == "cudaMemcpy"
                                                 or launch["api"] == "cudaMemcpyAsync" and dst_kind == 0):
                launch["blocking"] = True
            ops.append(dict(start=start, end=end, pid=pid, corr=corr, launch=launch, record=table == "GRAPH_TRACE",
                            graph=table == "GRAPH_TRACE" or node is not None))
    for op in ops:
        launch = op["launch"]
        around = [r for r in stages if launch and r["pid"] == op["pid"] and r["tid"] == launch["tid"]
                  and r["start"] <= launch["start"] < r["end"]]
        op["stages"] = {r["name"] for r in around}
        op["inner"] = max(around, key=lambda r: (r["start"], -r["end"]))["name"] if around else None

    result = {s: defaultdict(int) for s in (*STAGES, "other")}
    for op in ops:
        if op["inner"] and not op["record"]:
            result[op["inner"]]["ops"] += 1
    for inner in {(op["pid"], op["corr"]): op["inner"] for op in ops if op["graph"]}.values():
        if inner:
            result[inner]["graphs"] += 1
    for (pid, _), call in runtime.items():
        if call["api"] in SYNC or call.get("blocking"):
            around = [r for r in stages if (r["pid"], r["tid"]) == (pid, call["tid"])
                      and r["start"] <= call["start"] < r["end"]]
            if around:
                result[max(around, key=lambda r: (r["start"], -r["end"]))["name"]]["syncs"] += 1
    for r in stages:
        result[r["name"]]["count"] += 1
    # A stage's host time (and its wait) is every ns on a thread inside any of its ranges, once.
    for name, pid, tid in {(r["name"], r["pid"], r["tid"]) for r in stages}:
        mine = [r for r in stages if (r["name"], r["pid"], r["tid"]) == (name, pid, tid)]
        waits = [c for (p, _), c in runtime.items() if p == pid and c["tid"] == tid
                 and (c["api"] in SYNC or c.get("blocking"))]
        inside = [(t, n) for t, n in pieces(min(r["start"] for r in mine), max(r["end"] for r in mine),
                                            [x for r in (*mine, *waits) for x in (r["start"], r["end"])])
                  if any(r["start"] <= t < r["end"] for r in mine)]
        result[name]["cpu"] += sum(n for _, n in inside)
        result[name]["wait"] += sum(n for t, n in inside if any(c["start"] <= t < c["end"] for c in waits))
    for op in ops:
        for name in op["stages"]:
            result[name]["gpu"] += op["end"] - op["start"]
    for step in steps:
        mine = [r for r in stages if r["pid"] == step["pid"] and r["tid"] == step["tid"]]
        attributed = [op for op in ops if op["pid"] == step["pid"] and op["inner"]
                      and op["start"] < step["end"] and op["end"] > step["start"]]
        bounds = [x for r in (*mine, *attributed) for x in (r["start"], r["end"])]
        for t, n in pieces(step["start"], step["end"], bounds):
            running = [op for op in attributed if op["start"] <= t < op["end"]]
            if running:
                owner = min(running, key=lambda op: (op["launch"]["start"], op["corr"], op["start"]))["inner"]
            else:
                covering = [r for r in mine if r["start"] <= t < r["end"]]
                owner = max(covering, key=lambda r: (r["start"], -r["end"]))["name"] if covering else "other"
            result[owner]["crit"] += n
    return dict(steps=len(steps), tokens=tokens, stages=result,
                step_ns=sum(s["end"] - s["start"] for s in steps),
                wall_ns=max(s["end"] for s in steps) - min(s["start"] for s in steps))


def random_export(rng: np.random.Generator, schema: str, names: str = "registered", graphs: str | None = None
                  ) -> Export:
    """1-2 processes, 1-2 threads each, a few steps of overlapping and nested stage ranges (at least
    one inside each step, others across its start or end, which --drop-incomplete leaves out), CCCL
    ranges with stage names, GPU ops launched inside and outside stages and running into later
    steps, sync calls and blocking copies, token marks in and out of the domain; with `graphs` (a
    GRAPH_MODES mode) also CUDA graph replays recorded that way, whose nodes run up to a few steps
    after their launch (the host running ahead), overlapping each other and the eager ops."""
    export = Export(schema, names)
    used = set()  # (pid, tid, start, end) of stage ranges: exact duplicates would tie

    for pid in range(1, rng.integers(1, 3) + 1):
        for domain in rng.permutation([DOMAIN, "CCCL"]):  # domain ids differ between processes
            export.declare_domain(str(domain), pid=pid)
        for tid in range(pid * 10, pid * 10 + rng.integers(1, 3)):
            t = int(rng.integers(0, 30))
            for _ in range(rng.integers(1, 4)):
                length = int(rng.integers(15, 70))
                export.range(STEP, t, t + length, pid=pid, tid=tid, start_end=bool(rng.integers(0, 2)))
                start = t + int(rng.integers(0, length))  # every step holds a stage range
                used.add((pid, tid, start, end := start + int(rng.integers(0, t + length - start + 1))))
                export.range(str(rng.choice(STAGES)), start, end, pid=pid, tid=tid)
                for _ in range(rng.integers(0, 6)):
                    start = t + int(rng.integers(-4, length))
                    end = start + int(rng.integers(0, 30))
                    if (pid, tid, start, end) in used:
                        continue
                    used.add((pid, tid, start, end))
                    export.range(str(rng.choice(STAGES)), start, end, pid=pid, tid=tid)
                if rng.integers(0, 2):
                    start = t + int(rng.integers(0, length))
                    export.range(str(rng.choice(STAGES)), start, start + 5, domain="CCCL", pid=pid, tid=tid)
                for _ in range(rng.integers(0, 5)):
                    launch = t + int(rng.integers(-3, length + 3))
                    start = launch + int(rng.integers(1, 25))
                    span = (start, start + int(rng.integers(1, 30)))
                    kind = rng.integers(0, 4)
                    if kind == 0:
                        export.kernel(*span, launch=(launch, launch + 2), pid=pid, tid=tid)
                    elif kind == 1:
                        export.memcpy(*span, launch=(launch, span[1] + 1), pid=pid, tid=tid,
                                      api=str(rng.choice(["cudaMemcpy_v3020", "cudaMemcpyAsync_v3020"])),
                                      copy_kind=int(rng.choice([DTOH, HTOD])), dst_kind=int(rng.choice([0, 1])))
                    elif kind == 2:
                        export.memset(*span, launch=(launch, launch + 1), pid=pid, tid=tid)
                    else:
                        export.kernel(*span, launch=None, pid=pid, tid=tid)
                for _ in range(rng.integers(0, 4) if graphs else 0):
                    launch = t + int(rng.integers(-3, length + 3))
                    first = launch + int(rng.integers(1, 120))
                    nodes = []
                    for _ in range(rng.integers(1, 5)):
                        start = first + int(rng.integers(0, 20))
                        nodes.append((start, start + int(rng.integers(1, 25)),
                                      str(rng.choice(["kernel", "kernel", "memcpy", "memset"]))))
                    export.graph_launch((launch, launch + 3), nodes, mode=graphs, graph=int(rng.integers(1, 4)),
                                        pid=pid, tid=tid)
                if rng.integers(0, 2):
                    start = t + int(rng.integers(0, length))
                    export.runtime_call("cudaStreamSynchronize_v3020", start, start + int(rng.integers(1, 15)),
                                        pid=pid, tid=tid)
                export.mark(TOKENS_MARK, t + length, int(rng.integers(1, 9)), pid=pid, tid=tid)
                if rng.integers(0, 3) == 0:
                    export.mark(TOKENS_MARK, t + length, 1000, domain="CCCL", pid=pid, tid=tid)
                t += length + int(rng.integers(0, 12))
    return export


def _check_against_reference(path) -> None:
    expected = reference(path)
    attribution = attribute(load(path), drop_incomplete=True)  # stage ranges across a step's bounds
    summary = breakdown(attribution)
    assert summary["steps"] == expected["steps"]
    assert summary["tokens"] == expected["tokens"]
    assert summary["wall_s"] * 1e9 == pytest.approx(expected["wall_ns"])
    totals = attribution.per_step.group_by("owner").sum()
    got = {row["owner"]: row for row in totals.iter_rows(named=True)}
    for owner, want in expected["stages"].items():
        assert got[owner]["crit_ns"] == want["crit"], owner
        assert got[owner]["cpu_ns"] == want["cpu"], owner
        assert got[owner]["count"] == want["count"], owner
        assert got[owner]["gpu_ns"] == want["gpu"], owner
        assert got[owner]["wait_ns"] == want["wait"], owner
        assert got[owner]["gpu_ops"] == want["ops"], owner
        assert got[owner]["graph_launches"] == want["graphs"], owner
        assert got[owner]["sync_calls"] == want["syncs"], owner
    shares = [s["crit_share"] for s in summary["stages"]] + [summary["other_crit_share"]]
    assert sum(shares) == pytest.approx(1.0)
    assert sum(w["crit"] for w in expected["stages"].values()) == expected["step_ns"]


@pytest.mark.parametrize("seed", range(6))
def test_every_name_encoding_gives_the_breakdown_of_registered_names(seed, tmp_path):
    """The same random trace written with registered, inline and mixed names (nsys writes each,
    by how the application names its ranges): one breakdown, one per-step table."""
    results = {}
    for names in NAME_ENCODINGS:
        path = random_export(np.random.default_rng(seed), "2025.3" if seed % 2 else "2022.4", names).write(
            tmp_path / f"{names}.sqlite")
        attribution = attribute(load(path), drop_incomplete=True)
        results[names] = ({**breakdown(attribution), "source": None}, attribution.per_step)
    (summary, per_step), *others = results.values()
    assert summary["steps"] > 0
    for other_summary, other_per_step in others:
        assert other_summary == summary and other_per_step.equals(per_step)


@pytest.mark.parametrize("seed", range(40))
def test_fast_attribution_matches_brute_force_on_random_exports(seed, tmp_path):
    rng = np.random.default_rng(seed)
    path = random_export(rng, "2025.3" if seed % 2 else "2022.4").write(tmp_path / "random.sqlite")
    _check_against_reference(path)


@pytest.mark.parametrize("schema, graphs", [("2022.4", "node"), ("2025.3", "node"), ("2025.3", "graph")])
@pytest.mark.parametrize("seed", range(15))
def test_fast_attribution_matches_brute_force_with_graph_replays(seed, schema, graphs, tmp_path):
    """Graph replays as nsys records them in either mode and schema (2022.4 exports no whole-graph
    records), their GPU work running steps after the launch."""
    path = random_export(np.random.default_rng(seed), schema, graphs=graphs).write(tmp_path / "random.sqlite")
    _check_against_reference(path)


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("seed", range(20))
def test_walking_in_small_windows_changes_nothing(seed, window, tmp_path, monkeypatch):
    """The attribution walks each thread's steps in windows of about `_WINDOW_RANGES` stage
    ranges; windows of one or two ranges cut between almost every step, with ops running on
    from one window into the next."""
    monkeypatch.setattr(attribution_module, "_WINDOW_RANGES", window)
    rng = np.random.default_rng(seed)
    schema = "2025.3" if seed % 2 else "2022.4"
    graphs = (None, "node", "graph" if schema == "2025.3" else "node")[seed % 3]  # graph work running windows later
    path = random_export(rng, schema, graphs=graphs).write(tmp_path / "random.sqlite")
    _check_against_reference(path)


def test_reference_itself_on_a_known_answer(tmp_path):
    """The reference must agree with a hand computation, or the random test proves nothing."""
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 0, 30)
    export.range("verify", 30, 90)
    export.kernel(10, 60, launch=(5, 8))  # draft's kernel runs on into verify
    export.kernel(60, 80, launch=(35, 36))
    export.mark(TOKENS_MARK, 100, 4)
    expected = reference(export.write(tmp_path / "known.sqlite"))
    crit = {owner: dict(v).get("crit", 0) for owner, v in expected["stages"].items()}
    assert crit == {"draft": 60, "verify": 30, "other": 10, "tree_build": 0, "accept": 0, "kv_compact": 0,
                    "sampling": 0}
    assert expected["tokens"] == 4 and expected["steps"] == 1
