"""Process-wide settings of the `ddprof` command, applied before numpy and polars load.

A million-range breakdown is a second of work on two cores, so what the process does around it
shows (measured with `perf` on benchmarks/breakdown_scale.py's export):
- OpenBLAS's worker threads busy-wait after numpy starts them, taking a core from the export
  readers; ddprof does no matrix products, so its numpy needs one thread.
- glibc hands freed blocks between 128 KiB and 32 MiB back to the kernel, and the next array of
  that size faults and zeroes its pages again; the analysis allocates and frees hundreds of them.
- Python's cycle collector walks the import-time objects again and again while the command runs;
  a command's objects live until it exits, so collecting cycles buys nothing.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for it
_TRIM_THRESHOLD = 1 << 30


def apply() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when numpy loads OpenBLAS
    if sys.platform == "linux":
        libc = ctypes.CDLL(None)
        if hasattr(libc, "mallopt"):  # glibc (musl has no mallopt)
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    gc.disable()
