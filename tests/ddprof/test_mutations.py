"""The promise under damage: a mutation corpus of the committed exports and the example traces.

Each variant is a damaged or odd copy of a real-schema export (truncated, bytes flipped, a NULL,
a BLOB or text where a number or text belongs, times and token counts near the int64 limits,
intervals reversed) or a rewrite that keeps every value (other page sizes, WAL, UTF-16, rows in
another order, an extra index). Damage must give one line naming the file (DdprofError, exit 2
from the command); a rewrite must give the very same numbers. A flipped byte may land in a value
that stays plausible; then the numbers must still be sane (no negative time, shares summing to 1).
"""

import math
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from ddprof.errors import DdprofError
from ddprof.pipeline import analyse
from tests.ddprof.exports import example
from tests.ddprof.test_breakdown_cli import ddprof

DATA = Path(__file__).resolve().parents[1] / "data"
INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
KERNEL, RUNTIME, MEMCPY = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY"
FIRST_RANGE = "rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
FIRST_MARK = "rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 34)"
FIRST_DOMAIN = "rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 75)"
FIRST = "rowid = (SELECT min(rowid) FROM {table})"

# SQL that damages one value: every one must be refused in one line naming the file.
DAMAGE = {
    "null range start": f"UPDATE NVTX_EVENTS SET start = NULL WHERE {FIRST_RANGE}",
    "null range globalTid": f"UPDATE NVTX_EVENTS SET globalTid = NULL WHERE {FIRST_RANGE}",
    "null mark globalTid": f"UPDATE NVTX_EVENTS SET globalTid = NULL WHERE {FIRST_MARK}",
    "null kernel start": f"UPDATE {KERNEL} SET start = NULL WHERE {FIRST.format(table=KERNEL)}",
    "null kernel end": f'UPDATE {KERNEL} SET "end" = NULL WHERE {FIRST.format(table=KERNEL)}',
    "null kernel globalPid": f"UPDATE {KERNEL} SET globalPid = NULL WHERE {FIRST.format(table=KERNEL)}",
    "null runtime end": f'UPDATE {RUNTIME} SET "end" = NULL WHERE {FIRST.format(table=RUNTIME)}',
    "null runtime correlationId": f"UPDATE {RUNTIME} SET correlationId = NULL WHERE {FIRST.format(table=RUNTIME)}",
    "blob string": "UPDATE StringIds SET value = CAST(value AS BLOB) WHERE id = (SELECT min(id) FROM StringIds)",
    "blob domain name": f"UPDATE NVTX_EVENTS SET text = CAST(text AS BLOB) WHERE {FIRST_DOMAIN}",
    "text start": f"UPDATE NVTX_EVENTS SET start = 'soon' WHERE {FIRST_RANGE}",
    "real kernel end": f'UPDATE {KERNEL} SET "end" = "end" + 0.5 WHERE {FIRST.format(table=KERNEL)}',
    "text duration": "UPDATE ANALYSIS_DETAILS SET duration = 'long'",
    "kernel end near int64 max": f'UPDATE {KERNEL} SET "end" = {INT64_MAX} WHERE {FIRST.format(table=KERNEL)}',
    "range start near int64 min": f"UPDATE NVTX_EVENTS SET start = {INT64_MIN} WHERE {FIRST_RANGE}",
    "runtime start far away": f"UPDATE {RUNTIME} SET start = 1 << 60, \"end\" = (1 << 60) + 5 "
                              f"WHERE {FIRST.format(table=RUNTIME)}",
    "token payload near 2^62": "UPDATE NVTX_EVENTS SET int64Value = 1 << 62, uint64Value = NULL "
                               f"WHERE {FIRST_MARK}",
    "reversed kernel": f'UPDATE {KERNEL} SET start = "end", "end" = start WHERE {FIRST.format(table=KERNEL)}',
    "reversed runtime call": f'UPDATE {RUNTIME} SET start = "end" + 1 WHERE {FIRST.format(table=RUNTIME)}',
    "reversed range": f'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE {FIRST_RANGE}',
    "string table dropped": "DROP TABLE StringIds",
}
# SQL (run on a copy, or into a new file) that keeps every value.
REWRITES = {
    "vacuumed": ["VACUUM"],
    "pages of 1 KiB": ["PRAGMA page_size = 1024", "VACUUM"],
    "pages of 64 KiB": ["PRAGMA page_size = 65536", "VACUUM"],
    "wal, checkpointed": ["PRAGMA journal_mode = WAL", "CREATE TABLE scratch (x)", "DROP TABLE scratch",
                          "PRAGMA wal_checkpoint(TRUNCATE)"],
    "an index and a table more": [f"CREATE INDEX by_start ON {KERNEL} (start)", "CREATE TABLE notes (text TEXT)",
                                  "INSERT INTO notes VALUES ('hello')"],
}


