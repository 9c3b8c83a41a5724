"""What an operator asks: how is each pipeline doing, and what happened lately.

``kafka-ingest status`` calls these and only reads (the lag: :mod:`kafka_ingest.ops.lag`);
:func:`check_pipeline` (the monitor DAG's check) also records the check in
``monitor_checks``, the memory of the lag-growth rule. What they read is asked through
:mod:`kafka_ingest.db.observations`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.db.observations import (
    LedgerLooks,
    LetterLooks,
    MonitorChecksRepository,
    newest_gap,
)
from kafka_ingest.errors import IngestError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ops.lag import LagRow, lag, lags
from kafka_ingest.ops.monitor import CheckResult, Figures, check


def status_rows(conn: Any, pipeline: str | None, *,
                limit: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last ``limit`` committed chunks, newest first, with every counter, and the dead
    letters by class and status (``kafka-ingest status``'s tables)."""
    return LedgerLooks(conn).recent(pipeline, limit=limit), LetterLooks(conn).counts(pipeline)


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
    rows: list[LagRow] | None = None
    lag_note = "not known: no Kafka settings"
    if clients is not None:
        try:
            rows = lag(pipeline, clients, db)
        except (IngestError, ValueError) as exc:  # a missing topic, Kafka unreachable
            lag_note = f"not known: {exc}"
    with db.session() as conn:
        result = check(pipeline, rows, conn, record_check=False)
        latest = {"live": LedgerLooks(conn).newest_live_chunk(pipeline.name),
                  "gap": newest_gap(conn, pipeline.name),
                  "alert": MonitorChecksRepository(conn).newest_alert(pipeline.name)}
    return _status_lines(pipeline, result, latest, lag_note)


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
