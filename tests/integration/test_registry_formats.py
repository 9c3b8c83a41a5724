"""Registry formats on the real stack: Avro, Protobuf and JSON Schema records written by
confluent-kafka's own serializers against the real schema registry (Apicurio, Confluent's
API), read by the real engine into a real Postgres. No mocks.

What a producing team does is what the producers here do: ``AvroSerializer`` with an
Avro schema, ``ProtobufSerializer`` with a message class built at run time from a
``FileDescriptorProto`` in a fresh ``DescriptorPool`` (importing
``google/protobuf/timestamp.proto``; no generated ``_pb2`` module), ``JSONSerializer`` with
a JSON Schema; each registers its schema under ``<topic>-value`` (TopicNameStrategy).
Topics and subjects are random per test and deleted after.

Covered: exact rows and exact dead letters for each format, with poison of every kind
(no magic byte, an unknown schema id, a payload its writer schema cannot decode, records
the contract refuses, an unknown version), the schema id in ``dead_letters.schema_id`` and
in the DLQ record's ``kafka-ingest.schema_id`` header; the registry stopped mid-run (a
registry of this test's own) is transient and the retry exact, and so is a restarted
registry that knows none of a chunk's ids; schema evolution under BACKWARD, records judged
by the version they carry (an unreadable latest version stops none of a readable one);
``kafka-ingest schema from-registry`` onboarding an Avro topic end to end; TLS and
basic-auth settings reaching the client without leaking the secret.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
import yaml
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.db.tables import apply_tables
from kafka_ingest.engine.ingest import ingest_range, plan_run, run_ingest
from kafka_ingest.engine.replay import plan_replay, replay_range, summarize_replay
from kafka_ingest.errors import (
    ContractMismatch,
    RegistryLacksSchemas,
    RegistryRefused,
    RegistryUnavailable,
)
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry, registry_settings_from
from kafka_ingest.requests import LiveRun, ReplayFilters, ReplayRequest
from kafka_ingest_dev import stack
from kafka_ingest_dev.procs import free_ports
from tests.support.ingest import group_offsets, highs, query, read_topic, stored_offsets

with warnings.catch_warnings():  # authlib's notice about httpx2, as kafka_ingest's registry
    warnings.simplefilter("ignore")
    from confluent_kafka.schema_registry import (
        Schema,
        SchemaRegistryClient,
        record_subject_name_strategy,
    )
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

pytestmark = pytest.mark.integration

KAFKA_INGEST = Path(sys.executable).parent / "kafka-ingest"
#: A schema id no registry here holds (ids are allocated from 1 up): the registry answers 404.
UNKNOWN_ID = 2**31 - 1
TABLE = "pay_rows"
EVENT_TYPE = "pay_event"

# --------------------------------------------------------------------------- the records

AT_1 = datetime(2026, 3, 4, 5, 6, 7, 123000, tzinfo=UTC)
AT_2 = datetime(2025, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
REF_1 = UUID("7f0e3b2c-1111-4c4c-9a9a-0123456789ab")
REF_2 = UUID("00000000-0000-4000-8000-000000000001")

#: What the producing team's application holds; each format's writer turns it into its
#: own object (an Avro dict, a Protobuf message, a JSON document).
GOOD_1 = {"event_id": "pay-1", "version": 1, "account": "acc-1", "amount": Decimal("12.50"),
          "at": AT_1, "ref": REF_1, "note": "first", "detail": {"city": "Lisboa", "zip": 1100}}
#: The optional note left out; a negative amount below one.
GOOD_2 = {**GOOD_1, "event_id": "pay-2", "amount": Decimal("-0.07"), "at": AT_2, "ref": REF_2,
          "note": None, "detail": {"city": "Porto", "zip": 4000}}
#: After the poison: the batch went on.
GOOD_3 = {**GOOD_1, "event_id": "pay-3", "account": "a" * 16, "note": "third"}

AVRO_PAYMENT = {
    "type": "record", "name": "Payment", "namespace": "test.formats",
    "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "version", "type": "int", "default": 1},
        {"name": "account", "type": "string"},
        # the writer allows four places, the contract two: a fourth place is refused
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal",
                                    "precision": 12, "scale": 4}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "detail", "type": {"type": "record", "name": "Detail", "fields": [
            {"name": "city", "type": "string"}, {"name": "zip", "type": "int"}]}},
    ],
}

JSON_PAYMENT = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Payment", "type": "object",
    "properties": {
        "event_id": {"type": "string"},
        "version": {"type": "integer"},
        # no maxLength: the writer is looser than the contract (a producer's schema often is)
        "account": {"type": "string"},
        "amount": {"type": "number"},
        "at": {"type": "string", "format": "date-time"},
        "ref": {"type": "string", "format": "uuid"},
        "note": {"type": ["string", "null"]},
        "detail": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "zip": {"type": "integer"}}},
    },
    "required": ["event_id", "version", "account", "amount", "at", "ref", "detail"],
}

#: The declared contract each format's pipeline reads with (Protobuf has no decimal and no
#: uuid type: its payments carry no amount, and the ref as text).
CONTRACT_FIELDS: dict[str, dict[str, Any]] = {
    "account": {"type": "text", "max_length": 16},
    "amount": {"type": "numeric", "precision": 12, "scale": 2},
    "at": {"type": "timestamptz"},
    "ref": {"type": "uuid"},
    "note": {"type": "text", "max_length": 64, "required": False},
    "detail": {"type": "jsonb"},
}
PROTO_CONTRACT_FIELDS = {**{k: v for k, v in CONTRACT_FIELDS.items() if k != "amount"},
                         "ref": {"type": "text", "max_length": 36}}


# --------------------------------------------------------------------------- producers


def proto_payment_class(*, package: str = "test.formats", detail_first: bool = False) -> Any:
    """``<package>.Payment`` as a message class, from a descriptor built here in a fresh
    pool (the way a team without generated code, or a tool, builds one). ``detail_first``:
    its ``Detail`` is a top-level message declared before ``Payment`` (so Payment is the
    file's second message: message index [1]) instead of nested in it."""
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}/payment_{uuid.uuid4().hex[:8]}.proto",
        package=package, syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    if detail_first:
        detail = file.message_type.add(name="Detail")
        payment = file.message_type.add(name="Payment")
        detail_type = f".{package}.Detail"
    else:
        payment = file.message_type.add(name="Payment")
        detail = payment.nested_type.add(name="Detail")
        detail_type = f".{package}.Payment.Detail"
    detail.field.add(name="city", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    detail.field.add(name="zip", number=2, type=field.TYPE_INT32, label=field.LABEL_OPTIONAL)
    for number, name, kind in ((1, "event_id", field.TYPE_STRING),
                               (2, "version", field.TYPE_INT32),
                               (3, "account", field.TYPE_STRING),
                               (5, "ref", field.TYPE_STRING)):
        payment.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    payment.field.add(name="at", number=4, type=field.TYPE_MESSAGE,
                      type_name=".google.protobuf.Timestamp", label=field.LABEL_OPTIONAL)
    # proto3 `optional string note = 6;`: presence through a synthetic oneof
    payment.oneof_decl.add(name="_note")
    payment.field.add(name="note", number=6, type=field.TYPE_STRING,
                      label=field.LABEL_OPTIONAL, proto3_optional=True, oneof_index=0)
    payment.field.add(name="detail", number=7, type=field.TYPE_MESSAGE, type_name=detail_type,
                      label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    pool.Add(timestamp)
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Payment"))


@dataclass
class Writer:
    """One producing team's serializer for a topic: ``value(record)`` is the wire bytes."""

    fmt: str
    serialize: Callable[[Any, SerializationContext], bytes]
    to_object: Callable[[dict[str, Any]], Any]
    topic: str

    def value(self, record: dict[str, Any]) -> bytes:
        data = self.serialize(self.to_object(record),
                              SerializationContext(self.topic, MessageField.VALUE))
        assert data is not None
        return data


def _avro_object(record: dict[str, Any]) -> dict[str, Any]:
    return dict(record)


def _json_object(record: dict[str, Any]) -> dict[str, Any]:
    out = {**record, "amount": float(record["amount"]),
           "at": record["at"].isoformat().replace("+00:00", "Z"), "ref": str(record["ref"])}
    if out["note"] is None:
        del out["note"]
    return out


def proto_writer(sr: SchemaRegistryClient, topic: str, *, conf: dict[str, Any] | None = None,
                 **shape: Any) -> Writer:
    cls = proto_payment_class(**shape)

    def to_message(record: dict[str, Any]) -> Any:
        message = cls(event_id=record["event_id"], version=record["version"],
                      account=record["account"], ref=str(record["ref"]))
        message.at.FromDatetime(record["at"])
        if record["note"] is not None:
            message.note = record["note"]
        if record["detail"] is not None:
            message.detail.city = record["detail"]["city"]
            message.detail.zip = record["detail"]["zip"]
        return message

    return Writer("protobuf", ProtobufSerializer(cls, sr, conf), to_message, topic)


def writer(fmt: str, sr: SchemaRegistryClient, topic: str) -> Writer:
    if fmt == "avro":
        return Writer(fmt, AvroSerializer(sr, json.dumps(AVRO_PAYMENT)), _avro_object, topic)
    if fmt == "json_schema":
        return Writer(fmt, JSONSerializer(json.dumps(JSON_PAYMENT), sr), _json_object, topic)
    return proto_writer(sr, topic)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def subjects(registry_url: str) -> Iterator[list[str]]:
    """Subjects to delete afterwards (soft, then for good); tests append theirs."""
    made: list[str] = []
    yield made
    client = SchemaRegistryClient({"url": registry_url})
    try:
        for subject in made:
            delete_subject(client, subject)
    finally:
        client.close()


def delete_subject(client: SchemaRegistryClient, subject: str) -> None:
    """Soft, then for good; best effort: a leftover subject is harmless."""
    for permanent in (False, True):
        with contextlib.suppress(SchemaRegistryError):
            client.delete_subject(subject, permanent=permanent)


@pytest.fixture
def own_registry(stack_env: dict[str, str], tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A registry of this test's own (its own state dir and ports; the shared one is never
    touched), stopped afterwards whatever happens; yields its URL. ``stack_env`` comes
    first: the shared stack's environment is read before the state dir is changed."""
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", str(tmp_path / "own-state"))
    port, management = free_ports(2)
    monkeypatch.setenv("KAFKA_INGEST_REGISTRY_PORT", str(port))
    monkeypatch.setenv("KAFKA_INGEST_REGISTRY_MANAGEMENT_PORT", str(management))
    try:
        yield stack.start_registry(report=print)
    finally:
        stack.stop_registry(report=print)


# --------------------------------------------------------------------------- helpers


def produce(clients: KafkaClients, topic: str, values: list[bytes]) -> None:
    """Produce the values in order to partition 0, every delivery report checked."""
    producer = clients.producer()
    failures: list[Any] = []
    for value in values:
        producer.produce(topic, key=b"k", value=value, partition=0,
                         on_delivery=lambda err, _m: failures.extend([err] if err else []))
    assert producer.flush(producer.delivery_timeout_s) == 0 and not failures, failures


def registry_pipeline(topics: Any, fmt: str, fields: dict[str, Any], *, name: str = "p",
                      event_type: str = EVENT_TYPE, version: int = 1, table: str = TABLE,
                      topic: str | None = None, contract_version: int = 1,
                      **body: Any) -> Pipeline:
    """One pipeline on a fresh one-partition topic (or ``topic``) reading ``fmt`` with the
    default registry settings (``schema_registry: {}``)."""
    body = {"topic": topic or topics(1, "src"), "dlq_topic": topics(1, "dlq"),
            "table": table, "partitions": 1, "format": fmt, "schema_registry": {},
            "contract": {"event_type": event_type, "version": contract_version}, **body}
    contracts = {event_type: {"version": version, "fields": fields}}
    return parse_pipelines({"contracts": contracts, "pipelines": {name: body}})[name]


def apply(pg_dsn: str, pipeline: Pipeline) -> list[str]:
    with psycopg.connect(pg_dsn) as conn:
        return [c.statement for c in apply_tables(conn, pipeline).changes]


def new_run_id() -> str:
    return f"test__{uuid.uuid4().hex[:8]}"


def letters(pg_dsn: str, pipeline: Pipeline) -> dict[int, tuple[str, int | None]]:
    """source offset -> (error class, schema id) of the pipeline's parked dead letters."""
    rows = query(pg_dsn, "SELECT source_offset, error_class, schema_id FROM dead_letters"
                         " WHERE pipeline = %s AND status = 'parked'", (pipeline.name,))
    return {int(o): (c, None if s is None else int(s)) for o, c, s in rows}


def dlq_records(clients: KafkaClients, pipeline: Pipeline) -> dict[int, tuple[str, str | None,
                                                                             bytes | None]]:
    """source offset -> (error class header, schema id header, value) of the DLQ topic."""
    found = read_topic(clients, pipeline.dlq_topic, deadline_s=clients.request_timeout_s)
    out = {}
    for record in found.values():
        h = record.headers
        schema_id = h.get("kafka-ingest.schema_id")
        out[int(h["kafka-ingest.offset"])] = (h["kafka-ingest.error_class"].decode(),
                                              None if schema_id is None else schema_id.decode(),
                                              record.value)
    return out


def registry_clients(clients: KafkaClients, url: str, **config: Any) -> KafkaClients:
    return clients.with_registry(RegistrySettings({"url": url, **config}))


def unknown_id(value: bytes) -> bytes:
    """A registry serializer's value with the header's schema id replaced by one the
    registry does not have."""
    return b"\x00" + UNKNOWN_ID.to_bytes(4, "big") + value[5:]


# --------------------------------------------------------------------------- 1. every format

#: (error class, schema id: "id" the registered one, None none, UNKNOWN_ID that one)
EXPECTED_LETTERS_COMMON: dict[int, tuple[str, Any]] = {
    2: ("not_wire_format", None),  # plain JSON bytes: no magic byte, so no schema id
    3: ("unknown_schema", UNKNOWN_ID),  # a header whose id the registry answers 404 for
    4: ("undecodable", "id"),  # a valid value cut short: the writer schema cannot read it
    5: ("contract_violation", "id"),  # account: 17 characters, the contract takes 16
    6: ("contract_violation", "id"),  # see SIXTH below: a decimal's places, or an empty text
    7: ("unknown_version", "id"),  # version 2: the pipeline's contract knows version 1 only
}


def _sixth(fmt: str) -> dict[str, Any]:
    """The sixth poison pill: a decimal with three places (the contract keeps two; the
    Avro writer's scale is four); Protobuf has no decimal: an account left unset, which
    proto3 delivers as its zero value "", and the contract wants at least one character."""
    if fmt == "protobuf":
        return {**GOOD_1, "event_id": "pay-x6", "account": ""}
    return {**GOOD_1, "event_id": "pay-x6", "amount": Decimal("1.005")}


def _expected_rows(fmt: str) -> list[tuple[Any, ...]]:
    def row(rec: dict[str, Any], offset: int) -> tuple[Any, ...]:
        amount = () if fmt == "protobuf" else (rec["amount"].quantize(Decimal("0.01")),)
        ref = str(rec["ref"]) if fmt == "protobuf" else rec["ref"]
        return (rec["event_id"], rec["account"], *amount, rec["at"], ref, rec["note"],
                rec["detail"], offset)

    return [row(GOOD_1, 0), row(GOOD_2, 1), row(GOOD_3, 8)]


@pytest.mark.parametrize("fmt", [
    "avro",  # fastavro against the writer schema: Decimal, aware datetime, UUID arrive typed
    "protobuf",  # a class from the registry's descriptor; Timestamp -> aware datetime
    "json_schema",  # JSON validated as JSON: ISO date-time and uuid strings, a JSON number
])
def test_each_format_loads_exact_rows_and_dead_letters_every_kind_of_poison(
        fmt: str, topics: Any, clients: KafkaClients, db: Any, pg_dsn: str,
        registry_url: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:
    fields = PROTO_CONTRACT_FIELDS if fmt == "protobuf" else CONTRACT_FIELDS
    pipeline = registry_pipeline(topics, fmt, fields)
    subjects.append(f"{pipeline.topic}-value")
    apply(pg_dsn, pipeline)
    w = writer(fmt, sr, pipeline.topic)
    good_1 = w.value(GOOD_1)
    values = [
        good_1,
        w.value(GOOD_2),
        json.dumps({**GOOD_1, "event_id": "pay-x2"}, default=str).encode(),
        unknown_id(good_1),
        good_1[:-3],
        w.value({**GOOD_1, "event_id": "pay-x5", "account": "a" * 17}),
        w.value(_sixth(fmt)),
        w.value({**GOOD_1, "event_id": "pay-x7", "version": 2}),
        w.value(GOOD_3),
    ]
    produce(clients, pipeline.topic, values)
    # the id the producer's registry gave the schema, asked of the registry itself
    registered = sr.get_latest_version(f"{pipeline.topic}-value")
    schema_id = registered.schema_id
    assert registered.schema.schema_type == {"avro": "AVRO", "protobuf": "PROTOBUF",
                                             "json_schema": "JSON"}[fmt]
    assert good_1[0] == 0 and int.from_bytes(good_1[1:5], "big") == schema_id

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    print(f"\n{fmt}: {summary}")
    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (9, 3, 6)
    expected = {o: (c, schema_id if s == "id" else s)
                for o, (c, s) in EXPECTED_LETTERS_COMMON.items()}
    assert letters(pg_dsn, pipeline) == expected
    amount = () if fmt == "protobuf" else ("amount",)
    columns = ", ".join(("event_id", "account", *amount, "at", "ref", "note", "detail",
                         "source_offset"))
    assert query(pg_dsn, f"SELECT {columns} FROM {TABLE} ORDER BY source_offset") == \
        _expected_rows(fmt)
    # The DLQ record: the original bytes unchanged, the id in its own header (none without
    # a wire header).
    dlq = dlq_records(clients, pipeline)
    assert {o: (c, s) for o, (c, s, _) in dlq.items()} == {
        o: (c, None if s is None else str(s)) for o, (c, s) in expected.items()}
    assert {o: v for o, (_, _, v) in dlq.items()} == {o: values[o] for o in expected}
    assert stored_offsets(pg_dsn, pipeline) == {0: 9}


def test_a_protobuf_payload_without_its_optional_field_and_with_zero_values_loads(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:
    """proto3's presence rules as the contract sees them: a field without presence that
    the producer never set arrives as its zero value (zip 0, a city ""), an unset
    ``optional`` field is missing (note NULL), an unset message field is missing too (the
    required jsonb detail: a contract violation, not an empty object)."""
    pipeline = registry_pipeline(topics, "protobuf", PROTO_CONTRACT_FIELDS)
    subjects.append(f"{pipeline.topic}-value")
    apply(pg_dsn, pipeline)
    w = writer("protobuf", sr, pipeline.topic)
    zeros = w.value({**GOOD_2, "event_id": "pay-z", "detail": {"city": "", "zip": 0}})
    no_detail = w.value({**GOOD_2, "event_id": "pay-nodetail", "detail": None})
    produce(clients, pipeline.topic, [zeros, no_detail])

    summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                         run_id=new_run_id())

    assert (summary["inserted"], summary["dead_lettered"]) == (1, 1)
    assert query(pg_dsn, f"SELECT event_id, note, detail FROM {TABLE}") == [
        ("pay-z", None, {"city": "", "zip": 0})]
    detail = query(pg_dsn, "SELECT error_class, error_detail FROM dead_letters")
    assert len(detail) == 1 and detail[0][0] == "contract_violation"
    assert "detail" in detail[0][1], detail


# --------------------------------------------------------------------------- 1b. Protobuf, further


def test_a_protobuf_topic_importing_timestamp_loads_in_a_fresh_process(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str], tmp_path: Path) -> None:
    """``kafka-ingest run`` in a process of its own, as a worker runs a slice. The writer
    schema imports ``google/protobuf/timestamp.proto``; this pytest process has it in
    protobuf's default pool only because confluent-kafka's ``ProtobufSerializer`` imported
    the well-known types: a process that imports kafka_ingest alone does not."""
    from tests.support.pipelines import write_pipelines_file

    pipeline = registry_pipeline(topics, "protobuf", PROTO_CONTRACT_FIELDS)
    subjects.append(f"{pipeline.topic}-value")
    apply(pg_dsn, pipeline)
    w = writer("protobuf", sr, pipeline.topic)
    produce(clients, pipeline.topic, [w.value(GOOD_1), w.value(GOOD_2)])
    env = {**os.environ, **stack_env, "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline))}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)

    ran = _cli(env, "run", pipeline.name)

    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads(ran.stdout)
    dead = query(pg_dsn, "SELECT source_offset, error_class, error_detail FROM dead_letters")
    assert (summary["inserted"], summary["dead_lettered"]) == (2, 0), (
        "BUG (kafka_ingest.decode.codecs.protobuf._protobuf_reader): the imports of a Protobuf "
        "writer schema are looked up in protobuf's default pool, which holds "
        "google/protobuf/timestamp.proto only once some module imported timestamp_pb2; in "
        "a fresh process (the CLI, an Airflow worker) every record is dead-lettered: "
        f"{dead}")
    assert query(pg_dsn, f"SELECT event_id, at, note FROM {TABLE} ORDER BY 1") == [
        ("pay-1", AT_1, "first"), ("pay-2", AT_2, None)]


@pytest.mark.parametrize("strategy", [
    "topic",  # <topic>-value: which message of the file a record is, its indexes say
    "record",  # the pipeline names the record itself (schema_registry.record)
])
def test_the_plan_time_check_reads_the_protobuf_message_the_records_are(
        strategy: str, topics: Any, clients: KafkaClients, db: Any, pg_dsn: str,
        registry_url: str, sr: SchemaRegistryClient, subjects: list[str]) -> None:
    """A .proto file declaring a helper message before the topic's (``Detail``, then
    ``Payment``): the serializer writes message index [1], the decoder reads Payment; the
    plan-time check must compare the contract with Payment too, not with the file's first
    message."""
    package = f"test.formats_{uuid.uuid4().hex[:8]}"
    record = f"{package}.Payment"
    settings: dict[str, Any] = {} if strategy == "topic" else {
        "subject_strategy": "record", "record": record}
    pipeline = registry_pipeline(topics, "protobuf", PROTO_CONTRACT_FIELDS,
                                 schema_registry=settings)
    subject = pipeline.schema_registry.subject(pipeline.topic) if pipeline.schema_registry \
        else ""
    assert subject == (f"{pipeline.topic}-value" if strategy == "topic" else record)
    subjects.append(subject)
    apply(pg_dsn, pipeline)
    conf = None if strategy == "topic" else {"subject.name.strategy": record_subject_name_strategy}
    w = proto_writer(sr, pipeline.topic, conf=conf, package=package, detail_first=True)
    values = [w.value(GOOD_1), w.value(GOOD_2)]
    assert values[0][5:7] == b"\x02\x02"  # one index, 1 (zigzag): the file's second message
    produce(clients, pipeline.topic, values)

    try:
        summary = run_ingest(pipeline, registry_clients(clients, registry_url), db,
                             run_id=new_run_id())
    except ContractMismatch as exc:
        pytest.fail("BUG (kafka_ingest.decode.schemas.check_subject -> "
                    "ProtobufCodec.record_fields): the "
                    "contract is checked against the file's first message (message_index=0), "
                    "not the record's: a pipeline whose records decode is refused at plan "
                    f"time: {exc}")
    assert (summary["inserted"], summary["dead_lettered"]) == (2, 0)
    assert query(pg_dsn, f"SELECT event_id, detail FROM {TABLE} ORDER BY 1") == [
        ("pay-1", GOOD_1["detail"]), ("pay-2", GOOD_2["detail"])]


# --------------------------------------------------------------------------- 2. registry down


def test_the_registry_stopped_mid_run_is_transient_and_the_retry_is_exact(
        own_registry: str, topics: Any, clients: KafkaClients, db: Any,
        pg_dsn: str) -> None:
    """Produce through a registry of its own, plan the run while it answers, stop it, run
    the slice: RegistryUnavailable, nothing dead-lettered, no offset moved. The registry
    keeps its schemas in memory, so the restarted one is empty: the producing team's
    schema is registered again, first, as on the first start, and gets the same id (ids
    are allocated from 1 in a fresh registry); the records' headers name it again."""
    url = own_registry
    pipeline = registry_pipeline(topics, "avro", CONTRACT_FIELDS)
    apply(pg_dsn, pipeline)
    producer_sr = SchemaRegistryClient({"url": url})
    try:
        w = writer("avro", producer_sr, pipeline.topic)
        values = [w.value(GOOD_1), w.value(GOOD_2),
                  w.value({**GOOD_1, "event_id": "pay-x", "account": "a" * 17})]
        first_id = producer_sr.get_latest_version(f"{pipeline.topic}-value").schema_id
    finally:
        producer_sr.close()
    produce(clients, pipeline.topic, values)
    own = registry_clients(clients, url)
    run_id = new_run_id()
    ranges = plan_run(pipeline, own, db, run_id=run_id)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 3)]
    offsets_planned = stored_offsets(pg_dsn, pipeline)

    stack.stop_registry(report=print)

    with pytest.raises(RegistryUnavailable, match=r"get schema \d+ failed") as raised:
        ingest_range(pipeline, ranges[0], own, db, run_id=run_id)
    print(f"\nslice with the registry stopped: {type(raised.value).__name__}: {raised.value}")
    # a new run fails the same way, already at plan time (the subject's latest schema)
    with pytest.raises(RegistryUnavailable, match="latest of"):
        run_ingest(pipeline, own, db, run_id=new_run_id())
    assert query(pg_dsn, "SELECT count(*) FROM dead_letters") == [(0,)]
    assert query(pg_dsn, f"SELECT count(*) FROM {TABLE}") == [(0,)]
    assert stored_offsets(pg_dsn, pipeline) == offsets_planned
    assert offsets_planned in ({}, {0: 0})
    assert group_offsets(clients, pipeline) == {0: None}
    assert highs(clients, pipeline.dlq_topic) == {0: 0}

    assert stack.start_registry(report=print) == url
    again = SchemaRegistryClient({"url": url})
    try:
        again_id = again.register_schema(f"{pipeline.topic}-value",
                                         Schema(json.dumps(AVRO_PAYMENT), "AVRO"))
    finally:
        again.close()
    assert again_id == first_id

    summary = run_ingest(pipeline, own, db, run_id=run_id)  # the retry: the pinned plan

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (3, 2, 1)
    assert query(pg_dsn, f"SELECT event_id, amount FROM {TABLE} ORDER BY 1") == [
        ("pay-1", Decimal("12.50")), ("pay-2", Decimal("-0.07"))]
    assert letters(pg_dsn, pipeline) == {2: ("contract_violation", first_id)}
    assert stored_offsets(pg_dsn, pipeline) == {0: 3}


#: Two schemas of other subjects, registered before the producing team's: in a fresh
#: registry (ids allocated from 1) its schema gets id 3.
FILLERS = [{"type": "record", "name": f"Filler{i}", "namespace": "test.fillers",
            "fields": [{"name": f"n{i}", "type": "int"}]} for i in (1, 2)]


def _register_all(url: str, schemas: list[tuple[str, dict[str, Any]]]) -> list[int]:
    """Register (subject, Avro schema) pairs in order, as the producing teams did; their ids."""
    client = SchemaRegistryClient({"url": url})
    try:
        return [client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
                for subject, schema in schemas]
    finally:
        client.close()


def test_a_restarted_registry_that_knows_none_of_a_chunks_ids_fails_and_the_retry_is_exact(
        own_registry: str, topics: Any, clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    """A registry restored from another backup (here: this test's own registry restarted,
    so empty, then given the topic's subject again, whose schema now has another id): the
    subject exists and the contract reads it, but the registry answers 404 for the id every
    record carries. That is the registry's fault, not the records': the run fails
    (RegistryLacksSchemas, transient), nothing is dead-lettered, no offset moves. The
    right registry back (the same schemas registered in the same order: the same ids),
    the retry of the run loads exactly what it would have."""
    url = own_registry
    pipeline = registry_pipeline(topics, "avro", CONTRACT_FIELDS)
    subject = f"{pipeline.topic}-value"
    history = [("filler-1-value", FILLERS[0]), ("filler-2-value", FILLERS[1]),
               (subject, AVRO_PAYMENT)]
    *_, first_id = _register_all(url, history)
    apply(pg_dsn, pipeline)
    producer_sr = SchemaRegistryClient({"url": url})
    try:
        w = writer("avro", producer_sr, pipeline.topic)
        values = [w.value(GOOD_1), w.value(GOOD_2),
                  w.value({**GOOD_1, "event_id": "pay-x", "account": "a" * 17})]
    finally:
        producer_sr.close()
    assert {int.from_bytes(v[1:5], "big") for v in values} == {first_id}
    produce(clients, pipeline.topic, values)

    stack.stop_registry(report=print)
    assert stack.start_registry(report=print) == url
    [restored_id] = _register_all(url, [(subject, AVRO_PAYMENT)])  # the subject, readable
    assert restored_id != first_id
    own = registry_clients(clients, url)
    run_id = new_run_id()

    with pytest.raises(RegistryLacksSchemas) as raised:
        run_ingest(pipeline, own, db, run_id=run_id)

    print(f"\nthe restored registry: {raised.value}")
    assert raised.value.schema_ids == [first_id]
    assert f"{pipeline.topic}[0] offsets [0, 3)" in str(raised.value)
    assert query(pg_dsn, "SELECT count(*) FROM dead_letters") == [(0,)]
    assert query(pg_dsn, f"SELECT count(*) FROM {TABLE}") == [(0,)]
    assert stored_offsets(pg_dsn, pipeline) in ({}, {0: 0})
    assert group_offsets(clients, pipeline) == {0: None}
    assert highs(clients, pipeline.dlq_topic) == {0: 0}

    stack.stop_registry(report=print)  # the right backup: the same schemas, the same ids
    assert stack.start_registry(report=print) == url
    assert _register_all(url, history)[-1] == first_id

    summary = run_ingest(pipeline, own, db, run_id=run_id)  # the retry: the pinned plan

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (3, 2, 1)
    assert query(pg_dsn, f"SELECT event_id FROM {TABLE} ORDER BY 1") == [("pay-1",),
                                                                      ("pay-2",)]
    assert letters(pg_dsn, pipeline) == {2: ("contract_violation", first_id)}
    assert stored_offsets(pg_dsn, pipeline) == {0: 3}


# --------------------------------------------------------------------------- 3. evolution

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "test.evolution", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "version", "type": "int", "default": 1},
    {"name": "account", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                "scale": 2}},
]}
#: Additive: a new field with a default (a v2 reader can read v1 data). BACKWARD takes it.
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                   {"name": "channel", "type": ["null", "string"],
                                    "default": None}]}
