"""KafkaIngestHook over a real Airflow Kafka connection (from AIRFLOW_CONN_*) and broker."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from kafka_ingest.kafka.metadata import committed_offsets

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


def test_the_hooks_clients_are_the_connections(hook: Any, topics: Any) -> None:
    # every setting of the connection reaches the clients, but the two the hook forces
    topic = topics(2)
    clients = hook.clients
    assert clients.config["bootstrap.servers"] == hook.get_connection(
        "kafka_ingest_test").extra_dejson["bootstrap.servers"]
    assert clients.topic_id(topic)
    producer = clients.producer()
    producer.produce(topic, value=b"x", partition=1)
    assert producer.flush(30) == 0
    consumer = clients.consumer("hook-test")
    try:
        assert committed_offsets(consumer, topic, [0, 1]) == {0: None, 1: None}
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
    from kafka_ingest_tasks import table_updated_task

    task = table_updated_task(load_pipelines()["account_balances"])
    assert task.function({"inserted": 0, "deleted": 4, "tombstones": 4}) == 4
    with pytest.raises(AirflowSkipException, match="no row was inserted, updated or deleted"):
        task.function({"inserted": 0, "deleted": 0, "duplicates": 3})


def test_every_counter_of_a_runs_summary_goes_to_airflows_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the counters are ChunkCounts' fields: deleted, added later, was left out of the list
    from airflow.sdk.observability.stats import Stats

    from kafka_ingest.records import COUNTERS
    from kafka_ingest_tasks import emit_metrics

    sent: dict[str, float] = {}
    monkeypatch.setattr(Stats, "gauge", lambda name, value, **_: sent.update({name: value}))
    summary = {c: i + 1 for i, c in enumerate(COUNTERS)}

    emit_metrics("ingest", "p1", {**summary, "lag_after": 0, "partitions": 3})

    for c, value in summary.items():
        assert sent.get(f"kafka_ingest.ingest.{c}") == value, c
        assert sent.get(f"kafka_ingest.ingest.p1.{c}") == value, c
    assert "kafka_ingest.ingest.partitions" not in sent  # not a metric of the list
