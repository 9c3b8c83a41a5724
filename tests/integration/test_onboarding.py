"""Onboarding a topic with the declaration the CLI prints, on the real stack: Kafka, the
schema registry (Apicurio, Confluent's API) and Postgres. No mocks.

The three Kafka Connect Datagen quickstart schemas (``orders``: an int ``orderid``, a
long ``ordertime``, a nested ``address`` record; ``transactions``: a long
``transaction_id`` among other ``*_id`` fields; ``pageviews``: no id at all), registered
and produced with confluent-kafka's own ``AvroSerializer``, and ``orders`` again with a
registered key subject: ``kafka-ingest schema from-registry`` prints a pipelines file,
written as printed; ``schema apply``, ``topics create`` and ``run`` load every record;
a second run and a backfill of the whole topic write nothing more. A schemaless JSON topic
the same way through ``schema from-topic``, and its bad inputs (no topic, no records,
values that are not JSON) refused in one line, exit 2.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_ingest.kafka.clients import KafkaClients
from tests.integration.test_registry_formats import _cli, subjects  # noqa: F401
from tests.support.datagen import ORDERS, PAGEVIEWS, TRANSACTIONS
from tests.support.ingest import query

with warnings.catch_warnings():  # authlib's notice about httpx2, as kafka_ingest's registry
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

pytestmark = pytest.mark.integration

N = 40


def _order(i: int) -> dict[str, Any]:
    return {"ordertime": 1_497_014_222_380 + i, "orderid": i, "itemid": f"Item_{i % 7}",
            "orderunits": 0.5 + i, "address": {"city": f"City_{i % 3}", "state": "State_1",
                                               "zipcode": 10_000 + i}}


def _transaction(i: int) -> dict[str, Any]:
    return {"transaction_id": 1000 + i, "card_id": i % 5, "user_id": f"User_{i % 4}",
            "purchase_id": i % 9, "store_id": i % 3}


def _pageview(i: int) -> dict[str, Any]:
    # no id: the same view twice is two records
    return {"viewtime": 1_560_000_000_000 + i // 2, "userid": f"User_{i % 4}",
            "pageid": f"Page_{i % 6}"}


CASES = {  # topic prefix, schema, record, key schema, expected identity
    "orders": ("orders", ORDERS, _order, None, "orderid"),
    "transactions": ("transactions", TRANSACTIONS, _transaction, None, "transaction_id"),
    "pageviews": ("pageviews", PAGEVIEWS, _pageview, None, "source_position"),
    "orders_keyed": ("orders", ORDERS, _order, "int", "record_key"),
}


@pytest.fixture
def env(stack_env: dict[str, str], registry_url: str, pg_dsn: str) -> dict[str, str]:
    out = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url,
           "KAFKA_INGEST_PG_DSN": pg_dsn, "KAFKA_INGEST_PG_ADMIN_DSN": pg_dsn,
           "KAFKA_INGEST_PG_GRANT_TO": ""}
    out.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)
    return out


def _produce(clients: KafkaClients, topic: str, records: list[tuple[bytes | None, bytes]],
             partitions: int = 1) -> None:
    producer = clients.producer()
    failures: list[Any] = []
    for i, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=i % partitions,
                         on_delivery=lambda err, _m: failures.extend([err] if err else []))
    assert producer.flush(producer.delivery_timeout_s) == 0 and not failures, failures


def _comments(printed: str) -> str:
    """The printed comments as one line (they are wrapped)."""
    return " ".join(line[1:].strip() for line in printed.splitlines() if line.startswith("#"))


def _onboard(env: dict[str, str], printed: str, tmp_path: Path, pipeline: str, pg_dsn: str,
             topic: str, partitions: int, dlq_topics: list[str]) -> None:
    """The printed declaration as the pipelines file; apply, create the topics, run; a
    second run and a backfill of everything write nothing more."""
    pipelines_file = tmp_path / "pipelines.yaml"
    pipelines_file.write_text(printed, encoding="utf-8")
    env["KAFKA_INGEST_PIPELINES"] = str(pipelines_file)
    dlq_topics.append(f"{topic}-dlq")
    for command in (("schema", "apply", pipeline), ("topics", "create", pipeline)):
        done = _cli(env, *command)
        assert done.returncode == 0, done.stderr
    ran = _cli(env, "run", pipeline)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (N, N, 0)
    assert query(pg_dsn, f"SELECT count(*) FROM {pipeline}") == [(N,)]
    again = _cli(env, "run", pipeline)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["read"] == 0
    ranges = [arg for p in range(partitions) for arg in (
        "--partition", str(p), "--from-offset", "0", "--to-offset", str(N // partitions))]
    backfill = _cli(env, "backfill", pipeline, *ranges)
    assert backfill.returncode == 0, backfill.stderr
    assert query(pg_dsn, f"SELECT count(*) FROM {pipeline}") == [(N,)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_datagen_topic_is_onboarded_with_the_declaration_from_registry_prints(
        case: str, env: dict[str, str], topics: Any, clients: KafkaClients, pg_dsn: str,
        sr: SchemaRegistryClient, subjects: list[str],  # noqa: F811
        dlq_topics: list[str], tmp_path: Path) -> None:
    prefix, schema, make, key_schema, identity = CASES[case]
    topic = topics(1, prefix)
    subjects.append(f"{topic}-value")
    value = AvroSerializer(sr, json.dumps(schema))
    key = AvroSerializer(sr, json.dumps(key_schema)) if key_schema else None
    if key is not None:
        subjects.append(f"{topic}-key")
    records = [make(i) for i in range(N)]
    _produce(clients, topic, [
        (key(r["orderid"], SerializationContext(topic, MessageField.KEY)) if key
         else str(i).encode(), value(r, SerializationContext(topic, MessageField.VALUE)))
        for i, r in enumerate(records)])

    shown = _cli(env, "schema", "from-registry", f"{topic}-value", "--event-type", prefix)
    assert shown.returncode == 0, shown.stderr
    assert "HTTP Request" not in shown.stderr  # the registry's URLs are for -v only
    pipeline = topic.replace("-", "_")
    assert f"\n    identity: {identity}\n" in shown.stdout
    assert f"identity: {identity}, because " in _comments(shown.stdout)
    if key is not None:
        assert f"the key subject '{topic}-key' holds an integer key" in _comments(shown.stdout)
    _onboard(env, shown.stdout, tmp_path, pipeline, pg_dsn, topic, 1, dlq_topics)
    if prefix == "orders":
        address = records[3]["address"]  # flattened into path columns
        assert query(pg_dsn, f"SELECT orderid, address_city, address_state, address_zipcode "
                     f"FROM {pipeline} WHERE orderid = 3"
                     ) == [(3, address["city"], address["state"], address["zipcode"])]


def _payment(i: int) -> dict[str, Any]:
    record: dict[str, Any] = {
        "payment_id": f"pay-{i:05d}", "amount": 12.5 + i, "currency": "EUR",
        "paid_at": f"2026-01-02T03:{i % 60:02d}:05+01:00", "customerId": i % 4,
        "lines": [{"sku": "A", "qty": i}], "settled": i % 2 == 0}
    if i % 3:
        record["note"] = None if i % 2 else f"note {i}"
    return record


def test_a_schemaless_json_topic_is_onboarded_with_the_declaration_from_topic_prints(
        env: dict[str, str], topics: Any, clients: KafkaClients, pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    topic = topics(2, "payments")
    _produce(clients, topic, [(b"same-key", json.dumps(_payment(i)).encode())
                              for i in range(N)], partitions=2)
    shown = _cli(env, "schema", "from-topic", topic, "--sample", "1000")
    assert shown.returncode == 0, shown.stderr
    pipeline = topic.replace("-", "_")  # and the contract, without --event-type
    assert yaml.safe_load(shown.stdout)["pipelines"][pipeline]["contract"] == {
        "event_type": pipeline, "version": 1}
    assert f"guessed from {N} records" in _comments(shown.stdout)
    assert "\n    identity: payment_id\n" in shown.stdout
    assert ("identity: payment_id, because 'payment_id' is named as the records' own id "
            "(payment;") in _comments(shown.stdout)
    _onboard(env, shown.stdout, tmp_path, pipeline, pg_dsn, topic, 2, dlq_topics)
    assert query(pg_dsn, f"SELECT payment_id, amount, customer_id, settled, note, lines FROM "
                         f"{pipeline} WHERE payment_id IN ('pay-00004', 'pay-00005') ORDER BY 1"
                 ) == [("pay-00004", 16.5, 0, True, "note 4", [{"sku": "A", "qty": 4}]),
                       ("pay-00005", 17.5, 1, False, None, [{"sku": "A", "qty": 5}])]


def test_from_topic_refuses_bad_input_in_one_line(
        env: dict[str, str], topics: Any, clients: KafkaClients) -> None:
    empty, garbage, scalar = topics(1, "empty"), topics(1, "garbage"), topics(1, "scalar")
    _produce(clients, garbage, [(None, b"\x00\x01not json")])
    _produce(clients, scalar, [(None, b"42")])
    cases = {
        "no-such-topic-7d1c": "topic 'no-such-topic-7d1c'",
        empty: f"topic {empty!r} holds no records to sample",
        garbage: f"topic {garbage!r} partition 0 offset 0: the value is not JSON",
        scalar: f"topic {scalar!r} partition 0 offset 0: the value is a JSON int, not an "
                "object",
    }
    for topic, message in cases.items():
        done = _cli(env, "schema", "from-topic", topic, "--sample", "10", "--event-type", "e")
        assert done.returncode == 2 and done.stdout == ""
        (line,) = done.stderr.strip().splitlines()
        assert message in line, line