#: A new field without a default: a v2 reader cannot read v1 data. BACKWARD refuses it.
ORDER_V2_REQUIRED = {**ORDER_V1, "fields": [*ORDER_V1["fields"],
                                            {"name": "region", "type": "string"}]}
ORDER_CONTRACT = {
    "account": {"type": "text", "max_length": 16},
    "amount": {"type": "numeric", "precision": 10, "scale": 2},
    "channel": {"type": "text", "max_length": 16, "since": 2, "required": False},
}


def test_schema_evolution_under_backward_and_a_replay_once_the_contract_learns_v2(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:
    v1 = registry_pipeline(topics, "avro", ORDER_CONTRACT, event_type="order_evo",
                           version=2, contract_version=1, table="orders_evo")
    subject = f"{v1.topic}-value"
    subjects.append(subject)
    apply(pg_dsn, v1)
    old = Writer("avro", AvroSerializer(sr, json.dumps(ORDER_V1)), _avro_object, v1.topic)
    new = Writer("avro", AvroSerializer(sr, json.dumps(ORDER_V2)), _avro_object, v1.topic)
    order = {"event_id": "o-1", "version": 1, "account": "acc-1", "amount": Decimal("10.00")}
    produce(clients, v1.topic, [
        old.value(order),
        # written with v2, still a version-1 event: the v1 contract ignores the channel
        new.value({**order, "event_id": "o-2", "channel": "web"}),
        # a version-2 event: the v1 contract does not know it yet
        new.value({**order, "event_id": "o-3", "version": 2, "channel": "app",
                   "amount": Decimal("3.25")}),
    ])
    versions = sr.get_versions(subject)
    assert versions == [1, 2]
    v1_id = sr.get_version(subject, 1).schema_id
    v2_id = sr.get_version(subject, 2).schema_id

    # The incompatible writer: the producing team's serializer meets the registry's 409.
    refused = Writer("avro", AvroSerializer(sr, json.dumps(ORDER_V2_REQUIRED)), _avro_object,
                     v1.topic)
    with pytest.raises(SchemaRegistryError) as conflict:
        refused.value({**order, "region": "eu"})
    print(f"\nincompatible v2: HTTP {conflict.value.http_status_code} "
          f"{conflict.value.error_message}")
    assert conflict.value.http_status_code == 409
    assert sr.get_versions(subject) == [1, 2]

    first = run_ingest(v1, registry_clients(clients, registry_url), db, run_id=new_run_id())

    assert (first["read"], first["inserted"], first["dead_lettered"]) == (3, 2, 1)
    assert query(pg_dsn, "SELECT event_id, account, amount FROM orders_evo ORDER BY 1") == [
        ("o-1", "acc-1", Decimal("10.00")), ("o-2", "acc-1", Decimal("10.00"))]
    assert letters(pg_dsn, v1) == {2: ("unknown_version", v2_id)}

    # A contract requiring a field the latest schema lacks fails at plan time, naming it.
    strict = registry_pipeline(
        topics, "avro", {"account": ORDER_CONTRACT["account"],
                         "region": {"type": "text", "max_length": 8}},
        name="strict", event_type="order_region", topic=v1.topic, table="orders_region")
    apply(pg_dsn, strict)
    with pytest.raises(ContractMismatch) as mismatch:
        run_ingest(strict, registry_clients(clients, registry_url), db, run_id=new_run_id())
    print(f"plan-time check: {mismatch.value}")
    assert mismatch.value.subject == subject
    assert mismatch.value.problems == [
        "field 'region': required by the contract, absent from the writer schema"]
    assert stored_offsets(pg_dsn, strict) == {}
    assert query(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE pipeline = 'strict'") == [(0,)]

    # The contract learns version 2: the table gains its column, the replay lands o-3.
    v2 = registry_pipeline(topics, "avro", ORDER_CONTRACT, event_type="order_evo", version=2,
                           contract_version=2, table="orders_evo", topic=v1.topic,
                           dlq_topic=v1.dlq_topic)
    assert apply(pg_dsn, v2) == [
        'ALTER TABLE "orders_evo" ADD COLUMN "channel" character varying(16)']
    reg = registry_clients(clients, registry_url)

    def replay(filters: ReplayFilters, *, dry_run: bool = False) -> dict[str, Any]:
        run_id = f"replay__{uuid.uuid4().hex[:8]}"
        ranges = plan_replay(v2, reg, db, run_id=run_id,
                             request=ReplayRequest(LiveRun(), dry_run, filters))
        return summarize_replay(replay_range(v2, r, reg, db, run_id=run_id, dry_run=dry_run,
                                             filters=filters).to_dict() for r in ranges)

    # The filters read the letters' Avro payloads: o-3's letter is found by its event id
    # (the identity), another one's filters it out.
    for other in (ReplayFilters(event_id="o-9"), ReplayFilters(identity="o-9")):
        outcomes = replay(other, dry_run=True)["outcomes"]
        assert (outcomes["filtered_out"], outcomes["recovered"]) == (1, 0), outcomes
    for wanted in (ReplayFilters(event_id="o-3"), ReplayFilters(identity="o-3")):
        outcomes = replay(wanted, dry_run=True)["outcomes"]
        assert (outcomes["filtered_out"], outcomes["recovered"]) == (0, 1), outcomes
    replayed = replay(ReplayFilters())

    assert replayed["outcomes"]["recovered"] == 1, replayed
    # o-2 was loaded by the v1 contract, which had no channel column: it stays NULL
    assert query(pg_dsn, "SELECT event_id, amount, channel FROM orders_evo ORDER BY 1") == [
        ("o-1", Decimal("10.00"), None), ("o-2", Decimal("10.00"), None),
        ("o-3", Decimal("3.25"), "app")]
    assert query(pg_dsn, "SELECT source_offset, status, schema_id FROM dead_letters") == [
        (2, "recovered", v2_id)]
    assert v1_id != v2_id


#: A later version without ``account``, which the contract requires. Dropping a field is
#: BACKWARD-compatible (a reader of it reads older data), so the registry takes it.
ORDER_V2_NO_ACCOUNT = {**ORDER_V1, "fields": [f for f in ORDER_V1["fields"]
                                              if f["name"] != "account"]}


def test_an_unreadable_latest_version_stops_no_record_of_a_readable_one(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str]) -> None:
    """The subject's latest version is one the contract cannot read, and nobody has
    produced with it yet: the records of version 1 load (the plan only warns). Once a
    producer writes with it, those records are dead-lettered one by one, the reason naming
    the schema id and the field, and the version-1 records beside them still load."""
    pipeline = registry_pipeline(topics, "avro", ORDER_CONTRACT, event_type="order_judged",
                                 version=2, contract_version=1, table="orders_judged")
    subject = f"{pipeline.topic}-value"
    subjects.append(subject)
    apply(pg_dsn, pipeline)
    old = Writer("avro", AvroSerializer(sr, json.dumps(ORDER_V1)), _avro_object,
                 pipeline.topic)
    order = {"event_id": "o-1", "version": 1, "account": "acc-1", "amount": Decimal("10.00")}
    produce(clients, pipeline.topic, [old.value(order),
                                      old.value({**order, "event_id": "o-2"})])
    v2_id = sr.register_schema(subject, Schema(json.dumps(ORDER_V2_NO_ACCOUNT), "AVRO"))
    assert sr.get_versions(subject) == [1, 2]

    reg = registry_clients(clients, registry_url)
    first = run_ingest(pipeline, reg, db, run_id=new_run_id())

    assert (first["read"], first["inserted"], first["dead_lettered"]) == (2, 2, 0)
    new = Writer("avro", AvroSerializer(sr, json.dumps(ORDER_V2_NO_ACCOUNT)), _avro_object,
                 pipeline.topic)
    no_account = {k: v for k, v in order.items() if k != "account"}
    produce(clients, pipeline.topic, [new.value({**no_account, "event_id": "o-3"}),
                                      old.value({**order, "event_id": "o-4"})])

    second = run_ingest(pipeline, reg, db, run_id=new_run_id())

    assert (second["read"], second["inserted"], second["dead_lettered"]) == (2, 1, 1)
    assert query(pg_dsn, "SELECT event_id FROM orders_judged ORDER BY 1") == [
        ("o-1",), ("o-2",), ("o-4",)]
    assert letters(pg_dsn, pipeline) == {2: ("contract_violation", v2_id)}
    [(detail,)] = query(pg_dsn, "SELECT error_detail FROM dead_letters")
    print(f"\nthe letter of version 2: {detail}")
    assert detail.startswith(
        f"written with schema id {v2_id}, which the contract cannot read (field 'account': "
        "required by the contract, absent from the writer schema): account: Field required")


# --------------------------------------------------------------------------- 4. onboarding

SIGNUP = {"type": "record", "name": "Signup", "namespace": "test.onboard", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "customerName", "type": "string"},
    {"name": "plan", "type": {"type": "enum", "name": "Plan",
                              "symbols": ["FREE", "PRO", "ENTERPRISE"]}},
    {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 8,
                             "scale": 2}},
    {"name": "signedUpAt", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "accountId", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "seats", "type": "int"},
    {"name": "referrer", "type": ["null", "string"], "default": None},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "country", "type": "string"}]}},
]}
SIGNUPS = [
    {"event_id": "s-1", "customerName": "Ada Lovelace", "plan": "ENTERPRISE",
     "fee": Decimal("999.99"), "signedUpAt": AT_1, "accountId": REF_1, "seats": 250,
     "referrer": "babbage", "address": {"city": "London", "country": "UK"}},
    {"event_id": "s-2", "customerName": "Grace Hopper", "plan": "FREE",
     "fee": Decimal("0.00"), "signedUpAt": AT_2, "accountId": REF_2, "seats": 1,
     "referrer": None, "address": {"city": "Arlington", "country": "US"}},
]


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(KAFKA_INGEST), *args], env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    print(f"\n$ kafka-ingest {' '.join(args)}   (exit {done.returncode})")
    print(done.stdout, end="")
    if done.stderr.strip():
        print("[stderr]", done.stderr[-3000:], sep="\n", end="")
    return done


