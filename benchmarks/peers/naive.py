"""``B  naive loader``: what a simple DAG does, the baseline every row is compared with.

``json.loads`` + ``executemany(INSERT ... ON CONFLICT DO NOTHING)`` per chunk, COMMIT per
chunk, into an empty copy of the table. No DLQ, no stored offsets, no audit; it drops what
it cannot load and, with a hand-written guard, values Postgres would reject (else one
poison pill aborts its chunk).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import psycopg
from harness import (
    EPOCH_END,
    Bench,
    Measure,
    Target,
    as_measure,
    chunks,
    count_rows,
    make_table,
    rss_mb,
    run_child,
)
from psycopg import sql

from kafka_ingest.kafka.clients import KafkaClients

_NAIVE_COLUMNS = ("event_id", "device_id", "timestamp", "metric_value", "status", "unit",
                  "source_topic", "source_partition", "source_offset", "kafka_key",
                  "kafka_timestamp")


def _naive_insert(table: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {} ({}) VALUES (%s, %s, to_timestamp(%s), %s, %s, %s, %s, %s, %s, %s,"
        " to_timestamp(%s)) ON CONFLICT (event_id) DO NOTHING"
    ).format(sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, _NAIVE_COLUMNS)))


def _text_ok(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit and "\x00" not in value


def _naive_row(msg: Any) -> tuple[Any, ...] | None:
    """What a simple loader keeps: loadable objects whose values the table accepts."""
    try:
        e = json.loads(msg.value())
        ts, value = float(e["timestamp"]), float(e["metric_value"])
        row = (e["event_id"], e["device_id"], ts, value, e.get("status", "OK"), e.get("unit"))
    except (TypeError, ValueError, KeyError, OverflowError):
        return None
    fits = (_text_ok(row[0], 128) and _text_ok(row[1], 128) and _text_ok(row[4], 32)
            and (row[5] is None or _text_ok(row[5], 32))
            and math.isfinite(value) and 0 <= ts < EPOCH_END)
    if not fits:
        return None
    kind, ms = msg.timestamp()
    return (*row, msg.topic(), msg.partition(), msg.offset(), msg.key(),
            ms / 1000 if kind and ms >= 0 else None)


def child_naive(t: Target, table: str) -> dict[str, Any]:
    """Baseline B: json.loads + executemany INSERT ... ON CONFLICT DO NOTHING per chunk."""
    start_rss = rss_mb()
    insert = _naive_insert(table)
    consumer = KafkaClients(t.kafka).consumer(t.group)
    n = kept = 0
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in chunks(t, consumer):
                n += len(chunk.messages)
                rows = [r for r in map(_naive_row, chunk.messages) if r is not None]
                kept += len(rows)
                with conn.cursor() as cur:
                    cur.executemany(insert, rows)
                conn.commit()
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": n, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {"rows_sent": kept, "skipped": n - kept}}


def measure_naive(b: Bench, rep: int) -> Measure:
    name = f"bench_naive_{rep}"
    make_table(b.dsn, name)
    raw = run_child(child_naive, b.target, name)
    raw["detail"]["stored"] = count_rows(b.dsn, name)
    if raw["events"] != b.produced:  # what it stores is its own business (see the README)
        raise RuntimeError(f"read {raw['events']} messages of {b.produced}")
    return as_measure("B  naive loader (json.loads + executemany)", raw)
