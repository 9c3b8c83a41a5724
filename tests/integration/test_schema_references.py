"""Schema references on the real stack: writer schemas that name others registered under
subjects of their own, as confluent-kafka's serializers register them (``references``),
read by the real engine from the real registry (Apicurio, Confluent's API) into a real
Postgres. No mocks.

The producing team registers an Avro enum and a record (the record references the enum),
then its ``AvroSerializer`` registers the topic's schema with references to both; its
``ProtobufSerializer`` registers the file the topic's message imports under the import's
name, then the topic's schema referencing it. Covered: both formats ingested, exact rows;
``kafka-ingest schema from-registry`` on a subject with references; the registry failing
while references are fetched fails the slice and dead-letters nothing (a proxy of the real
registry refusing the referenced subject's versions); a writer schema the reader cannot
build dead-letters its own records (``schema_unreadable``) while the rest of the batch
lands and the offsets move on, and the DLQ replay loads them once the reader is fixed (the
fix stood in for by the reader's known-type table learning the file). Topics and subjects
are random per test and deleted after.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from kafka_ingest.decode.codecs.protobuf import WELL_KNOWN
from kafka_ingest.engine.ingest import ingest_range, plan_run, run_ingest
from kafka_ingest.engine.replay import plan_replay, replay_range, summarize_replay
from kafka_ingest.errors import RegistryUnavailable
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.requests import LiveRun, ReplayFilters, ReplayRequest
from tests.integration.test_registry_formats import (
    Writer,
    _avro_object,
    _cli,
    apply,
    dlq_records,
    letters,
    new_run_id,
    produce,
    registry_clients,
    registry_pipeline,
    subjects,  # noqa: F401  (the fixture: subjects deleted after the test)
)
from tests.support.ingest import highs, query, stored_offsets

with warnings.catch_warnings():  # authlib's notice about httpx2, as kafka_ingest's registry
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

pytestmark = pytest.mark.integration

AT = datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=UTC)

# --------------------------------------------------------------------------- Avro

TIER = {"type": "enum", "name": "Tier", "namespace": "test.refs",
        "symbols": ["GOLD", "SILVER", "BRONZE"]}
#: A shared record that references the enum itself: a reference of a reference.
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "test.refs", "fields": [
    {"name": "id", "type": "string"}, {"name": "tier", "type": "test.refs.Tier"}]}
PAYMENT = {"type": "record", "name": "Payment", "namespace": "test.topic", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "version", "type": "int", "default": 1},
    {"name": "account", "type": "string"},
    {"name": "customer", "type": "test.refs.Customer"},
    {"name": "tier", "type": "test.refs.Tier"},
]}
AVRO_CONTRACT = {"account": {"type": "text", "max_length": 16},
                 "customer": {"type": "jsonb"},
                 "tier": {"type": "text", "max_length": 6}}


def payment(n: int, tier: str = "GOLD") -> dict[str, Any]:
    return {"event_id": f"pay-{n}", "version": 1, "account": f"acc-{n}",
            "customer": {"id": f"c-{n}", "tier": "SILVER"}, "tier": tier}


def avro_references(sr: SchemaRegistryClient, topic: str,
                    cleanup: list[str]) -> list[SchemaReference]:
    """The shared types, registered as a producing team registers them (each under a
    subject of its own; the record referencing the enum): the references of a schema
    that uses both. ``cleanup`` gets them after the topic's, which references them."""
    tier, customer = f"{topic}-tier", f"{topic}-customer"
    cleanup.extend([f"{topic}-value", customer, tier])
    sr.register_schema(tier, Schema(json.dumps(TIER), "AVRO"))
    tier_ref = SchemaReference("test.refs.Tier", tier, sr.get_latest_version(tier).version)
    sr.register_schema(customer, Schema(json.dumps(CUSTOMER), "AVRO", [tier_ref]))
    return [SchemaReference("test.refs.Customer", customer,
                            sr.get_latest_version(customer).version), tier_ref]


