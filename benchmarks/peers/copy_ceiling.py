"""``COPY ceiling``: binary ``COPY`` of the validated rows into an empty table with no key
and no index (no conflict handling: the duplicates go in too), ``COMMIT`` per chunk; read
and validation not timed. What Postgres takes at best, the ceiling of every write path."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from harness import (
    TEMPLATE_TABLE,
    Bench,
    Measure,
    Target,
    as_measure,
    chunks,
    count_rows,
    rss_mb,
    run_child,
)
from psycopg import sql

from kafka_ingest.kafka.clients import KafkaClients
from peers.common import COLUMNS, Loader, size_limit


def child_copy(t: Target, table: str, max_bytes: int) -> dict[str, Any]:
    """Binary COPY of the validated rows into a table with no key, COMMIT per chunk (read
    and validation not timed). ``events`` are rows sent to Postgres."""
    loader = Loader(max_bytes)
    stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(n) for n, _ in COLUMNS))
    types = [pg for _, pg in COLUMNS]
    start_rss = rss_mb()
    consumer = KafkaClients(t.kafka).consumer(t.group)
    rows = 0
    secs = cpu = 0.0
    try:
        with psycopg.connect(t.dsn) as conn:
            for chunk in chunks(t, consumer):
                prepared = [r for r in map(loader.row, chunk.messages) if r is not None]
                t0, c0 = time.perf_counter(), time.process_time()
                with conn.cursor().copy(stmt) as copy:
                    copy.set_types(types)
                    for row in prepared:
                        copy.write_row(row)
                conn.commit()
                secs += time.perf_counter() - t0
                cpu += time.process_time() - c0
                rows += len(prepared)
    finally:
        consumer.close()
    return {"events": rows, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {}}


def measure_copy(b: Bench, rep: int) -> Measure:
    table = f"bench_copy_{rep}"
    with psycopg.connect(b.dsn, autocommit=True) as conn:  # no key, no index: no conflicts
        conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(
            sql.Identifier(table), sql.Identifier(TEMPLATE_TABLE)))
    raw = run_child(child_copy, b.target, table, size_limit(b))
    stored = count_rows(b.dsn, table)
    if stored != raw["events"]:
        raise RuntimeError(f"{table}: {stored} rows after COPY of {raw['events']}")
    return as_measure("COPY ceiling (binary COPY, no key, COMMIT per chunk; rows)", raw)
