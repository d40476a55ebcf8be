"""The C reader of SQLite table pages (ddprof/btree_scan.c) against Python's sqlite3 on the same files.

Random tables cover what the file format allows and nsys exports may hold: every integer width and
sign, NULLs, reals and text (repeated names, unique ones, empty, non-ASCII, longer than a page),
rows that spill into overflow pages, page sizes from 512 B to 64 KiB, deleted rows, an INTEGER
PRIMARY KEY column (the rowid under another name), columns added after rows were written (short
records). Damaged files must give a ScanError, never a crash.
"""

import random
from concurrent.futures import ThreadPoolExecutor
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from ddprof import btree_scan
from ddprof.btree_scan import (INT, NULLABLE_INT, PRESENCE, REAL, ROWID, TEXT, MappedFile, ScanError, _compile,
                               scan_table)
from ddprof.errors import DdprofError

EXPORT = Path(__file__).parents[1] / "data" / "h200_nsys2025_small_gpu_builder.sqlite"
INTS = [0, 1, -1, 127, -128, 255, 32767, -32768, 1 << 23, -(1 << 23), 1 << 31, -(1 << 31), 1 << 47,
        -(1 << 47), (1 << 63) - 1, -(1 << 63)]


def _scan(path: Path, table: str, columns: list[tuple[int, str]]):
    with sqlite3.connect(path) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    file = MappedFile(path)
    try:
        return scan_table(file, root, columns)
    finally:
        file.close()


def _expected(path: Path, table: str, names: list[str]) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid").fetchall()


def _value(rng: random.Random):
    pick = rng.random()
    if pick < 0.15:
        return None
    if pick < 0.5:
        return rng.choice(INTS)
    return rng.randrange(-(1 << 63), 1 << 63) >> rng.randrange(0, 63)


NAMES = ["", "step", "verify", "tree_build", "vérifier → 树", "emoji 🚀", "x" * 200]


def _note(rng: random.Random, k: int, page_size: int) -> str | None:
    """Mostly a few repeated names (as NVTX ranges are), some unique, some longer than a page."""
    pick = rng.random()
    if pick < 0.05:  # spills into overflow pages, before column c
        return "".join(rng.choice("abcé") for _ in range(rng.randrange(page_size, 3 * page_size)))
    if pick < 0.2:
        return None
    return f"range {k}" if pick < 0.35 else rng.choice(NAMES)


def _random_table(path: Path, seed: int, page_size: int) -> list[str]:
    """t(k INTEGER PRIMARY KEY, a, b, note TEXT, c, r REAL) plus d added later, with deleted rows;
    returns the integer columns' names."""
    rng = random.Random(seed)
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA page_size = {page_size}")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a INTEGER, b INTEGER, note TEXT, c INTEGER, r REAL)")
        rows = []
        for k in range(1500):
            rows.append((k * 3 + rng.randrange(3), _value(rng), _value(rng), _note(rng, k, page_size), _value(rng),
                         rng.choice([None, 0.5, -2.25, 3, 1e300])))
        db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows)
        db.execute("DELETE FROM t WHERE a % 7 = 3")
        db.execute("ALTER TABLE t ADD COLUMN d INTEGER")
        db.executemany("INSERT INTO t (a, b, c, d) VALUES (?, ?, ?, ?)",
                       [(_value(rng), _value(rng), _value(rng), _value(rng)) for _ in range(300)])
    return ["k", "a", "b", "c", "d"]


@pytest.mark.parametrize("seed, page_size", [(0, 512), (1, 4096), (2, 65536), (3, 1024)])
def test_random_tables_read_as_sqlite3_reads_them(tmp_path, seed, page_size):
    path = tmp_path / "t.sqlite"
    names = _random_table(path, seed, page_size)
    index = {"k": ROWID, "a": 1, "b": 2, "note": 3, "c": 4, "r": 5, "d": 6}
    columns = [(ROWID, INT)] + [(index[n], NULLABLE_INT) for n in names] + [(3, PRESENCE), (5, PRESENCE),
                                                                          (3, TEXT), (5, REAL)]
    rows, values, present, texts = _scan(path, "t", columns)
    expected = _expected(path, "t", ["rowid", *names, "note", "r", "note", "r"])
    assert rows == len(expected) > 1000
    assert values[0].tolist() == [row[0] for row in expected]
    for j in range(1, len(names) + 1):
        assert present[j].tolist() == [row[j] is not None for row in expected]
        assert values[j].tolist() == [row[j] or 0 for row in expected]
    for j in (-4, -3):
        assert values[j] is None and present[j].tolist() == [row[j] is not None for row in expected]
    notes = [row[-2] for row in expected]
    assert [texts[code] if has else None for code, has in zip(values[-2], present[-2])] == notes
    assert len(texts) == len(set(notes) - {None})  # each distinct text decoded once
    assert values[-1].dtype == np.float64
    assert [v if has else None for v, has in zip(values[-1].tolist(), present[-1])] == [row[-1] for row in expected]


