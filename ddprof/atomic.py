"""Files that appear whole or not at all: every file ddprof writes goes through `atomic_path`.

A file written in place and cut short (Ctrl-C, a full disk, a killed job) looks like a finished
one to the next run: a 0-byte `x.sqlite` beside a report made every later `breakdown x.nsys-rep`
fail on it. So a file is written under a hidden temporary name beside its destination (the same
filesystem, so the rename is atomic) and renamed only when the writer finished; on any failure or
interrupt the temporary file is removed, and a failure to remove it never hides the first error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` (same suffix, for tools that insist on one) for the block to
    write; renamed to `path` when the block completes, removed when it raises."""
    with atomic_paths([Path(path)]) as (partial,):
        yield partial


@contextlib.contextmanager
def atomic_paths(paths: list[Path]) -> Iterator[list[Path]]:
    """`atomic_path` for a set of files that is only whole together (a --parquet set): all are
    renamed into place once every one is written, none when any write fails."""
    partials = [path.with_name(f".{path.stem}.partial-{uuid.uuid4().hex[:8]}{path.suffix}") for path in paths]
    try:
        yield partials
        for path in paths:  # the one way a rename within a folder fails: a folder in the way
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        for partial, path in zip(partials, paths):
            os.replace(partial, path)
    except BaseException:
        for partial in partials:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
        raise
