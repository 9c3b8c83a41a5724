"""A registry-encoded pipeline's ingest DAG run for real: ``airflow dags test`` against the
stack's metadata database, real Kafka, the real schema registry (its Airflow connection
from ``AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT``, exactly as ``kafka-ingest stack env`` exports
it) and a fresh Postgres database; records written by confluent-kafka's AvroSerializer."""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest_dev import stack
from tests.integration.test_registry_formats import (
    AT_1,
    AT_2,
    CONTRACT_FIELDS,
    GOOD_1,
    GOOD_2,
    GOOD_3,
    PROTO_CONTRACT_FIELDS,
    REF_1,
    REF_2,
    UNKNOWN_ID,
    apply,
    delete_subject,
    produce,
    unknown_id,
    writer,
)
from tests.support.airflow_api import last_task_state
from tests.support.dag_runs import run_dag
from tests.support.ingest import query, read_topic, stored_offsets
from tests.support.pipelines import dag_env

with warnings.catch_warnings():  # authlib's notice about httpx2
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient

pytestmark = pytest.mark.integration

NAME = "pay_avro"
DAG_ID = f"{NAME}_ingest"


@pytest.fixture
def pipeline(topics: Any, sr: SchemaRegistryClient) -> Iterator[Pipeline]:
    """The Avro pipeline on fresh random topics; its subject deleted afterwards."""
    body = {"topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "pay_rows",
            "partitions": 1, "format": "avro", "schema_registry": {},
            "contract": {"event_type": "pay_event", "version": 1}, "chunk_size": 3}
    made = parse_pipelines({"contracts": {"pay_event": {"version": 1,
                                                        "fields": CONTRACT_FIELDS}},
                            "pipelines": {NAME: body}})[NAME]
    try:
        yield made
    finally:
        delete_subject(sr, f"{made.topic}-value")


def test_an_avro_pipelines_ingest_dag_loads_exact_rows_and_dead_letters(
        stack_env: dict[str, str], registry_url: str, clients: Any, pg_dsn: str,
        pipeline: Pipeline, sr: SchemaRegistryClient, tmp_path: Path) -> None:
    exported = stack.env()
    connection = json.loads(exported["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"])
    assert (connection["conn_type"], connection["schema"]) == ("http", "http")
    apply(pg_dsn, pipeline)
    w = writer("avro", sr, pipeline.topic)
    good_1 = w.value(GOOD_1)
    produce(clients, pipeline.topic, [
        good_1,
        w.value(GOOD_2),
        b'{"event_id": "plain-json"}',  # 2: no magic byte
        unknown_id(good_1),  # 3: an id the registry does not have
        good_1[:-3],  # 4: cut short
        w.value({**GOOD_1, "event_id": "pay-x5", "amount": Decimal("1.005")}),  # 5: places
        w.value(GOOD_3),  # 6: after the poison, in the third chunk (chunk_size 3)
    ])
    schema_id = sr.get_latest_version(f"{pipeline.topic}-value").schema_id
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline),
           "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT": exported["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"]}

    proc = run_dag(DAG_ID, env, log_file=tmp_path / f"run-{uuid.uuid4().hex[:6]}.log")

    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for line in (proc.stdout + proc.stderr).splitlines():
        if " live: read " in line or f"{NAME}: {{" in line:
            print(line[-400:])
    assert query(pg_dsn, "SELECT event_id, account, amount, at, ref, note, detail,"
                         " source_offset FROM pay_rows ORDER BY source_offset") == [
        ("pay-1", "acc-1", Decimal("12.50"), AT_1, REF_1, "first",
         {"city": "Lisboa", "zip": 1100}, 0),
        ("pay-2", "acc-1", Decimal("-0.07"), AT_2, REF_2, None,
         {"city": "Porto", "zip": 4000}, 1),
        ("pay-3", "a" * 16, Decimal("12.50"), AT_1, REF_1, "third",
         {"city": "Lisboa", "zip": 1100}, 6),
    ]
    expected = {2: ("not_wire_format", None), 3: ("unknown_schema", UNKNOWN_ID),
                4: ("undecodable", schema_id), 5: ("contract_violation", schema_id)}
    rows = query(pg_dsn, "SELECT source_offset, error_class, schema_id FROM dead_letters"
                         " WHERE pipeline = %s AND status = 'parked'", (NAME,))
    assert {o: (c, s) for o, c, s in rows} == expected
    dlq = read_topic(clients, pipeline.dlq_topic, deadline_s=clients.request_timeout_s)
    headers = {int(r.headers["kafka-ingest.offset"]): (
        r.headers["kafka-ingest.error_class"].decode(),
        int(r.headers["kafka-ingest.schema_id"]) if "kafka-ingest.schema_id" in r.headers
        else None) for r in dlq.values()}
    assert headers == expected
    assert stored_offsets(pg_dsn, pipeline) == {0: 7}
    assert query(pg_dsn, "SELECT count(DISTINCT run_id) FROM ingest_runs") == [(1,)]
    assert last_task_state(stack_env, DAG_ID, "table_updated") == "success"


def test_a_protobuf_pipelines_ingest_dag_reads_records_importing_timestamp(
        stack_env: dict[str, str], registry_url: str, clients: Any, topics: Any,
        pg_dsn: str, sr: SchemaRegistryClient, tmp_path: Path) -> None:
    """The Airflow side of the fresh-process case in tests/integration/test_registry_formats.py: the
    task runs in a process where nothing imported google/protobuf/timestamp.proto."""
    name = "pay_proto"
    body = {"topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "pay_rows",
            "partitions": 1, "format": "protobuf", "schema_registry": {},
            "contract": {"event_type": "pay_event", "version": 1}}
    pipeline = parse_pipelines({"contracts": {"pay_event": {
        "version": 1, "fields": PROTO_CONTRACT_FIELDS}}, "pipelines": {name: body}})[name]
    try:
        apply(pg_dsn, pipeline)
        w = writer("protobuf", sr, pipeline.topic)
        produce(clients, pipeline.topic, [w.value(GOOD_1), w.value(GOOD_2)])
        env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline),
               "AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT":
                   stack.env()["AIRFLOW_CONN_SCHEMA_REGISTRY_DEFAULT"]}

        proc = run_dag(f"{name}_ingest", env, log_file=tmp_path / "proto.log")

        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        dead = query(pg_dsn, "SELECT source_offset, error_class, error_detail"
                             " FROM dead_letters")
        assert dead == [], (
            "BUG (kafka_ingest.decode.codecs.protobuf._protobuf_reader): in the Airflow task's "
            "process google/protobuf/timestamp.proto is not in protobuf's default pool, "
            f"so every record is dead-lettered: {dead}")
        assert query(pg_dsn, "SELECT event_id, at FROM pay_rows ORDER BY 1") == [
            ("pay-1", AT_1), ("pay-2", AT_2)]
    finally:
        delete_subject(sr, f"{pipeline.topic}-value")
