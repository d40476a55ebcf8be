"""Find, run and export Nsight Systems, turning its quiet failure modes into clear errors.

nsys passes the profiled program's exit code through and exits 0 in several failure cases (missing
output folder, lost agent), so nothing here trusts an exit code: every step checks for its file.
The capture flags are the ones verified not to hang the agent on CPU machines (no perf sampling,
no context-switch tracing, a private TMPDIR and a unique session name).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from ddprof.atomic import atomic_path
from ddprof.errors import DdprofError
from ddprof.process_group import run_owned

SHM = Path("/dev/shm")  # where nsys keeps its machine-wide lock
INSTALL_HINT = "install it with `bash scripts/install-nsys.sh` (Debian non-free nsight-systems) or set NSYS=/path/to/nsys"

# Where Nsight Systems lives when it is not on PATH: Debian's package, CUDA toolkits, NVIDIA images.
_KNOWN_LOCATIONS = (
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/opt/nvidia/nsight-systems*/**/nsys",
    "/opt/nvidia/nsight-compute*/**/target-linux-x64/nsys",
)


@dataclass(frozen=True)
class Nsys:
    """One Nsight Systems installation: its CLI binary and the version it reports."""

    path: Path
    version: str

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.version.split(".") if p.isdigit())


def _candidates() -> list[str]:
    if os.environ.get("NSYS"):  # an explicit choice is the only one (a bare name is looked up on PATH)
        return [shutil.which(os.environ["NSYS"]) or os.environ["NSYS"]]
    found = []
    on_path = shutil.which("nsys")
    if on_path:
        found.append(on_path)
    for pattern in _KNOWN_LOCATIONS:
        found.extend(sorted(glob.glob(pattern, recursive=True), reverse=True))
    return found


def _version_of(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d{4}\.\d+(?:\.\d+)*)", out.stdout + out.stderr)
    return match.group(1) if match else None


def find_nsys() -> Nsys:
    """The first working nsys among $NSYS, PATH and the usual install locations."""
    for path in _candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            version = _version_of(path)
            if version:
                return Nsys(Path(path), version)
    if os.environ.get("NSYS"):
        raise DdprofError(f"NSYS={os.environ['NSYS']} is not a working nsys binary; {INSTALL_HINT}")
    raise DdprofError(f"Nsight Systems (nsys) not found; {INSTALL_HINT}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _shutdown(nsys: Nsys, session: str) -> None:
    """End a session the way nsys means it to end (its daemon lets go of the machine-wide lock);
    harmless when it already ended (the normal case). ddprof.process_group kills what is left."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([str(nsys.path), "shutdown", f"--session={session}", "--kill=sigkill"],
                       capture_output=True, timeout=60, check=False)


def clear_stale_locks(shm: Path = SHM) -> list[Path]:
    """Remove nsys's machine-wide locks (`NSys-<version>` in /dev/shm) when no nsys process is
    alive to hold them (an agent killed mid-capture leaves its lock behind, with its dead pid
    inside). A lock whose agent is alive but stuck makes every capture on the machine, and plain
    `nsys profile /bin/true`, fail with "Agent launcher failed": `_held_locks` names it. Returns
    the locks removed."""
    locks = sorted(shm.glob("NSys-*"))
    if not locks or _nsys_pids():
        return []
    for lock in locks:
        with contextlib.suppress(OSError):
            lock.unlink()
    return locks


def _held_locks(shm: Path = SHM) -> str | None:
    """After nsys failed to start again and again: the lock, who holds it and the fix, in one line
    (None without a lock). An agent whose capture (`nsys profile --session-new=S`) is gone is the
    usual culprit: named alone when there is one."""
    locks = sorted(shm.glob("NSys-*"))
    if not locks:
        return None
    cmdlines = {pid: _cmdline(pid) for pid in _nsys_pids()}
    sessions = {arg.removeprefix("--session-new=") for args in cmdlines.values() for arg in args
                if arg.startswith("--session-new=")}
    orphans = [pid for pid, args in cmdlines.items() if "--start-agent" in args and not sessions & {
        arg.removeprefix("--session-name=") for arg in args if arg.startswith("--session-name=")}]
    pids = " ".join(map(str, orphans or cmdlines))
    held_by = (f"nsys agents {pids} outlived their captures" if orphans else f"nsys processes {pids} (a stuck capture?)")
    return (f"{locks[0]}: nsys could not start its agent; its machine-wide lock is held by {held_by}: end them "
            f"(kill -9 {pids}) and remove the lock (rm {' '.join(map(str, locks))}), then capture again")


def _nsys_pids() -> list[int]:
    """Live nsys processes of any capture on the machine (the CLI, its agent, launcher, tee)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if proc.joinpath("comm").read_text().startswith("nsys") and _cmdline(int(proc.name)):
                pids.append(int(proc.name))
    return sorted(pids)


def _cmdline(pid: int) -> list[str]:
    """A process's arguments (empty for a zombie or a process gone)."""
    try:
        return [arg.decode(errors="replace") for arg in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if arg]
    except OSError:
        return []


# nsys's own launch failures (no report, no app output), seen when several captures start at once;
# a fresh session almost always succeeds, so these are retried. App failures never are.
_INFRASTRUCTURE_FAILURES = re.compile(r"QuadDCommon|Agent launcher failed|Local Endpoint|agent connection|"
                                      r"Connection reset by peer", re.I)
ATTEMPTS = 3


