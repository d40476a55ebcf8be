"""Cut a real nsys export down to a few consecutive decode steps, for a small fixture in tests/data/.

Every table, column and the file's DDL stay as nsys wrote them; only rows go. The window runs from
the start of the first kept step to the start of the step after the last kept one (or the trace's
end), so each kept step keeps what follows it up to the next step (its tokens mark). Rows of
time-stamped tables are kept inside the window; NVTX registrations (domains, ...) are kept wherever
they are; a GPU op is kept with its launching runtime call (with the host running ahead its work
may run past the window), or, launched by no call, where it starts. A step is a `step` range of the
engine's NVTX domain; the SQL here shares no code with ddprof.

    python -m tests.ddprof.trim_export SOURCE.sqlite TARGET.sqlite --first-step 2 --steps 6
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
from pathlib import Path

from engine.stages import DOMAIN, STEP

GPU_OP_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                 "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
TIMED_NVTX_EVENTS = (34, 59, 60)  # marks and ranges (ENUM_NSYS_EVENT_TYPE); the others register names
_PID_BITS = -(1 << 24)  # globalTid & this = the globalPid of its process
STEP_STARTS = """
    SELECT n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
    WHERE n.eventType IN (59, 60) AND coalesce(n.text, s.value) = ?
      AND n.domainId IN (SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = ?)
    ORDER BY n.start"""


class TrimError(Exception):
    """Bad input: one line naming the file."""


def trim(source: Path, target: Path, first_step: int, steps: int) -> tuple[int, int]:
    """Write `target`: `source` cut to steps first_step .. first_step + steps - 1 (0-based, by start).
    Returns the window [start, end) in the export's ns."""
    if first_step < 0 or steps < 1:
        raise TrimError(f"{source}: --first-step must be >= 0 and --steps >= 1")
    shutil.copyfile(source, target)
    db = sqlite3.connect(target, isolation_level=None)
    try:
        starts = [start for (start,) in db.execute(STEP_STARTS, (STEP, DOMAIN))]
        if first_step + steps > len(starts):
            raise TrimError(f"{source}: {len(starts)} steps in the {DOMAIN} domain, "
                            f"asked for steps {first_step}..{first_step + steps - 1}")
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        timed = [t for t in tables if "start" in {row[1] for row in db.execute(f"PRAGMA table_info({t})")}]
        lo = starts[first_step]
        hi = (starts[first_step + steps] if first_step + steps < len(starts)
              else 1 + max(db.execute(f'SELECT max(max(start, coalesce("end", start))) FROM {t}').fetchone()[0] or 0
                           for t in timed))
        outside = "(start < ? OR start >= ?)"
        db.execute("BEGIN")
        if RUNTIME in tables:
            db.execute(f"CREATE TEMP TABLE launch AS SELECT globalTid & {_PID_BITS} AS pid, correlationId AS id, "
                       f"max(start >= ? AND start < ?) AS inside FROM {RUNTIME} GROUP BY 1, 2", (lo, hi))
            db.execute("CREATE INDEX temp.launch_by_id ON launch (id, pid)")
        for table in timed:
            if table in GPU_OP_TABLES and RUNTIME in tables:
                db.execute(f"DELETE FROM {table} WHERE NOT coalesce((SELECT inside FROM launch WHERE launch.id = "
                           f"{table}.correlationId AND launch.pid = {table}.globalPid), NOT {outside})", (lo, hi))
            elif table == "NVTX_EVENTS":
                kinds = ", ".join(map(str, TIMED_NVTX_EVENTS))
                db.execute(f"DELETE FROM NVTX_EVENTS WHERE eventType IN ({kinds}) AND {outside}", (lo, hi))
            else:
                db.execute(f"DELETE FROM {table} WHERE {outside}", (lo, hi))
        db.execute("COMMIT")
        db.execute("VACUUM")
    except BaseException:
        db.close()
        target.unlink()
        raise
    db.close()
    return lo, hi


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--first-step", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    try:
        lo, hi = trim(args.source, args.target, args.first_step, args.steps)
    except (TrimError, sqlite3.Error, OSError) as exc:
        print(exc if isinstance(exc, TrimError) else f"{args.source}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.target}: steps {args.first_step}..{args.first_step + args.steps - 1}, "
          f"[{lo}, {hi}) ns, {args.target.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
