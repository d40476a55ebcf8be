"""Process-wide settings of the `ddprof` command, applied before numpy and polars load.

A million-range breakdown is a second of work on two cores, so what the process does around it
shows (measured with `perf` on benchmarks/breakdown_scale.py's export):
- OpenBLAS's worker threads busy-wait after numpy starts them, taking a core from the export
  readers; ddprof does no matrix products, so its numpy needs one thread.
- Allocators hand freed memory back to the kernel, and the next array faults and zeroes its pages
  again (on this VM a fresh page costs more than the arithmetic done on it); the analysis
  allocates and frees hundreds of large arrays. So glibc keeps what it frees (no trimming, blocks
  up to 32 MiB from the heap, one arena for the reader threads too) and polars' jemalloc keeps
  its dirty pages.
- Python's cycle collector walks the import-time objects again and again while the command runs;
  a command's objects live until it exits, so collecting cycles buys nothing.
- At exit the interpreter frees a million-row analysis object by object, which takes longer
  than the kernel takes to drop the whole process: `exit_now` ends it once output is flushed.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # mallopt parameters (malloc.h)
_MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for it
_TRIM_THRESHOLD = 1 << 30


def apply() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when numpy loads OpenBLAS
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:-1,muzzy_decay_ms:-1")  # polars' jemalloc
    if sys.platform == "linux":
        libc = ctypes.CDLL(None)
        if hasattr(libc, "mallopt"):  # glibc (musl has no mallopt)
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
            libc.mallopt(_M_ARENA_MAX, 1)
    gc.disable()


def exit_now(code: int | str | None) -> None:
    """Flush the output and end the process with sys.exit's meaning of `code`, skipping teardown."""
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