def test_an_avro_topic_is_onboarded_from_its_registered_subject_with_the_cli(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str], tmp_path: Path) -> None:
    topic, dlq = topics(1, "src"), topics(1, "dlq")
    subject = f"{topic}-value"
    subjects.append(subject)
    w = Writer("avro", AvroSerializer(sr, json.dumps(SIGNUP)), _avro_object, topic)
    produce(clients, topic, [w.value(s) for s in SIGNUPS])
    env = {**os.environ, **stack_env, "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url,
           "KAFKA_INGEST_PG_DSN": pg_dsn, "KAFKA_INGEST_PG_ADMIN_DSN": pg_dsn,
           "KAFKA_INGEST_PG_GRANT_TO": ""}
    env.pop("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", None)

    unnamed = _cli(env, "schema", "from-registry", subject, "--format", "avro")
    assert unnamed.returncode == 0, unnamed.stderr  # the contract named after the pipeline
    pipeline = topic.replace("-", "_")
    assert yaml.safe_load(unnamed.stdout)["pipelines"][pipeline]["contract"] == {
        "event_type": pipeline, "version": 1}
    shown = _cli(env, "schema", "from-registry", subject, "--format", "avro",
                 "--event-type", "signup")
    assert shown.returncode == 0, shown.stderr
    contract = yaml.safe_load(shown.stdout)["contracts"]["signup"]
    schema_id = sr.get_latest_version(subject).schema_id
    assert contract == {
        "version": 1,
        "doc": f"From subject {subject!r} version 1 (schema id {schema_id}).",
        "fields": {
            "customerName": {"type": "text", "max_length": 256, "column": "customer_name"},
            "plan": {"type": "text", "max_length": 10},  # the longest symbol
            "fee": {"type": "numeric", "precision": 8, "scale": 2},
            "signedUpAt": {"type": "timestamptz", "column": "signed_up_at"},
            "accountId": {"type": "uuid", "column": "account_id"},
            "seats": {"type": "integer"},  # Avro int
            "referrer": {"type": "text", "max_length": 256, "required": False},
            "address": {"type": "record", "fields": {  # a column per field, by its path
                "city": {"type": "text", "max_length": 256},
                "country": {"type": "text", "max_length": 256}}},
        },
    }
    document = {"contracts": {"signup": contract}, "pipelines": {"signups": {
        "topic": topic, "dlq_topic": dlq, "table": "signups", "partitions": 1,
        "format": "avro", "schema_registry": {},
        "contract": {"event_type": "signup", "version": 1}}}}
    parse_pipelines(document)  # loads as it is
    pipelines_file = tmp_path / "pipelines.yaml"
    pipelines_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    env["KAFKA_INGEST_PIPELINES"] = str(pipelines_file)

    applied = _cli(env, "schema", "apply", "signups")
    assert applied.returncode == 0, applied.stderr
    assert "applied (signups): the table is missing" in applied.stdout
    ran = _cli(env, "run", "signups")
    assert ran.returncode == 0, ran.stderr

    summary = json.loads(ran.stdout)
    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (2, 2, 0)
    assert query(pg_dsn, "SELECT event_id, customer_name, plan, fee, signed_up_at,"
                         " account_id, seats, referrer, address_city, address_country FROM"
                         " signups ORDER BY 1") == [
        ("s-1", "Ada Lovelace", "ENTERPRISE", Decimal("999.99"), AT_1, REF_1, 250, "babbage",
         "London", "UK"),
        ("s-2", "Grace Hopper", "FREE", Decimal("0.00"), AT_2, REF_2, 1, None,
         "Arlington", "US")]


