"""Bounded reads against the real broker: chunk boundaries by offset and by bytes, and
offsets that transaction markers and aborted transactions leave unused."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_ingest.engine.ingest import ingest_range, plan_run
from kafka_ingest.kafka.metadata import watermarks
from kafka_ingest.kafka.reader import read_range
from tests.support.ingest import metric, stored_offsets, table_ids

pytestmark = pytest.mark.integration


def _read(clients: Any, topic: str, start: int, end: int, **kwargs: Any) -> list[Any]:
    consumer = clients.consumer(f"reader-test-{uuid.uuid4().hex[:6]}")
    try:
        return list(read_range(consumer, topic, 0, start, end, **kwargs))
    finally:
        consumer.close()


def test_chunks_end_early_once_their_bytes_pass_the_budget(clients: Any, topics: Any) -> None:
    topic = topics(1)
    producer = clients.producer()
    for i in range(30):
        producer.produce(topic, value=bytes(990), key=f"{i:010d}".encode(), partition=0)
    assert producer.flush(30) == 0

    chunks = _read(clients, topic, 2, 30, chunk_size=100, max_chunk_bytes=5000)

    # 1000 bytes a message: each chunk ends with the message that reaches 5000 bytes
    assert [(c.start, c.end) for c in chunks] == [(2, 7), (7, 12), (12, 17), (17, 22),
                                                  (22, 27), (27, 30)]
    assert [m.offset() for c in chunks for m in c.messages] == list(range(2, 30))


def test_transaction_markers_and_aborted_records_leave_gaps_read_by_position(
        clients: Any, topics: Any, make_pipeline: Any, db: Any, pg_dsn: str,
        kafka_config: dict[str, Any]) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1, chunk_size=4)
    producer = Producer({**kafka_config, "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    ids = []
    for batch, commit in ((range(0, 5), True), (range(5, 8), False), (range(8, 13), True)):
        producer.begin_transaction()
        for i in batch:
            producer.produce(pipeline.topic, metric(f"e{i}", "d", 1.0 + i), key=b"k",
                             partition=0)
        if commit:
            producer.commit_transaction(30)
            ids += [f"e{i}" for i in batch]
        else:
            assert producer.flush(30) == 0  # written to the log, then aborted
            producer.abort_transaction(30)
    _, high = watermarks(clients.consumer("reader-test"), pipeline.topic, [0])[0]
    assert high == 16  # 13 records and 3 markers; only 10 records are committed

    chunks = _read(clients, pipeline.topic, 0, high, chunk_size=4, idle_timeout_s=10)
    assert [c.end for c in chunks][-1] == high
    assert [m.value() for c in chunks for m in c.messages] == [
        metric(i, "d", 1.0 + int(i[1:])) for i in ids]

    run_id = "txn"
    for rng in plan_run(pipeline, clients, db, run_id=run_id):
        report = ingest_range(pipeline, rng, clients, db, run_id=run_id)
        assert (report.read, report.inserted) == (10, 10)
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(ids)
    assert stored_offsets(pg_dsn, pipeline) == {0: high}