def avro_writer(sr: SchemaRegistryClient, topic: str, cleanup: list[str]) -> Writer:
    """The topic's serializer: it registers PAYMENT under ``<topic>-value`` with its
    references (``cleanup``: the subjects to delete after)."""
    schema = Schema(json.dumps(PAYMENT), "AVRO", avro_references(sr, topic, cleanup))
    return Writer("avro", AvroSerializer(sr, schema), _avro_object, topic)


def test_avro_with_a_named_type_of_another_subject_is_ingested(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    pipeline = registry_pipeline(topics, "avro", AVRO_CONTRACT)
    apply(pg_dsn, pipeline)
    w = avro_writer(sr, pipeline.topic, subjects)
    records = [payment(n, tier) for n, tier in ((1, "GOLD"), (2, "BRONZE"), (3, "SILVER"))]
    produce(clients, pipeline.topic, [w.value(r) for r in records])
    registered = sr.get_latest_version(f"{pipeline.topic}-value")
    print(f"\nregistered: id {registered.schema_id}, references {registered.schema.references}")
    assert [r.name for r in registered.schema.references] == ["test.refs.Customer",
                                                              "test.refs.Tier"]

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (3, 3, 0)
    assert query(pg_dsn, "SELECT event_id, account, customer, tier, source_offset FROM "
                         "pay_rows ORDER BY source_offset") == [
        ("pay-1", "acc-1", {"id": "c-1", "tier": "SILVER"}, "GOLD", 0),
        ("pay-2", "acc-2", {"id": "c-2", "tier": "SILVER"}, "BRONZE", 1),
        ("pay-3", "acc-3", {"id": "c-3", "tier": "SILVER"}, "SILVER", 2)]
    assert stored_offsets(pg_dsn, pipeline) == {0: 3}


def test_schema_from_registry_prints_a_contract_for_a_subject_with_references(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    """The referenced enum is a text column bounded by its longest symbol, the referenced
    record a column per field (the enum it references among them), as the same types
    defined inline would be."""
    topic = topics(1, "src")
    w = avro_writer(sr, topic, subjects)
    produce(clients, topic, [w.value(payment(1))])  # the serializer registers the subject
    subject = f"{topic}-value"
    env = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)

    shown = _cli(env, "schema", "from-registry", subject, "--format", "avro",
                 "--event-type", "payment")

    assert shown.returncode == 0, shown.stderr
    schema_id = sr.get_latest_version(subject).schema_id
    assert yaml.safe_load(shown.stdout)["contracts"]["payment"] == {
        "version": 1,
        "doc": f"From subject {subject!r} version 1 (schema id {schema_id}).",
        "fields": {"account": {"type": "text", "max_length": 256},
                   "customer": {"type": "record", "fields": {
                       "id": {"type": "text", "max_length": 256},
                       "tier": {"type": "text", "max_length": 6}}},
                   "tier": {"type": "text", "max_length": 6}},  # "SILVER", "BRONZE"
    }


class _HalfDownRegistry(BaseHTTPRequestHandler):
    """Forwards GETs to the real registry, except the versions of the subjects named in
    ``server.refused``, answered 503 (a registry half down behind its load balancer)."""

    def do_GET(self) -> None:
        server: Any = self.server
        if any(f"/subjects/{subject}/versions/" in self.path for subject in server.refused):
            self._answer(503, b'{"error_code": 50301, "message": "no healthy backend"}')
            return
        answer = httpx.get(server.upstream + self.path, timeout=10)
        self._answer(answer.status_code, answer.content)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def half_down(registry_url: str) -> Iterator[Any]:
    """A proxy of the registry (``.url``, its ccompat URL) refusing the versions of the
    subjects in ``.refused``; its thread joined afterwards."""
    parts = urllib.parse.urlsplit(registry_url)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HalfDownRegistry)
    server.upstream = f"{parts.scheme}://{parts.netloc}"  # type: ignore[attr-defined]
    server.refused = set()  # type: ignore[attr-defined]
    server.url = f"http://127.0.0.1:{server.server_port}{parts.path}"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="half-down-registry")
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def test_the_registry_failing_while_references_are_fetched_fails_the_slice_and_dead_letters_nothing(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str], half_down: Any) -> None:  # noqa: F811
    """The schema by id answers, its references' subject versions do not (503): an
    infrastructure fault, so the slice fails (RegistryUnavailable: Airflow retries),
    nothing is dead-lettered, no row lands and no offset moves; the retry with the
    registry whole loads every record."""
    pipeline = registry_pipeline(topics, "avro", AVRO_CONTRACT)
    apply(pg_dsn, pipeline)
    w = avro_writer(sr, pipeline.topic, subjects)
    produce(clients, pipeline.topic, [w.value(payment(n)) for n in (1, 2, 3)])
    whole = registry_clients(clients, registry_url)
    run_id = new_run_id()
    [planned] = plan_run(pipeline, whole, db, run_id=run_id)
    offsets_planned = stored_offsets(pg_dsn, pipeline)
    half_down.refused.add(f"{pipeline.topic}-customer")

    with pytest.raises(RegistryUnavailable, match=r"version 1 of src-\w+-customer failed: "
                                                  "HTTP 503") as raised:
        ingest_range(pipeline, planned, registry_clients(clients, half_down.url, **{
            "max.retries": 0}), db, run_id=run_id)

    print(f"\nthe references unreachable: {raised.value}")
    assert query(pg_dsn, "SELECT count(*) FROM dead_letters") == [(0,)]
    assert query(pg_dsn, "SELECT count(*) FROM pay_rows") == [(0,)]
    assert stored_offsets(pg_dsn, pipeline) == offsets_planned
    assert highs(clients, pipeline.dlq_topic) == {0: 0}

    summary = run_ingest(pipeline, whole, db, run_id=run_id)  # the retry: the pinned plan

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (3, 3, 0)
    assert stored_offsets(pg_dsn, pipeline) == {0: 3}


