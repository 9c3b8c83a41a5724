"""What an operator asks: how far behind is each pipeline, and what happened lately.

Read-only: ``kafka-ingest lag`` and ``kafka-ingest status`` call these.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from kafka_ingest.clients import KafkaClients
from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database, OffsetsRepository
from kafka_ingest.reader import committed_offsets, partitions_of, watermarks


def lag(pipeline: Pipeline, clients: KafkaClients, db: Database) -> list[dict[str, Any]]:
    """Per partition: stored offset, Kafka group offset, watermarks and lag."""
    consumer = clients.consumer(pipeline.group_id)
    try:
        parts = partitions_of(consumer, pipeline.topic)
        marks = watermarks(consumer, pipeline.topic, parts)
        group = committed_offsets(consumer, pipeline.topic, parts)
    finally:
        consumer.close()
    with db.session() as conn:
        stored = OffsetsRepository(conn).all(pipeline.name, pipeline.topic)
    rows = []
    for p in parts:
        low, high = marks[p]
        s = stored.get(p)
        rows.append({"pipeline": pipeline.name, "topic": pipeline.topic, "partition": p,
                     "stored_offset": s, "group_offset": group.get(p), "low": low,
                     "high": high, "lag": high - (s if s is not None else low)})
    return rows


def status_rows(conn: Any, pipeline: str | None, *,
                limit: int = 10) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last ``limit`` committed chunks and the dead letters by class and status."""
    where = sql.SQL("WHERE pipeline = %s" if pipeline else "")
    args = [pipeline] if pipeline else []
    runs = _rows(conn, sql.SQL(
        "SELECT pipeline, mode, partition, start_offset, end_offset, read, inserted,"
        " duplicates, stale, dead_lettered, tombstones, round(seconds::numeric, 3) AS seconds,"
        " committed_at FROM ingest_runs {} ORDER BY id DESC LIMIT %s").format(where),
        [*args, limit])
    dead = _rows(conn, sql.SQL(
        "SELECT pipeline, status, error_class, count(*) AS n, max(last_failed_at) AS last"
        " FROM dead_letters {} GROUP BY 1, 2, 3 ORDER BY 1, 2, 4 DESC").format(where), args)
    return runs, dead


def _rows(conn: Any, query: sql.Composable, args: list[Any]) -> list[dict[str, Any]]:
    cur = conn.execute(query, args)
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
