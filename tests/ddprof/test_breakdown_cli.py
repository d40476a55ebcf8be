"""`ddprof breakdown` as a user runs it: the --json shape, the table, --parquet, --stage-map, errors."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from engine.stages import PREFILL, STAGES, STEP, TOKENS_MARK
from tests.ddprof.exports import Export, example
from tests.ddprof.test_attribution_stage_map import SGLANG_TOML, sglang_like

ROOT = Path(__file__).resolve().parents[2]


def ddprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return example("2022.4").write(tmp_path_factory.mktemp("cli") / "run.sqlite")


def test_json_is_exactly_one_object_of_the_documented_shape(export):
    done = ddprof("breakdown", export, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # one object, nothing else on stdout
    top = {"steps": int, "tokens": int, "wall_s": float, "tok_per_s": float, "bound_by": str,
           "other_crit_ms": float, "stages": list}
    for key, kind in top.items():
        assert type(summary[key]) is kind, key
    assert [s["stage"] for s in summary["stages"]] == list(STAGES)
    stage = {"stage": str, "count": int, "cpu_ms": float, "cpu_share": float, "gpu_ms": float, "crit_ms": float,
             "crit_share": float, "gpu_ops": int, "sync_calls": int}
    for row in summary["stages"]:
        for key, kind in stage.items():
            assert type(row[key]) is kind, key
    # The example's answers (tests/ddprof/exports.py `example`): two 800 ns steps, 15 tokens.
    assert (summary["steps"], summary["tokens"], summary["bound_by"]) == (2, 15, "draft")
    assert summary["wall_s"] == pytest.approx(1800e-9)
    crit = {s["stage"]: round(s["crit_ms"] * 1e6) for s in summary["stages"]}
    assert crit == {"draft": 300, "tree_build": 80, "verify": 180, "accept": 180, "kv_compact": 180,
                    "sampling": 180}
    assert round(summary["other_crit_ms"] * 1e6) == 500
    # Per step: draft launches a kernel, accept a blocking D2H copy (an op and a wait), kv_compact a
    # memset; sampling calls cudaStreamSynchronize.
    calls = {s["stage"]: (s["gpu_ops"], s["sync_calls"]) for s in summary["stages"]}
    assert calls == {"draft": (2, 0), "tree_build": (0, 0), "verify": (0, 0), "accept": (2, 2), "kv_compact": (2, 0),
                     "sampling": (0, 2)}


def test_table_names_the_bound_stage_and_every_stage(export):
    done = ddprof("breakdown", export)
    assert done.returncode == 0, done.stderr
    assert "bound by draft" in done.stdout
    for name in (*STAGES, "other"):
        assert name in done.stdout


def test_parquet_writes_the_frames(export, tmp_path):
    done = ddprof("breakdown", export, "--json", "--parquet", tmp_path / "frames")
    assert done.returncode == 0, done.stderr
    stages = pl.read_parquet(tmp_path / "frames" / "stages.parquet")
    assert stages["stage"].to_list() == list(STAGES)
    owners = pl.read_parquet(tmp_path / "frames" / "step_owners.parquet")
    assert owners.height == 2 * (len(STAGES) + 1)
    assert owners.group_by("step_id").agg(pl.col("crit_ns").sum())["crit_ns"].to_list() == [800, 800]
    ops = pl.read_parquet(tmp_path / "frames" / "gpu_ops.parquet")
    assert ops["stage"].to_list() == ["draft", "accept", "kv_compact"] * 2
    for name in ("ranges", "marks", "steps", "stage_ranges", "runtime_calls", "incomplete_ranges"):
        assert (tmp_path / "frames" / f"{name}.parquet").is_file()


def test_a_failed_parquet_write_leaves_no_partial_set(export, tmp_path):
    frames = tmp_path / "frames"
    (frames / "steps.parquet").mkdir(parents=True)  # one of the files cannot be written
    done = ddprof("breakdown", export, "--parquet", frames)
    assert done.returncode == 2 and "cannot write the parquet files" in done.stderr
    assert [p.name for p in frames.iterdir()] == ["steps.parquet"]  # the others it wrote are gone


def test_parquet_stages_of_host_only_and_gpu_runs_concatenate(export, tmp_path):
    host_only = Export()
    host_only.range(STEP, 0, 100)
    host_only.range("verify", 10, 60)
    host_only.mark(TOKENS_MARK, 100, 2)
    for name, path in (("gpu", export), ("host", host_only.write(tmp_path / "host.sqlite"))):
        assert ddprof("breakdown", path, "--json", "--parquet", tmp_path / name).returncode == 0
    frames = [pl.read_parquet(tmp_path / name / "stages.parquet") for name in ("gpu", "host")]
    assert frames[1]["gpu_ms"].dtype == pl.Float64 and frames[1]["gpu_ms"].null_count() == len(STAGES)
    assert pl.concat(frames).height == 2 * len(STAGES)  # a Null-typed column refused this before
    owners = [pl.read_parquet(tmp_path / name / "step_owners.parquet") for name in ("gpu", "host")]
    for column in ("wait_ns", "gpu_ns", "crit_gpu_ns", "gpu_ops", "sync_calls"):  # unknown without GPU tracing
        assert owners[1][column].null_count() == owners[1].height and owners[0][column].null_count() == 0
    assert pl.concat(owners).height == owners[0].height + owners[1].height


def test_stage_map_option(tmp_path):
    path = sglang_like().write(tmp_path / "sglang.sqlite")
    (tmp_path / "sglang.toml").write_text(SGLANG_TOML)
    failed = ddprof("breakdown", path, "--json")
    assert failed.returncode == 2 and "--stage-map" in failed.stderr
    done = ddprof("breakdown", path, "--json", "--stage-map", tmp_path / "sglang.toml")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 2


def _bad_inputs(folder: Path, good: Path) -> dict[str, tuple[list, Path]]:
    """Each bad case: the arguments after `breakdown`, and the file the error must name."""
    (folder / "notes.sqlite").write_text("not a database")
    (folder / "map.toml").write_text("[ranges]\nfwd = 'forward'")
    with sqlite3.connect(folder / "empty.sqlite") as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    unclosed = Export()
    unclosed.range(STEP, 0, None)
    unclosed.write(folder / "unclosed.sqlite")
    unknown_stages = Export()  # steps, but every range inside them has a name no map knows
    unknown_stages.range(STEP, 0, 100)
    unknown_stages.range("forward", 10, 90)
    unknown_stages.mark(TOKENS_MARK, 100, 4)
    unknown_stages.write(folder / "unknown_stages.sqlite")
    negative = _one_step()
    negative.mark(TOKENS_MARK, 100, -5)
    negative.write(folder / "negative_tokens.sqlite")
    reversed_range = _one_step()
    reversed_range.range("verify", 80, 40)
    reversed_range.write(folder / "reversed.sqlite")
    good_bytes = good.read_bytes()
    (folder / "bad_text.sqlite").write_bytes(good_bytes)
    with sqlite3.connect(folder / "bad_text.sqlite") as db:  # a damaged string: not UTF-8
        db.execute("UPDATE StringIds SET value = CAST(x'ff41' AS TEXT) WHERE value = 'verify'")
    (folder / "map.json").write_bytes(b"\xff\xfe{}")
    return {
        "missing": ([folder / "missing.sqlite"], folder / "missing.sqlite"),
        "not_sqlite": ([folder / "notes.sqlite"], folder / "notes.sqlite"),
        "no_nvtx": ([folder / "empty.sqlite"], folder / "empty.sqlite"),
        "unclosed": ([folder / "unclosed.sqlite"], folder / "unclosed.sqlite"),
        "bad_map": ([good, "--stage-map", folder / "map.toml"], folder / "map.toml"),
        "parquet_is_a_file": ([good, "--parquet", folder / "notes.sqlite"], folder / "notes.sqlite"),
        "parquet_under_a_file": ([good, "--parquet", folder / "notes.sqlite" / "frames"],
                                 folder / "notes.sqlite" / "frames"),
        "unknown_stages": ([folder / "unknown_stages.sqlite"], folder / "unknown_stages.sqlite"),
        "negative_tokens": ([folder / "negative_tokens.sqlite"], folder / "negative_tokens.sqlite"),
        "range_ends_before_it_starts": ([folder / "reversed.sqlite"], folder / "reversed.sqlite"),
        "string_not_utf8": ([folder / "bad_text.sqlite"], folder / "bad_text.sqlite"),
        "map_not_utf8": ([good, "--stage-map", folder / "map.json"], folder / "map.json"),
    }


def _one_step() -> Export:
    export = Export()
    export.range(STEP, 0, 100)
    export.range("draft", 10, 90)
    return export


@pytest.mark.parametrize("case", ["missing", "not_sqlite", "no_nvtx", "unclosed", "bad_map", "parquet_is_a_file",
                                  "parquet_under_a_file", "unknown_stages", "negative_tokens",
                                  "range_ends_before_it_starts", "string_not_utf8", "map_not_utf8"])
def test_bad_input_is_one_line_exit_2_no_traceback(tmp_path, export, case):
    args, named = _bad_inputs(tmp_path, export)[case]
    done = ddprof("breakdown", *args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddprof: error: ") and "Traceback" not in done.stderr
    assert str(named) in lines[0]


def test_a_trace_without_token_marks_reports_tok_s_as_unknown_not_zero(tmp_path):
    path = _one_step().write(tmp_path / "no_tokens.sqlite")
    done = ddprof("breakdown", path, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tokens"] is None and summary["tok_per_s"] is None
    assert all(s["what_if"]["tok_per_s_if_free"] is None for s in summary["stages"])
    table = ddprof("breakdown", path)
    assert table.returncode == 0, table.stderr
    assert "n/a tokens" in table.stdout and "no token marks" in table.stdout


def test_doctor_reports_a_missing_nsys_and_still_lists_the_rest():
    done = subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", "doctor", "--json"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "NSYS": "/nonexistent/nsys"})
    assert done.returncode == 1
    facts = json.loads(done.stdout)
    assert facts["nsys"].startswith("missing: NSYS=/nonexistent/nsys") and facts["nsys_version"] is None
    assert facts["torch"] and facts["triton"]


def test_the_wall_tok_s_is_over_is_split_into_steps_prefill_and_the_rest(tmp_path):
    """Steps 0-100 and 150-250 (wall 250 ns); prefill 100-130 between them, and 240-260, which lies in
    a step and past the wall: only its 30 ns between steps count. The other 20 ns are the rest."""
    trace = Export()
    for start in (0, 150):
        trace.range(STEP, start, start + 100)
        trace.range("draft", start, start + 100)
        trace.mark(TOKENS_MARK, start + 99, 2)
    trace.range(PREFILL, 100, 130)
    trace.range(PREFILL, 240, 260)
    path = trace.write(tmp_path / "wall.sqlite")
    done = ddprof("breakdown", path, "--json")
    assert done.returncode == 0, done.stderr
    wall = json.loads(done.stdout)["wall"]
    assert wall["ms"] * 1e6 == pytest.approx(250)
    assert {key: round(wall[key]["ms"] * 1e6) for key in ("steps", "prefill", "between_steps")} == {
        "steps": 200, "prefill": 30, "between_steps": 20}
    assert wall["prefill"]["share"] == pytest.approx(30 / 250)
    table = ddprof("breakdown", path).stdout
    assert "tok/s = decode tokens / wall; the wall holds 80.0% decode steps, 12.0% prefill" in table
    for row in ("decode steps", "prefill (between steps)", "other between steps"):
        assert row in table


def test_another_engines_trace_has_no_prefill_row_value(tmp_path):
    path = sglang_like().write(tmp_path / "sglang.sqlite")
    (tmp_path / "map.toml").write_text(SGLANG_TOML)
    done = ddprof("breakdown", path, "--stage-map", tmp_path / "map.toml", "--json")
    assert done.returncode == 0, done.stderr
    wall = json.loads(done.stdout)["wall"]
    assert wall["prefill"] is None and wall["steps"]["ms"] + wall["between_steps"]["ms"] == pytest.approx(wall["ms"])
