"""Read-only queries behind ``kafka-ingest status``: recent chunks and dead letters."""

from __future__ import annotations

from typing import Any


def status_rows(conn: Any, pipeline: str | None, *,
                limit: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last ``limit`` committed chunks and the dead letters by class and status."""
    where, args = ("WHERE pipeline = %s", [pipeline]) if pipeline else ("", [])
    cur = conn.execute(
        "SELECT pipeline, mode, partition, start_offset, end_offset, read, inserted,"
        " duplicates, stale, dead_lettered, tombstones, round(seconds::numeric, 3) AS seconds,"
        f" committed_at FROM ingest_runs {where} ORDER BY id DESC LIMIT %s",
        [*args, limit],
    )
    cols = [d.name for d in cur.description]
    runs = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    cur = conn.execute(
        "SELECT pipeline, status, error_class, count(*) AS n, max(last_failed_at) AS last"
        f" FROM dead_letters {where} GROUP BY 1, 2, 3 ORDER BY 1, 2, 4 DESC",
        args,
    )
    cols = [d.name for d in cur.description]
    dead = [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    return runs, dead
