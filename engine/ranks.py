"""`--ranks N`: run the same engine command as N processes, one per expert-parallel rank.

Each child gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and
joins the group itself (engine/expert_parallel.py); launched by torchrun instead, the command runs
as the rank torchrun says. Under `nsys profile` the children are traced too: one report holds
every rank's process. When a rank fails, the others stop within their collective timeout; a rank
that does not stop by then is killed, and this process exits with the first failure's line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from engine.errors import EngineError

GRACE_S = 10.0  # past the collective timeout, before a rank that has not stopped is killed
_POLL_S = 0.05


@contextmanager
def rendezvous(ranks: int) -> Iterator[dict[str, str]]:
    """The group's store, hosted here for as long as the ranks run, as torchrun's agent hosts it:
    the environment that makes every rank its client. Bound to a port the system picks and held
    open, so no other process can take the port between choosing it and the ranks' start."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, ranks, is_master=True, wait_for_workers=False)
    try:
        yield {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "WORLD_SIZE": str(ranks),
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
    finally:
        del store


def launch(argv: list[str], ranks: int, timeout_s: float) -> int:
    """Run `python -m engine ARGV` as `ranks` processes; 0 when every rank succeeded."""
    with rendezvous(ranks) as group:
        return _run(argv, ranks, timeout_s, group)


def _run(argv: list[str], ranks: int, timeout_s: float, group: dict[str, str]) -> int:
    children = [subprocess.Popen([sys.executable, "-m", "engine", *argv],
                                 env={**os.environ, **group, "RANK": str(rank), "LOCAL_RANK": str(rank)})
                for rank in range(ranks)]
    first_failure: tuple[int, int] | None = None  # (rank, exit code)
    deadline = None
    hung: list[int] = []  # ranks still running long after another failed: killed here
    try:
        while any(child.poll() is None for child in children):
            if first_failure is None:
                first_failure = _first_failure([child.returncode for child in children])
                if first_failure is not None:
                    deadline = time.monotonic() + timeout_s + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for rank, child in enumerate(children):
                    if child.poll() is None:
                        hung.append(rank)
                        child.kill()
            time.sleep(_POLL_S)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    codes = [child.returncode for child in children]
    first_failure = first_failure or _first_failure(codes)
    if first_failure is None:
        return 0
    if hung:  # the others gave up on it in a collective; it neither answered nor exited
        raise EngineError(f"rank {hung[0]} of {ranks} stopped answering: the other ranks timed out waiting for it "
                          f"and it did not exit, so it was killed ({_others(codes, hung[0])})")
    rank, code = first_failure
    raise EngineError(f"rank {rank} of {ranks} {_exit(code)}; the other ranks stopped ({_others(codes, rank)})")


def _first_failure(codes: list[int | None]) -> tuple[int, int] | None:
    """(rank, code) of the failed rank to blame: one killed by a signal before one that exited with
    an error (the survivors of a killed rank exit with theirs a moment later), then the lowest rank."""
    failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
    return min(failed, key=lambda failure: (failure[1] >= 0, failure[0])) if failed else None


def _exit(code: int) -> str:
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _others(codes: list[int], failed: int) -> str:
    return ", ".join(f"rank {r}: {_exit(code) if code else 'exited cleanly'}"
                     for r, code in enumerate(codes) if r != failed)