# --------------------------------------------------------------------------- Protobuf


def proto_payment_class(tag: str) -> Any:
    """``test.refs_<tag>.Payment`` from a file importing another, ``customer_<tag>.proto``
    (a message and an enum) and ``google/protobuf/timestamp.proto``: built at run time in
    a fresh pool, as a team without generated code builds them."""
    field = descriptor_pb2.FieldDescriptorProto
    package = f"test.refs_{tag}"
    shared = descriptor_pb2.FileDescriptorProto(
        name=f"test/refs/customer_{tag}.proto", package=package, syntax="proto3")
    tier = shared.enum_type.add(name="Tier")
    for number, name in enumerate(("TIER_UNSPECIFIED", "GOLD", "SILVER")):
        tier.value.add(name=name, number=number)
    customer = shared.message_type.add(name="Customer")
    customer.field.add(name="id", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    topic_file = descriptor_pb2.FileDescriptorProto(
        name=f"test/refs/payment_{tag}.proto", package=package, syntax="proto3",
        dependency=[shared.name, "google/protobuf/timestamp.proto"])
    message = topic_file.message_type.add(name="Payment")
    for number, name in ((1, "event_id"), (3, "account")):
        message.field.add(name=name, number=number, type=field.TYPE_STRING,
                          label=field.LABEL_OPTIONAL)
    message.field.add(name="version", number=2, type=field.TYPE_INT32,
                      label=field.LABEL_OPTIONAL)
    message.field.add(name="customer", number=4, type=field.TYPE_MESSAGE,
                      type_name=f".{package}.Customer", label=field.LABEL_OPTIONAL)
    message.field.add(name="at", number=5, type=field.TYPE_MESSAGE,
                      type_name=".google.protobuf.Timestamp", label=field.LABEL_OPTIONAL)
    message.field.add(name="tier", number=6, type=field.TYPE_ENUM,
                      type_name=f".{package}.Tier", label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    for file in (timestamp, shared, topic_file):
        pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Payment"))


def test_protobuf_importing_another_registered_file_is_ingested(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    tag = uuid.uuid4().hex[:8]
    pipeline = registry_pipeline(topics, "protobuf", {
        "account": {"type": "text", "max_length": 16}, "customer": {"type": "jsonb"},
        "at": {"type": "timestamptz"}, "tier": {"type": "text", "max_length": 16}})
    # the serializer registers the import under its file name, then the topic's schema
    subjects.extend([f"{pipeline.topic}-value", f"test/refs/customer_{tag}.proto"])
    apply(pg_dsn, pipeline)
    cls = proto_payment_class(tag)
    serialize = ProtobufSerializer(cls, sr)

    def value(n: int, tier: str) -> bytes:
        message = cls(event_id=f"pay-{n}", version=1, account=f"acc-{n}", tier=tier)
        message.customer.id = f"c-{n}"
        message.at.FromDatetime(AT)
        return Writer("protobuf", serialize, lambda m: m, pipeline.topic).value(message)

    produce(clients, pipeline.topic, [value(1, "GOLD"), value(2, "SILVER")])
    registered = sr.get_latest_version(f"{pipeline.topic}-value")
    print(f"\nregistered: id {registered.schema_id}, references {registered.schema.references}")
    assert [r.name for r in registered.schema.references] == [
        f"test/refs/customer_{tag}.proto"]

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (2, 2, 0)
    assert query(pg_dsn, "SELECT event_id, account, customer, at, tier FROM pay_rows "
                         "ORDER BY 1") == [("pay-1", "acc-1", {"id": "c-1"}, AT, "GOLD"),
                                           ("pay-2", "acc-2", {"id": "c-2"}, AT, "SILVER")]
    assert stored_offsets(pg_dsn, pipeline) == {0: 2}


# --------------------------------------------------------------------------- JSON Schema

#: A shared address, registered under a subject of its own and referenced as
#: ``address.json``; its ``zip`` a definition of its own document.
ADDRESS_JSON = {"$id": "address.json", "type": "object", "required": ["city"],
                "definitions": {"zip": {"type": "string", "maxLength": 10}},
                "properties": {"city": {"type": "string", "maxLength": 40},
                               "zip": {"anyOf": [{"$ref": "#/definitions/zip"},
                                                 {"type": "null"}], "default": None}}}
#: The topic's schema as pydantic's ``model_json_schema()`` writes one: optional fields as
#: ``anyOf`` with ``null``, an enum in ``$defs``; the address by reference.
SHIPMENT_JSON = {
    "title": "Shipment", "type": "object", "required": ["event_id", "carrier", "destination"],
    "$defs": {"Carrier": {"title": "Carrier", "type": "string", "enum": ["DHL", "UPS"]}},
    "properties": {
        "event_id": {"title": "Event Id", "type": "string"},
        "carrier": {"$ref": "#/$defs/Carrier"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "destination": {"$ref": "address.json"},
        "weight": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None}}}


def test_json_schema_with_refs_and_optional_unions_is_declared_and_ingested_as_printed(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        db: Any, pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:  # noqa: F811
    """``schema from-registry`` declares what the schema says (an optional text, the enum
    bounded by its longest value, the referenced address flattened), and that declaration
    loads every record, nulls where the producer sent none."""
    topic = topics(1, "src")
    address = f"{topic}-address"
    subjects.extend([f"{topic}-value", address])
    sr.register_schema(address, Schema(json.dumps(ADDRESS_JSON), "JSON"))
    ref = SchemaReference("address.json", address, sr.get_latest_version(address).version)
    writer = Writer("json_schema", JSONSerializer(
        Schema(json.dumps(SHIPMENT_JSON), "JSON", [ref]), sr), dict, topic)
    records = [{"event_id": "s-1", "carrier": "DHL", "note": "fragile", "weight": 2.5,
                "destination": {"city": "Lyon", "zip": "69001"}},
               {"event_id": "s-2", "carrier": "UPS", "note": None,
                "destination": {"city": "Oslo", "zip": None}}]
    produce(clients, topic, [writer.value(r) for r in records])
    env = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)

    shown = _cli(env, "schema", "from-registry", f"{topic}-value", "--format", "json_schema",
                 "--event-type", "shipment")

    assert shown.returncode == 0, shown.stderr
    fields = yaml.safe_load(shown.stdout)["contracts"]["shipment"]["fields"]
    assert fields == {
        "carrier": {"type": "text", "max_length": 3},
        "note": {"type": "text", "max_length": 256, "required": False},
        "destination": {"type": "record", "fields": {
            "city": {"type": "text", "max_length": 40},
            "zip": {"type": "text", "max_length": 10, "required": False}}},
        "weight": {"type": "float", "required": False}}
    pipeline = registry_pipeline(topics, "json_schema", fields, event_type="shipment",
                                 table="shipments", topic=topic)
    apply(pg_dsn, pipeline)

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (2, 2, 0)
    assert query(pg_dsn, "SELECT event_id, carrier, note, destination_city, destination_zip,"
                         " weight FROM shipments ORDER BY 1") == [
        ("s-1", "DHL", "fragile", "Lyon", "69001", 2.5),
        ("s-2", "UPS", None, "Oslo", None, None)]


# --------------------------------------------------------------------------- unreadable


def _decimal_file() -> descriptor_pb2.FileDescriptorProto:
    """``google/type/decimal.proto`` as googleapis-common-protos ships it, built here rather
    than imported (``google.type.decimal_pb2``): an import would put it in protobuf's
    default pool, where the reader before #33 looked for imports, and make the schema
    readable in this process alone. (confluent-kafka's Protobuf serde imports most other
    ``google/type`` files, so those are in this process's default pool.)"""
    field = descriptor_pb2.FieldDescriptorProto
    decimal = descriptor_pb2.FileDescriptorProto(name="google/type/decimal.proto",
                                                 package="google.type", syntax="proto3")
    message = decimal.message_type.add(name="Decimal")
    message.field.add(name="value", number=1, type=field.TYPE_STRING,
                      label=field.LABEL_OPTIONAL)
    return decimal


def proto_order_class(tag: str, *, amount: bool) -> Any:
    """``test.orders_<tag>.Order``: version 1, or version 2 with a ``google.type.Decimal``
    amount, whose file ``ProtobufSerializer`` registers no reference for (it skips
    ``google/type/*`` as known types) and this reader does not know."""
    field = descriptor_pb2.FieldDescriptorProto
    package = f"test.orders_{tag}"
    file = descriptor_pb2.FileDescriptorProto(
        name=f"test/orders/order_{tag}_v{2 if amount else 1}.proto", package=package,
        syntax="proto3")
    message = file.message_type.add(name="Order")
    for number, name in ((1, "event_id"), (3, "account")):
        message.field.add(name=name, number=number, type=field.TYPE_STRING,
                          label=field.LABEL_OPTIONAL)
    message.field.add(name="version", number=2, type=field.TYPE_INT32,
                      label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    if amount:
        file.dependency.append("google/type/decimal.proto")
        message.field.add(name="amount", number=4, type=field.TYPE_MESSAGE,
                          type_name=".google.type.Decimal", label=field.LABEL_OPTIONAL)
        pool.Add(_decimal_file())
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Order"))


def test_an_unreadable_writer_schema_dead_letters_its_records_only_and_replays_after_the_fix(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Version 2 of the topic's schema imports ``google/type/decimal.proto`` with no
    reference (the serializer skips it as a known type) and the reader knows no such
    file: it cannot build the schema. Its records, and only they, are ``schema_unreadable``
    dead letters naming the import; version 1's records beside them land and the stored
    offset moves past the chunk. Then the fix (the reader learns the file: here its
    known-type table gains it, as a release that knows ``google/type`` would) and the DLQ
    replay of that error class loads the letters, as they were, into the table."""
    tag = uuid.uuid4().hex[:8]
    pipeline = registry_pipeline(topics, "protobuf", {
        "account": {"type": "text", "max_length": 16},
        "amount": {"type": "jsonb", "required": False}})
    subject = f"{pipeline.topic}-value"
    subjects.append(subject)
    apply(pg_dsn, pipeline)
    v1, v2 = proto_order_class(tag, amount=False), proto_order_class(tag, amount=True)
    old = Writer("protobuf", ProtobufSerializer(v1, sr), lambda m: m, pipeline.topic)
    first = old.value(v1(event_id="o-0", version=1, account="acc-0"))
    sr.set_compatibility(subject, "NONE")  # a new file each version: not this test's point
    new = Writer("protobuf", ProtobufSerializer(v2, sr), lambda m: m, pipeline.topic)

    def order_v2(n: int) -> bytes:
        message = v2(event_id=f"o-{n}", version=1, account=f"acc-{n}")
        message.amount.value = f"{n}.50"
        return new.value(message)

    values = [first, order_v2(1), old.value(v1(event_id="o-2", version=1, account="acc-2")),
              order_v2(3), old.value(v1(event_id="o-4", version=1, account="acc-4"))]
    produce(clients, pipeline.topic, values)
    v1_id, v2_id = (sr.get_version(subject, n).schema_id for n in (1, 2))
    assert sr.get_version(subject, 2).schema.references == []  # no reference for the import

    reg = registry_clients(clients, registry_url)
    summary = run_ingest(pipeline, reg, db, run_id=new_run_id())

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (5, 3, 2)
    assert query(pg_dsn, "SELECT event_id, account, amount FROM pay_rows ORDER BY 1") == [
        ("o-0", "acc-0", None), ("o-2", "acc-2", None), ("o-4", "acc-4", None)]
    assert letters(pg_dsn, pipeline) == {1: ("schema_unreadable", v2_id),
                                         3: ("schema_unreadable", v2_id)}
    [(detail,)] = query(pg_dsn, "SELECT DISTINCT error_detail FROM dead_letters")
    print(f"\nthe letters of schema id {v2_id}: {detail}")
    assert detail.startswith(f"schema id {v2_id} cannot be read: the Protobuf file "
                             f"'test/orders/order_{tag}_v2.proto' cannot be built: it imports "
                             "'google/type/decimal.proto', which none of its references")
    dlq = dlq_records(clients, pipeline)
    assert {o: (c, s, v) for o, (c, s, v) in dlq.items()} == {
        1: ("schema_unreadable", str(v2_id), values[1]),
        3: ("schema_unreadable", str(v2_id), values[3])}
    assert stored_offsets(pg_dsn, pipeline) == {0: 5}
    assert v1_id != v2_id

    learned = descriptor_pool.DescriptorPool()  # the fix: the reader learns the file
    learned.Add(_decimal_file())
    monkeypatch.setitem(WELL_KNOWN, "google/type/decimal.proto",
                        learned.FindFileByName("google/type/decimal.proto"))
    replayed = _replay(pipeline, reg, db)

    assert replayed["outcomes"]["recovered"] == 2, replayed
    assert query(pg_dsn, "SELECT event_id, amount, source_offset FROM pay_rows "
                         "ORDER BY 1") == [
        ("o-0", None, 0), ("o-1", {"value": "1.50"}, 1), ("o-2", None, 2),
        ("o-3", {"value": "3.50"}, 3), ("o-4", None, 4)]
    assert query(pg_dsn, "SELECT source_offset, status FROM dead_letters ORDER BY 1") == [
        (1, "recovered"), (3, "recovered")]


def _replay(pipeline: Any, clients: KafkaClients, db: Any) -> dict[str, Any]:
    """The DLQ replay of the ``schema_unreadable`` letters, as the replay DAG runs it."""
    run_id = f"replay__{uuid.uuid4().hex[:8]}"
    request = ReplayRequest(LiveRun(), False,
                            ReplayFilters(error_classes=frozenset({"schema_unreadable"})))
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=request)
    return summarize_replay(replay_range(pipeline, r, clients, db, run_id=run_id,
                                         dry_run=False, filters=request.filters).to_dict()
                            for r in ranges)