# --------------------------------------------------------------------------- 5. TLS, auth

SECRET = "pw-Secr3t-4711"
USER_INFO = f"svc-reader:{SECRET}"


def _ca_file(path: Path) -> Path:
    """A self-signed CA certificate (PEM), its subject CN naming it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kafka-ingest test registry CA")])
    now = datetime.now(tz=UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _client_config(registry: SchemaRegistry) -> Any:
    return registry._client._rest_client  # what the client was built with


def test_basic_auth_and_a_ca_reach_the_registry_client_and_the_secret_stays_hidden(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka_ingest.cli import registry_settings

    ca = _ca_file(tmp_path / "ca.pem")
    url = "https://registry.example.test:8443/apis/ccompat/v7"
    monkeypatch.setenv("KAFKA_INGEST_SCHEMA_REGISTRY_URL", url)
    monkeypatch.setenv("KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG", json.dumps(
        {"basic.auth.user.info": USER_INFO, "ssl.ca.location": str(ca), "timeout": 5}))
    settings = registry_settings()
    assert settings is not None
    # and from an Airflow connection, as the DAGs read it (login/password as basic auth)
    from_airflow = registry_settings_from(
        source="Airflow connection 'schema_registry_default'", host="registry.example.test",
        port=8443, scheme="https", login="svc-reader", password=SECRET,
        extra={"path": "/apis/ccompat/v7", "ssl.ca.location": str(ca), "timeout": 5})
    assert from_airflow.config == settings.config

    for made in (settings, from_airflow):
        assert SECRET not in repr(made) and "***" in repr(made)
        registry = SchemaRegistry(made)
        try:
            rest = _client_config(registry)
            assert rest.base_urls == [url]
            assert rest.auth == ("svc-reader", SECRET)
            assert rest.timeout == 5
            cas = [dict(item[0] for item in c["subject"]) for c in rest.verify.get_ca_certs()]
            assert cas == [{"commonName": "kafka-ingest test registry CA"}]
            assert SECRET not in repr(registry.settings)
        finally:
            registry.close()


@pytest.fixture
def dropping_server() -> Iterator[int]:
    """A TCP port that accepts each connection and closes it at once (a load balancer
    with no healthy backend); the server thread is joined afterwards."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, name="dropping-server")
    thread.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        done.set()
        thread.join(5)
        srv.close()


