"""Schema references without a registry: writer schemas that name others (an Avro named
type, a Protobuf import, each registered under a subject of its own) are read through
their resolved references; a reference the registry does not serve makes that schema id's
records ``schema_unreadable`` dead letters, the others load; the registry client resolves
references recursively by subject and version, once each, and an outage while it does is
transient. The integration tests (``tests/integration/test_schema_references.py``) show the
same on the real registry with confluent-kafka's serializers.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import fastavro
import httpx
import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaReference
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kafka_ingest.decode.codecs import codec_for
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.schemas import contract_from_schema
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import RegistryUnavailable
from kafka_ingest.kafka.registry import Reference, RegistrySettings, SchemaRegistry, WriterSchema
from kafka_ingest.records import row_values
from tests.support.datagen import nested_past_parser_depth
from tests.support.fakes import Msg
from tests.unit.decode.test_formats import OneSchema, pipeline

TIER = {"type": "enum", "name": "Tier", "namespace": "t.refs", "symbols": ["GOLD", "SILVER"]}
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "t.refs", "fields": [
    {"name": "id", "type": "string"}, {"name": "tier", "type": "t.refs.Tier"}]}
PAYMENT = {"type": "record", "name": "Payment", "namespace": "t.main", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "account", "type": "string"},
    {"name": "customer", "type": "t.refs.Customer"},
    {"name": "tier", "type": "t.refs.Tier"},
]}
CONTRACT = {"payment": {"fields": {"account": {"type": "text", "max_length": 16},
                                   "customer": {"type": "jsonb"},
                                   "tier": {"type": "text", "max_length": 6}}}}


def _avro_ref(name: str, subject: str, schema: dict[str, Any], schema_id: int,
              *refs: Reference) -> Reference:
    return Reference(name, subject, 1, WriterSchema(schema_id, "AVRO", json.dumps(schema),
                                                    subject, 1, refs))


TIER_REF = _avro_ref("t.refs.Tier", "tier", TIER, 1)
#: The customer references the tier itself: a reference of a reference.
CUSTOMER_REF = _avro_ref("t.refs.Customer", "customer", CUSTOMER, 2, TIER_REF)


def payment_value(schema_id: int, record: dict[str, Any]) -> bytes:
    named: dict[str, Any] = {}
    for part in (TIER, CUSTOMER):
        fastavro.parse_schema(part, named_schemas=named)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(PAYMENT, named_schemas=named), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


PAY = {"event_id": "p-1", "account": "acc-1", "customer": {"id": "c-1", "tier": "GOLD"},
       "tier": "SILVER"}


def test_avro_named_types_of_other_subjects_are_read_through_the_references() -> None:
    schema = WriterSchema(5, "AVRO", json.dumps(PAYMENT), "pay-value", 1,
                          (CUSTOMER_REF, TIER_REF))
    p = pipeline(contract=CONTRACT)
    result = validate_chunk([Msg(0, value_=payment_value(5, PAY))], p,
                            RegistryDecoder(p, OneSchema(schema)))  # type: ignore[arg-type]
    assert [row_values(r)[:4] for r in result.rows] == [
        ("p-1", "acc-1", {"id": "c-1", "tier": "GOLD"}, "SILVER")]
    assert result.dead == []
    # the contract from the schema: the referenced enum is text, the referenced record
    # flattened to path columns as a record defined inline is, and those columns filled
    body, _ = contract_from_schema(codec_for("avro").format, schema)
    assert body["fields"] == {"account": {"type": "text", "max_length": 256},
                              "customer": {"type": "record", "fields": {
                                  "id": {"type": "text", "max_length": 256},
                                  "tier": {"type": "text", "max_length": 6}}},
                              "tier": {"type": "text", "max_length": 6}}
    made = pipeline(contract={"payment": body})
    result = validate_chunk([Msg(0, value_=payment_value(5, PAY))], made,
                            RegistryDecoder(made, OneSchema(schema)))  # type: ignore[arg-type]
    assert made.model.SINK_COLUMNS == (
        ("event_id", "text"), ("account", "text"), ("customer_id", "text"),
        ("customer_tier", "text"), ("tier", "text"))
    assert [row_values(r)[:5] for r in result.rows] == [
        ("p-1", "acc-1", "c-1", "GOLD", "SILVER")]


def test_a_union_of_referenced_records_offers_each_record() -> None:
    codec = codec_for("avro")
    schema = WriterSchema(6, "AVRO", json.dumps(["t.refs.Customer", "t.refs.Tier"]),
                          references=(CUSTOMER_REF, TIER_REF))
    assert [sorted(f) for f in codec.record_fields(schema)] == [["id", "tier"]]
    assert list(codec.record_fields(schema, "t.refs.Customer")[0]) == ["id", "tier"]


def test_a_reference_the_registry_does_not_serve_dead_letters_that_schema_s_records_only(
        ) -> None:
    """Schema 7 names a version of ``customer`` the registry has no more: its records are
    ``schema_unreadable`` dead letters naming the reference; schema 5's records load."""
    lost = Reference("t.refs.Customer", "customer", 3, None)
    registry = OneSchema(
        WriterSchema(5, "AVRO", json.dumps(PAYMENT), references=(CUSTOMER_REF, TIER_REF)),
        WriterSchema(7, "AVRO", json.dumps(PAYMENT), references=(lost, TIER_REF)))
    p = pipeline(contract=CONTRACT)
    messages = [Msg(0, value_=payment_value(7, PAY)),
                Msg(1, value_=payment_value(5, {**PAY, "event_id": "p-2"})),
                Msg(2, value_=payment_value(7, {**PAY, "event_id": "p-3"}))]
    result = validate_chunk(messages, p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [row_values(r)[0] for r in result.rows] == ["p-2"]
    assert [(d.source_offset, d.error_class, d.schema_id) for d in result.dead] == [
        (0, "schema_unreadable", 7), (2, "schema_unreadable", 7)]
    assert result.dead[0].error_detail == (
        "schema id 7 cannot be read: its reference 't.refs.Customer' names version 3 of "
        "subject 'customer', which the registry does not serve")
    assert registry.asked == [7, 5]  # judged once per id


# --------------------------------------------------------------------------- Protobuf


def _proto_files() -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.FileDescriptorProto]:
    field = descriptor_pb2.FieldDescriptorProto
    customer = descriptor_pb2.FileDescriptorProto(name="t/refs/customer.proto",
                                                  package="t.refs", syntax="proto3")
    message = customer.message_type.add(name="Customer")
    message.field.add(name="id", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    payment = descriptor_pb2.FileDescriptorProto(
        name="t/main/payment.proto", package="t.main", syntax="proto3",
        dependency=["t/refs/customer.proto", "google/protobuf/timestamp.proto"])
    message = payment.message_type.add(name="Payment")
    message.field.add(name="event_id", number=1, type=field.TYPE_STRING,
                      label=field.LABEL_OPTIONAL)
    message.field.add(name="account", number=2, type=field.TYPE_STRING,
                      label=field.LABEL_OPTIONAL)
    message.field.add(name="customer", number=3, type=field.TYPE_MESSAGE,
                      type_name=".t.refs.Customer", label=field.LABEL_OPTIONAL)
    return customer, payment


def _b64(file: descriptor_pb2.FileDescriptorProto) -> str:
    return base64.b64encode(file.SerializeToString()).decode()


def test_a_protobuf_file_importing_a_registered_file_is_read_through_its_reference() -> None:
    customer, payment = _proto_files()
    pool = descriptor_pool.DescriptorPool()
    from google.protobuf import timestamp_pb2

    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    for file in (timestamp, customer, payment):
        pool.Add(file)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.main.Payment"))
    body = cls(event_id="p-1", account="acc-1", customer={"id": "c-1"}).SerializeToString()
    ref = Reference("t/refs/customer.proto", "t/refs/customer.proto", 1,
                    WriterSchema(2, "PROTOBUF", _b64(customer)))
    contract = {"payment": {"fields": {"account": {"type": "text", "max_length": 16},
                                       "customer": {"type": "jsonb"}}}}
    p = pipeline("protobuf", contract)
    unserved = Reference("t/refs/customer.proto", "t/refs/customer.proto", 9, None)
    registry = OneSchema(WriterSchema(5, "PROTOBUF", _b64(payment), references=(ref,)),
                         WriterSchema(6, "PROTOBUF", _b64(payment), references=(unserved,)),
                         WriterSchema(7, "PROTOBUF", _b64(payment)))  # no reference at all
    values = [b"\x00" + i.to_bytes(4, "big") + b"\x00" + body for i in (5, 6, 7)]
    result = validate_chunk([Msg(o, value_=v) for o, v in enumerate(values)], p,
                            RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [row_values(r)[:3] for r in result.rows] == [("p-1", "acc-1", {"id": "c-1"})]
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (1, "schema_unreadable"), (2, "schema_unreadable")]
    assert "names version 9 of subject 't/refs/customer.proto'" in result.dead[0].error_detail
    assert "imports 't/refs/customer.proto', which none of its references defines" in \
        result.dead[1].error_detail


# --------------------------------------------------------------------------- the client


class FakeClient:
    """confluent-kafka's ``SchemaRegistryClient`` port: schemas by id, subject versions,
    and what it was asked; ``down`` subjects answer as an unreachable registry does."""

    def __init__(self, down: frozenset[str] = frozenset()) -> None:
        self.asked: list[tuple[Any, ...]] = []
        self.down = down
        tier = Schema(json.dumps(TIER), "AVRO")
        customer = Schema(json.dumps(CUSTOMER), "AVRO",
                          [SchemaReference("t.refs.Tier", "tier", 1)])
        self.versions = {
            ("tier", 1): RegisteredSchema(schema_id=1, guid=None, schema=tier, subject="tier",
                                          version=1),
            ("customer", 1): RegisteredSchema(schema_id=2, guid=None, schema=customer,
                                              subject="customer", version=1)}
        self.ids = {5: Schema(json.dumps(PAYMENT), "AVRO",
                              [SchemaReference("t.refs.Customer", "customer", 1),
                               SchemaReference("t.refs.Tier", "tier", 1)])}

    def get_schema(self, schema_id: int, fmt: str | None = None) -> Schema:
        self.asked.append(("id", schema_id))
        return self.ids[schema_id]

    def get_version(self, subject: str, version: int, deleted: bool = False,
                    fmt: str | None = None) -> RegisteredSchema:
        self.asked.append((subject, version, deleted))
        if subject in self.down:
            raise httpx.ConnectError("connection refused")
        if (subject, version) not in self.versions:
            raise SchemaRegistryError(404, 40402, "version not found")
        return self.versions[(subject, version)]

    def close(self) -> None:
        pass


def registry_over(client: FakeClient) -> SchemaRegistry:
    registry = SchemaRegistry(RegistrySettings({"url": "http://registry"}))
    registry._client = client  # type: ignore[assignment]  # the port, faked
    return registry


def test_the_client_resolves_references_recursively_once_each_version() -> None:
    client = FakeClient()
    found = registry_over(client).schema(5)
    assert found is not None
    assert [(r.name, r.subject, r.version, r.schema is not None) for r in found.references] == [
        ("t.refs.Customer", "customer", 1, True), ("t.refs.Tier", "tier", 1, True)]
    customer = found.references[0].schema
    assert customer is not None and customer.references[0].schema == \
        found.references[1].schema  # the tier of the customer is the tier of the payment
    assert [r.name for r in found.referenced()] == ["t.refs.Tier", "t.refs.Customer"]
    # a soft-deleted version still serves the schemas that reference it, as the
    # serializers read it; each version asked once
    assert client.asked == [("id", 5), ("customer", 1, True), ("tier", 1, True)]


def test_a_reference_the_registry_lacks_is_left_for_the_codec_to_refuse() -> None:
    client = FakeClient()
    del client.versions[("tier", 1)]
    found = registry_over(client).schema(5)
    assert found is not None and found.references[1].schema is None


def test_the_registry_unreachable_while_references_are_fetched_is_transient() -> None:
    registry = registry_over(FakeClient(down=frozenset({"tier"})))
    with pytest.raises(RegistryUnavailable, match="version 1 of tier failed"):
        registry.schema(5)
    # nor does the decoder dead-letter the record: the chunk fails, Airflow retries
    p = pipeline(contract=CONTRACT)
    with pytest.raises(RegistryUnavailable):
        validate_chunk([Msg(0, value_=payment_value(5, PAY))], p, RegistryDecoder(p, registry))


def test_a_writer_schema_nested_past_the_parsers_depth_dead_letters_its_records_only() -> None:
    """Schema 9 is a record nested 1,200 deep: Python's parser cannot read it, so its
    records are ``schema_unreadable`` dead letters (replayable once it can be read), and
    schema 5's records in the same chunk load; the chunk does not fail."""
    text = nested_past_parser_depth()
    registry = OneSchema(
        WriterSchema(5, "AVRO", json.dumps(PAYMENT), references=(CUSTOMER_REF, TIER_REF)),
        WriterSchema(9, "AVRO", text))
    p = pipeline(contract=CONTRACT)
    messages = [Msg(0, value_=b"\x00\x00\x00\x00\x09\x02"),
                Msg(1, value_=payment_value(5, {**PAY, "event_id": "p-2"})),
                Msg(2, value_=b"\x00\x00\x00\x00\x09\x04")]
    result = validate_chunk(messages, p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [row_values(r)[0] for r in result.rows] == ["p-2"]
    assert [(d.source_offset, d.error_class, d.schema_id) for d in result.dead] == [
        (0, "schema_unreadable", 9), (2, "schema_unreadable", 9)]
