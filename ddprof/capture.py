"""Run the engine's serving loop under Nsight Systems and leave a complete, shareable capture.

A capture is three files side by side: `NAME.nsys-rep` (the report), `NAME.sqlite` (exported at
once, so any nsys version can read the trace later) and `NAME.json` (what ran and how fast). They
are built in a hidden staging folder next to the destination and moved into place only when all
three exist, so a failed capture never leaves files that look complete.

nsys stores the profiled process's whole environment and its stdout inside the report, so the
engine runs with an allowlisted environment and reports progress through a file, not stdout.
Progress comes in named phases (PHASES): nsys starting (and Python importing torch under it), the
engine loading its model and warming up, serving (requests done of total), nsys writing its report
once the last request is done, exporting the SQLite.

Without CUDA the GPU builder's Triton kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set
for the engine only): real, but far slower than on a GPU; the summary's device says `cpu`, and
every page and comparison of such a run says its tree_build times are interpreter times.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ddprof import __version__
from ddprof.errors import DdprofError
from ddprof.export_db import ExportDb
from ddprof.load import load
from ddprof.nsys import Nsys, export_sqlite, find_nsys, profile
from ddprof.process_group import deferred, handle_signals, run_owned
from engine.stages import DOMAIN, STEP

# The variables the profiled engine (and nsys itself) may see. Everything else in the caller's
# shell -- tokens, keys, passwords -- stays out of the report.
ENV_ALLOWLIST = (
    "PATH", "HOME", "LANG", "LC_ALL", "TERM",
    "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONHASHSEED",
    "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
    "TRITON_INTERPRET", "TRITON_CACHE_DIR", "TRITON_HOME",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    # Safety settings some GPU hosts require to stay set in every program they start.
    "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
)


STARTING, LOADING, SERVING = "starting nsys", "loading the model", "serving"
WRITING, EXPORTING = "nsys writing the report", "exporting the SQLite"
PHASES = (STARTING, LOADING, SERVING, WRITING, EXPORTING)
# What `on_progress` receives: the phase, and for SERVING the requests done and their total.
ProgressCallback = Callable[[str, int | None, int | None], None]


@dataclass(frozen=True)
class CaptureRequest:
    """What to serve. None means "the engine's default", which the engine records in its summary."""

    workload: str
    concurrency: int
    out: Path
    model: str | None = None
    builder: str | None = None
    budget: int | None = None
    requests: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    batch_invariant: bool | None = None
    cuda_graphs: bool | None = None
    overlap: bool | None = None
    prefill_tokens: int | None = None  # prompt tokens per batched prefill (engine serve --prefill-tokens)
    ranks: int | None = None  # expert-parallel processes: one report holds every rank's process
    moe_layers: int | None = None  # MoE layers of a random-weight preset (engine serve --moe-layers)
    timeout_s: float = 1800


@dataclass(frozen=True)
class Capture:
    """The three files of a finished capture and the metadata written to `json_path`."""

    report: Path
    sqlite: Path
    json_path: Path
    meta: dict


def allowlisted_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The subset of `environ` (default: this process's) that may be stored inside a report."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in ENV_ALLOWLIST if name in environ}


def cuda_available() -> bool:
    """Whether the engine will run on a GPU here, which decides what nsys traces."""
    with deferred():
        import torch

        return torch.cuda.is_available()


def serve_command(request: CaptureRequest, device: str, summary: Path, progress: Path) -> list[str]:
    """The `python -m engine serve ...` command line for `request`; only given options are passed."""
    command = [sys.executable, "-m", "engine", "serve", "--workload", request.workload,
               "--concurrency", str(request.concurrency), "--device", device]
    for flag, value in (("--model", request.model), ("--builder", request.builder),
                        ("--budget", request.budget), ("--requests", request.requests),
                        ("--max-new-tokens", request.max_new_tokens), ("--seed", request.seed),
                        ("--ranks", request.ranks), ("--moe-layers", request.moe_layers),
                        ("--prefill-tokens", request.prefill_tokens)):
        if value is not None:
            command += [flag, str(value)]
    for flag, on in (("batch-invariant", request.batch_invariant), ("cuda-graphs", request.cuda_graphs),
                     ("overlap", request.overlap)):
        if on is not None:
            command.append(f"--{flag}" if on else f"--no-{flag}")
    return command + ["--summary", str(summary), "--progress", str(progress)]


def capture(request: CaptureRequest, *, on_progress: ProgressCallback | None = None) -> Capture:
    """Serve `request` under nsys and write NAME.nsys-rep, NAME.sqlite and NAME.json.

    `on_progress(phase, done, total)` is called as each phase starts and (from a helper thread) as
    requests finish; `done` and `total` are None outside SERVING.
    """
    out = _output_name(Path(request.out))
    if not 0 < request.timeout_s < float("inf"):  # also refuses nan
        raise DdprofError(f"--timeout must be a positive, finite number of seconds (got {request.timeout_s})")
    nsys = find_nsys()
    with handle_signals():
        created = _make_output_folder(out.parent)
        try:
            return _capture_into(out, request, nsys, on_progress)
        except BaseException:
            _remove_empty(created)
            raise


def _output_name(out: Path) -> Path:
    """The capture's name without extension (`--out traces/x.nsys-rep` means traces/x), refused
    before anything runs when it cannot name a file (`--out ''`, `--out /`, an existing folder)."""
    if out.suffix in (".nsys-rep", ".sqlite", ".json"):
        out = out.with_suffix("")
    if not out.name or out.name in (".", "..") or out.is_dir():
        raise DdprofError(f"{str(out) or repr('')}: --out must name the capture's files (e.g. traces/run writes "
                          "traces/run.nsys-rep, .sqlite and .json), not a folder")
    return out


def _capture_into(out: Path, request: CaptureRequest, nsys: Nsys, on_progress: ProgressCallback | None) -> Capture:
    """Profile in a hidden staging folder beside `out`, then publish the three files together."""
    device = "cuda" if cuda_available() else "cpu"
    env = allowlisted_env()
    if request.builder == "gpu" and device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    report_phase = on_progress or (lambda phase, done, total: None)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.capturing-", dir=out.parent))
    try:
        summary_path, progress_path = staging / "summary.json", staging / "progress"
        command = serve_command(request, device, summary_path, progress_path)
        _check_arguments(command, env)
        report_phase(STARTING, None, None)
        with _ProgressTail(progress_path, on_progress):
            report = profile(command, staging / out.name, trace="cuda,nvtx" if device == "cuda" else "nvtx",
                             timeout_s=request.timeout_s, env=env, nsys=nsys)
        report_phase(EXPORTING, None, None)
        sqlite_path = export_sqlite(report, nsys=nsys)
        summary = _read_summary(summary_path)
        meta = _metadata(summary, nsys, trace_steps=_count_steps(sqlite_path, summary.get("steps")))
        staged_json = staging / f"{out.name}.json"
        staged_json.write_text(json.dumps(meta, indent=2) + "\n")
        return _publish(report, sqlite_path, staged_json, out, meta)
    except DdprofError as exc:  # name the capture asked for, not the staging folder that is about to go
        raise DdprofError(str(exc).replace(f"{staging}{os.sep}", f"{out.parent}{os.sep}")) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make_output_folder(folder: Path) -> list[Path]:
    """Create `folder` (and missing parents); returns the folders created, deepest first."""
    created = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DdprofError(f"{folder}: cannot create output folder ({exc.strerror})") from None
    if not os.access(folder, os.W_OK):
        raise DdprofError(f"{folder}: output folder is not writable")
    return created


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a failed capture created (deepest first), so it leaves nothing behind."""
    for folder in folders:
        if any(folder.iterdir()):
            return
        folder.rmdir()


