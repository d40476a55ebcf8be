"""ddprof's per-user cache folder: things worth keeping between runs that belong to no trace
(the compiled SQLite reader, exports of reports that sit in read-only folders)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/ddprof (default ~/.cache/ddprof), or a per-user temp folder when that
    cannot be created (a read-only home)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    folder = Path(root) / "ddprof"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        folder = Path(tempfile.gettempdir()) / f"ddprof-{os.getuid()}"
        folder.mkdir(exist_ok=True)
    return folder
