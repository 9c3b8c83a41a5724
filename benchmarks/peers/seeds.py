"""``seeds' loop``: the loop this project started from: ``poll()`` one message, validate,
insert (autocommit), ``commit(asynchronous=False)``, per message. Capped at the first
``--seeds-cap`` messages (2,000): its events/s is its own, nothing is extrapolated."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from harness import (
    BASE_PIPELINE,
    Bench,
    Measure,
    Target,
    as_measure,
    check_committed,
    make_table,
    pipeline_of,
    rss_mb,
    run_child,
)
from psycopg import sql

from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.reader import read_range
from peers.common import Loader, insert_sql, size_limit

#: How many messages the seeds' loop gets unless ``--seeds-cap`` says otherwise.
SEEDS_CAP = 2000

def child_seeds(t: Target, table: str, group: str, cap: int,
                max_bytes: int) -> dict[str, Any]:
    """The seeds' loop: poll one message, validate, insert, commit it synchronously."""
    from confluent_kafka import Consumer

    loader = Loader(max_bytes)
    insert = insert_sql(table)
    last: dict[int, int] = {}
    start_rss = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    first = None
    consumer = Consumer({**t.kafka, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    deadline = time.monotonic() + 600
    try:
        with psycopg.connect(t.dsn, autocommit=True) as conn:
            consumer.subscribe([t.topic])
            while loader.read < cap:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"read {loader.read} of {cap} messages in 600 s")
                msg: Any = consumer.poll(1.0)
                if msg is None or msg.error():
                    continue
                first = first or time.perf_counter() - t0
                row = loader.row(msg)
                if row is not None:
                    conn.execute(insert, row)
                consumer.commit(message=msg, asynchronous=False)
                last[msg.partition()] = msg.offset()
    finally:
        consumer.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": loader.read, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(),
            "detail": {"dropped": loader.dropped, "last_offsets": last,
                       "first_message_s": round(first or 0.0, 3)}}


def measure_seeds(b: Bench, rep: int) -> Measure:
    cap = min(b.peers.seeds_cap, b.produced)
    table, group = f"bench_seeds_{rep}", f"bench-{b.tag}-seeds-{rep}"
    make_table(b.dsn, table)
    raw = run_child(child_seeds, b.target, table, group, cap, size_limit(b))
    last = {int(k): v for k, v in raw["detail"].pop("last_offsets").items()}
    raw["detail"]["rows"] = check_seeds(b, table, last)
    check_committed(b, group, {part: offset + 1 for part, offset in last.items()})
    return as_measure(f"seeds' loop (poll + commit per message), first {cap:,} messages "
                         "only", raw)


def check_seeds(b: Bench, table: str, last: dict[int, int]) -> int:
    """The table holds exactly the valid events among the messages the loop read (each
    partition's prefix up to ``last``), as the project's validate_chunk sees them."""
    pipeline = pipeline_of((BASE_PIPELINE, b.base_body))
    want: set[str] = set()
    consumer = b.clients.consumer(f"bench-{b.tag}-seedcheck")
    try:
        for p, end in last.items():
            start = b.target.ranges[p][0]
            for chunk in read_range(consumer, b.source, p, start, end + 1, chunk_size=5000):
                rows = validate_chunk(chunk.messages, pipeline).rows
                want.update(getattr(r, "values", r)[0] for r in rows)  # the event id
    finally:
        consumer.close()
    with psycopg.connect(b.dsn) as conn:
        got = {r[0] for r in conn.execute(
            sql.SQL("SELECT event_id FROM {}").format(sql.Identifier(table)))}
    if got != want:
        raise RuntimeError(f"{table}: {len(got)} rows, expected the {len(want)} valid events"
                           f" read; missing {sorted(want - got)[:3]},"
                           f" extra {sorted(got - want)[:3]}")
    return len(got)
