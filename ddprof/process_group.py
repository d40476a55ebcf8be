"""One owner for every process ddprof starts, and SIGINT/SIGTERM turned into a clean stop.

nsys spreads a capture over processes no process group holds: its CLI, a daemon that detaches
(its own session, parent init), a launcher, and the profiled engine in a session of its own. A
killed or interrupted ddprof used to leave them running until the workload ended, and a stuck
daemon kept nsys's lock for the whole machine. So every process started through `run_owned`
carries an owner mark in its environment (inherited by all of its descendants, detached or not),
and when the run ends, on every path, each process carrying the mark is killed and reaped.

SIGTERM (a CI cancel, `timeout`) would end Python without running a `finally`; under
`handle_signals` it raises `Interrupted` like SIGINT does, once: a second signal never breaks the
cleanup the first one started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

OWNER_VARIABLE = "DDPROF_OWNER"
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_REAP_S = 10


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: everything started is being stopped and removed. A
    BaseException, so that no `except Exception` swallows it on the way out."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


_raised = False  # the one Interrupted of a handle_signals block has been raised
_deferring = 0  # inside `deferred` blocks
_pending: int | None = None  # a signal that arrived in one


def _raise_once(signum: int, frame) -> None:
    global _raised, _pending
    if _raised:
        return
    if _deferring:
        _pending = signum
        return
    _raised = True
    raise Interrupted(signum)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal until the block ends (an import of torch: a Python exception raised inside
    its C++ initialisation ends in pybind11's terminate, not a clean stop)."""
    global _deferring, _pending
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _pending is not None:
        signum, _pending = _pending, None
        _raise_once(signum, None)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted (once) in the block; nested uses and other threads
    leave the handlers as they are."""
    global _raised
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _raise_once:
        yield
        return
    previous = {signum: signal.signal(signum, _raise_once) for signum in _SIGNALS}
    _raised = False
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _new_owner() -> str:
    return f"ddprof-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def run_owned(args: list[str], *, timeout_s: float, env: dict[str, str] | None = None,
              stop: Callable[[], None] | None = None) -> tuple[int, str, str]:
    """Run `args` to the end or `timeout_s` (then subprocess.TimeoutExpired) and return (exit
    code, stdout, stderr); whatever happens, no process it started outlives the call. `stop`,
    when given, runs first on every exit (a graceful end: nsys's own session shutdown)."""
    owner = _new_owner()
    run_env = {**(os.environ if env is None else env), OWNER_VARIABLE: owner}
    proc = subprocess.Popen(args, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            encoding="utf-8", errors="replace", start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:
        try:
            if stop:
                stop()
        finally:
            _end_owned(owner, proc)
    return proc.returncode, stdout, stderr


def _end_owned(owner: str, proc: subprocess.Popen | None = None) -> None:
    """Kill every process that carries `owner`'s mark (again while new ones appear) and wait until
    they are gone; `proc`, the one started, is reaped and its pipes closed."""
    mark = f"{OWNER_VARIABLE}={owner}".encode()
    deadline = time.monotonic() + _REAP_S
    while True:
        marked = [pid for pid in _pids() if pid != os.getpid() and _carries(pid, mark)]
        for pid in marked:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if proc is not None and proc.poll() is None and proc.pid not in marked:
            with contextlib.suppress(OSError):
                proc.kill()
        if not marked or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_S)
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _carries(pid: int, mark: bytes) -> bool:
    """Whether a live process (not a zombie: its environ reads empty) has `mark` in its environment."""
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
