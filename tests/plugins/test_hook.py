"""KafkaIngestHook over a real Airflow Kafka connection (from AIRFLOW_CONN_*) and broker."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_ingest.kafka.reader import committed_offsets

pytestmark = pytest.mark.integration


@pytest.fixture
def hook(stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from kafka_ingest_hook import KafkaIngestHook

    # A connection that asks for auto commit and auto offset reset: the hook must refuse.
    extra = {"bootstrap.servers": stack_env["KAFKA_BOOTSTRAP_SERVERS"],
             "enable.auto.commit": True, "auto.offset.reset": "latest"}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_INGEST_TEST",
                       json.dumps({"conn_type": "kafka", "extra": extra}))
    return KafkaIngestHook(kafka_config_id="kafka_ingest_test")


def test_hook_reads_a_bounded_range_and_commits_after(hook: Any, topics: Any) -> None:
    topic = topics(2)
    t0 = int(time.time() * 1000) - 60_000
    producer = hook.clients.producer()
    for i in range(50):
        producer.produce(topic, value=str(i).encode(), partition=i % 2, timestamp=t0 + i * 100)
    assert producer.flush(30) == 0

    assert hook.watermarks(topic, [0, 1]) == {0: (0, 25), 1: (0, 25)}
    chunks = list(hook.read_range("hook-test", topic, 1, 5, 20, chunk_size=6))
    assert [(c.start, c.end) for c in chunks] == [(5, 11), (11, 17), (17, 20)]
    assert [m.offset() for c in chunks for m in c.messages] == list(range(5, 20))
    # message i went to partition i % 2 at t0 + 100 i: partition 1 offset k is i = 2k + 1
    assert hook.offsets_for_time(topic, [0, 1], t0 + 1000) == {0: 5, 1: 5}
    assert hook.offsets_for_time(topic, [0, 1], t0 + 10**9) == {0: 25, 1: 25}

    assert hook.commit_offsets("hook-test", topic, {1: 20})
    consumer = hook.clients.consumer("hook-test")
    try:
        assert committed_offsets(consumer, topic, [0, 1]) == {0: None, 1: 20}
    finally:
        consumer.close()


def test_the_connection_cannot_turn_on_auto_commit_or_offset_reset(hook: Any,
                                                                   topics: Any) -> None:
    topic = topics(1)
    consumer = hook.clients.consumer("hook-test-forced")
    try:
        # auto.offset.reset=error: reading below the low watermark is an error, never a jump.
        consumer.assign([TopicPartition(topic, 0, 10)])
        messages = consumer.consume(num_messages=1, timeout=5)
        assert messages and messages[0].error() is not None
    finally:
        consumer.close()


def test_a_run_that_only_deleted_rows_updates_the_tables_asset() -> None:
    # Asset-scheduled consumers must hear of deletes too; an empty run stays quiet.
    from airflow.sdk.exceptions import AirflowSkipException

    from kafka_ingest.config import load_pipelines
    from kafka_ingest_hook import table_updated_task

    task = table_updated_task(load_pipelines()["account_balances"])
    assert task.function({"inserted": 0, "deleted": 4, "tombstones": 4}) == 4
    with pytest.raises(AirflowSkipException, match="no row was inserted, updated or deleted"):
        task.function({"inserted": 0, "deleted": 0, "duplicates": 3})