def test_a_dictionary_that_outgrows_its_first_size_is_grown(tmp_path, monkeypatch):
    path = tmp_path / "t.sqlite"
    _random_table(path, 5, 4096)
    monkeypatch.setattr(btree_scan, "_DICTIONARY_BYTES", 16)
    _, values, present, texts = _scan(path, "t", [(3, TEXT)])
    assert [texts[c] if has else None for c, has in zip(values[0], present[0])] == [
        note for note, in _expected(path, "t", ["note"])]


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "StringIds"])
def test_every_column_of_a_real_export_reads_as_sqlite3_reads_it(table):
    with sqlite3.connect(EXPORT) as db:
        info = db.execute(f"PRAGMA table_info({table})").fetchall()
    kinds = {"INTEGER": NULLABLE_INT, "TEXT": TEXT, "REAL": REAL}
    columns = [(ROWID if pk else cid, kinds.get(kind.upper(), PRESENCE)) for cid, _, kind, _, _, pk in info]
    rows, values, present, texts = _scan(EXPORT, table, columns)
    expected = _expected(EXPORT, table, [name for _, name, *_ in info])
    assert rows == len(expected) > 0
    with_text = table in ("NVTX_EVENTS", "StringIds")  # domain names inline; the registered strings
    assert (TEXT in {kind for _, kind in columns}) == with_text
    for j, (_, kind) in enumerate(columns):
        if kind == NULLABLE_INT:
            assert values[j].tolist() == [row[j] or 0 for row in expected]
        if kind in (TEXT, REAL):
            read = [(texts[v] if kind == TEXT else v) if has else None
                    for v, has in zip(values[j].tolist(), present[j])]
            assert read == [row[j] for row in expected]
        if columns[j][0] != ROWID:
            assert present[j].tolist() == [row[j] is not None for row in expected]


@pytest.mark.parametrize("stored, kind, message", [
    (2.5, INT, "non-integer value in an integer column at rowid 2"),
    ("x", INT, "non-integer value in an integer column at rowid 2"),
    ("x", REAL, "non-numeric value in a real column at rowid 2"),
    (7, TEXT, "non-text value in a text column at rowid 2"),
    (b"x", TEXT, "blob in a text column at rowid 2"),
])
def test_a_value_of_another_type_than_the_column_read_is_an_error(tmp_path, stored, kind, message):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (a)")
        db.executemany("INSERT INTO t VALUES (?)", [(1 if kind != TEXT else "one",), (stored,), (None,)])
    with pytest.raises(ScanError, match=message):
        _scan(path, "t", [(0, kind)])
    assert _scan(path, "t", [(0, PRESENCE)]).present[0].tolist() == [True, True, False]


def test_text_that_is_not_utf8_is_an_error(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (a TEXT)")
        db.execute("INSERT INTO t VALUES ('qqqq')")
    path.write_bytes(path.read_bytes().replace(b"qqqq", b"q\xffqq"))
    with pytest.raises(ScanError, match="text that is not UTF-8"):
        _scan(path, "t", [(0, TEXT)])


def test_utf16_files_decode_their_text(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA encoding = 'UTF-16be'")
        db.execute("CREATE TABLE t (a TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [(n,) for n in NAMES])
    _, values, _, texts = _scan(path, "t", [(0, TEXT)])
    assert [texts[code] for code in values[0]] == NAMES


def test_damaged_pages_give_an_error_or_rows_never_a_crash(tmp_path):
    """Bytes overwritten at random past the header: each scan must return or raise ScanError
    (a crash would end the test run). Most damage is caught; some (a changed value) cannot be."""
    source = tmp_path / "t.sqlite"
    _random_table(source, 7, 1024)
    clean = source.read_bytes()
    rng = np.random.default_rng(7)
    caught = 0
    for trial in range(300):
        damaged = bytearray(clean)
        for at in rng.integers(100, len(clean), rng.integers(1, 40)):
            damaged[at] = rng.integers(0, 256)
        path = tmp_path / f"d{trial}.sqlite"
        path.write_bytes(damaged)
        try:
            _scan(path, "t", [(ROWID, INT), (1, NULLABLE_INT), (3, TEXT), (5, REAL), (6, NULLABLE_INT)])
        except ScanError:
            caught += 1
        except sqlite3.DatabaseError:
            caught += 1  # damage in sqlite_master: the root page lookup failed first
        path.unlink()
    assert caught > 50


def test_a_page_number_past_the_end_of_a_truncated_file_is_an_error(tmp_path):
    path = tmp_path / "t.sqlite"
    _random_table(path, 4, 512)
    with sqlite3.connect(path) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 't'").fetchone()[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    file = MappedFile(path)
    try:
        with pytest.raises(ScanError, match="page number out of range|broken overflow chain"):
            scan_table(file, root, [(1, NULLABLE_INT), (3, TEXT), (6, NULLABLE_INT)])
    finally:
        file.close()


def test_a_compiler_that_fails_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.raises(DdprofError, match="false failed to build it") as caught:
        _compile(tmp_path / "reader.so")
    assert "\n" not in str(caught.value) and not (tmp_path / "reader.so").exists()


def test_reader_threads_that_all_need_the_library_first_build_it_once(tmp_path, monkeypatch):
    """An export's reader threads ask for the C library at the same moment on a fresh machine."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(btree_scan, "_compile", counting := _CountingCompile(btree_scan._compile))
    btree_scan._built_library.cache_clear()
    try:
        with ThreadPoolExecutor(4) as pool:
            libraries = list(pool.map(lambda _: btree_scan._library(), range(4)))
        assert counting.calls == 1 and len({id(lib) for lib in libraries}) == 1
        assert list((tmp_path / "ddprof").glob("*.tmp")) == []
    finally:
        btree_scan._built_library.cache_clear()  # later tests load the shared cache's build again


class _CountingCompile:
    def __init__(self, compile_):
        self.compile, self.calls = compile_, 0

    def __call__(self, target):
        self.calls += 1
        self.compile(target)
