"""Registry formats without a registry: the wire header, Protobuf's message indexes and
field mapping, the registry settings from a connection, the error mapping, the plan-time
contract check and the contract generator (the integration tests use the real registry)."""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any
from uuid import UUID

import fastavro
import httpx
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from pydantic import BaseModel

from kafka_ingest.config import Format, parse_pipelines
from kafka_ingest.decode.codecs.avro import avro_fields
from kafka_ingest.decode.codecs.json_schema import json_schema_fields
from kafka_ingest.decode.codecs.protobuf import message_indexes, protobuf_fields
from kafka_ingest.decode.codecs.wire import split_header, wire_schema_id
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.schemas import contract_from_schema, contract_problems
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import (
    NotWireFormat,
    RegistryRefused,
    RegistryUnavailable,
    SettingsError,
    Undecodable,
)
from kafka_ingest.kafka.registry import (
    Reference,
    RegistrySettings,
    WriterSchema,
    is_descriptor,
    map_registry_error,
    registry_settings_from,
)
from kafka_ingest.records import row_values
from tests.support.datagen import nested_past_parser_depth
from tests.support.fakes import Msg

AVRO: dict[str, Any] = {"type": "record", "name": "Reading", "namespace": "com.acme", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "device", "type": "string"},
    {"name": "value", "type": "double"},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal",
                                         "precision": 10, "scale": 2}], "default": None},
    {"name": "owner", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "LONGEST"]}},
    {"name": "meta", "type": {"type": "map", "values": "string"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "blob", "type": "bytes"},
    {"name": "sentAt", "type": "long"},
]}
CONTRACT = {"reading": {"fields": {
    "device": {"type": "text", "max_length": 8},
    "value": {"type": "float"},
    "at": {"type": "timestamptz"},
    "amount": {"type": "numeric", "precision": 10, "scale": 2, "required": False},
}}}


class OneSchema:
    """The registry port: the schemas it was given, by id."""

    def __init__(self, *schemas: WriterSchema) -> None:
        self.known = {s.schema_id: s for s in schemas}
        self.asked: list[int] = []
        self.settings = RegistrySettings({"url": "http://registry"})

    def schema(self, schema_id: int, *, serialized: bool = False) -> WriterSchema | None:
        self.asked.append(schema_id)
        return self.known.get(schema_id)


def pipeline(fmt: str = "avro", contract: dict[str, Any] | None = None) -> Any:
    return parse_pipelines({"contracts": contract or CONTRACT, "pipelines": {"p": {
        "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows",
        "contract": {"event_type": next(iter(contract or CONTRACT)), "version": 1},
        "format": fmt, "schema_registry": {}}}})["p"]


def avro_value(schema_id: int, record: dict[str, Any], schema: dict[str, Any] = AVRO) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


GOOD = {"event_id": "e1", "device": "d1", "value": 1.5,
        "at": datetime(2026, 1, 1, tzinfo=UTC), "amount": Decimal("1.25"),
        "owner": UUID("7f0e3b2c-1111-4c4c-9a9a-0123456789ab"), "kind": "A",
        "meta": {"a": "b"}, "tags": ["x"], "blob": b"\x01", "sentAt": 1}


# --------------------------------------------------------------------------- the wire header

@pytest.mark.parametrize(("value", "expected"), [
    (b"\x00\x00\x00\x00\x07rest", 7),  # magic byte, big-endian id
    (b"\x00\x00\x01\x00\x00", 65536),  # a header alone is still one
    (b'{"event_id": 1}', None),  # JSON, not the wire format
    (b"\x00\x00\x01", None),  # too short for an id
    (None, None),  # a tombstone
])
def test_the_schema_id_is_read_from_the_header_only(value: bytes | None,
                                                    expected: int | None) -> None:
    assert wire_schema_id(value) == expected


def test_a_value_without_the_header_is_a_data_error_saying_what_it_starts_with() -> None:
    with pytest.raises(NotWireFormat, match="starts with 0x7b"):
        split_header(b'{"a": 1}')
    with pytest.raises(NotWireFormat, match="too short"):
        split_header(b"\x00\x01")
    assert split_header(b"\x00\x00\x00\x00\x2apayload") == (42, b"payload")


@pytest.mark.parametrize(("payload", "indexes"), [
    (b"\x00msg", [0]),  # the common case: one 0 byte for the first message
    (b"\x02\x02msg", [1]),  # count 1 (zigzag 2), index 1 (zigzag 2)
    (b"\x04\x00\x06msg", [0, 3]),  # a nested message: count 2, path 0 -> 3
])
def test_protobuf_message_indexes_are_zigzag_varints(payload: bytes, indexes: list[int]) -> None:
    found, rest = message_indexes(payload)
    assert (found, rest) == (indexes, b"msg")


def test_cut_message_indexes_are_undecodable() -> None:
    with pytest.raises(Undecodable):
        message_indexes(b"\x04\x00")


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "F", "fields": [  # the flat reader
        {"name": "s", "type": "string"}, {"name": "u", "type": ["null", "string"]},
        {"name": "d", "type": "double"}]},
    {"type": "record", "name": "G", "fields": [  # fastavro's reader (an enum)
        {"name": "s", "type": "string"},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}}]},
])
def test_an_avro_reader_reads_the_payload_where_it_starts_in_the_value(schema: Any) -> None:
    """The decoder hands a reader the whole value and where its payload starts (after the
    wire header), so the payload is not copied out of every value first."""
    from kafka_ingest.decode.codecs.avro import _avro_reader

    reader = _avro_reader(WriterSchema(3, "AVRO", json.dumps(schema)))
    record = {"s": "é-1", "u": "x", "d": 1.5, "e": "B"}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    payload = out.getvalue()
    want = {f["name"]: record[f["name"]] for f in schema["fields"]}
    assert reader(payload) == want
    assert reader(b"\x00\x00\x00\x00\x03" + payload, 5) == want
    with pytest.raises(Undecodable):  # cut short, counted from where the payload starts
        reader(b"\x00\x00\x00\x00\x03" + payload[:3], 5)


