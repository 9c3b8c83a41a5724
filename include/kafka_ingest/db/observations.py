"""What the looks read: the monitor's check, ``kafka-ingest status``, the Prometheus metrics
and the pipelines page (``kafka_ingest.ops``), each a query of its own here.

Each costs the same however long the history: it reads a summary kept as chunks and
letters are written (``ingest_totals``, ``dead_letter_totals``, migration 0010), or a
window or the newest rows through an index, never a bookkeeping table from end to end
(``tests/integration/test_look_cost.py`` compares the buffers each reads over a short
and a long history). All read, but :meth:`MonitorChecksRepository.record`; none commits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from kafka_ingest.records import COUNTERS, ChunkCounts


def database_now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock (the start of the current transaction): every look of one
    check judges time by it."""
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None  # noqa: S101 (SELECT now() returns one row)
    now: datetime = row[0]
    return now


def _rows(conn: psycopg.Connection[Any], query: sql.Composed | str,
          args: Sequence[Any]) -> list[dict[str, Any]]:
    cur = conn.execute(query, args)
    cols = [d.name for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _one(conn: psycopg.Connection[Any], query: str, args: Sequence[Any]) -> Any:
    row = conn.execute(query, args).fetchone()
    return None if row is None else row[0]


# --------------------------------------------------------------------------- the ledger

#: The counters' columns (of ``ingest_runs`` and ``ingest_totals`` alike).
_COUNTERS = sql.SQL(", ").join(map(sql.Identifier, COUNTERS))
#: The ledger's totals by mode: as many rows as partitions, however long the ledger, and
#: unchanged by its retention.
_TOTALS = sql.SQL("SELECT mode, {} FROM ingest_totals WHERE pipeline = %s GROUP BY mode").format(
    sql.SQL(", ").join(sql.SQL("coalesce(sum({}), 0)").format(sql.Identifier(c))
                       for c in COUNTERS))
#: The newest live chunk of each partition is kept with its totals.
_NEWEST_LIVE = (
    "SELECT last_run_id AS run_id, topic, partition, last_start_offset AS start_offset,"
    " last_end_offset AS end_offset, last_committed_at AS committed_at"
    " FROM ingest_totals WHERE pipeline = %s AND mode = 'live'"
    " ORDER BY last_committed_at DESC, last_id DESC LIMIT 1")
#: The recent chunks, with every counter of the audit row.
_RECENT = sql.SQL("SELECT pipeline, mode, partition, start_offset, end_offset, {counters},"
                  " round(seconds::numeric, 3) AS seconds, committed_at"
                  " FROM ingest_runs {where} ORDER BY {order} LIMIT %s")


class LedgerLooks:
    """``ingest_runs`` (the audit, one row per committed chunk) and ``ingest_totals``
    (its sums per partition and mode, and the newest chunk of each), read."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def live_window(self, pipeline: str, now: datetime, minutes: int) -> tuple[int, int]:
        """Messages read and dead-lettered by the live chunks committed in the
        ``minutes`` before ``now`` (``ingest_runs_pipeline_idx``)."""
        row = self.conn.execute(
            "SELECT coalesce(sum(read), 0), coalesce(sum(dead_lettered), 0) FROM ingest_runs"
            " WHERE pipeline = %s AND mode = 'live'"
            " AND committed_at > %s::timestamptz - %s::int * interval '1 minute'",
            (pipeline, now, minutes)).fetchone()
        assert row is not None  # noqa: S101 (an aggregate returns one row)
        return int(row[0]), int(row[1])

    def last_live_commit(self, pipeline: str) -> datetime | None:
        """When the pipeline's newest live chunk was committed (None: never)."""
        found: datetime | None = _one(
            self.conn, "SELECT max(last_committed_at) FROM ingest_totals"
                       " WHERE pipeline = %s AND mode = 'live'", (pipeline,))
        return found

    def newest_live_chunk(self, pipeline: str) -> dict[str, Any] | None:
        """The newest live chunk: its run, topic, partition, offsets and commit time."""
        return next(iter(_rows(self.conn, _NEWEST_LIVE, (pipeline,))), None)

    def totals(self, pipeline: str) -> dict[str, ChunkCounts]:
        """The ledger's counters by mode (``live``, ``backfill``, ``replay``), every chunk
        ever committed counted (the retention of ``ingest_runs`` leaves them)."""
        return {mode: ChunkCounts(**dict(zip(COUNTERS, map(int, values), strict=True)))
                for mode, *values in self.conn.execute(_TOTALS, (pipeline,)).fetchall()}

    def recent(self, pipeline: str | None, *, limit: int = 10) -> list[dict[str, Any]]:
        """The last ``limit`` committed chunks, newest first: one pipeline's from the end
        of its index, all pipelines' from the end of the ledger."""
        where, order = (sql.SQL("WHERE pipeline = %s"), sql.SQL("committed_at DESC, id DESC")) \
            if pipeline else (sql.SQL(""), sql.SQL("id DESC"))
        return _rows(self.conn, _RECENT.format(counters=_COUNTERS, where=where, order=order),
                     [*([pipeline] if pipeline else []), limit])


# --------------------------------------------------------------------------- dead letters


class LetterLooks:
    """``dead_letter_totals`` (kept by triggers as letters come, change and go; recovered
    letters the retention deleted still count), and the parked letters' own newest
    failure (``dead_letters_parked_idx``): no recovered letter is ever read."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def parked(self, pipeline: str) -> int:
        """The pipeline's dead letters still parked."""
        return int(_one(self.conn, "SELECT coalesce(sum(letters), 0) FROM dead_letter_totals"
                                   " WHERE pipeline = %s AND status = 'parked'", (pipeline,)))

    def counts(self, pipeline: str | None) -> list[dict[str, Any]]:
        """The dead letters (of one pipeline, or all) by pipeline, status and error class:
        how many (``n``), and the newest failure (``last``; of a parked class its letters'
        own, one probe of the index per class, of a recovered class the totals' record)."""
        where = sql.SQL("WHERE pipeline = %s" if pipeline else "")
        return _rows(self.conn, sql.SQL(
            "SELECT c.pipeline, c.status, c.error_class, c.n,"
            " CASE WHEN c.status = 'parked' THEN (SELECT max(d.last_failed_at)"
            "   FROM dead_letters d WHERE d.pipeline = c.pipeline AND d.status = 'parked'"
            "   AND d.error_class = c.error_class) ELSE c.last END AS last"
            " FROM (SELECT pipeline, status, error_class, sum(letters)::bigint AS n,"
            "   max(last_failed_at) AS last FROM dead_letter_totals {}"
            "   GROUP BY 1, 2, 3 HAVING sum(letters) > 0) AS c"
            " ORDER BY 1, 2, 4 DESC").format(where), [pipeline] if pipeline else [])

    def parked_by_reason(self, pipeline: str) -> dict[str, int]:
        """The parked letters by error class."""
        return {r["error_class"]: int(r["n"]) for r in self.counts(pipeline)
                if r["status"] == "parked"}


# --------------------------------------------------------------------------- the monitor


@dataclass(frozen=True)
class RecordedCheck:
    """One recorded monitor check: when, the total lag, the lag per partition."""

    at: datetime
    total_lag: int
    partition_lags: Mapping[int, int]


class MonitorChecksRepository:
    """``monitor_checks``: one row per check of the monitor DAG (the lag-growth rule's
    memory, the page's lag history, the last alert)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def record(self, pipeline: str, *, at: datetime, total_lag: int, group_lag: int | None,
               dlq_rate: float | None, parked: int, breaches: Sequence[str],
               partition_lags: Mapping[int, int]) -> None:
        """Append one check (the caller commits)."""
        self.conn.execute(
            "INSERT INTO monitor_checks (pipeline, checked_at, total_lag, group_lag, dlq_rate,"
            " parked, breaches, partition_lags) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (pipeline, at, total_lag, group_lag, dlq_rate, parked, list(breaches),
             Jsonb({str(p): lag for p, lag in sorted(partition_lags.items())})))

    def newest_totals(self, pipeline: str, n: int) -> list[int]:
        """The total lag of the newest ``n`` checks, oldest first."""
        return [int(r[0]) for r in self.conn.execute(
            "SELECT total_lag FROM monitor_checks WHERE pipeline = %s ORDER BY id DESC LIMIT %s",
            (pipeline, n)).fetchall()][::-1]

    def first_checked_at(self, pipeline: str) -> datetime | None:
        """When the monitor first checked the pipeline (None: never)."""
        found: datetime | None = _one(
            self.conn, "SELECT checked_at FROM monitor_checks WHERE pipeline = %s"
                       " ORDER BY id LIMIT 1", (pipeline,))
        return found

    def newest_alert(self, pipeline: str) -> dict[str, Any] | None:
        """The newest check that breached a rule: ``checked_at``, ``breaches``."""
        return next(iter(_rows(
            self.conn, "SELECT checked_at, breaches FROM monitor_checks"
                       " WHERE pipeline = %s AND cardinality(breaches) > 0"
                       " ORDER BY id DESC LIMIT 1", (pipeline,))), None)

    def history(self, pipelines: Sequence[str], *,
                hours: int) -> dict[str, list[RecordedCheck]]:
        """The checks of the last ``hours`` per pipeline, oldest first."""
        rows = self.conn.execute(
            "SELECT pipeline, checked_at, total_lag, partition_lags FROM monitor_checks"
            " WHERE pipeline = ANY(%s) AND checked_at > now() - %s * interval '1 hour'"
            " ORDER BY id", (list(pipelines), hours)).fetchall()
        out: dict[str, list[RecordedCheck]] = {name: [] for name in pipelines}
        for name, at, total, parts in rows:
            out[name].append(RecordedCheck(at, int(total), {int(k): int(v) for k, v
                                                            in (parts or {}).items()}))
        return out


# --------------------------------------------------------------------------- offset gaps


def newest_gap(conn: psycopg.Connection[Any], pipeline: str) -> dict[str, Any] | None:
    """The pipeline's newest offset gap (``offset_gaps_pipeline_idx``): the only failure
    that leaves a row."""
    return next(iter(_rows(
        conn, "SELECT topic, partition, from_offset, to_offset, run_id, detected_at"
              " FROM offset_gaps WHERE pipeline = %s ORDER BY id DESC LIMIT 1",
        (pipeline,))), None)
