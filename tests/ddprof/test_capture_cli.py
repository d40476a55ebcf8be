"""`ddprof capture` refuses bad input with one line and exit code 2, before nsys starts, leaving no files."""

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddprof.capture import ENV_ALLOWLIST, allowlisted_env
from ddprof.report import PlainProgress, capture_progress
from engine.serve_defaults import (DEFAULT_BUDGET, DEFAULT_BUILDER, DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODEL,
                                   DEFAULT_REQUESTS, DEFAULT_SEED)


def ddprof(*args, env=None):
    return subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300)


@pytest.mark.parametrize("args, message", [
    (["--workload", "nope"], "ddprof: error: unknown workload 'nope'; choose one of chat, code, long-context, fixed"),
    (["--workload", "chat", "--model", "huge"], "ddprof: error: unknown model preset 'huge'; choose one of tiny, small"),
    (["--workload", "chat", "--concurrency", "0"], "ddprof: error: --concurrency must be at least 1 (got 0)"),
    (["--workload", "chat", "--builder", "fpga"], "ddprof: error: unknown tree builder 'fpga'; choose cpu or gpu"),
    (["--workload", "long-context", "--model", "tiny"], "ddprof: error: the longest request of workload long-context needs"),
    (["--workload", "chat", "--requests", "1000000000"], "ddprof: error: --requests 1,000,000,000: the chat workload's "
                                                         "prompts (up to 512 tokens each) could need"),
    (["--workload", "chat", "--timeout", "nan"], "ddprof: error: --timeout must be a positive, finite number"),
    (["--workload", "chat", "--timeout", "inf"], "ddprof: error: --timeout must be a positive, finite number"),
    (["--workload", "chat", "--concurrency", "many"], "ddprof: error: Invalid value for '--concurrency': "),
    (["--workload", "chat", "--no-such-option"], "ddprof: error: No such option: --no-such-option"),
])
def test_bad_arguments_are_one_line_errors_and_leave_no_files(tmp_path, args, message):
    done = ddprof("capture", *args, "--out", str(tmp_path / "new" / "folders" / "run"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr  # usage errors too: no usage text
    assert done.stderr.startswith(message)
    assert "Traceback" not in done.stderr + done.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out", ["", "/", "."])
def test_an_output_that_names_no_file_is_refused_before_anything_runs(tmp_path, out):
    done = subprocess.run([sys.executable, "-c", "from ddprof.cli import main; main()", "capture", "--workload", "chat",
                           "--out", out], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--out must name the capture's files" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_missing_nsys_says_how_to_install_it(tmp_path):
    done = ddprof("capture", "--workload", "chat", "--out", str(tmp_path / "run"), env={"NSYS": "/nonexistent/nsys"})
    assert done.returncode == 2
    assert "not a working nsys binary; install it with `bash scripts/install-nsys.sh`" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_output_folder_that_cannot_be_created_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the output folder should go")
    done = ddprof("capture", "--workload", "chat", "--out", str(blocker / "traces" / "run"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"ddprof: error: {blocker / 'traces'}: cannot create output folder (Not a directory)"


def test_the_allowlist_keeps_what_the_engine_needs_and_nothing_else():
    caller = {"PATH": "/usr/bin", "HOME": "/root", "TRITON_INTERPRET": "1", "AWS_SECRET_ACCESS_KEY": "x",
              "GITHUB_TOKEN": "y", "HF_TOKEN": "z"}
    assert allowlisted_env(caller) == {"PATH": "/usr/bin", "HOME": "/root", "TRITON_INTERPRET": "1"}
    assert not any("TOKEN" in name or "KEY" in name or "SECRET" in name for name in ENV_ALLOWLIST)


def test_plain_progress_lines_name_each_phase_and_repeat_a_count_at_most_every_interval():
    """What a piped `ddprof capture` writes to stderr instead of a bar (a fake clock, no sleeping)."""
    lines, now = io.StringIO(), [0.0]
    progress = PlainProgress(counts=True, every_s=10, stream=lines, clock=lambda: now[0])
    on_progress = capture_progress(progress, progress.add_task("capture: checking the arguments"), lambda: "capture")
    assert lines.getvalue() == ""  # nothing before the first phase: an argument error stays the only line
    for at, phase, done, total in ((1, "starting nsys", None, None), (4, "loading the model", None, None),
                                   (9, "serving", 0, 8), (12, "serving", 3, 8), (20, "serving", 5, 8),
                                   (25, "serving", 8, 8), (26, "exporting the SQLite", None, None)):
        now[0] = at
        on_progress(phase, done, total)
    assert lines.getvalue().splitlines() == [
        "[   1.0 s] capture: starting nsys", "[   4.0 s] capture: loading the model",
        "[   9.0 s] capture: serving, requests done 0/8", "[  20.0 s] capture: serving, requests done 5/8",
        "[  26.0 s] capture: exporting the SQLite"]


def test_help_shows_the_engines_real_defaults_and_no_type_on_flags():
    done = ddprof("capture", "--help")
    assert done.returncode == 0
    for option, value in (("--model", DEFAULT_MODEL), ("--builder", DEFAULT_BUILDER), ("--budget", DEFAULT_BUDGET),
                          ("--requests", DEFAULT_REQUESTS), ("--max-new-tokens", DEFAULT_MAX_NEW_TOKENS),
                          ("--seed", DEFAULT_SEED)):
        text = " ".join(done.stdout.split())  # the help wraps at 80 columns
        assert re.search(rf"{option} <\w+> [^<]*\(default: {value}\)", text), (option, text)
    assert "the engine's" not in done.stdout and "<bool>" not in done.stdout
    sweep = ddprof("sweep", "--help")
    assert "(default: 1,2,4 on a CPU; 1,8,32 on a GPU)" in " ".join(sweep.stdout.split()) and "<bool>" not in sweep.stdout


@pytest.mark.parametrize("field,flag", [("batch_invariant", "batch-invariant"), ("cuda_graphs", "cuda-graphs"),
                                        ("overlap", "overlap")])
def test_capture_passes_its_switches_on_to_the_engine(tmp_path, field, flag):
    from ddprof.capture import CaptureRequest, serve_command

    def command(setting):
        request = CaptureRequest(workload="chat", concurrency=2, out=tmp_path / "run", **{field: setting})
        return serve_command(request, "cpu", tmp_path / "s.json", tmp_path / "p")

    assert f"--no-{flag}" in command(False) and f"--{flag}" in command(True)
    assert not any(flag in part for part in command(None))