def test_protobuf_message_indexes_are_read_where_the_payload_starts() -> None:
    assert message_indexes(b"\x00\x00\x00\x00\x07\x04\x00\x06msg", 5) == ([0, 3], b"msg")


# --------------------------------------------------------------------------- decoding

def test_avro_decodes_once_per_schema_id_and_every_poison_is_its_own_dead_letter() -> None:
    registry = OneSchema(WriterSchema(5, "AVRO", json.dumps(AVRO)))
    p = pipeline()
    decoder = RegistryDecoder(p, registry)  # type: ignore[arg-type]
    good = avro_value(5, GOOD)
    messages = [
        Msg(0, value_=good),
        Msg(1, value_=avro_value(5, {**GOOD, "event_id": "e2"})),
        Msg(2, value_=b'{"event_id": "json"}'),  # no magic byte
        Msg(3, value_=b"\x00\x00\x00\x00\x09" + good[5:]),  # id 9: not registered
        Msg(4, value_=good[:9]),  # cut short
        Msg(5, value_=avro_value(5, {**GOOD, "event_id": "e3", "device": "x" * 9})),
    ]
    result = validate_chunk(messages, p, decoder)
    assert [row_values(r)[:5] for r in result.rows] == [
        ("e1", "d1", 1.5, datetime(2026, 1, 1, tzinfo=UTC), Decimal("1.25")),
        ("e2", "d1", 1.5, datetime(2026, 1, 1, tzinfo=UTC), Decimal("1.25"))]
    assert [(d.source_offset, d.error_class, d.schema_id) for d in result.dead] == [
        (2, "not_wire_format", None), (3, "unknown_schema", 9), (4, "undecodable", 5),
        (5, "contract_violation", 5)]
    assert registry.asked == [5, 9]  # each id asked once; the refusal is remembered too


def test_a_schema_of_another_type_is_not_decoded_as_this_format() -> None:
    registry = OneSchema(WriterSchema(5, "JSON", "{}"))
    decoder = RegistryDecoder(pipeline(), registry)  # type: ignore[arg-type]
    result = validate_chunk([Msg(0, value_=b"\x00\x00\x00\x00\x05{}")], pipeline(),
                            decoder)
    assert [(d.error_class, "is a JSON schema" in d.error_detail) for d in result.dead] == [
        ("unknown_schema", True)]


def test_json_schema_payloads_are_validated_as_json() -> None:
    registry = OneSchema(WriterSchema(6, "JSON", '{"type": "object"}'))
    p = pipeline("json_schema")
    decoder = RegistryDecoder(p, registry)  # type: ignore[arg-type]
    header = b"\x00\x00\x00\x00\x06"
    result = validate_chunk([
        Msg(0, value_=header + b'{"event_id": "e1", "device": "d", "value": 2,'
                                      b' "at": "2026-01-01T00:00:00Z", "amount": "1.50"}'),
        Msg(1, value_=header + b"{not json"),
        Msg(2, value_=header + b'{"event_id": "e2", "device": "d", "value": 2,'
                                      b' "at": "2026-01-01T00:00:00"}'),  # naive
    ], p, decoder)
    assert [row_values(r)[0] for r in result.rows] == ["e1"]
    assert [d.error_class for d in result.dead] == ["undecodable", "contract_violation"]