def _check_arguments(command: list[str], env: dict[str, str]) -> None:
    """Let the engine validate its arguments before nsys starts, so bad input fails fast and plainly."""
    try:
        returncode, _, stderr = run_owned([*command, "--check"], env=env, timeout_s=600)
    except subprocess.TimeoutExpired:
        raise DdprofError("engine serve --check did not answer within 600 s") from None
    if returncode != 0:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        raise DdprofError(lines[-1].removeprefix("engine: error: ") if lines
                          else f"engine serve --check failed (exit {returncode})")


def _read_summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DdprofError(f"{path}: the engine wrote no readable run summary ({exc})") from None


def _count_steps(sqlite_path: Path, engine_steps: int | None) -> int:
    """Number of `step` ranges of the engine's domain, read as every analysis reads them. Zero where
    the engine says it ran decode steps means NVTX was silently off (e.g. nvtx>=0.2.12); where it
    ran none, the run was too short to decode."""
    with ExportDb(sqlite_path) as db:
        recorded = "NVTX_EVENTS" in db.tables  # absent when the run emitted no NVTX at all
    steps = 0
    if recorded:
        ranges = load(sqlite_path).flat_ranges
        steps = ranges.filter((pl.col("name") == STEP) & (pl.col("domain") == DOMAIN)).height
    if steps == 0 and engine_steps == 0:
        raise DdprofError(f"{sqlite_path}: the engine ran no decode step (every request ended at prefill); "
                          "ask for more tokens (--max-new-tokens) or more requests")
    if steps == 0:
        raise DdprofError(f"{sqlite_path}: the trace holds no NVTX `{STEP}` ranges (domain {DOMAIN}); "
                          "is nvtx pinned to 0.2.11?")
    return steps