def _sources(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("sources")
    sources = {path.stem: path for path in sorted(DATA.glob("*.sqlite"))}
    for schema in ("2022.4", "2025.3"):
        sources[f"example {schema}"] = example(schema).write(folder / f"example_{schema}.sqlite")
    return sources


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Each source with its numbers: the summary and the per-step table."""
    return {name: (path, _numbers(path)) for name, path in _sources(tmp_path_factory).items()}


def _numbers(path: Path):
    _, attribution, summary = analyse(path)
    return {**summary, "source": None}, attribution.per_step


def _refused(path: Path) -> str:
    """The one-line error of `path`, which must name it; fails the test if it is analysed."""
    with pytest.raises(DdprofError) as caught:
        analyse(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


def _copy(path: Path, target: Path) -> Path:
    shutil.copyfile(path, target)
    return target


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_value_is_one_line_naming_the_file(damage, sources, tmp_path):
    sql = DAMAGE[damage]
    damaged = 0
    for name, (path, _) in sources.items():
        if any(table in sql and table not in _tables(path) for table in (KERNEL, RUNTIME)):
            continue  # the source has no such rows (nsys leaves empty tables out)
        variant = _copy(path, tmp_path / f"{name.replace(' ', '_')}.sqlite")
        try:
            with sqlite3.connect(variant) as db:
                db.execute(sql)
        except sqlite3.IntegrityError:  # a NOT NULL column of nsys 2025's DDL: the example exports have none
            continue
        _refused(variant)
        damaged += 1
    assert damaged >= 2


@pytest.mark.parametrize("rewrite", REWRITES)
def test_a_rewrite_that_keeps_every_value_keeps_every_number(rewrite, sources, tmp_path):
    for name, (path, (summary, per_step)) in sources.items():
        variant = _copy(path, tmp_path / f"{name.replace(' ', '_')}.sqlite")
        db = sqlite3.connect(variant, isolation_level=None)
        for sql in REWRITES[rewrite]:
            if KERNEL in sql and KERNEL not in _tables(path):
                continue
            db.execute(sql)
        db.close()
        got_summary, got_per_step = _numbers(variant)
        assert got_summary == summary and got_per_step.equals(per_step), (name, rewrite)


def test_utf16_and_rows_in_another_order_keep_every_number(sources, tmp_path):
    """The same rows in a UTF-16 file, every table's rows in a random order."""
    rng = random.Random(0)
    for name, (path, (summary, per_step)) in sources.items():
        variant = tmp_path / f"{name.replace(' ', '_')}_utf16.sqlite"
        variant.unlink(missing_ok=True)
        with sqlite3.connect(path) as src, sqlite3.connect(variant) as dst:
            dst.execute("PRAGMA encoding = 'UTF-16le'")
            for (sql,) in src.execute("SELECT sql FROM sqlite_master WHERE type = 'table'").fetchall():
                dst.execute(sql)
            for table in _tables(path):
                rows = src.execute(f"SELECT * FROM {table}").fetchall()
                rng.shuffle(rows)
                if rows:
                    dst.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        got_summary, got_per_step = _numbers(variant)
        assert got_summary == summary and got_per_step.equals(per_step), name


def test_a_truncated_export_is_one_line_naming_the_file(sources, tmp_path):
    for name, (path, _) in sources.items():
        data = path.read_bytes()
        for size in (0, 50, 100, 4096, len(data) // 2, len(data) - 1):
            variant = tmp_path / f"{name.replace(' ', '_')}_{size}.sqlite"
            variant.write_bytes(data[:size])
            _refused(variant)


def _sane(summary: dict) -> None:
    for stage in summary["stages"]:
        for key in ("cpu_ms", "crit_ms", "wait_ms"):
            assert stage[key] >= 0 and math.isfinite(stage[key]), (stage["stage"], key)
        assert stage["gpu_ms"] is None or stage["gpu_ms"] >= 0
    shares = [s["crit_share"] for s in summary["stages"]] + [summary["other_crit_share"]]
    assert sum(shares) == pytest.approx(1.0)
    assert summary["tok_per_s"] is None or 0 <= summary["tok_per_s"] < 1e12


@pytest.mark.parametrize("seed", [*range(24), 57, 158, 209, 231, 397, 545, 999])  # and the seeds that found bugs
def test_flipped_bytes_are_refused_or_give_sane_numbers(seed, sources, tmp_path):
    rng = random.Random(seed)
    for name, (path, _) in sources.items():
        data = bytearray(path.read_bytes())
        for _ in range(8):
            at = rng.randrange(100, len(data))  # past the header, which test_export_reader damages
            data[at] ^= 1 << rng.randrange(8)
        variant = tmp_path / f"{name.replace(' ', '_')}.sqlite"
        variant.write_bytes(data)
        try:
            _, _, summary = analyse(variant)
        except DdprofError as exc:
            assert str(exc).startswith(f"{variant}: ") and "\n" not in str(exc)
        else:
            _sane(summary)


def test_the_command_says_each_kind_of_damage_in_one_line_and_exits_2(sources, tmp_path):
    path, _ = sources["example 2025.3"]
    for damage in ("null kernel start", "blob string", "token payload near 2^62", "reversed kernel"):
        variant = _copy(path, tmp_path / f"{damage.replace(' ', '_')}.sqlite")
        with sqlite3.connect(variant) as db:
            db.execute(DAMAGE[damage])
        done = ddprof("breakdown", variant, "--json")
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.startswith(f"ddprof: error: {variant}: ") and done.stderr.count("\n") == 1, done.stderr
