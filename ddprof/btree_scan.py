"""Read integer, real and text columns of an SQLite table through `btree_scan.c`, built on first use.

SQLite's own API costs ~150 ns a row on a million-row export table (its virtual machine decodes
each row); decoding the table's B-tree pages in C costs a fraction of that, and runs on several
threads at once (ctypes lets go of the GIL during the call). Like Triton with its launchers, the
C file is compiled once per source version with the machine's C compiler and cached.
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import shutil
import subprocess
import threading
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ddprof.cache import cache_dir
from ddprof.errors import DdprofError

SOURCE = Path(__file__).with_suffix(".c")
ROWID = -1  # column index that reads the rowid
INT, NULLABLE_INT, PRESENCE = "int", "nullable int", "presence"  # what to read of a column
REAL, TEXT = "real", "text"  # and of a number column read as float64 / of a text column (codes, nullable)
_MODES = {INT: 0, NULLABLE_INT: 0, PRESENCE: 1, REAL: 2, TEXT: 3}  # btree_scan.c's MODE_*
_DICTIONARY_FULL = -2
_DICTIONARY_BYTES = 1 << 16  # first size of a text dictionary's bytes; grown 8x while a scan needs more
_ENCODINGS = {1: "utf-8", 2: "utf-16-le", 3: "utf-16-be"}  # the file header's text encoding
_FLAGS = ["-O2", "-shared", "-fPIC", "-nostdlib"]
_SCRATCH = 1 << 20  # largest row prefix readable when a row spills into overflow pages


class ScanError(Exception):
    """The file's pages do not form the table the caller asked for (damaged or not SQLite)."""


class MappedFile:
    """An SQLite file mapped read-only, shared by the scans of its tables on several threads."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            header = f.read(100)
            page_size = int.from_bytes(header[16:18], "big")
            self.page_size = 65536 if page_size == 1 else page_size
            if len(header) < 100 or self.page_size < 512 or self.page_size & (self.page_size - 1):
                raise ScanError("not an SQLite file header")
            self.reserved = header[20]
            self.encoding = _ENCODINGS.get(int.from_bytes(header[56:60], "big"), "utf-8")
            self._map = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self.size = len(self._map)
        self.address = np.frombuffer(self._map, np.uint8).ctypes.data  # the view dies here; the map lives on

    def close(self) -> None:
        self._map.close()


class Scan(NamedTuple):
    """A table's columns: `rows`; per asked column its `values` (int64, 0 where NULL; float64 for
    REAL; for TEXT codes into `texts`) and `present` (bool: not NULL), None where not asked for."""
    rows: int
    values: list[np.ndarray | None]
    present: list[np.ndarray | None]
    texts: list[str]  # the distinct values of the TEXT columns, by code


class _Dictionary(ctypes.Structure):
    """btree_scan.c's struct dictionary."""
    _fields_ = [("slots", ctypes.c_void_p), ("n_slots", ctypes.c_longlong), ("offsets", ctypes.c_void_p),
                ("max_entries", ctypes.c_longlong), ("bytes", ctypes.c_void_p), ("bytes_size", ctypes.c_longlong),
                ("entries", ctypes.c_longlong)]