def _metadata(summary: dict, nsys: Nsys, trace_steps: int) -> dict:
    """The engine's summary plus what only the capture knows: the trace's step count and nsys/ddprof versions."""
    versions = {**summary.pop("versions", {}), "nsys": nsys.version, "ddprof": __version__}
    return {**summary, "trace_steps": trace_steps, "versions": versions}


def _publish(report: Path, sqlite_path: Path, staged_json: Path, out: Path, meta: dict) -> Capture:
    """Move the staged files into place; the JSON goes last, so it exists only beside a full set."""
    final = Capture(report=out.with_name(out.name + ".nsys-rep"), sqlite=out.with_name(out.name + ".sqlite"),
                    json_path=out.with_name(out.name + ".json"), meta=meta)
    with deferred():  # a signal now would leave part of the set in place
        final.json_path.unlink(missing_ok=True)
        os.replace(report, final.report)
        os.replace(sqlite_path, final.sqlite)
        os.replace(staged_json, final.json_path)
    return final


def _progress_state(fields: list[str]) -> tuple | None:
    """A progress line ("loading", or "done total") as a phase and counts; None for any other line
    (the bar then skips it: a thread that raised would freeze it without a word)."""
    if fields == ["loading"]:
        return LOADING, None, None
    if len(fields) == 2 and all(field.isdigit() for field in fields):
        return SERVING, int(fields[0]), int(fields[1])
    return None


class _ProgressTail:
    """Follows the engine's progress file ("loading", then "done total" lines) and reports each change.

    The engine runs as nsys's child with its stdout captured into the report, so a file is the
    one channel that reaches the user's terminal while the capture runs.
    """

    def __init__(self, path: Path, on_progress: ProgressCallback | None, interval_s: float = 0.25):
        self._path, self._on_progress, self._interval_s = path, on_progress, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last: tuple[str, int | None, int | None] | None = None
        self._read = 0  # complete lines already reported

    def __enter__(self) -> _ProgressTail:
        if self._on_progress:
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        if self._on_progress:
            self._stop.set()
            self._thread.join()
            self._poll()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._poll()

    def _poll(self) -> None:
        """Report what the new complete lines say: every change of phase (a short phase is not
        skipped between two polls), then the latest count."""
        try:
            lines = self._path.read_text().split("\n")
        except OSError:
            return
        complete = [line.split() for line in lines[:-1] if line.strip()]  # the last piece may be half-written
        new, self._read = [_progress_state(line) for line in complete[self._read:]], len(complete)
        new = [state for state in new if state is not None]
        for index, state in enumerate(new):
            changes_phase = self._last is None or state[0] != self._last[0]
            if state != self._last and (changes_phase or index == len(new) - 1):
                self._last = state
                self._on_progress(*state)
            if state[0] == SERVING and state[1] == state[2]:  # the engine is done; nsys writes the report
                self._last = (WRITING, None, None)
                self._on_progress(*self._last)
                return