def _reading_class() -> tuple[Any, str]:
    fd = descriptor_pb2.FileDescriptorProto(name="r.proto", package="acme", syntax="proto3",
                                            dependency=["google/protobuf/timestamp.proto"])
    msg = fd.message_type.add(name="Reading")
    f = descriptor_pb2.FieldDescriptorProto
    for number, (name, kind) in enumerate([("event_id", f.TYPE_STRING),
                                           ("device", f.TYPE_STRING),
                                           ("value", f.TYPE_DOUBLE),
                                           ("count", f.TYPE_INT64)], start=1):
        msg.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    msg.field.add(name="at", number=5, type=f.TYPE_MESSAGE,
                  type_name=".google.protobuf.Timestamp", label=f.LABEL_OPTIONAL)
    msg.field.add(name="note", number=6, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL,
                  proto3_optional=True, oneof_index=0)
    msg.oneof_decl.add(name="_note")
    msg.field.add(name="tags", number=7, type=f.TYPE_STRING, label=f.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    known = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(known)
    pool.Add(known)
    pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Reading"))
    return cls, base64.b64encode(fd.SerializeToString()).decode()


def test_protobuf_messages_become_the_contract_s_dict_with_64_bit_ints_and_timestamps() -> None:
    cls, text = _reading_class()
    registry = OneSchema(WriterSchema(8, "PROTOBUF", text))
    contract = {"proto_reading": {"fields": {
        "device": {"type": "text", "max_length": 8}, "value": {"type": "float"},
        "count": {"type": "bigint"}, "at": {"type": "timestamptz"},
        "note": {"type": "text", "max_length": 8, "required": False},
        "tags": {"type": "array", "items": {"type": "text", "max_length": 4}}}}}
    p = pipeline("protobuf", contract)
    message = cls(event_id="e1", device="d", value=0.0, count=2**40, tags=["a"])
    message.at.FromSeconds(1_767_225_600)
    header = b"\x00\x00\x00\x00\x08\x00"
    result = validate_chunk([Msg(0, value_=header + message.SerializeToString()),
                             Msg(1, value_=header + b"\xff\xff")],
                            p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    # value 0.0 has no presence in proto3 and still arrives; note is unset: missing (None)
    assert [row_values(r) for r in result.rows] == [
        ("e1", "d", 0.0, 2**40, datetime(2026, 1, 1, tzinfo=UTC), None, ["a"])]
    assert [d.error_class for d in result.dead] == ["undecodable"]


def test_a_descriptor_is_told_from_proto_source() -> None:
    _, text = _reading_class()
    assert is_descriptor(text)
    assert not is_descriptor('syntax = "proto3"; message A { string a = 1; }')


# --------------------------------------------------------------------------- settings, errors

def test_every_connection_setting_reaches_the_client_and_no_secret_its_repr() -> None:
    settings = registry_settings_from(
        source="conn 'r'", host="registry.example", port=8443, scheme="https", login="svc",
        password="s3cret", extra={"path": "apis/ccompat/v7", "ssl.ca.location": "/ca.pem",
                                  "timeout": 3})
    assert settings.config == {"url": "https://registry.example:8443/apis/ccompat/v7",
                               "basic.auth.user.info": "svc:s3cret",
                               "ssl.ca.location": "/ca.pem", "timeout": 3}
    assert "s3cret" not in repr(settings) and "***" in repr(settings)


@pytest.mark.parametrize(("host", "extra", "message"), [
    (None, {}, "no host"),
    ("h", {"basic.auth.user.info": "a:b"}, "not both"),
])
def test_a_connection_that_cannot_work_is_a_settings_error(host: str | None,
                                                           extra: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        registry_settings_from(source="c", host=host, port=None, scheme=None, login="u",
                               password="p", extra=extra)


def test_an_unknown_client_setting_is_refused_by_name() -> None:
    from kafka_ingest.kafka.registry import SchemaRegistry

    with pytest.raises(SettingsError, match=r"ssl\.ca\.locaton"):
        SchemaRegistry(RegistrySettings({"url": "http://r", "ssl.ca.locaton": "/x"}))


@pytest.mark.parametrize(("exc", "kind"), [
    (SchemaRegistryError(503, 50003, "unavailable"), RegistryUnavailable),
    (SchemaRegistryError(500, 50001, "store"), RegistryUnavailable),
    (SchemaRegistryError(401, 40101, "unauthorized"), RegistryRefused),
    (SchemaRegistryError(403, 40301, "forbidden"), RegistryRefused),
    (httpx.ConnectError("refused"), RegistryUnavailable),
    (httpx.ReadTimeout("slow"), RegistryUnavailable),
])
def test_registry_failures_map_onto_the_tree(exc: Exception, kind: type[Exception]) -> None:
    assert isinstance(map_registry_error("get schema 1", exc), kind)


# --------------------------------------------------------------------------- contracts

def test_writer_fields_say_what_each_arrives_as() -> None:
    fields = avro_fields(json.dumps(AVRO))
    assert {n: (f.kind, f.nullable) for n, f in fields.items()} == {
        "event_id": ("string", False), "device": ("string", False), "value": ("float", False),
        "at": ("datetime", False), "amount": ("decimal", True), "owner": ("uuid", False),
        "kind": ("string", False), "meta": ("object", False), "tags": ("array", False),
        "blob": ("bytes", False), "sentAt": ("integer", False)}
    _, text = _reading_class()
    proto = protobuf_fields(text)
    assert (proto["at"].kind, proto["at"].nullable, proto["note"].nullable,
            proto["value"].nullable, proto["tags"].items) == ("datetime", True, True, False,
                                                              "string")
    js = json_schema_fields(json.dumps({"type": "object", "required": ["a"], "properties": {
        "a": {"type": "string", "format": "date-time"}, "b": {"type": ["integer", "null"]}}}))
    assert {n: (f.kind, f.nullable) for n, f in js.items()} == {
        "a": ("datetime", False), "b": ("integer", True)}


class _Tier(StrEnum):
    GOLD = "GOLD"
    SILVER = "SILVER"


class _Address(BaseModel):
    city: str
    zip: str | None = None


class _Shipment(BaseModel):
    """A value as producing teams model it: optional fields, an enum and a nested model,
    which pydantic's ``model_json_schema()`` writes as ``anyOf`` with ``null`` and
    ``$ref`` into ``$defs``."""

    event_id: str
    note: str | None = None
    tier: _Tier
    destination: _Address
    origin: _Address | None = None
    tags: list[_Tier] = []
    weight: float | None = None
    extra: Any = None


def test_json_schema_fields_follow_refs_and_optional_unions_as_pydantic_writes_them() -> None:
    text = json.dumps(_Shipment.model_json_schema())
    fields = json_schema_fields(text)
    said = {n: (f.kind, f.nullable, f.max_length, f.items) for n, f in fields.items()}
    assert said == {
        "event_id": ("string", False, None, None), "note": ("string", True, None, None),
        "tier": ("string", False, 6, None),  # the enum's longest symbol
        "destination": ("object", False, None, None), "origin": ("object", True, None, None),
        "tags": ("array", True, None, "string"), "weight": ("float", True, None, None),
        "extra": ("any", True, None, None)}
    assert {n: (f.kind, f.nullable) for n, f in fields["origin"].fields.items()} == {
        "city": ("string", False), "zip": ("string", True)}
    # the plan's check: a contract of text, a record and a float reads it
    p = parse_pipelines({"contracts": {"shipment": {"version": 1, "fields": {
        "note": {"type": "text", "max_length": 64, "required": False},
        "tier": {"type": "text", "max_length": 6},
        "destination": {"type": "record", "fields": {
            "city": {"type": "text", "max_length": 40},
            "zip": {"type": "text", "max_length": 10, "required": False}}},
        "weight": {"type": "float", "required": False},
        "extra": {"type": "jsonb", "required": False}}}},
        "pipelines": {"p": {"topic": "t", "dlq_topic": "d", "table": "shipments",
                            "format": "json_schema", "schema_registry": {},
                            "contract": {"event_type": "shipment", "version": 1}}}})["p"]
    assert contract_problems(p, fields) == []
    body, skipped = contract_from_schema(Format.JSON_SCHEMA, WriterSchema(
        3, "JSON", text, subject="s", version=1), text_max_length=64)
    assert body["fields"]["note"] == {"type": "text", "max_length": 64, "required": False}
    assert body["fields"]["tier"] == {"type": "text", "max_length": 6}
    assert body["fields"]["origin"]["type"] == "record"
    assert "extra" not in body["fields"] and any(s.startswith("extra:") for s in skipped)


def test_json_schema_refs_reach_the_schemas_it_references_in_the_registry() -> None:
    """By the reference's name (as confluent-kafka's ``JSONSerializer`` resolves them) or
    the referenced schema's ``$id``, with a JSON pointer after ``#``; a ``$ref`` inside the
    referenced schema points into that schema. A ``$ref`` to nothing, or references that
    loop, say any value: the check does not judge it."""
    address = {"$id": "https://example.test/address.json", "type": "object",
               "required": ["city"], "definitions": {"zip": {"type": "string",
                                                             "maxLength": 10}},
               "properties": {"city": {"type": "string"}, "zip": {"$ref": "#/definitions/zip"}}}
    refs = (Reference("address.json", "addr", 1, WriterSchema(7, "JSON", json.dumps(address))),)
    text = json.dumps({"type": "object", "required": ["to"], "properties": {
        "to": {"$ref": "address.json"},
        "zip": {"$ref": "https://example.test/address.json#/definitions/zip"},
        "lost": {"$ref": "nowhere.json"},
        "loop": {"$ref": "#/properties/loop"}}})
    fields = json_schema_fields(text, refs)
    assert fields["to"].kind == "object" and fields["to"].fields is not None
    assert {n: (f.kind, f.max_length) for n, f in fields["to"].fields.items()} == {
        "city": ("string", None), "zip": ("string", 10)}
    assert (fields["zip"].kind, fields["zip"].max_length) == ("string", 10)
    assert fields["lost"].kind == fields["loop"].kind == "any"
    fields = json_schema_fields(text)  # the references not given: "to" is any value
    assert fields["to"].kind == "any"


def test_json_schema_all_of_admits_null_only_as_every_part_does_and_ref_siblings_add() -> None:
    """``allOf`` lets null through when every part does (one saying ``null``, the others
    nothing of the type); the keys beside a ``$ref`` add to what it names (properties and
    ``required`` joined) rather than replace it. Both were lost before: an optional field
    declared required, a record's own fields dropped."""
    addr = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
    fields = json_schema_fields(json.dumps({
        "type": "object", "required": ["a", "b", "c", "d", "e", "f"], "$defs": {"Addr": addr},
        "properties": {
            "a": {"allOf": [{"type": ["string", "null"]}, {"maxLength": 5}]},
            "b": {"allOf": [{"type": ["string", "null"]}, {"type": "string"}]},
            "c": {"allOf": [{"anyOf": [{"$ref": "#/$defs/Addr"}, {"type": "null"}]}]},
            "d": {"type": "string", "allOf": [{"type": ["string", "null"]}]},
            "e": {"$ref": "#/$defs/Addr", "required": ["zip"],
                  "properties": {"zip": {"type": "string", "maxLength": 10}}},
            "f": {"$ref": "#/$defs/Addr", "description": "where it goes"}}}))
    said = {n: (f.kind, f.nullable, f.max_length) for n, f in fields.items()}
    assert said == {"a": ("string", True, 5), "b": ("string", False, None),
                    "c": ("object", True, None), "d": ("string", False, None),
                    "e": ("object", False, None), "f": ("object", False, None)}
    assert {n: (f.kind, f.nullable, f.max_length) for n, f in fields["e"].fields.items()} == {
        "city": ("string", False, None), "zip": ("string", False, 10)}
    assert set(fields["f"].fields) == {"city"}


@pytest.mark.timeout(60)  # the old resolver branched 3 ways 64 deep: it never ended
def test_json_schema_refs_that_branch_into_themselves_end_as_any_value() -> None:
    """A definition whose ``anyOf``/``allOf`` branches refer back to it (valid JSON Schema,
    and a crafted one could come from any producer) is given up after a bounded number of
    steps, all branches together, and the odd types of ``required`` and ``properties``
    are read as absent, not as an error."""
    loops = {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"},
                                       {"allOf": [{"$ref": "#/$defs/A"}]}]}},
             "required": "p0", "properties": {f"p{i}": {"$ref": "#/$defs/A"} for i in range(50)}}
    fields = json_schema_fields(json.dumps(loops))
    assert {f.kind for f in fields.values()} == {"any"}
    assert all(f.nullable for f in fields.values())  # "required" is not a list: none is
    assert json_schema_fields(json.dumps({"properties": ["a", "b"]})) == {}


