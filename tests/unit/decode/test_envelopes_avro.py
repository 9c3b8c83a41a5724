"""Change events in Avro through the registry (#34): the Avro schema Apicurio's Kafka
Connect ``AvroConverter`` registered for Debezium's Postgres change events of a table
(``data/debezium_customers_envelope.avsc``, taken from the real registry, the topic prefix
shortened to ``pg``) stands for the Connect schema JsonConverter would carry
(:mod:`kafka_ingest.decode.connect_schema`): the same declaration, Debezium's semantic
types decoded, the drift check, and a composite key read from an Avro record key. The real
connector and converter are in ``tests/integration/test_debezium_registry.py``; no service
is touched here."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import fastavro
import pytest

from kafka_ingest.config import UNAVAILABLE, parse_pipelines
from kafka_ingest.decode.connect_schema import from_avro
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.envelopes import key_reader, row_declaration
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.engine.ingest import IngestWriter
from kafka_ingest.errors import RegistryLacksSchemas, SourceChanged
from kafka_ingest.kafka.reader import Chunk
from kafka_ingest.kafka.registry import WriterSchema
from kafka_ingest.records import row_values
from tests.support.fakes import Msg
from tests.unit.decode.test_formats import OneSchema
from tests.unit.decode.test_registry_judgement import _NoEncoder

ENVELOPE = json.loads((Path(__file__).parent / "data" /
                       "debezium_customers_envelope.avsc").read_text())
KEY = {"type": "record", "name": "Key", "namespace": "pg.public.customers",
       "fields": [{"name": "region", "type": "string"}, {"name": "id", "type": "int"}],
       "connect.name": "pg.public.customers.Key"}
ENVELOPE_ID, KEY_ID = 21, 22


def declared() -> dict[str, Any]:
    fields, _, left_out = row_declaration(from_avro(ENVELOPE))
    assert left_out == []
    return fields


def mirror(**body: Any) -> Any:
    return parse_pipelines({"contracts": {"customer": {"fields": declared()}}, "pipelines": {
        "m": {"topic": "pg.public.customers", "dlq_topic": "m-dlq", "table": "customers",
              "contract": {"event_type": "customer", "version": 1}, "envelope": "debezium",
              "format": "avro", "schema_registry": {}, **body}}})["m"]


def encoded(schema: dict[str, Any], schema_id: int, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


ROW: dict[str, Any] = {
    "id": 7, "name": "Ada", "balance": Decimal("1234.56"), "born": 19_000,
    "seen_at": 1_700_000_000_123_456, "changed_at": "2026-01-02T03:04:05.123456Z",
    "profile": '{"tier": "gold"}', "ref": "0b7e1bd0-8d3f-4a3c-9d1e-0123456789ab",
    "photo": b"\x00\x01\xff", "notes": "x" * 40}
SOURCE = {"version": "3.6.1.Final", "connector": "postgresql", "name": "pg",
          "ts_ms": 1_767_225_600_000, "db": "src", "schema": "public", "table": "customers"}


def change(op: str, after: dict[str, Any] | None, schema: dict[str, Any] = ENVELOPE,
           schema_id: int = ENVELOPE_ID) -> bytes:
    return encoded(schema, schema_id, {"before": None, "after": after, "source": SOURCE,
                                       "op": op, "ts_ms": 1_767_225_600_000})


def decoder(p: Any, *extra: WriterSchema) -> RegistryDecoder:
    registry = OneSchema(WriterSchema(ENVELOPE_ID, "AVRO", json.dumps(ENVELOPE), "v", 1),
                         WriterSchema(KEY_ID, "AVRO", json.dumps(KEY), "k", 1), *extra)
    return RegistryDecoder(p, registry)  # type: ignore[arg-type]


def test_the_converters_schema_stands_for_the_connect_schema_jsonconverter_carries() -> None:
    """Debezium's semantic types, Connect's Decimal (an Avro logical type) and optional
    columns come back as JsonConverter would write them, so the declaration is the one
    ``schema from-topic`` makes from JSON change events."""
    assert {name: spec["type"] for name, spec in declared().items()} == {
        "id": "integer", "name": "text", "balance": "numeric", "born": "date",
        "seen_at": "timestamp", "changed_at": "timestamptz", "profile": "jsonb",
        "ref": "uuid", "photo": "bytea", "notes": "text"}
    assert declared()["balance"] == {"type": "numeric", "precision": 12, "scale": 2,
                                     "required": False}
    assert "required" not in declared()["id"]  # int, not a union with null


def test_an_avro_change_event_is_decoded_by_the_connect_schema_its_writer_schema_keeps(
        ) -> None:
    p = mirror(record_key={"column": "id", "format": "registry", "type": "bigint"})
    key = encoded({"type": "record", "name": "Key", "fields": [{"name": "id", "type": "int"}]},
                  23, {"id": 7})
    registry_key = WriterSchema(23, "AVRO", json.dumps(
        {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "int"}]}), "k", 1)
    result = validate_chunk([Msg(0, key_=key, value_=change("c", ROW)),
                             Msg(1, key_=key, value_=change("d", None))], p,
                            decoder(p, registry_key))
    assert result.dead == []
    (row,) = result.rows
    values = dict(zip([c.name for c in p.sink_columns], row_values(row), strict=False))
    assert values["balance"] == Decimal("1234.56")
    assert values["born"] == date(2022, 1, 8)
    assert values["seen_at"] == datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert values["changed_at"] == datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert values["profile"] == {"tier": "gold"}
    assert values["ref"] == UUID("0b7e1bd0-8d3f-4a3c-9d1e-0123456789ab")
    assert values["photo"] == b"\x00\x01\xff"
    assert [d.key for d in result.deletes] == [7]


def test_the_placeholder_of_a_toasted_avro_value_passes_to_be_kept_by_the_writer() -> None:
    p = mirror(record_key={"column": "id", "format": "registry", "type": "bigint"})
    left_out = {**ROW, "notes": UNAVAILABLE, "profile": UNAVAILABLE,
                "photo": UNAVAILABLE.encode()}
    result = validate_chunk([Msg(0, value_=change("u", left_out))], p, decoder(p))
    assert result.dead == []
    (row,) = result.rows
    values = dict(zip([c.name for c in p.sink_columns], row_values(row), strict=False))
    assert values["notes"] == UNAVAILABLE and values["photo"] == UNAVAILABLE.encode()


def test_a_column_added_in_a_new_avro_schema_stops_the_run() -> None:
    p = mirror(record_key={"column": "id", "format": "registry", "type": "bigint"})
    newer = json.loads(json.dumps(ENVELOPE))
    newer["fields"][0]["type"][1]["fields"].append(
        {"name": "score", "type": ["null", "int"], "default": None})
    schema = WriterSchema(24, "AVRO", json.dumps(newer), "v", 2)
    with pytest.raises(SourceChanged, match="column 'score' added"):
        validate_chunk([Msg(0, value_=change("c", {**ROW, "score": 3}, newer, 24))], p,
                       decoder(p, schema))


def test_a_composite_key_is_read_from_the_fields_of_an_avro_record_key() -> None:
    registry = OneSchema(WriterSchema(KEY_ID, "AVRO", json.dumps(KEY), "k", 1))
    some = mirror(record_key={"column": "id", "format": "registry", "type": "bigint"})
    read = key_reader(("region", "id"), ("text", "int4"),
                      RegistryDecoder(some, registry))  # type: ignore[arg-type]
    assert read(encoded(KEY, KEY_ID, {"region": "eu", "id": 1})) == ("eu", 1)
    assert read(b'{"region": "us", "id": 2}') == ("us", 2)  # a JSON key as before
    # a primary key whose columns are named like JsonConverter's two parts is its own
    odd = {"type": "record", "name": "Key", "fields": [
        {"name": "schema", "type": "string"}, {"name": "payload", "type": "int"}]}
    registry.known[27] = WriterSchema(27, "AVRO", json.dumps(odd), "k", 1)
    read = key_reader(("schema", "payload"), ("text", "int4"),
                      RegistryDecoder(some, registry))  # type: ignore[arg-type]
    assert read(encoded(odd, 27, {"schema": "s", "payload": 3})) == ("s", 3)
    assert read(b'{"schema": "s", "payload": 4}') == ("s", 4)


#: Connect's Decimal and Date as the converter writes them (Avro logical types, decoded by
#: fastavro), as an array's items: a ``numeric(10,2)[]`` column, a ``date[]`` one (under
#: ``time.precision.mode: connect``).
DECIMAL_ITEM = {"type": "bytes", "scale": 2, "precision": 10, "connect.version": 1,
                "connect.parameters": {"scale": "2", "connect.decimal.precision": "10"},
                "connect.name": "org.apache.kafka.connect.data.Decimal",
                "logicalType": "decimal"}
DATE_ITEM = {"type": "int", "connect.version": 1,
             "connect.name": "org.apache.kafka.connect.data.Date", "logicalType": "date"}


def test_an_array_of_avro_logical_type_items_is_left_as_the_codec_decoded_it() -> None:
    """Items the codec decoded already (a Decimal, a date) are not decoded again: a
    ``numeric(10,2)[]`` column (left out of the contract) no longer dead-letters its rows,
    and a ``date[]`` column (declared) keeps its dates."""
    arrays = json.loads(json.dumps(ENVELOPE))
    arrays["fields"][0]["type"][1]["fields"] += [
        {"name": "amounts", "type": ["null", {"type": "array", "items": ["null", DECIMAL_ITEM]}],
         "default": None},
        {"name": "days", "type": ["null", {"type": "array", "items": ["null", DATE_ITEM]}],
         "default": None}]
    fields, _, left_out = row_declaration(from_avro(arrays))
    assert [line.split(":")[0] for line in left_out] == ["amounts"]
    assert fields["days"]["type"] == "array"
    p = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {"m": {
        "topic": "pg.public.customers", "dlq_topic": "m-dlq", "table": "customers",
        "contract": {"event_type": "customer", "version": 1}, "envelope": "debezium",
        "format": "avro", "schema_registry": {},
        "record_key": {"column": "id", "format": "registry", "type": "bigint"}}}})["m"]
    schema = WriterSchema(25, "AVRO", json.dumps(arrays), "v", 2)
    value = change("c", {**ROW, "amounts": [Decimal("1.50"), None, Decimal("-0.07")],
                         "days": [date(2026, 1, 2), date(1969, 12, 31)]}, arrays, 25)
    result = validate_chunk([Msg(0, value_=value)], p, decoder(p, schema))
    assert [(d.error_class, d.error_detail) for d in result.dead] == []
    (row,) = result.rows
    values = dict(zip([c.name for c in p.sink_columns], row_values(row), strict=False))
    assert values["days"] == [date(2026, 1, 2), date(1969, 12, 31)]
    assert values["balance"] == Decimal("1234.56")


def test_avro_logical_types_connect_has_no_name_for_are_declared_and_left_as_decoded(
        ) -> None:
    """``uuid``, ``time-micros``, ``timestamp-micros`` and ``local-timestamp-*`` (a
    converter of another make may write them) arrive decoded by the codec: declared as the
    column that takes that value, and not decoded a second time (a UUID read as a string
    again failed the whole run)."""
    logical = json.loads(json.dumps(ENVELOPE))
    logical["fields"][0]["type"][1]["fields"] += [
        {"name": f, "type": ["null", {"type": t, "logicalType": lt}], "default": None}
        for f, t, lt in (("token", "string", "uuid"), ("opens", "long", "time-micros"),
                         ("paid_at", "long", "timestamp-micros"),
                         ("local_ms", "long", "local-timestamp-millis"),
                         ("local_us", "long", "local-timestamp-micros"))]
    fields, _, left_out = row_declaration(from_avro(logical))
    assert left_out == []
    assert {f: fields[f]["type"] for f in ("token", "opens", "paid_at", "local_ms",
                                           "local_us")} == {
        "token": "uuid", "opens": "time", "paid_at": "timestamptz", "local_ms": "timestamp",
        "local_us": "timestamp"}
    p = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {"m": {
        "topic": "pg.public.customers", "dlq_topic": "m-dlq", "table": "customers",
        "contract": {"event_type": "customer", "version": 1}, "envelope": "debezium",
        "format": "avro", "schema_registry": {},
        "record_key": {"column": "id", "format": "registry", "type": "bigint"}}}})["m"]
    token = UUID("7f0e3b2c-1111-4c4c-9a9a-0123456789ab")
    at = datetime(2026, 3, 4, 5, 6, 7, 891011)
    row = {**ROW, "token": token, "opens": time(9, 30, 0, 123456),
           "paid_at": at.replace(tzinfo=UTC), "local_ms": at.replace(microsecond=891000),
           "local_us": at}
    schema = WriterSchema(26, "AVRO", json.dumps(logical), "v", 2)
    result = validate_chunk([Msg(0, value_=change("c", row, logical, 26))], p, decoder(p, schema))
    assert [(d.error_class, d.error_detail) for d in result.dead] == []
    values = dict(zip([c.name for c in p.sink_columns], row_values(result.rows[0]),
                      strict=False))
    assert (values["token"], values["opens"], values["local_us"]) == (
        token, time(9, 30, 0, 123456), at)
    assert values["paid_at"] == at.replace(tzinfo=UTC)


def test_change_events_of_a_schema_id_the_registry_lacks_fail_the_chunk_beside_known_keys(
        ) -> None:
    """A registry that lags (a replica, a restored backup) misses the newest value schema
    (a column added upstream), while the record keys' schema, the same for the table's
    whole life, is an old id it knows: the chunk fails (transient, retried), it is not
    dead-lettered, which would leave the mirror without those changes."""
    p = mirror(record_key={"column": "id", "format": "registry", "type": "bigint"})
    key_schema = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "int"}]}
    key = encoded(key_schema, 23, {"id": 7})
    registry = OneSchema(WriterSchema(23, "AVRO", json.dumps(key_schema), "k", 1))
    writer = IngestWriter(p, decoder=RegistryDecoder(p, registry))  # type: ignore[arg-type]
    values = [change("c", ROW, schema_id=30), change("u", ROW, schema_id=30)]
    chunk = Chunk("pg.public.customers", 0, 0, 2,
                  [Msg(i, key_=key, value_=v) for i, v in enumerate(values)])
    with pytest.raises(RegistryLacksSchemas) as raised:
        writer.prepare(chunk, _NoEncoder())  # type: ignore[arg-type]
    assert raised.value.schema_ids == [30]


def test_a_composite_mirrors_registry_keys_of_an_id_the_registry_lacks_fail_the_chunk(
        ) -> None:
    """A mirror keyed by several columns reads its record keys by their wire header: a
    chunk whose keys all carry an id the registry lacks (a primary key changed upstream,
    the registry behind) fails as transient, beside values of an id it knows, rather than
    dead-letter its deletes."""
    p = mirror(identity=["id", "name"])
    key_schema = {"type": "record", "name": "Key", "fields": [
        {"name": "id", "type": "int"}, {"name": "name", "type": "string"}]}
    key = encoded(key_schema, 31, {"id": 7, "name": "Ada"})
    writer = IngestWriter(p, decoder=decoder(p))  # type: ignore[arg-type]
    chunk = Chunk("pg.public.customers", 0, 0, 2, [
        Msg(0, key_=key, value_=change("c", ROW)), Msg(1, key_=key, value_=change("d", None))])
    with pytest.raises(RegistryLacksSchemas) as raised:
        writer.prepare(chunk, _NoEncoder())  # type: ignore[arg-type]
    assert raised.value.schema_ids == [31]


def test_a_plain_avro_schema_deeper_than_a_connect_schemas_limit_is_no_mirror() -> None:
    """``schema from-registry`` reads a subject's schema as a Connect schema first: one it
    cannot read so (nested deeper than a change event's) is a plain schema, declared as
    before, not a failure of the command."""
    from kafka_ingest.cli.schema import _envelope_versions
    from kafka_ingest.decode.codecs import codec_for

    deep: dict[str, Any] = {"type": "record", "name": "L0", "fields": []}
    level = deep
    for depth in range(1, 30):
        inner = {"type": "record", "name": f"L{depth}", "fields": []}
        level["fields"].append({"name": "next", "type": inner})
        level = inner
    schema = WriterSchema(40, "AVRO", json.dumps(deep), "deep-value", 1)
    assert _envelope_versions(codec_for("avro"), OneSchema(schema), "deep-value",  # type: ignore[arg-type]
                              schema) == []


@pytest.mark.parametrize("fmt", ["protobuf", "json_schema"])
def test_a_mirror_of_a_registry_format_that_keeps_no_connect_schema_is_refused_at_load(
        fmt: str) -> None:
    """Debezium's types and a column added at the source are read from the Connect schema
    a converter's Avro schema keeps; a format without one would mirror unchecked."""
    with pytest.raises(ValueError, match=f"format '{fmt}' keeps no such schema"):
        mirror(format=fmt, record_key={"column": "id", "format": "registry", "type": "bigint"})
