"""What an operator asks: how far behind is each pipeline, and what happened lately.

``kafka-ingest lag`` and ``kafka-ingest status`` call these and only read;
:func:`check_pipeline` (the monitor DAG's check) also records the check in
``monitor_checks``, the memory of the lag-growth rule.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database, OffsetsRepository, translate_errors
from kafka_ingest.errors import IngestError, KafkaRefused, KafkaUnavailable, TopicMissing
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.reader import group_offsets, topic_partitions, watermarks
from kafka_ingest.ops.monitor import CheckResult, Figures, check

log = logging.getLogger(__name__)


def lag(pipeline: Pipeline, clients: KafkaClients, db: Database) -> list[dict[str, Any]]:
    """Per partition: stored offset, Kafka group offset, watermarks and both lags.

    ``lag`` is the truth, from the stored offset (Postgres is the source of truth): the
    high watermark minus the stored offset, or minus the low watermark when nothing is
    stored yet. ``group_lag`` is what lag tools (``kafka-consumer-groups``, Burrow) see,
    from the consumer group's committed offset (``None`` when the group has none). They
    differ after a kill between the database commit and the Kafka commit, until the next
    live run re-syncs the group to the stored offset.
    """
    found = lags([pipeline], clients, db)[pipeline.name]
    if isinstance(found, IngestError):
        raise found
    return found


def lags(pipelines: Sequence[Pipeline], clients: KafkaClients, db: Database, *,
         timeout_s: float | None = None) -> dict[str, list[dict[str, Any]] | IngestError]:
    """:func:`lag` of several pipelines of one cluster and database (see
    :class:`LagReader`), with clients and a connection of their own, closed after."""
    with LagReader(clients, db, timeout_s=timeout_s) as reader:
        return reader.read(pipelines)


class LagReader:
    """Reads the lag of many pipelines of one cluster and one database, again and again
    (the lag trigger's loop), over one consumer, one admin client and one Postgres
    connection kept between reads: per read, one metadata request, the watermarks, one
    admin request per consumer group and one query.

    :meth:`read` gives, per pipeline, its rows (as :func:`lag`'s) or the error that kept
    them from being known (a missing topic), so one pipeline's trouble does not hide the
    others'; a cluster or database out of reach raises, and the clients and connection are
    made anew at the next read. Every request waits ``timeout_s`` at most (default: the
    config's ``socket.timeout.ms``).
    """

    def __init__(self, clients: KafkaClients, db: Database, *,
                 timeout_s: float | None = None) -> None:
        self.clients, self.db = clients, db
        self.timeout_s = timeout_s or clients.request_timeout_s
        self._consumer: Any = None
        self._admin: Any = None
        self._conn: Any = None
        #: A read and a close never overlap (the trigger closes from another thread).
        self._lock = threading.Lock()

    def __enter__(self) -> LagReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        consumer, conn = self._consumer, self._conn
        self._consumer = self._admin = self._conn = None
        if consumer is not None:
            consumer.close()
        if conn is not None:
            conn.close()

    def read(self, pipelines: Sequence[Pipeline], *, group: bool = True
             ) -> dict[str, list[dict[str, Any]] | IngestError]:
        """``group=False``: leave the consumer groups' offsets out (``group_offset`` and
        ``group_lag`` None), one admin request per pipeline fewer (the lag trigger's
        reads, which judge by the stored offsets only)."""
        with self._lock:
            try:
                return self._read(pipelines, group)
            except BaseException:
                self._close()  # whatever broke, the next read starts afresh
                raise

    def _read(self, pipelines: Sequence[Pipeline], group: bool
              ) -> dict[str, list[dict[str, Any]] | IngestError]:
        wait_s = self.timeout_s
        if self._consumer is None:
            self._consumer = self.clients.consumer("kafka-ingest.lag")
            self._admin = self.clients.admin()
        self._consumer.poll(0)  # serve its queued events (it is kept between reads)
        out: dict[str, list[dict[str, Any]] | IngestError] = {}
        marks: dict[str, dict[int, tuple[int, int]]] = {}
        topics = topic_partitions(self._consumer, timeout_s=wait_s)
        for p in pipelines:
            if p.topic not in topics:
                out[p.name] = TopicMissing(p.topic)
                continue
            marks[p.name] = watermarks(self._consumer, p.topic, topics[p.topic],
                                       timeout_s=wait_s)
        live = [p for p in pipelines if p.name in marks]
        try:
            groups = group_offsets(self._admin, [(p.group_id, p.topic, list(marks[p.name]))
                                                 for p in live if group], timeout_s=wait_s)
        except (KafkaRefused, KafkaUnavailable) as exc:  # group lag unknown, lag still known
            log.warning("consumer group offsets not read: %s", exc)
            groups = {}
        if self._conn is None:
            self._conn = self.db.connect(autocommit=True)
        with translate_errors("stored offsets"):
            stored = OffsetsRepository(self._conn).of_pipelines([(p.name, p.topic)
                                                                 for p in live])
        for p in live:
            rows: list[dict[str, Any]] = []
            out[p.name] = rows
            committed = groups.get((p.group_id, p.topic), {})
            for part, (low, high) in sorted(marks[p.name].items()):
                s, g = stored.get((p.name, p.topic, part)), committed.get(part)
                rows.append({"pipeline": p.name, "topic": p.topic, "partition": part,
                             "stored_offset": s, "group_offset": g, "low": low,
                             "high": high, "lag": high - (s if s is not None else low),
                             "group_lag": high - g if g is not None else None})
        return out


def status_rows(conn: Any, pipeline: str | None, *,
                limit: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last ``limit`` committed chunks (newest first: one pipeline's from the end of
    its index, all pipelines' from the end of the ledger) and the dead letters by class
    and status."""
    where, order = (sql.SQL("WHERE pipeline = %s"), sql.SQL("committed_at DESC, id DESC")) \
        if pipeline else (sql.SQL(""), sql.SQL("id DESC"))
    args = [pipeline] if pipeline else []
    runs = _rows(conn, sql.SQL(
        "SELECT pipeline, mode, partition, start_offset, end_offset, read, inserted,"
        " duplicates, stale, dead_lettered, known_dead, tombstones,"
        " round(seconds::numeric, 3) AS seconds,"
        " committed_at FROM ingest_runs {} ORDER BY {} LIMIT %s").format(where, order),
        [*args, limit])
    return runs, dead_letter_counts(conn, pipeline)


def dead_letter_counts(conn: Any, pipeline: str | None) -> list[dict[str, Any]]:
    """The dead letters (of one pipeline, or all) by pipeline, status and error class:
    how many, and the newest failure (``kafka-ingest status``, the pipelines page).

    The counts are ``dead_letter_totals`` (kept by triggers as letters come, change and
    go; recovered letters the retention deleted still count), so no recovered letter is
    read; the newest failure of a parked class is its letters' own (one probe of
    ``dead_letters_parked_idx`` per class), of a recovered class the totals' record."""
    where = sql.SQL("WHERE pipeline = %s" if pipeline else "")
    return _rows(conn, sql.SQL(
        "SELECT c.pipeline, c.status, c.error_class, c.n,"
        " CASE WHEN c.status = 'parked' THEN (SELECT max(d.last_failed_at) FROM dead_letters d"
        "   WHERE d.pipeline = c.pipeline AND d.status = 'parked'"
        "   AND d.error_class = c.error_class) ELSE c.last END AS last"
        " FROM (SELECT pipeline, status, error_class, sum(letters)::bigint AS n,"
        "   max(last_failed_at) AS last FROM dead_letter_totals {}"
        "   GROUP BY 1, 2, 3 HAVING sum(letters) > 0) AS c"
        " ORDER BY 1, 2, 4 DESC").format(where),
        [pipeline] if pipeline else [])


def _rows(conn: Any, query: sql.Composable, args: list[Any]) -> list[dict[str, Any]]:
    cur = conn.execute(query, args)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


# --------------------------------------------------------------------------- on-call view


def check_pipeline(pipeline: Pipeline, clients: KafkaClients, db: Database) -> CheckResult:
    """The monitor's check of one pipeline (:func:`check_pipelines`); a pipeline whose lag
    cannot be known (a missing topic) raises."""
    found = check_pipelines([pipeline], clients, db)[0][1]
    if isinstance(found, IngestError):
        raise found
    return found


def check_pipelines(pipelines: Sequence[Pipeline], clients: KafkaClients, db: Database
                    ) -> list[tuple[Pipeline, CheckResult | IngestError]]:
    """The monitor DAG's check of pipelines of one cluster and database: their lag
    (:func:`lags`: Kafka's watermarks against the stored offsets, one look for all), the
    rules of :mod:`kafka_ingest.ops.monitor`, and each check recorded in ``monitor_checks``
    (committed together). A pipeline whose lag cannot be known (a missing topic) comes
    back as its error, unrecorded, and does not keep the others from being checked; a
    cluster or database out of reach raises."""
    found = lags(pipelines, clients, db)
    out: list[tuple[Pipeline, CheckResult | IngestError]] = []
    with db.session() as conn:
        for p in pipelines:
            rows = found[p.name]
            out.append((p, rows if isinstance(rows, IngestError)
                        else check(p, rows, conn, record_check=True)))
        conn.commit()
    return out


def pipeline_status(pipeline: Pipeline, clients: KafkaClients | None,
                    db: Database) -> list[str]:
    """The on-call view of one pipeline, as lines of text: the last successful run (the
    newest committed live chunk), the lag, the DLQ rate in the alert window, the parked
    letters, the last error, the monitor's last alert, and the rules breached now (judged
    as the monitor DAG judges them; nothing is recorded).

    Without ``clients`` (no Kafka settings), or when Kafka cannot tell the lag, the view
    says so and the rules that need the lag are not judged.

    "Last error" is the newest offset gap (retention deleted unread messages), the only
    failure that leaves a row: a failed run rolls back everything it did, so its error is
    in the Airflow task log, not in this database.
    """
    rows: list[dict[str, Any]] | None = None
    lag_note = "not known: no Kafka settings"
    if clients is not None:
        try:
            rows = lag(pipeline, clients, db)
        except (IngestError, ValueError) as exc:  # a missing topic, Kafka unreachable
            lag_note = f"not known: {exc}"
    with db.session() as conn:
        result = check(pipeline, rows, conn, record_check=False)
        latest = {key: next(iter(_rows(conn, query, [pipeline.name])), None)
                  for key, query in _LATEST.items()}
    return _status_lines(pipeline, result, latest, lag_note)


_LATEST: dict[str, sql.Composable] = {
    "live": sql.SQL(  # the newest live chunk of each partition is kept with its totals
        "SELECT last_run_id AS run_id, topic, partition, last_start_offset AS start_offset,"
        " last_end_offset AS end_offset, last_committed_at AS committed_at"
        " FROM ingest_totals WHERE pipeline = %s AND mode = 'live'"
        " ORDER BY last_committed_at DESC, last_id DESC LIMIT 1"),
    "gap": sql.SQL(
        "SELECT topic, partition, from_offset, to_offset, run_id, detected_at"
        " FROM offset_gaps WHERE pipeline = %s ORDER BY id DESC LIMIT 1"),
    "alert": sql.SQL(
        "SELECT checked_at, breaches FROM monitor_checks"
        " WHERE pipeline = %s AND cardinality(breaches) > 0 ORDER BY id DESC LIMIT 1"),
}


def _when(ts: datetime, now: datetime) -> str:
    minutes = max(0, int((now - ts).total_seconds() // 60))
    ago = (f"{minutes} min" if minutes < 120 else
           f"{minutes // 60} h" if minutes < 48 * 60 else f"{minutes // 1440} days")
    return f"{ts.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z ({ago} ago)"


def _lag_text(f: Figures, lag_note: str, max_lag: int) -> str:
    if f.total_lag is None:
        return lag_note
    group = "not known" if f.group_lag is None else str(f.group_lag)
    return (f"{f.total_lag} messages over {f.partitions} partitions (group lag {group}); "
            f"limit {max_lag}")


def _dlq_text(f: Figures, max_rate: float) -> str:
    rate = f.dlq_rate
    if rate is None:
        return f"no message read by live chunks; limit {max_rate:.2%}"
    return (f"{f.dead_lettered} of {f.read} read by live chunks ({rate:.2%}); "
            f"limit {max_rate:.2%}")


def _last_run_text(live: dict[str, Any] | None, now: datetime) -> str:
    if live is None:
        return "none: no live chunk committed yet"
    return (f"{_when(live['committed_at'], now)}, run {live['run_id']}, chunk "
            f"{live['topic']}[{live['partition']}] [{live['start_offset']}, "
            f"{live['end_offset']})")


def _error_text(gap: dict[str, Any] | None, now: datetime) -> str:
    if gap is None:
        return ("none recorded (a failed run rolls back and leaves no row: see the "
                "ingest DAG's failed tasks in Airflow)")
    return (f"offset gap {gap['topic']}[{gap['partition']}] [{gap['from_offset']}, "
            f"{gap['to_offset']}) skipped {_when(gap['detected_at'], now)}, run "
            f"{gap['run_id']}: retention deleted unread messages")


def _status_lines(pipeline: Pipeline, result: CheckResult,
                  latest: dict[str, dict[str, Any] | None], lag_note: str) -> list[str]:
    f, alerts, alert = result.figures, pipeline.alerts, latest["alert"]
    fields = [
        ("last successful run", _last_run_text(latest["live"], f.now)),
        ("lag", _lag_text(f, lag_note, alerts.max_lag)),
        (f"DLQ (last {f.window_minutes} min)", _dlq_text(f, alerts.max_dlq_rate)),
        ("parked letters", f"{f.parked}; limit {alerts.max_parked}"),
        ("last error", _error_text(latest["gap"], f.now)),
        ("last alert", "none recorded by the monitor DAG" if alert is None else
         f"{_when(alert['checked_at'], f.now)}: {', '.join(alert['breaches'])}"),
        ("breaches now", f"{len(result.breaches)}" if result.breaches else "none"),
    ]
    lines = [f"{pipeline.name}: {pipeline.topic} -> {pipeline.table}"]
    lines += [f"  {label:<20} {text}" for label, text in fields]
    lines += [f"    ! {b.message}" for b in result.breaches]
    return lines