def profile(command: list[str], out: Path, *, trace: str = "nvtx", timeout_s: float = 600,
            env: dict[str, str] | None = None, nsys: Nsys | None = None) -> Path:
    """Run `command` under `nsys profile` and return the `.nsys-rep` it wrote.

    `out` is the report path without extension. `env` is the whole environment of the profiled
    program (nsys stores it inside the report, so callers pass an allowlist).
    """
    nsys = nsys or find_nsys()
    out = Path(out)
    if not out.parent.is_dir():
        raise DdprofError(f"{out.parent}: output folder does not exist")
    if not os.access(out.parent, os.W_OK):
        raise DdprofError(f"{out.parent}: output folder is not writable")
    report = out.with_name(out.name + ".nsys-rep")
    clear_stale_locks()
    for attempt in range(1, ATTEMPTS + 1):
        report.unlink(missing_ok=True)
        returncode, stdout, stderr = _profile_once(nsys, command, out, trace, timeout_s, env)
        if returncode == 0 or report.is_file() or not _INFRASTRUCTURE_FAILURES.search(stderr):
            break
    else:
        held = _held_locks()
        if held:
            raise DdprofError(held)
    if returncode < 0:  # nsys itself was killed: the program's exit code never came back
        report.unlink(missing_ok=True)
        raise DdprofError(f"nsys profile was killed by {signal.Signals(-returncode).name} (exit {returncode}); "
                          "its processes were ended and nothing was kept")
    if returncode != 0:
        report.unlink(missing_ok=True)
        raise DdprofError(f"profiled program failed (exit {returncode}): {_last_line(stderr)}")
    if not report.is_file() or report.stat().st_size == 0:
        raise DdprofError(f"{report}: nsys wrote no report ({_last_line(stderr or stdout)})")
    return report


def trace_flags(trace: str) -> list[str]:
    """`nsys profile`'s flags for `trace` (its --trace value): with CUDA traced, each node of a CUDA
    graph replay recorded as its own op (`--cuda-graph-trace=node`; nsys's default, `graph`, records
    one span per replay, which hides what each node costs; both 2022.4 and 2025.3 accept it)."""
    return [f"--trace={trace}", *(["--cuda-graph-trace=node"] if "cuda" in trace.split(",") else [])]


def _profile_once(nsys: Nsys, command: list[str], out: Path, trace: str, timeout_s: float,
                  env: dict[str, str] | None) -> tuple[int, str, str]:
    """One `nsys profile` run in a private TMPDIR and a unique session, always cleaned up: on
    success, failure, timeout or interrupt no process of it survives and its TMPDIR is gone."""
    session = f"ddprof-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmpdir = tempfile.mkdtemp(prefix="ddprof-nsys-")
    run_env = dict(os.environ if env is None else env)
    run_env["TMPDIR"] = tmpdir
    args = [str(nsys.path), "profile", f"--session-new={session}", *trace_flags(trace),
            "--sample=none", "--cpuctxsw=none", "--wait=primary", "-f", "true", "-o", str(out),
            *command]
    try:
        return run_owned(args, timeout_s=timeout_s, env=run_env, stop=lambda: _shutdown(nsys, session))
    except subprocess.TimeoutExpired:
        out.with_name(out.name + ".nsys-rep").unlink(missing_ok=True)
        raise DdprofError(f"nsys profile timed out after {timeout_s:.0f} s (session {session} shut down): "
                          f"{' '.join(command)}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def export_sqlite(report: Path, sqlite_path: Path | None = None, *, nsys: Nsys | None = None,
                  timeout_s: float = 600) -> Path:
    """Export a `.nsys-rep` to SQLite (beside it by default) and check the result is a real export.

    nsys writes under a temporary name, renamed once checked: an interrupted or failed export
    (nsys exits 0 with a 0-byte file on a full disk) never leaves a file a later run would trust."""
    nsys = nsys or find_nsys()
    report = Path(report)
    if not report.is_file():
        raise DdprofError(f"{report}: no such report")
    sqlite_path = Path(sqlite_path) if sqlite_path else report.with_suffix(".sqlite")
    with atomic_path(sqlite_path) as partial:
        args = [str(nsys.path), "export", "--type=sqlite", "-q", "true", "-f", "true", "-o", str(partial), str(report)]
        try:
            returncode, stdout, stderr = run_owned(args, timeout_s=timeout_s)
        except subprocess.TimeoutExpired:
            raise DdprofError(f"{report}: nsys export timed out after {timeout_s:.0f} s") from None
        message = stderr + stdout
        if re.search(r"version.*not supported|unsupported.*version|newer version", message, re.I):
            raise DdprofError(f"{report}: written by a newer Nsight Systems than the local {nsys.version}; "
                              "export it to SQLite on the machine that captured it (nsys export --type sqlite)")
        if re.search(r"disk is full|no space left", message, re.I):
            raise DdprofError(f"{sqlite_path}: no space left on the device for the export ({_free(sqlite_path)})")
        if returncode != 0 or not partial.is_file() or partial.stat().st_size == 0:
            raise DdprofError(f"{report}: nsys export failed: {_last_line(message)}")
        _check_export(partial, sqlite_path)
    return sqlite_path


def _free(path: Path) -> str:
    """The free space of `path`'s filesystem, in words."""
    try:
        stat = os.statvfs(path.parent)
    except OSError:
        return "free space unknown"
    return f"{stat.f_bavail * stat.f_frsize / 2**20:,.1f} MiB free"


def _check_export(written: Path, sqlite_path: Path) -> None:
    """`written` (the export of `sqlite_path`, under its temporary name) must be a whole export."""
    try:
        with sqlite3.connect(f"file:{written}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise DdprofError(f"{sqlite_path}: export is not a readable SQLite file ({exc})") from None
    if "StringIds" not in tables:
        raise DdprofError(f"{sqlite_path}: export has no StringIds table: not an Nsight Systems export")
