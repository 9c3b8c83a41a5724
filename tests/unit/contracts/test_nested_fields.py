"""Nested values in declared contracts: a ``record`` field lands as columns named by its
path, each read through that path from JSON and from decoded Avro alike; a pipeline's
identity names one by its dotted path; the declaration's limits are load errors; and
``schema from-registry`` flattens a writer schema's records (up to the nesting limit, else
``jsonb``) into a contract that reads the records it was made from.
"""

from __future__ import annotations

import base64
import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from kafka_ingest.config import Format, parse_pipelines
from kafka_ingest.contracts import json_schema
from kafka_ingest.contracts.columns import contract_columns, payload_paths
from kafka_ingest.decode.codecs.avro import avro_fields
from kafka_ingest.decode.codecs.json_schema import json_schema_fields
from kafka_ingest.decode.codecs.protobuf import WELL_KNOWN
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.schemas import contract_from_schema, contract_problems
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.registry import WriterSchema
from kafka_ingest.records import row_values
from tests.support.fakes import Msg
from tests.unit.decode.test_formats import OneSchema

ORDER = yaml.safe_load("""
order:
  fields:
    orderid: {type: integer}
    address:
      type: record
      fields:
        city:    {type: text, max_length: 16}
        zipCode: {type: bigint, column: zip}
        geo:
          type: record
          required: false
          column: g
          fields:
            lat: {type: float}
            lon: {type: float}
    note: {type: text, max_length: 8, required: false}
""")


def pipeline(contracts: dict[str, Any], *, fmt: str = "json", **body: Any) -> Any:
    event_type = next(iter(contracts))
    return parse_pipelines({"contracts": contracts, "pipelines": {"p": {
        "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows", "format": fmt,
        "contract": {"event_type": event_type, "version": 1},
        **({"schema_registry": {}} if fmt != "json" else {}), **body}}})["p"]


def load_error(contracts: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as info:
        pipeline(contracts)
    return str(info.value)


def test_a_record_is_a_column_per_field_named_by_its_path() -> None:
    model = pipeline(ORDER).model
    assert [(c.name, c.ddl, c.nullable) for c in contract_columns(model)] == [
        ("event_id", "character varying(128)", False),
        ("orderid", "integer", False),
        ("address_city", "character varying(16)", False),
        ("address_zip", "bigint", False),
        ("address_g_lat", "double precision", True),  # inside an optional record
        ("address_g_lon", "double precision", True),
        ("note", "character varying(8)", True)]
    assert payload_paths(model) == {
        "event_id": "event_id", "orderid": "orderid", "address.city": "address_city",
        "address.zipCode": "address_zip", "address.geo.lat": "address_g_lat",
        "address.geo.lon": "address_g_lon", "note": "note"}


def _json_rows(p: Any, payloads: list[dict[str, Any]]) -> tuple[list[tuple[Any, ...]],
                                                                list[tuple[str, str]]]:
    result = validate_chunk([Msg(i, value_=json.dumps(v).encode())
                             for i, v in enumerate(payloads)], p)
    return ([row_values(r)[:7] for r in result.rows],
            [(d.error_class, d.error_detail) for d in result.dead])


def test_json_values_are_read_through_their_paths_and_a_missing_one_names_its_path() -> None:
    p = pipeline(ORDER)
    address = {"city": "Lisbon", "zipCode": 1000, "geo": {"lat": 38.7, "lon": -9.1}}
    rows, dead = _json_rows(p, [
        {"event_id": "a", "orderid": 1, "address": address, "note": "n"},
        # the optional record missing, or null: its columns NULL
        {"event_id": "b", "orderid": 2, "address": {"city": "Porto", "zipCode": 4000}},
        {"event_id": "c", "orderid": 3, "address": {"city": "Faro", "zipCode": 8000,
                                                     "geo": None}},
        # a required nested field missing; the record not an object; the record missing
        {"event_id": "d", "orderid": 4, "address": {"zipCode": 1}},
        {"event_id": "e", "orderid": 5, "address": "Lisbon"},
        {"event_id": "f", "orderid": 6},
        # a nested value of the wrong type
        {"event_id": "g", "orderid": 7, "address": {"city": "X", "zipCode": "1"}},
    ])
    assert rows == [("a", 1, "Lisbon", 1000, 38.7, -9.1, "n"),
                    ("b", 2, "Porto", 4000, None, None, None),
                    ("c", 3, "Faro", 8000, None, None, None)]
    assert dead == [
        ("contract_violation", "address.city: Field required [missing]"),
        ("contract_violation", "address.city: Field required [missing]; address.zipCode: "
                               "Field required [missing]"),
        ("contract_violation", "address.city: Field required [missing]; address.zipCode: "
                               "Field required [missing]"),
        ("contract_violation", "address.zipCode: Input should be a valid integer [int_type]")]


AVRO_ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "event_id", "type": "string"},
    {"name": "orderid", "type": "int"},
    {"name": "address", "type": {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zipCode", "type": "long"},
        {"name": "geo", "type": ["null", {"type": "record", "name": "Geo", "fields": [
            {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]}]}]}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}


