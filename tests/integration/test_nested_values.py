"""Nested values on the real stack: records inside records land as columns named by their
path, arrays of records as ``jsonb``, read by the real engine from real Kafka (and the
real registry, Apicurio through Confluent's API) into a real Postgres. No mocks.

Covered: Kafka Connect Datagen's ``orders`` quickstart shape (int ``orderid``, long
``ordertime``, a nested ``address`` record) registered by confluent-kafka's own
``AvroSerializer``, ``kafka-ingest schema from-registry`` printing a contract with the
address flattened to ``address_city``/``address_state``/``address_zipcode``, that contract
used as printed (plus ``identity: orderid``) and the records ingested, each row checked;
a nested JSON object on a plain-JSON pipeline with a declared ``record`` (and the
pipeline's identity a dotted path into it), one record missing a nested required field
dead-lettered naming its path; an array of records inside a nested record landing as
one ``jsonb`` column; an Avro field of each type the type table of docs/formats.md
gives a column of its own (bytes, fixed, decimal, enum, uuid, date, time, timestamps with
and without a zone) declared by ``schema from-registry`` and landing exactly; a Protobuf
message (``ProtobufSerializer``) whose nested message flattens and whose ``Duration``,
``StringValue`` and ``Struct`` land as ``interval``, ``text`` and ``jsonb``. Topics and
subjects are random per test and deleted after.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
import yaml
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kafka_ingest.config import parse_pipelines
from kafka_ingest.decode.codecs.protobuf import WELL_KNOWN
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.kafka.clients import KafkaClients
from tests.integration.test_registry_formats import (
    Writer,
    _avro_object,
    _cli,
    apply,
    letters,
    new_run_id,
    produce,
    registry_clients,
    subjects,  # noqa: F401  (the fixture: subjects deleted after the test)
)
from tests.support.datagen import ORDERS
from tests.support.ingest import query, stored_offsets

with warnings.catch_warnings():  # authlib's notice about httpx2, as the registry client's
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

pytestmark = pytest.mark.integration

N = 300
AT = datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=UTC)



def order(n: int) -> dict[str, Any]:
    return {"ordertime": 1_500_000_000_000 + n * 1000, "orderid": n, "itemid": f"Item_{n % 7}",
            "orderunits": n / 4, "address": {"city": f"City_{n % 11}",
                                             "state": f"State_{n % 5}",
                                             "zipcode": 10_000 + n}}


def _pipeline_document(topic: str, dlq: str, table: str, event_type: str,
                       contract: dict[str, Any], fmt: str, **body: Any) -> dict[str, Any]:
    return {"contracts": {event_type: contract}, "pipelines": {"p": {
        "topic": topic, "dlq_topic": dlq, "table": table, "partitions": 1, "format": fmt,
        "contract": {"event_type": event_type, "version": 1}, **body}}}


def _from_registry(stack_env: dict[str, str], registry_url: str, subject: str,
                   event_type: str) -> dict[str, Any]:
    env = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)
    shown = _cli(env, "schema", "from-registry", subject, "--format", "avro",
                 "--event-type", event_type)
    assert shown.returncode == 0, shown.stderr
    contract: dict[str, Any] = yaml.safe_load(shown.stdout)["contracts"][event_type]
    return contract


def test_datagen_orders_from_the_registry_land_with_the_address_as_path_columns(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        db: Any, pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    subject = f"{topic}-value"
    subjects.append(subject)
    w = Writer("avro", AvroSerializer(sr, json.dumps(ORDERS)), _avro_object, topic)
    produce(clients, topic, [w.value(order(n)) for n in range(1, N + 1)])

    contract = _from_registry(stack_env, registry_url, subject, "orders")

    assert contract["fields"] == {
        "ordertime": {"type": "bigint"},
        "orderid": {"type": "integer"},
        "itemid": {"type": "text", "max_length": 256},
        "orderunits": {"type": "float"},
        "address": {"type": "record", "fields": {
            "city": {"type": "text", "max_length": 256},
            "state": {"type": "text", "max_length": 256},
            "zipcode": {"type": "bigint"}}}}
    document = _pipeline_document(topic, dlq, "orders", "orders", contract, "avro",
                                  schema_registry={}, identity="orderid")
    pipeline = parse_pipelines(json.loads(json.dumps(document)))["p"]
    apply(pg_dsn, pipeline)

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (N, N, 0)
    rows = query(pg_dsn, "SELECT orderid, ordertime, itemid, orderunits, address_city, "
                         "address_state, address_zipcode, event_id FROM orders ORDER BY 1")
    assert rows == [(n, 1_500_000_000_000 + n * 1000, f"Item_{n % 7}", n / 4, f"City_{n % 11}",
                     f"State_{n % 5}", 10_000 + n, None) for n in range(1, N + 1)]
    assert query(pg_dsn, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                         "attrelid = 'orders'::regclass AND attname = 'address_zipcode'") == [
        ("bigint",)]
    assert stored_offsets(pg_dsn, pipeline) == {0: N}


#: A plain-JSON contract with a nested object declared as a record, itself holding one.
JSON_CONTRACT = {"fields": {
    "order": {"type": "record", "fields": {
        "id": {"type": "bigint"},
        "ship_to": {"type": "record", "fields": {
            "city": {"type": "text", "max_length": 32},
            "zip": {"type": "text", "max_length": 8, "required": False}}}}},
    "total": {"type": "numeric", "precision": 10, "scale": 2}}}


def json_order(n: int) -> dict[str, Any]:
    ship_to: dict[str, Any] = {"city": f"C{n % 3}"}
    if n % 2:
        ship_to["zip"] = f"{n:05d}"
    return {"order": {"id": n, "ship_to": ship_to, "ignored": [1, 2]}, "total": f"{n}.50"}


def test_a_nested_json_object_lands_as_path_columns_identified_by_its_path(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    document = _pipeline_document(topic, dlq, "json_orders", "json_order", JSON_CONTRACT,
                                  "json", identity="order.id")
    pipeline = parse_pipelines(document)["p"]
    apply(pg_dsn, pipeline)
    values = [json.dumps(json_order(n)).encode() for n in range(1, N + 1)]
    values.append(json.dumps({"order": {"id": 999, "ship_to": {}}, "total": "1"}).encode())
    produce(clients, topic, values)

    summary = run_ingest(pipeline, clients, db, run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (N + 1, N, 1)
    assert query(pg_dsn, "SELECT order_id, order_ship_to_city, order_ship_to_zip, total::text "
                         "FROM json_orders ORDER BY 1") == [
        (n, f"C{n % 3}", f"{n:05d}" if n % 2 else None, f"{n}.50") for n in range(1, N + 1)]
    # the primary key is the identity's column: order.id's
    assert query(pg_dsn, "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                         "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE "
                         "i.indrelid = 'json_orders'::regclass AND i.indisprimary") == [
        ("order_id",)]
    assert letters(pg_dsn, pipeline) == {N: ("contract_violation", None)}
    detail = query(pg_dsn, "SELECT error_detail FROM dead_letters WHERE pipeline = %s",
                   (pipeline.name,))
    assert "order.ship_to.city" in detail[0][0]


#: A nested record holding an array of records and a map: both kept whole as jsonb.
SHIPMENTS = {"type": "record", "name": "Shipment", "namespace": "test.nested", "fields": [
    {"name": "shipmentId", "type": "long"},
    {"name": "route", "type": {"type": "record", "name": "Route", "fields": [
        {"name": "origin", "type": "string"},
        {"name": "stops", "type": {"type": "array", "items": {
            "type": "record", "name": "Stop", "fields": [
                {"name": "city", "type": "string"}, {"name": "minutes", "type": "int"}]}}},
        {"name": "labels", "type": {"type": "map", "values": "string"}}]}},
]}


def shipment(n: int) -> dict[str, Any]:
    return {"shipmentId": n, "route": {
        "origin": f"O{n}", "stops": [{"city": f"S{n}-{i}", "minutes": i * 10}
                                     for i in range(n % 3)],
        "labels": {"lane": str(n % 4)}}}


def test_an_array_of_records_and_a_map_inside_a_nested_record_land_as_jsonb(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        db: Any, pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    subject = f"{topic}-value"
    subjects.append(subject)
    w = Writer("avro", AvroSerializer(sr, json.dumps(SHIPMENTS)), _avro_object, topic)
    produce(clients, topic, [w.value(shipment(n)) for n in range(1, 101)])

    contract = _from_registry(stack_env, registry_url, subject, "shipment")

    assert contract["fields"] == {
        "shipmentId": {"type": "bigint", "column": "shipment_id"},
        "route": {"type": "record", "fields": {
            "origin": {"type": "text", "max_length": 256},
            "stops": {"type": "jsonb"},
            "labels": {"type": "jsonb"}}}}
    document = _pipeline_document(topic, dlq, "shipments", "shipment", contract, "avro",
                                  schema_registry={}, identity="shipmentId")
    pipeline = parse_pipelines(document)["p"]
    apply(pg_dsn, pipeline)

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (100, 100, 0)
    assert query(pg_dsn, "SELECT shipment_id, route_origin, route_stops, route_labels FROM "
                         "shipments ORDER BY 1") == [
        (n, f"O{n}", [{"city": f"S{n}-{i}", "minutes": i * 10} for i in range(n % 3)],
         {"lane": str(n % 4)}) for n in range(1, 101)]


#: One field of each Avro type the type table (docs/formats.md) gives a column of its own.
TYPED = {"type": "record", "name": "Typed", "namespace": "test.nested", "fields": [
    {"name": "id", "type": "int"},
    {"name": "raw", "type": "bytes"},
    {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6,
                               "scale": 2}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "LONGER"]}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "clock", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "wall", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
]}


def typed(n: int) -> dict[str, Any]:
    return {"id": n, "raw": bytes([0, n]), "digest": n.to_bytes(4, "big"),
            "price": Decimal(f"{n}.25"), "kind": "LONGER" if n % 2 else "A",
            "ref": UUID(int=n), "day": date(2026, 1, 1) + timedelta(days=n),
            "clock": time(12, n % 60, 0, n), "at": AT + timedelta(seconds=n),
            "wall": datetime(2026, 5, 6, 7, 8, 9) + timedelta(minutes=n)}


def test_each_avro_type_lands_in_the_column_type_the_table_gives_it(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        db: Any, pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    subject = f"{topic}-value"
    subjects.append(subject)
    w = Writer("avro", AvroSerializer(sr, json.dumps(TYPED)), _avro_object, topic)
    produce(clients, topic, [w.value(typed(n)) for n in range(1, 51)])
    contract = _from_registry(stack_env, registry_url, subject, "typed")
    document = _pipeline_document(topic, dlq, "typed", "typed", contract, "avro",
                                  schema_registry={}, identity="id")
    pipeline = parse_pipelines(document)["p"]
    apply(pg_dsn, pipeline)

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (50, 50, 0)
    columns = [name for name in typed(1)]
    assert query(pg_dsn, "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                         "WHERE attrelid = 'typed'::regclass AND attname = ANY(%s) "
                         "ORDER BY attnum", (columns,)) == [
        ("id", "integer"), ("raw", "bytea"), ("digest", "bytea"), ("price", "numeric(6,2)"),
        ("kind", "character varying(6)"), ("ref", "uuid"), ("day", "date"),
        ("clock", "time without time zone"), ("at", "timestamp with time zone"),
        ("wall", "timestamp without time zone")]
    assert query(pg_dsn, f"SELECT {', '.join(columns)} FROM typed ORDER BY id") == [
        tuple(typed(n).values()) for n in range(1, 51)]


def shipment_message_class() -> Any:
    """``test.nested.Parcel``: a nested ``Address`` message, a ``Duration``, a wrapper and a
    ``Struct``, as a message class built in a fresh pool (no generated code)."""
    f = descriptor_pb2.FieldDescriptorProto
    known = ("google/protobuf/duration.proto", "google/protobuf/wrappers.proto",
             "google/protobuf/struct.proto")
    fd = descriptor_pb2.FileDescriptorProto(
        name=f"test/nested/parcel_{uuid.uuid4().hex[:8]}.proto", package="test.nested",
        syntax="proto3", dependency=list(known))
    parcel = fd.message_type.add(name="Parcel")
    address = parcel.nested_type.add(name="Address")
    address.field.add(name="city", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    address.field.add(name="zip", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    parcel.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    for number, (name, type_name) in enumerate([
            ("address", ".test.nested.Parcel.Address"), ("took", ".google.protobuf.Duration"),
            ("note", ".google.protobuf.StringValue"), ("extra", ".google.protobuf.Struct")],
            start=2):
        parcel.field.add(name=name, number=number, type=f.TYPE_MESSAGE, type_name=type_name,
                         label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    for name in known:
        file = descriptor_pb2.FileDescriptorProto()
        WELL_KNOWN[name].CopyToProto(file)
        pool.Add(file)
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("test.nested.Parcel"))


def test_a_protobuf_message_s_nested_message_and_well_known_types_land_typed(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        db: Any, pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    subject = f"{topic}-value"
    subjects.append(subject)
    cls = shipment_message_class()
    serialize = ProtobufSerializer(cls, sr)

    def parcel(n: int) -> bytes:
        message = cls(id=n)
        if n % 2:  # the others leave every message unset: NULL
            message.address.city, message.address.zip = f"City{n}", n
            message.took.FromSeconds(n * 60)
            message.note.value = f"n{n}"
            message.extra.update({"n": n})
        data = serialize(message, SerializationContext(topic, MessageField.VALUE))
        assert data is not None
        return data

    produce(clients, topic, [parcel(n) for n in range(1, 101)])
    env = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)
    shown = _cli(env, "schema", "from-registry", subject, "--format", "protobuf",
                 "--event-type", "parcel")
    assert shown.returncode == 0, shown.stderr
    contract = yaml.safe_load(shown.stdout)["contracts"]["parcel"]
    assert contract["fields"] == {
        "id": {"type": "bigint"},
        "address": {"type": "record", "required": False, "fields": {
            "city": {"type": "text", "max_length": 256}, "zip": {"type": "integer"}}},
        "took": {"type": "interval", "required": False},
        "note": {"type": "text", "max_length": 256, "required": False},
        "extra": {"type": "jsonb", "required": False}}
    document = _pipeline_document(topic, dlq, "parcels", "parcel", contract, "protobuf",
                                  schema_registry={}, identity="id")
    pipeline = parse_pipelines(document)["p"]
    apply(pg_dsn, pipeline)

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (100, 100, 0)
    assert query(pg_dsn, "SELECT id, address_city, address_zip, took, note, extra FROM "
                         "parcels ORDER BY id") == [
        (n, f"City{n}", n, timedelta(minutes=n), f"n{n}", {"n": n}) if n % 2
        else (n, None, None, None, None, None) for n in range(1, 101)]