@pytest.mark.parametrize("scheme", [
    "http",  # the connection reset: RegistryUnavailable
    "https",  # the same outage met in the TLS handshake: must be RegistryUnavailable too
])
def test_a_connection_dropped_by_the_registry_side_is_transient(scheme: str,
                                                                dropping_server: int) -> None:
    registry = SchemaRegistry(RegistrySettings({
        "url": f"{scheme}://127.0.0.1:{dropping_server}/apis/ccompat/v7", "max.retries": 0}))
    try:
        with pytest.raises((RegistryUnavailable, RegistryRefused)) as raised:
            registry.schema(1)
    finally:
        registry.close()
    assert isinstance(raised.value, RegistryUnavailable), (
        "BUG (kafka_ingest.kafka.registry._refused_tls): every ssl.SSLError in the cause "
        "chain is taken for a refused TLS setting, ssl.SSLEOFError too: an https registry "
        "whose connection drops in the handshake (a load balancer without a healthy "
        "backend, a registry restarting behind its TLS proxy) fails the task as permanent, "
        f"with no retry; over http the same outage is transient: {raised.value!r}")


def test_https_to_the_plain_http_registry_is_refused_never_a_dead_letter(
        topics: Any, clients: KafkaClients, db: Any, pg_dsn: str, registry_url: str,
        sr: SchemaRegistryClient, subjects: list[str], tmp_path: Path) -> None:
    """``https://`` to the registry's plain-HTTP port: the TLS handshake gets an HTTP
    answer (``WRONG_VERSION_NUMBER``), an ``ssl.SSLError`` under httpx's ConnectError:
    RegistryRefused (permanent; a setting, not an outage: no retry can cure it). At plan
    time and in a slice planned while the registry answered: never a dead letter."""
    pipeline = registry_pipeline(topics, "avro", CONTRACT_FIELDS)
    subjects.append(f"{pipeline.topic}-value")
    apply(pg_dsn, pipeline)
    w = writer("avro", sr, pipeline.topic)
    produce(clients, pipeline.topic, [w.value(GOOD_1), w.value(GOOD_2)])
    https = registry_url.replace("http://", "https://", 1)
    ca = _ca_file(tmp_path / "ca.pem")
    wrong = registry_clients(clients, https, **{"basic.auth.user.info": USER_INFO,
                                                "ssl.ca.location": str(ca)})

    with pytest.raises(RegistryRefused, match="TLS") as at_plan:
        run_ingest(pipeline, wrong, db, run_id=new_run_id())
    print(f"\nat plan: {type(at_plan.value).__name__}: {at_plan.value}")
    run_id = new_run_id()
    ranges = plan_run(pipeline, registry_clients(clients, registry_url), db, run_id=run_id)
    with pytest.raises(RegistryRefused, match=r"get schema \d+ refused: TLS"):
        ingest_range(pipeline, ranges[0], wrong, db, run_id=run_id)
    assert SECRET not in str(at_plan.value)
    assert query(pg_dsn, "SELECT count(*) FROM dead_letters") == [(0,)]
    assert highs(clients, pipeline.dlq_topic) == {0: 0}
    assert stored_offsets(pg_dsn, pipeline) in ({}, {0: 0})


