"""What a benchmark ran on (GPU, CPU, library versions) and how its result file is written."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from ddprof.atomic import atomic_path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit(root: Path = RESULTS.parents[1]) -> str | None:
    """The commit the benchmark's code is: DDPROF_COMMIT where set (on 2026-12-02 the device's copy
    of the tree held a git directory at the commit the session started from, later commits showing
    as uncommitted changes, so its HEAD named the wrong commit; benchmarks/gpu_verify.sh requires the
    variable); else git's HEAD where `root` (the project) is a git checkout's top, with "+changes"
    where tracked files differ from it; else None."""
    if os.environ.get("DDPROF_COMMIT"):
        return os.environ["DDPROF_COMMIT"]
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():  # not a checkout, or another one around it
        return None
    head, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    return None if head is None else head + ("+changes" if changes else "")  # None: no commit yet


def describe() -> dict:
    import torch  # here: a result written by a trace reader (capture_kernels.py) needs no torch
    import triton

    gpu = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "commit": source_commit(),
        "gpu": gpu.name if gpu else None,
        "gpu_sms": gpu.multi_processor_count if gpu else None,
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }


def write_result(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as partial:  # an interrupted benchmark never leaves half a result file
        partial.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {path}", flush=True)