@pytest.mark.timeout(60)  # the fan-out below made millions of fields before
def test_json_schema_odd_shapes_read_safely_and_as_what_they_say() -> None:
    """Found by a review: a ``$ref`` fanning out into itself, arrays of numbers, an anchor,
    several types beside ``properties``, odd ``allOf`` parts and ``$ref``/``format``
    values."""
    fan = {"$ref": "#/$defs/N", "$defs": {"N": {"type": "object", "properties": {
        f"p{i}": {"$ref": "#/$defs/N"} for i in range(6)}}}}
    fields = json_schema_fields(json.dumps(fan))
    assert set(fields) == {f"p{i}" for i in range(6)}
    odd = json_schema_fields(json.dumps({"$defs": {"Name": {"$anchor": "name", "type": "string"}},
                                         "properties": {
        "nums": {"type": "array", "items": {"type": "number"}},
        "one": {"anyOf": [{"type": "number"}, {"type": "number", "minimum": 0}]},
        "name": {"$ref": "#name"},
        "either": {"type": ["string", "object"], "properties": {"a": {"type": "string"}}},
        "parts": {"allOf": [{"required": True}, {"properties": ["x"]}]},
        "ref": {"$ref": 5}, "day": {"type": "string", "format": ["date"]}}}))
    assert {n: (f.kind, f.items) for n, f in odd.items()} == {
        "nums": ("array", "float"), "one": ("float", None), "name": ("any", None),
        "either": ("any", None), "parts": ("object", None), "ref": ("any", None),
        "day": ("string", None)}
    # a contract reading a record inside a field the schema leaves open is not refused
    p = parse_pipelines({"contracts": {"trip": {"version": 1, "fields": {
        "destination": {"type": "record", "fields": {"city": {"type": "text",
                                                               "max_length": 40}}}}}},
        "pipelines": {"p": {"topic": "t", "dlq_topic": "d", "table": "trips",
                            "format": "json_schema", "schema_registry": {},
                            "contract": {"event_type": "trip", "version": 1}}}})["p"]
    assert contract_problems(p, json_schema_fields(json.dumps({"properties": {
        "event_id": {"type": "string"}, "destination": {}}}))) == []