def avro_value(schema_id: int, schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


def test_decoded_avro_records_are_read_through_the_same_paths() -> None:
    p = pipeline(ORDER, fmt="avro")
    schema = WriterSchema(3, "AVRO", json.dumps(AVRO_ORDER))
    assert contract_problems(p, avro_fields(AVRO_ORDER)) == []
    records = [{"event_id": "a", "orderid": 1, "note": None, "address": {
                    "city": "Lisbon", "zipCode": 1000, "geo": {"lat": 1.5, "lon": 2.5}}},
               {"event_id": "b", "orderid": 2, "note": "x", "address": {
                   "city": "C" * 17, "zipCode": 1, "geo": None}}]
    result = validate_chunk([Msg(i, value_=avro_value(3, AVRO_ORDER, r))
                             for i, r in enumerate(records)], p,
                            RegistryDecoder(p, OneSchema(schema)))  # type: ignore[arg-type]
    assert [row_values(r)[:7] for r in result.rows] == [
        ("a", 1, "Lisbon", 1000, 1.5, 2.5, None)]
    assert [d.error_class for d in result.dead] == ["contract_violation"]
    assert "address.city" in result.dead[0].error_detail


def test_the_plan_check_follows_a_path_into_the_writer_s_records() -> None:
    p = pipeline(ORDER, fmt="avro")
    address = AVRO_ORDER["fields"][2]["type"]
    no_city = {**AVRO_ORDER, "fields": [
        *AVRO_ORDER["fields"][:2],
        {"name": "address", "type": {**address, "fields": address["fields"][1:]}},
        AVRO_ORDER["fields"][3]]}
    string_zip = {**AVRO_ORDER, "fields": [
        *AVRO_ORDER["fields"][:2],
        {"name": "address", "type": {**address, "fields": [
            address["fields"][0], {"name": "zipCode", "type": "string"}, address["fields"][2]]}},
        AVRO_ORDER["fields"][3]]}
    flat = {**AVRO_ORDER, "fields": [*AVRO_ORDER["fields"][:2],
                                     {"name": "address", "type": "string"}]}
    assert contract_problems(p, avro_fields(no_city)) == [
        "field 'address.city': required by the contract, absent from the writer schema"]
    assert contract_problems(p, avro_fields(string_zip)) == [
        "field 'address.zipCode': the writer sends string, the contract's bigint column "
        "takes integer"]
    assert contract_problems(p, avro_fields(flat)) == [
        "field 'address.city': required by the contract, absent from the writer schema",
        "field 'address.zipCode': required by the contract, absent from the writer schema"]


def test_an_identity_names_a_nested_field_by_its_path() -> None:
    p = pipeline(ORDER, identity="address.zipCode")
    assert p.identity_columns == ("address_zip",)
    assert not p.model.model_fields["event_id"].is_required()  # not the identity now
    with pytest.raises(ValueError, match="must be a required field"):
        pipeline(ORDER, identity="address.geo.lat")  # inside an optional record


def _record(fields: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "record", "fields": fields, **more}


INT = {"type": "integer"}


@pytest.mark.parametrize(("fields", "needle"), [
    # a record of no fields makes no column
    ({"a": _record({})}, "a record needs fields"),
    ({"a": _record({"b": INT}, default={"b": 1})}, "a record takes no default"),
    # four records deep: the fourth is one too many
    ({"a": _record({"b": _record({"c": _record({"d": _record({"e": INT})})})})},
     "field 'a.b.c.d': records nest at most 3 deep"),
    # a top-level field and a nested one making the same column
    ({"a_b": INT, "a": _record({"b": INT})}, "fields 'a_b' and 'a.b' both make column 'a_b'"),
    ({"a" * 40: _record({"b" * 30: INT})}, "give the record's or the field's 'column'"),
    ({"a": _record({"b": {**INT, "since": 2}})}, "field 'a.b' was added in version 2"),
    ({"a": {"type": "array", "items": _record({"b": INT})}}, "nor a record"),
    ({"a": {**INT, "fields": {"b": INT}}}, "'fields' does not apply to type 'integer'"),
])
def test_a_declaration_that_cannot_be_is_a_load_error(fields: dict[str, Any],
                                                      needle: str) -> None:
    assert needle in load_error({"c": {"version": 2, "fields": fields}})


def test_three_records_deep_is_within_the_limit() -> None:
    deep = {"c": {"fields": {"a": _record({"b": _record({"c": _record({"d": INT})})})}}}
    assert [c.name for c in contract_columns(pipeline(deep).model)][1:] == ["a_b_c_d"]


# --------------------------------------------------------------------------- from-registry

NESTED = {"type": "record", "name": "Top", "fields": [
    {"name": "count", "type": "int"},
    {"name": "total", "type": "long"},
    {"name": "raw", "type": "bytes"},
    {"name": "hash", "type": {"type": "fixed", "name": "Md5", "size": 16}},
    {"name": "lines", "type": {"type": "array", "items": {
        "type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}]}}},
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "a", "type": ["null", {"type": "record", "name": "A", "fields": [
        {"name": "b", "type": {"type": "record", "name": "B", "fields": [
            {"name": "c", "type": {"type": "record", "name": "C", "fields": [
                {"name": "leaf", "type": "string"},
                {"name": "d", "type": {"type": "record", "name": "D", "fields": [
                    {"name": "e", "type": "int"}]}}]}}]}}]}]},
]}


def test_from_registry_flattens_records_to_the_limit_and_keeps_the_rest_whole() -> None:
    body, skipped = contract_from_schema(Format.AVRO, WriterSchema(
        4, "AVRO", json.dumps(NESTED), subject="s", version=1), text_max_length=32)
    assert body["fields"] == {
        "count": {"type": "integer"},  # Avro int
        "total": {"type": "bigint"},  # Avro long
        "raw": {"type": "bytea"},
        "hash": {"type": "bytea"},
        "lines": {"type": "jsonb"},  # an array of records
        "attrs": {"type": "jsonb"},  # a map
        "a": {"type": "record", "required": False, "fields": {"b": {"type": "record", "fields": {
            "c": {"type": "record", "fields": {
                "leaf": {"type": "text", "max_length": 32},
                "d": {"type": "jsonb"}}}}}}},  # the fourth record deep: whole
    }
    assert skipped == []  # the identity is proposed beside the contract (schema_identity)
    made = pipeline({"made": body}, fmt="avro", identity="count")
    assert [c.name for c in contract_columns(made.model)] == [
        "event_id", "count", "total", "raw", "hash", "lines", "attrs", "a_b_c_leaf", "a_b_c_d"]
    record = {"count": 7, "total": 2**40, "raw": b"\x00\x01", "hash": b"h" * 16,
              "lines": [{"sku": "s1"}, {"sku": "s2"}], "attrs": {"k": 1},
              "a": {"b": {"c": {"leaf": "L", "d": {"e": 5}}}}}
    empty = {**record, "count": 8, "a": None}
    result = validate_chunk([Msg(0, value_=avro_value(4, NESTED, record)),
                             Msg(1, value_=avro_value(4, NESTED, empty))], made,
                            RegistryDecoder(made, OneSchema(WriterSchema(
                                4, "AVRO", json.dumps(NESTED)))))  # type: ignore[arg-type]
    assert result.dead == []
    assert [row_values(r)[:9] for r in result.rows] == [
        (None, 7, 2**40, b"\x00\x01", b"h" * 16, [{"sku": "s1"}, {"sku": "s2"}], {"k": 1},
         "L", {"e": 5}),
        (None, 8, 2**40, b"\x00\x01", b"h" * 16, [{"sku": "s1"}, {"sku": "s2"}], {"k": 1},
         None, None)]


def test_json_schema_objects_flatten_as_avro_records_do() -> None:
    text = json.dumps({"type": "object", "required": ["order"], "properties": {
        "order": {"type": "object", "required": ["id"], "properties": {
            "id": {"type": "integer"}, "city": {"type": "string", "maxLength": 20}}},
        "free": {"type": "object"}}})
    assert json_schema_fields(text)["order"].fields is not None
    body, _ = contract_from_schema(Format.JSON_SCHEMA, WriterSchema(
        9, "JSON", text, subject="s", version=1), text_max_length=64)
    assert body["fields"] == {
        "order": {"type": "record", "fields": {
            "id": {"type": "bigint"},
            "city": {"type": "text", "max_length": 20, "required": False}}},
        "free": {"type": "jsonb", "required": False}}  # an object of unsaid properties


def test_the_contract_s_json_schema_nests_each_path_where_the_payload_holds_it() -> None:
    schema = json_schema("order", 1, {"order.v1": pipeline(ORDER).model})
    assert set(schema["properties"]) == {"version", "event_id", "orderid", "address", "note"}
    assert schema["required"] == ["event_id", "orderid", "address"]
    address = schema["properties"]["address"]
    assert (set(address["properties"]), address["required"]) == (
        {"city", "zipCode", "geo"}, ["city", "zipCode"])
    assert set(address["properties"]["geo"]["properties"]) == {"lat", "lon"}
    assert "required" not in address["properties"]["geo"]  # an optional record


# --------------------------------------------------------------------------- Protobuf

WKT_FILES = ("google/protobuf/timestamp.proto", "google/protobuf/duration.proto",
             "google/protobuf/wrappers.proto", "google/protobuf/struct.proto")


def _shipment_file() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="ship.proto", package="acme", syntax="proto3",
                                            dependency=list(WKT_FILES))
    address = fd.message_type.add(name="Address")
    address.field.add(name="city", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    address.field.add(name="zip", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    msg = fd.message_type.add(name="Shipment")
    for number, (name, kind, type_name, label) in enumerate([
            ("id", f.TYPE_INT64, "", f.LABEL_OPTIONAL),
            ("address", f.TYPE_MESSAGE, ".acme.Address", f.LABEL_OPTIONAL),
            ("at", f.TYPE_MESSAGE, ".google.protobuf.Timestamp", f.LABEL_OPTIONAL),
            ("took", f.TYPE_MESSAGE, ".google.protobuf.Duration", f.LABEL_OPTIONAL),
            ("note", f.TYPE_MESSAGE, ".google.protobuf.StringValue", f.LABEL_OPTIONAL),
            ("weight", f.TYPE_MESSAGE, ".google.protobuf.DoubleValue", f.LABEL_OPTIONAL),
            ("extra", f.TYPE_MESSAGE, ".google.protobuf.Struct", f.LABEL_OPTIONAL),
            ("stops", f.TYPE_MESSAGE, ".acme.Address", f.LABEL_REPEATED),
            ("raw", f.TYPE_BYTES, "", f.LABEL_OPTIONAL)], start=1):
        field = msg.field.add(name=name, number=number, type=kind, label=label)
        if type_name:
            field.type_name = type_name
    return fd


def test_protobuf_messages_flatten_and_well_known_types_take_their_column_types() -> None:
    fd = _shipment_file()
    pool = descriptor_pool.DescriptorPool()
    for name in WKT_FILES:
        known = descriptor_pb2.FileDescriptorProto()
        WELL_KNOWN[name].CopyToProto(known)
        pool.Add(known)
    pool.Add(fd)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Shipment"))
    text = base64.b64encode(fd.SerializeToString()).decode()
    schema = WriterSchema(11, "PROTOBUF", text, subject="s", version=1)

    body, _ = contract_from_schema(Format.PROTOBUF, schema, text_max_length=16,
                                   record="acme.Shipment")

    assert body["fields"] == {
        "id": {"type": "bigint"},
        "address": {"type": "record", "required": False, "fields": {
            "city": {"type": "text", "max_length": 16},
            "zip": {"type": "integer"}}},  # int32
        "at": {"type": "timestamptz", "required": False},
        "took": {"type": "interval", "required": False},  # Duration
        "note": {"type": "text", "max_length": 16, "required": False},  # StringValue
        "weight": {"type": "float", "required": False},  # DoubleValue
        "extra": {"type": "jsonb", "required": False},  # Struct
        "stops": {"type": "jsonb"},  # repeated messages
        "raw": {"type": "bytea"}}
    made = pipeline({"made": body}, fmt="protobuf", identity="id")
    full = cls(id=1, address={"city": "Porto", "zip": 4000}, note={"value": "fragile"},
               weight={"value": 2.5}, stops=[{"city": "A"}, {"city": "B", "zip": 2}],
               raw=b"\x00\xff")
    full.at.FromSeconds(1_767_225_600)
    full.took.FromSeconds(90)
    full.extra.update({"k": [1, "two"]})
    bare = cls(id=2)  # every message unset: NULL; a zero int64 arrives as 0
    header = b"\x00\x00\x00\x00\x0b\x02\x02"  # message index path [1]: Shipment
    result = validate_chunk([Msg(0, value_=header + full.SerializeToString()),
                             Msg(1, value_=header + bare.SerializeToString())], made,
                            RegistryDecoder(made, OneSchema(schema)))  # type: ignore[arg-type]
    assert result.dead == []
    assert [row_values(r)[:11] for r in result.rows] == [
        (None, 1, "Porto", 4000, datetime(2026, 1, 1, tzinfo=UTC), timedelta(seconds=90),
         "fragile", 2.5, {"k": [1.0, "two"]}, [{"city": "A", "zip": 0}, {"city": "B", "zip": 2}],
         b"\x00\xff"),
        (None, 2, None, None, None, None, None, None, None, [], b"")]


def test_from_registry_keeps_a_record_whole_when_its_path_columns_would_be_too_long() -> None:
    """Postgres names are at most 63 characters: a record whose path columns would be
    longer is one jsonb column, so the printed contract loads."""
    long = "a" * 40
    schema = {"type": "record", "name": "Top", "fields": [
        {"name": "id", "type": "int"},
        {"name": "outer", "type": {"type": "record", "name": "Outer", "fields": [
            {"name": "short", "type": "int"},
            {"name": long, "type": {"type": "record", "name": "Inner", "fields": [
                {"name": "b" * 30, "type": "int"}]}}]}}]}
    body, _ = contract_from_schema(Format.AVRO, WriterSchema(
        4, "AVRO", json.dumps(schema), subject="s", version=1))
    assert body["fields"]["outer"] == {"type": "record", "fields": {
        "short": {"type": "integer"}, long: {"type": "jsonb"}}}
    made = pipeline({"made": body}, fmt="avro", identity="id")
    assert [c.name for c in contract_columns(made.model)] == [
        "event_id", "id", "outer_short", f"outer_{long}"]