def test_a_failing_cli_run_logs_no_registry_password(
        stack_env: dict[str, str], registry_url: str, topics: Any, clients: KafkaClients,
        pg_dsn: str, sr: SchemaRegistryClient, subjects: list[str], tmp_path: Path) -> None:
    """``kafka-ingest -v run`` (debug logging: httpx's and the client's too) against the
    registry with basic auth over the wrong scheme: it fails, and neither the password
    nor the Authorization header's base64 appears anywhere in its output."""
    pipeline = registry_pipeline(topics, "avro", CONTRACT_FIELDS)
    subjects.append(f"{pipeline.topic}-value")
    apply(pg_dsn, pipeline)
    w = writer("avro", sr, pipeline.topic)
    produce(clients, pipeline.topic, [w.value(GOOD_1)])
    from tests.support.pipelines import write_pipelines_file

    env = {**os.environ, **stack_env, "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "KAFKA_INGEST_SCHEMA_REGISTRY_URL": registry_url.replace("http://", "https://", 1),
           "KAFKA_INGEST_SCHEMA_REGISTRY_CONFIG": json.dumps(
               {"basic.auth.user.info": USER_INFO})}
    ran = _cli(env, "-v", "run", pipeline.name)

    output = ran.stdout + ran.stderr
    assert ran.returncode == 2, output[-3000:]
    assert "schema registry latest of" in output and "refused: TLS" in output, output[-3000:]
    assert SECRET not in output
    assert base64.b64encode(USER_INFO.encode()).decode() not in output
    assert query(pg_dsn, "SELECT count(*) FROM dead_letters") == [(0,)]