def test_the_plan_check_names_each_field_the_contract_cannot_read() -> None:
    p = pipeline()
    assert contract_problems(p, avro_fields(json.dumps(AVRO))) == []
    without_value = {**AVRO, "fields": [f for f in AVRO["fields"] if f["name"] != "value"]}
    string_at = {**AVRO, "fields": [
        {"name": "at", "type": "string"} if f["name"] == "at" else f for f in AVRO["fields"]]}
    assert contract_problems(p, avro_fields(json.dumps(without_value))) == [
        "field 'value': required by the contract, absent from the writer schema"]
    assert contract_problems(p, avro_fields(json.dumps(string_at))) == [
        "field 'at': the writer sends string, the contract's timestamp with time zone column "
        "takes datetime"]
    # JSON Schema payloads are validated as JSON: an ISO string is what a timestamp takes
    js = pipeline("json_schema")
    assert contract_problems(js, json_schema_fields(json.dumps({"type": "object", "properties": {
        "event_id": {"type": "string"}, "device": {"type": "string"},
        "value": {"type": "number"}, "at": {"type": "string"}}}))) == []


def test_a_contract_made_from_a_schema_loads_and_is_as_strict() -> None:
    body, skipped = contract_from_schema(
        Format.AVRO, WriterSchema(5, "AVRO", json.dumps(AVRO), subject="s", version=2),
        text_max_length=64)
    assert body["fields"]["amount"] == {"type": "numeric", "precision": 10, "scale": 2,
                                        "required": False}
    assert body["fields"]["kind"] == {"type": "text", "max_length": 7}  # its longest symbol
    assert body["fields"]["sentAt"] == {"type": "bigint", "column": "sent_at"}
    assert body["fields"]["tags"] == {"type": "array", "items": {"type": "text",
                                                                 "max_length": 64}}
    assert body["fields"]["blob"] == {"type": "bytea"}  # Avro bytes: Postgres' bytes
    assert skipped == []
    made = parse_pipelines({"contracts": {"made": body}, "pipelines": {"p": {
        "topic": "t", "dlq_topic": "d", "table": "p_rows", "format": "avro",
        "schema_registry": {}, "contract": {"event_type": "made", "version": 1}}}})["p"]
    registry = OneSchema(WriterSchema(5, "AVRO", json.dumps(AVRO)))
    result = validate_chunk([Msg(0, value_=avro_value(5, GOOD)),
                             Msg(1, value_=avro_value(5, {**GOOD, "device": "x" * 65}))],
                            made, RegistryDecoder(made, registry))  # type: ignore[arg-type]
    assert len(result.rows) == 1 and [d.error_class for d in result.dead] == [
        "contract_violation"]


def test_a_registry_encoded_key_fills_the_key_column_and_deletes_on_its_tombstone() -> None:
    key_schema = {"type": "record", "name": "AccountKey", "fields": [
        {"name": "id", "type": "long"}]}
    registry = OneSchema(WriterSchema(5, "AVRO", json.dumps(AVRO)),
                         WriterSchema(6, "AVRO", json.dumps(key_schema)))
    p = parse_pipelines({"contracts": CONTRACT, "pipelines": {"p": {
        "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows", "format": "avro",
        "schema_registry": {}, "contract": {"event_type": "reading", "version": 1},
        "record_key": {"column": "account", "format": "registry", "field": "id",
                       "type": "bigint"},
        "upsert": {"mode": "latest", "key": "account", "order_by": "source_offset"},
        "on_tombstone": "delete"}}})["p"]

    def key(account: int) -> bytes:
        return avro_value(6, {"id": account}, key_schema)

    result = validate_chunk([
        Msg(0, value_=avro_value(5, GOOD), key_=key(7)),
        Msg(1, value_=None, key_=key(8)),  # a tombstone of account 8
        Msg(2, value_=avro_value(5, {**GOOD, "event_id": "e2"}), key_=b"plain"),
        Msg(3, value_=None, key_=b"\x00\x00\x00\x00\x63"),  # key schema id 99: unknown
    ], p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [row_values(r)[-1] for r in result.rows] == [7]  # the key column after the contract's
    assert [(t.key, t.offset) for t in result.deletes] == [(8, 1)]
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (2, "bad_key"), (3, "bad_key")]
    assert "no magic byte" in result.dead[0].error_detail
    with pytest.raises(ValueError, match="registry format"):
        parse_pipelines({"contracts": CONTRACT, "pipelines": {"p": {
            "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows",
            "contract": {"event_type": "reading", "version": 1},
            "record_key": {"column": "account", "format": "registry"}}}})


