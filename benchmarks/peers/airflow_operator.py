"""``Airflow ConsumeFromTopicOperator``: the Apache Kafka provider's operator, run through
its own ``execute()``, with a per-message ``apply_function`` (validate, ``INSERT ... ON
CONFLICT DO NOTHING``, autocommit) and with ``apply_function_batch`` (validate the batch,
``executemany``, one transaction per batch). No DLQ: what the contract rejects is dropped.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psycopg
from harness import (
    Bench,
    Measure,
    Target,
    as_measure,
    check_committed,
    check_rows,
    make_table,
    range_ends,
    rss_mb,
    run_child,
)

from peers.common import Loader, insert_sql, size_limit

#: The operator's batch size (its default).
OPERATOR_BATCH = 1000

def child_operator(t: Target, style: str, table: str, group: str, total: int,
                   max_bytes: int) -> dict[str, Any]:
    """The provider's ConsumeFromTopicOperator, run through its own ``execute()``."""
    conn_id = "bench_kafka"
    extra = {**t.kafka, "group.id": group, "auto.offset.reset": "earliest",
             "enable.auto.commit": "false"}  # as the operator asks for with commit_cadence
    os.environ[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(
        {"conn_type": "kafka", "extra": extra})
    from airflow.providers.apache.kafka.operators.consume import ConsumeFromTopicOperator

    loader = Loader(max_bytes)
    insert = insert_sql(table)
    conn = psycopg.connect(t.dsn, autocommit=(style == "row"))
    cur = conn.cursor()

    def per_message(msg: Any) -> None:
        row = loader.row(msg)
        if row is not None:
            cur.execute(insert, row)  # autocommit: one transaction per row

    def per_batch(msgs: list[Any]) -> None:
        rows = [r for r in map(loader.row, msgs) if r is not None]
        cur.executemany(insert, rows)
        conn.commit()  # one transaction per batch

    fn = {"apply_function": per_message} if style == "row" else \
        {"apply_function_batch": per_batch}
    op = ConsumeFromTopicOperator(
        task_id=f"consume_{style}", kafka_config_id=conn_id, topics=[t.topic],
        max_messages=total, max_batch_size=OPERATOR_BATCH, commit_cadence="end_of_batch",
        poll_timeout=10, **fn)
    start_rss = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        op.execute(context={})
    finally:
        conn.close()
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"events": loader.read, "seconds": secs, "cpu_s": cpu, "start_rss_mb": start_rss,
            "peak_rss_mb": rss_mb(), "detail": {"dropped": loader.dropped}}


def _measure_operator(b: Bench, rep: int, style: str, label: str) -> Measure:
    table, group = f"bench_op_{style}_{rep}", f"bench-{b.tag}-op-{style}-{rep}"
    make_table(b.dsn, table)
    raw = run_child(child_operator, b.target, style, table, group, b.produced, size_limit(b))
    if raw["events"] != b.produced:
        raise RuntimeError(f"the operator read {raw['events']} of {b.produced} messages")
    raw["detail"]["rows"] = check_rows(b, table, b.expect.get("row", 0))
    check_committed(b, group, range_ends(b.target))
    return as_measure(label, raw)


def measure_operator_batch(b: Bench, rep: int) -> Measure:
    return _measure_operator(b, rep, "batch", "Airflow ConsumeFromTopicOperator, "
                             f"apply_function_batch + executemany ({OPERATOR_BATCH:,}/txn)")


def measure_operator_row(b: Bench, rep: int) -> Measure:
    return _measure_operator(b, rep, "row", "Airflow ConsumeFromTopicOperator, "
                             "apply_function per message (INSERT, autocommit)")