def scan_table(file: MappedFile, root_page: int, columns: list[tuple[int, str]]) -> Scan:
    """The columns of the rowid table whose B-tree starts at `root_page`, in rowid order. Each
    column is (index, one of INT, NULLABLE_INT, PRESENCE, REAL, TEXT); INT reads NULL as 0 and
    gives no presence, PRESENCE gives presence alone (of a value of any type)."""
    lib = _library()
    index = (ctypes.c_int * len(columns))(*(c for c, _ in columns))
    mode = (ctypes.c_int * len(columns))(*(_MODES[kind] for _, kind in columns))
    err = ctypes.create_string_buffer(256)
    args = (file.address, file.size, file.page_size, file.reserved, root_page, len(columns), index, mode)
    rows = lib.scan_table(*args, 0, None, None, None, 0, None, err, len(err))  # count, then read
    if rows < 0:
        raise ScanError(err.value.decode())
    values = [None if kind == PRESENCE else np.empty(rows, np.int64) for _, kind in columns]
    present = [np.empty(rows, np.bool_) if kind != INT else None for _, kind in columns]
    scratch = np.empty(_SCRATCH, np.uint8)
    max_entries = rows * sum(kind == TEXT for _, kind in columns)  # a row adds one value per text column at most
    slots = np.zeros(1 << (2 * max_entries).bit_length(), np.int64)  # calloc'd: only probed pages are touched
    offsets = np.zeros(max_entries + 1, np.int64)
    text_bytes = np.empty(min(_DICTIONARY_BYTES, file.size), np.uint8)
    while True:
        dictionary = _Dictionary(slots.ctypes.data, slots.size, offsets.ctypes.data, max_entries,
                                 text_bytes.ctypes.data, text_bytes.size, 0)
        read = lib.scan_table(*args, rows, _pointers(values), _pointers(present), scratch.ctypes.data, scratch.size,
                              ctypes.byref(dictionary), err, len(err))
        # Distinct texts never hold more bytes than the file: more means damage the scan caught.
        if read != _DICTIONARY_FULL or text_bytes.size >= file.size:
            break
        slots[:] = 0
        text_bytes = np.empty(min(8 * text_bytes.size, file.size), np.uint8)
    if read != rows:
        raise ScanError(err.value.decode() if read == -1 else "text values larger than the file" if read < 0 else
                        f"{read} rows where {rows} were counted")
    for array, (_, kind) in zip(values, columns):
        if kind == REAL:
            array.dtype = np.float64  # btree_scan.c wrote the doubles' bits
    return Scan(rows, values, present, _texts(text_bytes, offsets[:dictionary.entries + 1], file.encoding))


def _texts(data: np.ndarray, offsets: np.ndarray, encoding: str) -> list[str]:
    """The dictionary's values as str; text that does not decode is a damaged file."""
    raw = data[:offsets[-1]].tobytes()
    bounds = offsets.tolist()
    try:
        return [raw[start:end].decode(encoding) for start, end in zip(bounds, bounds[1:])]
    except UnicodeDecodeError as exc:
        raise ScanError(f"text that is not {encoding.upper()} ({exc.reason})") from None


def _pointers(arrays: list[np.ndarray | None]):
    return (ctypes.c_void_p * len(arrays))(*(None if a is None else a.ctypes.data for a in arrays))


_BUILDING = threading.Lock()  # the reader threads of one export all ask for the library at once


def _library() -> ctypes.CDLL:
    with _BUILDING:
        return _built_library()


@cache
def _built_library() -> ctypes.CDLL:
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(_FLAGS).encode()).hexdigest()[:16]
    built = cache_dir() / f"btree_scan-{digest}.so"
    if not built.exists():
        _compile(built)
    lib = ctypes.CDLL(str(built))
    i64, ptr = ctypes.c_longlong, ctypes.c_void_p
    lib.scan_table.restype = i64
    lib.scan_table.argtypes = [ptr, i64, i64, i64, i64, ctypes.c_int, ptr, ptr, i64, ptr, ptr, ptr, i64, ptr,
                               ctypes.c_char_p, ctypes.c_int]
    return lib


def _compile(target: Path) -> None:
    compiler = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if compiler is None:
        raise DdprofError("ddprof builds a small C reader for SQLite exports and found no C compiler "
                          "(cc, gcc or clang): install one (Debian: apt-get install gcc)")
    partial = target.with_suffix(f".{os.getpid()}.tmp")  # other processes may build it too
    done = subprocess.run([compiler, *_FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True)
    if done.returncode != 0:
        raise DdprofError(f"{SOURCE}: {compiler} failed to build it: {' '.join(done.stderr.split())[:300]}")
    os.replace(partial, target)  # atomic: concurrent builders never load a half-written file