def test_a_json_schema_key_that_is_not_json_is_a_bad_key_not_a_failed_chunk() -> None:
    registry = OneSchema(WriterSchema(6, "JSON", '{"type": "object"}'),
                         WriterSchema(7, "JSON", '{"type": "string"}'))
    p = parse_pipelines({"contracts": CONTRACT, "pipelines": {"p": {
        "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows", "format": "json_schema",
        "schema_registry": {}, "contract": {"event_type": "reading", "version": 1},
        "record_key": {"column": "account", "format": "registry"}}}})["p"]
    value = (b"\x00\x00\x00\x00\x06" + b'{"event_id": "e1", "device": "d", "value": 2,'
             b' "at": "2026-01-01T00:00:00Z"}')
    result = validate_chunk([Msg(0, value_=value, key_=b'\x00\x00\x00\x00\x07"acct-1"'),
                             Msg(1, value_=value, key_=b"\x00\x00\x00\x00\x07{not json")],
                            p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [row_values(r)[-1] for r in result.rows] == ["acct-1"]
    assert [(d.source_offset, d.error_class, d.error_detail.startswith("record key: not JSON"))
            for d in result.dead] == [(1, "bad_key", True)]


# --------------------------------------------------------------------------- found in review

def test_typed_values_nested_in_a_jsonb_field_are_a_contract_violation_not_a_crash() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "event_id", "type": "string"},
        {"name": "limits", "type": {"type": "map", "values": {
            "type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}}}]}
    contract = {"with_limits": {"fields": {"limits": {"type": "jsonb"}}}}
    p = pipeline("avro", contract)
    registry = OneSchema(WriterSchema(5, "AVRO", json.dumps(schema)))
    result = validate_chunk([Msg(0, value_=avro_value(5, {"event_id": "e", "limits": {
        "daily": Decimal("5.50")}}, schema))], p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    # a Decimal no JSON encoder takes: refused by the contract, before the COPY would fail
    assert [(d.error_class, "JSON values only" in d.error_detail) for d in result.dead] == [
        ("contract_violation", True)]


def test_a_protobuf_timestamp_past_year_9999_is_undecodable() -> None:
    cls, text = _reading_class()
    registry = OneSchema(WriterSchema(8, "PROTOBUF", text))
    contract = {"proto_at": {"fields": {"at": {"type": "timestamptz"}}}}
    p = pipeline("protobuf", contract)
    message = cls(event_id="e1")
    message.at.seconds = 2**40  # year 36812
    result = validate_chunk([Msg(0, value_=b"\x00\x00\x00\x00\x08\x00"
                                 + message.SerializeToString())],
                            p, RegistryDecoder(p, registry))  # type: ignore[arg-type]
    assert [d.error_class for d in result.dead] == ["undecodable"]


def test_a_lone_surrogate_in_a_json_key_is_a_bad_key() -> None:
    from kafka_ingest.config import RecordKey
    from kafka_ingest.decode.message_columns import key_value
    from kafka_ingest.errors import BadKey

    with pytest.raises(BadKey, match="lone surrogate"):
        key_value(RecordKey(column="k", format="json"), b'"\\ud800"')  # type: ignore[arg-type]


def test_log_order_is_only_for_a_key_the_partitioner_keeps_in_one_partition() -> None:
    with pytest.raises(ValueError, match="record key's column"):
        parse_pipelines({"contracts": CONTRACT, "pipelines": {"p": {
            "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows",
            "contract": {"event_type": "reading", "version": 1},
            "upsert": {"mode": "latest", "key": "device", "order_by": "source_offset"}}}})


def test_a_404_without_a_not_found_code_is_a_wrong_url_not_a_missing_schema() -> None:
    from kafka_ingest.kafka.registry import SchemaRegistry

    def no_such_api(_what: Any, fmt: str | None = None) -> Any:
        raise SchemaRegistryError(404, -1, "RESTEASY003210: Could not find resource")

    def no_such_schema(_what: Any, fmt: str | None = None) -> Any:
        raise SchemaRegistryError(404, 40403, "Schema 9 not found.")

    assert SchemaRegistry._ask("get schema 9", no_such_schema, 9, None) is None
    with pytest.raises(RegistryRefused, match="check its path"):
        SchemaRegistry._ask("get schema 9", no_such_api, 9, None)
    assert isinstance(map_registry_error("x", SchemaRegistryError(422, 42201, "bad")),
                      RegistryRefused)


def test_credentials_in_the_registry_url_never_reach_repr_or_messages() -> None:
    settings = RegistrySettings({"url": "https://svc:s3cret@registry.example:8443/apis/ccompat/v7"})
    assert "s3cret" not in repr(settings) and "s3cret" not in settings.url
    assert settings.url == "https://***@registry.example:8443/apis/ccompat/v7"


# --------------------------------------------------------------------------- the flat Avro reader

_PRIMITIVES = ["null", "boolean", "int", "long", "float", "double", "string", "bytes"]


def _random_value(rng: Any, avro_type: str) -> Any:
    import math
    import struct

    return {"null": None, "boolean": rng.random() < .5,
            "int": rng.choice([rng.randint(-2**31, 2**31 - 1), rng.randint(-70, 70)]),
            "long": rng.choice([rng.randint(-2**63, 2**63 - 1), rng.randint(-200, 200), 0]),
            "float": struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0],
            "double": rng.choice([rng.uniform(-1e300, 1e300), 0.0, -0.0, math.inf]),
            "string": "".join(rng.choice("aé€😀\x00z")
                              for _ in range(rng.choice([0, 1, 63, 64, 200]))),
            "bytes": bytes(rng.randrange(256) for _ in range(rng.choice([0, 5, 64, 300])))
            }[avro_type]


def _random_fields(rng: Any, depth: int, name: str) -> list[dict[str, Any]]:
    """Random fields: primitives, unions of them, and (above depth 0) records of such."""
    fields: list[dict[str, Any]] = []
    for i in range(rng.randint(1, 9 if depth == 2 else 4)):
        roll = rng.random()
        if roll < .3:
            fields.append({"name": f"f{i}", "type": rng.sample(_PRIMITIVES, rng.randint(1, 3))})
        elif roll < .45 and depth:
            fields.append({"name": f"f{i}", "type": {"type": "record", "name": f"{name}_{i}",
                                                     "fields": _random_fields(rng, depth - 1,
                                                                              f"{name}_{i}")}})
        else:
            kind = rng.choice(_PRIMITIVES)
            fields.append({"name": f"f{i}", "type": {"type": kind, "avro.java.string":
                           "String"} if kind == "string" and rng.random() < .2 else kind})
    return fields


def _random_record(rng: Any, fields: list[dict[str, Any]]) -> dict[str, Any]:
    record = {}
    for f in fields:
        t = f["type"]
        if isinstance(t, list):
            t = rng.choice(t)
        if isinstance(t, dict) and t["type"] == "record":
            record[f["name"]] = _random_record(rng, t["fields"])
        else:
            record[f["name"]] = _random_value(rng, t["type"] if isinstance(t, dict) else t)
    return record


def test_the_flat_avro_reader_reads_what_fastavro_reads_and_refuses_what_it_refuses() -> None:
    """Records of primitives, unions of them and records of those are read by the
    project's reader made per schema (fastavro's per-field dispatch was most of the Avro
    path's cost): on random schemas, records and every cut of their payloads, it must agree
    with fastavro exactly."""
    import random

    from kafka_ingest.decode.codecs.avro import _avro_reader

    rng = random.Random(7)
    checked = nested = 0
    for s in range(60):
        fields = _random_fields(rng, 2, f"R{s}")
        schema = {"type": "record", "name": f"R{s}", "fields": fields}
        nested += '"record"' in json.dumps(fields)
        reader = _avro_reader(WriterSchema(s, "AVRO", json.dumps(schema)))
        assert reader.__qualname__.startswith("_flat_reader"), schema  # not fastavro's
        parsed = fastavro.parse_schema(schema)
        for _ in range(4):
            record = _random_record(rng, fields)
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, record)
            payload = out.getvalue()
            want = fastavro.schemaless_reader(io.BytesIO(payload), parsed)
            got = reader(payload)
            assert json.dumps(got, default=repr) == json.dumps(want, default=repr)
            assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
            for cut in range(len(payload)):  # every cut: both refuse, or both read the same
                try:
                    fastavro_read: Any = fastavro.schemaless_reader(io.BytesIO(payload[:cut]),
                                                                    parsed)
                except Exception:
                    fastavro_read = "refused"
                try:
                    ours: Any = reader(payload[:cut])
                except Undecodable:
                    ours = "refused"
                assert (ours == "refused") == (fastavro_read == "refused"), (schema, cut)
            for _ in range(20):  # bytes changed at random: read as fastavro reads, or refused
                changed = bytearray(payload)
                for _ in range(rng.randint(1, 3) if changed else 0):
                    changed[rng.randrange(len(changed))] = rng.randrange(256)
                try:
                    ours = reader(bytes(changed))
                except Undecodable:  # fastavro reads a negative union index from the end,
                    continue  # and keeps a varint's low 64 bits: not us
                assert json.dumps(ours, default=repr) == json.dumps(
                    fastavro.schemaless_reader(io.BytesIO(bytes(changed)), parsed),
                    default=repr), (schema, bytes(changed))
            checked += 1
    assert checked == 240
    assert nested > 15  # records inside records were among them


@pytest.mark.parametrize("payload", [
    b"\x04\xff\xfe\x00",  # a string that is not UTF-8
    b"\x00\x04",  # a union index past its branches
    b"\x00\x01",  # a negative union index
    b"\x00\x80\x01",  # a union index of two bytes (64), past its branches
    b"\x01",  # a negative length
])
def test_the_flat_avro_reader_refuses_bad_bytes_as_undecodable(payload: bytes) -> None:
    from kafka_ingest.decode.codecs.avro import _avro_reader

    reader = _avro_reader(WriterSchema(1, "AVRO", json.dumps({
        "type": "record", "name": "X", "fields": [
            {"name": "s", "type": "string"}, {"name": "u", "type": ["null", "string"]}]})))
    with pytest.raises(Undecodable):
        reader(payload)


#: What a flat reader's code may name: the helpers it is given and the builtins it calls.
_FLAT_READER_NAMES = {"len", "type", "IndexError", "ValueError", "varint", "struct_error",
                      "Undecodable", "schema_id", "decode", "__name__"}


def test_the_flat_avro_reader_takes_any_field_name_as_data_and_calls_only_its_helpers() -> None:
    """The reader is compiled from source made per schema: a field name is a literal in it,
    never code, whatever it holds (quotes, backslashes, newlines, braces, Python)."""
    import inspect

    from kafka_ingest.decode.codecs.avro import _avro_reader

    names = ["a'b", 'q"', "back\\slash", "new\nline", "'}); import os; os._exit(3); ({'",
             "__import__('os').system('false')", "ünï", "class", "v0", "p", "i", ""]
    schema = {"type": "record", "name": "H", "fields": [
        *({"name": n, "type": "string"} for n in names),
        {"name": "inner", "type": {"type": "record", "name": "I", "fields": [
            {"name": "'\n}", "type": ["null", "double"]}, {"name": "x", "type": "float"}]}}]}
    reader = _avro_reader(WriterSchema(5, "AVRO", json.dumps(schema)))
    assert reader.__qualname__.startswith("_flat_reader")
    record = {**{n: f"value of {n}" for n in names}, "inner": {"'\n}": 2.5, "x": 0.5}}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    assert reader(out.getvalue()) == record
    code = reader.__code__  # type: ignore[attr-defined]
    assert set(code.co_names) - _FLAT_READER_NAMES <= {"unpack_fd", "unpack_d", "unpack_f"}
    assert "def decode(p, i=0, /):" in inspect.getsource(reader)  # in linecache: steppable


def test_the_flat_avro_reader_reads_long_varints_as_fastavro_and_wide_schemas_go_to_it() -> None:
    from kafka_ingest.decode.codecs.avro import FLAT_MAX_LINES, _avro_reader

    schema = {"type": "record", "name": "X", "fields": [
        {"name": "s", "type": "string"}, {"name": "u", "type": ["null", "string"]},
        {"name": "n", "type": "long"}]}
    reader = _avro_reader(WriterSchema(1, "AVRO", json.dumps(schema)))
    parsed = fastavro.parse_schema(schema)
    for payload in (b"\x82\x00a\x80\x00\x80\x01",  # each varint in two bytes, not one
                    b"\x02a\x02\x82\x80\x00b\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"):
        assert reader(payload) == fastavro.schemaless_reader(io.BytesIO(payload), parsed)
    for payload in (b"\x02a\x00\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x11",  # over 64 bits
                    b"\x02a\x00" + b"\x80" * 10 + b"\x00"):  # over 10 bytes
        with pytest.raises(Undecodable, match="varint"):  # fastavro reads them, wrapped
            reader(payload)
    # a reader of over FLAT_MAX_LINES lines (13 a text field) is fastavro's
    wide = {"type": "record", "name": "W", "fields": [
        {"name": f"f{k}", "type": "string"} for k in range(FLAT_MAX_LINES // 13 + 1)]}
    wide_reader = _avro_reader(WriterSchema(2, "AVRO", json.dumps(wide)))
    assert not wide_reader.__qualname__.startswith("_flat_reader")
    record = {f["name"]: f["name"] for f in wide["fields"]}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(wide), record)
    assert wide_reader(out.getvalue()) == record
    narrower = {**wide, "fields": wide["fields"][:FLAT_MAX_LINES // 14]}
    assert _avro_reader(WriterSchema(3, "AVRO", json.dumps(narrower))).__qualname__.startswith(
        "_flat_reader")


@pytest.mark.parametrize(("fields", "record"), [
    # a union naming a type twice: not Avro, read by fastavro (64 branches of one type
    # made 5.7 GB of source to compile for 2,000 such fields)
    ([{"name": "u", "type": ["null", "string", "string"]}], {"u": "x"}),
    ([{"name": 1, "type": "int"}], {1: 5}),  # a name that is not text
])
def test_what_avro_does_not_allow_and_fastavro_reads_stays_with_fastavro(
        fields: list[dict[str, Any]], record: dict[Any, Any]) -> None:
    from kafka_ingest.decode.codecs.avro import _avro_reader

    schema = {"type": "record", "name": "N", "fields": fields}
    reader = _avro_reader(WriterSchema(4, "AVRO", json.dumps(schema)))
    assert not reader.__qualname__.startswith("_flat_reader")
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    assert reader(out.getvalue()) == fastavro.schemaless_reader(
        io.BytesIO(out.getvalue()), fastavro.parse_schema(schema))


def test_a_writer_schema_nested_past_the_parsers_depth_is_unreadable_not_a_crash() -> None:
    """Its records are dead-lettered (schema_unreadable) and the rest load; a
    RecursionError failed the task at that offset, every retry."""
    from kafka_ingest.decode.codecs.avro import _avro_reader
    from kafka_ingest.errors import SchemaUnreadable

    text = nested_past_parser_depth()
    with pytest.raises(SchemaUnreadable, match="RecursionError"):
        _avro_reader(WriterSchema(9, "AVRO", text))


@pytest.mark.parametrize("schema", [
    {"type": "record", "name": "Y", "fields": [
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}]},
    {"type": "record", "name": "Z", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}}]},
    {"type": "record", "name": "W", "fields": [
        {"name": "u", "type": ["null", {"type": "string", "logicalType": "uuid"}]}]},
    {"type": "record", "name": "V", "fields": [  # an optional record: a union of one
        {"name": "a", "type": ["null", {"type": "record", "name": "A", "fields": [
            {"name": "x", "type": "string"}]}]}]},
    {"type": "record", "name": "U", "fields": [  # a record in place, then used by name
        {"name": "a", "type": {"type": "record", "name": "B", "fields": [
            {"name": "x", "type": "string"}]}}, {"name": "b", "type": "B"}]},
    {"type": "record", "name": "T", "fields": [  # a record in place holding a logical type
        {"name": "a", "type": {"type": "record", "name": "C", "fields": [
            {"name": "t", "type": {"type": "int", "logicalType": "date"}}]}}]},
    "string",
])
def test_logical_types_nested_types_and_non_records_stay_with_fastavro(schema: Any) -> None:
    from kafka_ingest.decode.codecs.avro import _avro_reader

    reader = _avro_reader(WriterSchema(2, "AVRO", json.dumps(schema)))
    assert not reader.__qualname__.startswith("_flat_reader")
