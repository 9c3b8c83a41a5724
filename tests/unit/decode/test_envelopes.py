"""Change events (``envelope: debezium``, #34): Debezium's envelope read between the codec
and the contract. The messages here are shaped as Kafka Connect's JsonConverter writes
Debezium's Postgres events (the real connector's are in
``tests/integration/test_debezium_mirror.py``); no service is touched."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from kafka_ingest.config import UNAVAILABLE, parse_pipelines
from kafka_ingest.decode.envelopes import (
    EnvelopeReader,
    key_declaration,
    primary_key_declaration,
    row_declaration,
    row_reader,
    source_changes,
    unavailable,
)
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import ReplicaIdentityNotFull, SourceChanged
from kafka_ingest.kafka.dlq import DeadLetter
from kafka_ingest.records import EVERY_KEY
from kafka_ingest.requests import ReplayFilters, letter_identity
from tests.support.fakes import Msg

CUSTOMER: dict[str, Any] = {"fields": {
    "id": {"type": "bigint"},
    "name": {"type": "text", "max_length": 64},
    "balance": {"type": "numeric", "precision": 12, "scale": 2, "required": False},
    "born": {"type": "date", "required": False},
    "seen_at": {"type": "timestamp", "required": False},
    "changed_at": {"type": "timestamptz", "required": False},
    "opens": {"type": "time", "required": False},
    "ref": {"type": "uuid", "required": False},
    "profile": {"type": "jsonb", "required": False},
    "notes": {"type": "text", "max_length": 100_000, "required": False},
    "photo": {"type": "bytea", "required": False},
}}
MIRROR: dict[str, Any] = {
    "topic": "pg.public.customers", "contract": {"event_type": "customer", "version": 1},
    "table": "customers", "dlq_topic": "customers-dlq", "envelope": "debezium",
    "record_key": {"column": "id", "format": "json", "field": "id", "type": "bigint"}}

#: The Connect schemas of the source table's columns, as Debezium's Postgres connector
#: writes them (decimal.handling.mode precise, time.precision.mode adaptive).
COLUMNS: list[dict[str, Any]] = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "12"},
     "field": "balance"},
    {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1,
     "field": "born"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp",
     "version": 1, "field": "seen_at"},
    {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp",
     "version": 1, "field": "changed_at"},
    {"type": "int64", "optional": True, "name": "io.debezium.time.MicroTime", "version": 1,
     "field": "opens"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1,
     "field": "ref"},
    {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1,
     "field": "profile"},
    {"type": "string", "optional": True, "field": "notes"},
    {"type": "bytes", "optional": True, "field": "photo"},
]


def envelope_schema(columns: list[dict[str, Any]]) -> dict[str, Any]:
    row = {"type": "struct", "fields": columns, "optional": True,
           "name": "pg.public.customers.Value"}
    return {"type": "struct", "name": "pg.public.customers.Envelope", "optional": False,
            "version": 2, "fields": [
                {**row, "field": "before"}, {**row, "field": "after"},
                {"type": "struct", "optional": False, "name": "io.debezium.connector.postgresql"
                 ".Source", "field": "source", "fields": [
                     {"type": "string", "optional": False, "field": "connector"},
                     {"type": "int64", "optional": True, "field": "lsn"}]},
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"}]}


def change(op: str, after: dict[str, Any] | None, *, before: Any = None,
           schema: bool = True, columns: list[dict[str, Any]] | None = None) -> bytes:
    payload = {"before": before, "after": after,
               "source": {"connector": "postgresql", "lsn": 1234}, "op": op,
               "ts_ms": 1_767_225_600_000}
    if not schema:
        return json.dumps(payload).encode()
    # JsonConverter's own layout: compact, the schema first
    return json.dumps({"schema": envelope_schema(columns or COLUMNS), "payload": payload},
                      separators=(",", ":")).encode()


def key(value: int, *, schema: bool = True) -> bytes:
    if not schema:
        return json.dumps({"id": value}).encode()
    return json.dumps({"schema": {"type": "struct", "optional": False,
                                  "name": "pg.public.customers.Key",
                                  "fields": [{"type": "int64", "optional": False,
                                              "field": "id"}]},
                       "payload": {"id": value}}, separators=(",", ":")).encode()


def mirror(**body: Any) -> Any:
    return parse_pipelines({"contracts": {"customer": CUSTOMER},
                            "pipelines": {"m": {**MIRROR, **body}}}, source="t.yaml")["m"]


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


FULL_ROW: dict[str, Any] = {
    "id": 7, "name": "Ada", "balance": b64((123456).to_bytes(3, "big", signed=True)),
    "born": 19_000, "seen_at": 1_700_000_000_123_456,
    "changed_at": "2026-01-02T03:04:05.123456Z", "opens": 9 * 3600 * 1_000_000,
    "ref": "0b7e1bd0-8d3f-4a3c-9d1e-0123456789ab", "profile": '{"tier": "gold"}',
    "notes": "x" * 40, "photo": b64(b"\x00\x01\xff")}


def test_a_mirror_pipeline_is_a_latest_table_keyed_by_the_record_key_in_log_order() -> None:
    p = mirror()
    assert (p.upsert.mode.value, p.upsert.key, p.upsert.order_by) == (
        "latest", "id", "source_offset")
    assert p.deletes and p.conflict_columns == ("id",)


@pytest.mark.parametrize(("body", "says"), [
    ({"record_key": None}, "reads the row's primary key from the record key"),
    ({"record_key": {"column": "id"}}, "reads the row's primary key from the record key"),
    ({"upsert": {"mode": "append"}}, "mirrors a table"),
    ({"on_tombstone": "dead_letter"}, "on_tombstone must stay 'skip'"),
])
def test_a_mirror_that_could_not_mirror_is_refused_at_load(body: dict[str, Any],
                                                           says: str) -> None:
    with pytest.raises(ValueError, match=says):
        mirror(**body)


@pytest.mark.parametrize("items", [
    {"type": "smallint"}, {"type": "boolean"}, {"type": "float"}, {"type": "timestamp"},
    {"type": "timestamptz"}, {"type": "time"}, {"type": "interval"},
    {"type": "numeric", "precision": 12, "scale": 2}])
def test_a_mirror_of_an_array_debezium_sends_as_null_when_left_out_is_refused_at_load(
        items: dict[str, Any]) -> None:
    """Debezium has no placeholder for these arrays: left out of an update, they arrive
    as null, which the table would store."""
    contract = {"fields": {**CUSTOMER["fields"],
                           "xs": {"type": "array", "items": items, "required": False}}}
    with pytest.raises(ValueError, match=r"column 'xs' is a .*Debezium sends null"):
        parse_pipelines({"contracts": {"customer": contract}, "pipelines": {"m": MIRROR}},
                        source="t.yaml")
    plain = {k: v for k, v in MIRROR.items() if k not in ("envelope", "record_key")}
    parse_pipelines({"contracts": {"customer": contract}, "pipelines": {"m": plain}},
                    source="t.yaml")


def test_a_mirror_of_a_replica_identity_full_source_takes_arrays_of_any_type() -> None:
    """A source table with REPLICA IDENTITY FULL sends every value of an update: with
    ``replica_identity: full`` the arrays refused above load; the setting is a mirror's."""
    contract = {"fields": {**CUSTOMER["fields"], "flags": {
        "type": "array", "items": {"type": "boolean"}, "required": False}}}
    full = {**MIRROR, "replica_identity": "full"}
    loaded = parse_pipelines({"contracts": {"customer": contract}, "pipelines": {"m": full}},
                             source="t.yaml")["m"]
    assert "flags" in {c.name for c in loaded.sink_columns}
    plain = {k: v for k, v in full.items() if k not in ("envelope", "record_key")}
    with pytest.raises(ValueError, match="replica_identity is a mirror's"):
        parse_pipelines({"contracts": {"customer": contract}, "pipelines": {"m": {
            **plain, "identity": "id"}}}, source="t.yaml")


def test_under_replica_identity_full_an_update_without_its_old_row_stops_the_run() -> None:
    """An update that carries no old row comes from a source that is not FULL: a left-out
    array would arrive as a null, so the run stops rather than write it."""
    full = mirror(replica_identity="full")
    old = {**FULL_ROW, "name": "Old"}
    result = validate_chunk([Msg(0, key_=key(7), value_=change("u", FULL_ROW, before=old))],
                            full)
    assert (len(result.rows), result.dead) == (1, [])
    with pytest.raises(ReplicaIdentityNotFull, match=r"pipeline m: a change event of op 'u' "
                                                     r"\(topic 'orders' partition 3\) carries no "
                                                     r"old row"):
        validate_chunk([Msg(0, key_=key(7), value_=change("u", FULL_ROW))], full)
    assert validate_chunk([Msg(0, key_=key(7), value_=change("u", FULL_ROW))],
                          mirror()).dead == []  # the default expects no old row


def test_the_array_placeholders_of_kept_columns_are_recognised() -> None:
    """Each kept array type's placeholder as Debezium writes it, decoded (its writer
    keeps the column; an earlier change of the chunk fills it)."""
    dates = [(date(1970, 1, 1) + timedelta(days=b)) for b in UNAVAILABLE.encode()]
    uuid = UUID("b68a35a7-17ad-35b3-af2a-ae46edb4545a")  # as Debezium wrote it
    for value in ([UNAVAILABLE], list(UNAVAILABLE.encode()), dates, [uuid], [str(uuid)]):
        assert unavailable(value), value
    assert not unavailable(dates[:-1]) and not unavailable([UUID(int=1)])


def test_the_declaration_leaves_out_an_array_debezium_sends_as_null_when_left_out() -> None:
    def array(column: str, **items: Any) -> dict[str, Any]:
        return {"type": "array", "optional": True, "field": column,
                "items": {"optional": True, **items}}

    fields, _, left_out = row_declaration(envelope_schema([
        COLUMNS[0], array("days", type="int32", name="io.debezium.time.Date", version=1),
        array("refs", type="string", name="io.debezium.data.Uuid", version=1),
        array("tags", type="string"), array("small", type="int16"),
        array("flags", type="boolean"),
        array("at", type="int64", name="io.debezium.time.MicroTimestamp", version=1)]))
    assert list(fields) == ["id", "days", "refs", "tags"]
    assert [n.split(":")[0] for n in left_out] == ["small", "flags", "at"]
    assert "small: int2[], an array Debezium sends as null when an update leaves it out" \
        in left_out[0]


def test_on_truncate_without_an_envelope_is_refused() -> None:
    with pytest.raises(ValueError, match="on_truncate is for change events"):
        parse_pipelines({"contracts": {"customer": CUSTOMER}, "pipelines": {"m": {
            **{k: v for k, v in MIRROR.items() if k not in ("envelope", "record_key")},
            "contract": {"event_type": "customer", "version": 1},
            "identity": "id", "on_truncate": "truncate"}}}, source="t.yaml")


def test_semantic_types_are_decoded_to_the_columns_python_values() -> None:
    result = validate_chunk([Msg(0, change("c", dict(FULL_ROW)), key(7))], mirror())
    assert not result.dead, result.dead
    (row,) = result.rows
    values = dict(zip(mirror().column_names, row, strict=False))
    assert values["balance"] == Decimal("1234.56")
    assert values["born"] == date(1970, 1, 1) + timedelta(days=19_000)
    assert values["seen_at"] == datetime(2023, 11, 14, 22, 13, 20, 123456)
    assert values["changed_at"] == datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert values["opens"] == time(9)
    assert values["ref"] == UUID("0b7e1bd0-8d3f-4a3c-9d1e-0123456789ab")
    assert values["profile"] == {"tier": "gold"}
    assert values["photo"] == b"\x00\x01\xff"
    assert values["id"] == 7 and values["name"] == "Ada"


@pytest.mark.parametrize("op", ["c", "r", "u"])
def test_inserts_snapshot_reads_and_updates_are_upserts_of_after(op: str) -> None:
    result = validate_chunk([Msg(3, change(op, {"id": 7, "name": "Ada"}), key(7))], mirror())
    assert len(result.rows) == 1 and not result.deletes and not result.dead


def test_without_the_schema_the_row_is_validated_as_json() -> None:
    msgs = [Msg(0, change("c", {"id": 7, "name": "Ada", "born": "2026-01-02"}, schema=False),
                key(7, schema=False)),
            Msg(1, change("c", {"id": 8, "name": "Bo", "born": 19_000}, schema=False),
                key(8, schema=False))]
    result = validate_chunk(msgs, mirror())
    assert [dict(zip(mirror().column_names, r, strict=False))["id"] for r in result.rows] == [7]
    (letter,) = result.dead
    assert letter.source_offset == 1 and letter.error_class == "contract_violation"
    assert "born" in letter.error_detail


def test_a_delete_deletes_its_key_and_the_tombstone_after_it_is_skipped() -> None:
    msgs = [Msg(0, change("c", {"id": 7, "name": "Ada"}), key(7)),
            Msg(1, change("d", None, before={"id": 7, "name": None}), key(7)),
            Msg(2, None, key(7))]
    result = validate_chunk(msgs, mirror())
    assert [(t.key, t.offset) for t in result.deletes] == [(7, 1)]
    assert result.tombstones == 2 and len(result.rows) == 1 and not result.dead


def test_a_truncate_is_skipped_or_deletes_every_key_before_it() -> None:
    msgs = [Msg(5, change("t", None), None)]
    skipped = validate_chunk(msgs, mirror())
    assert skipped.tombstones == 1 and not skipped.deletes and not skipped.dead
    truncated = validate_chunk(msgs, mirror(on_truncate="truncate"))
    assert [(t.key, t.offset) for t in truncated.deletes] == [(EVERY_KEY, 5)]


@pytest.mark.parametrize(("value", "says"), [
    (json.dumps({"before": None, "after": {"id": 1}}).encode(), "no 'op'"),
    (json.dumps({"op": "x", "after": {"id": 1}}).encode(), "op 'x' is not one of"),
    (json.dumps({"op": "u", "after": None}).encode(), "op 'u' without an 'after' row"),
    (b"[1, 2]", "not a change event"),
])
def test_malformed_change_events_are_dead_lettered_with_the_reason(value: bytes,
                                                                   says: str) -> None:
    result = validate_chunk([Msg(0, value, key(1))], mirror())
    (letter,) = result.dead
    assert letter.error_class == "bad_envelope" and says in letter.error_detail
    assert not result.rows and not result.deletes


def test_not_json_and_a_delete_without_its_key_are_dead_lettered() -> None:
    """An upsert's key is its ``after`` row's own column: its record key is not read."""
    result = validate_chunk([Msg(0, b"{not json", key(1)),
                             Msg(1, change("d", None), b'{"other": 1}'),
                             Msg(2, change("d", None), None),
                             Msg(3, change("c", {"id": 2, "name": "x"}), b"nope")], mirror())
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (0, "undecodable"), (1, "bad_key"), (2, "bad_key")]
    assert len(result.rows) == 1 and not result.deletes


def test_a_value_not_of_its_semantic_type_is_dead_lettered() -> None:
    bad = change("c", {**FULL_ROW, "balance": "%%% not base64"})
    (letter,) = validate_chunk([Msg(0, bad, key(7))], mirror()).dead
    assert letter.error_class == "bad_envelope" and "after.balance" in letter.error_detail


def test_the_toast_placeholder_passes_validation_to_be_kept_by_the_writer() -> None:
    row = {"id": 7, "name": "Ada", "notes": UNAVAILABLE, "profile": UNAVAILABLE,
           "photo": b64(UNAVAILABLE.encode())}
    result = validate_chunk([Msg(0, change("u", row), key(7))], mirror())
    assert not result.dead, result.dead
    values = dict(zip(mirror().column_names, result.rows[0], strict=False))
    assert values["notes"] == UNAVAILABLE
    assert values["profile"] == [UNAVAILABLE]
    assert values["photo"] == UNAVAILABLE.encode()


def test_each_schema_is_read_once_and_a_new_column_is_decoded_by_its_own() -> None:
    reader = EnvelopeReader(None)
    added = [*COLUMNS, {"type": "int32", "optional": True, "name": "io.debezium.time.Date",
                        "field": "joined"}]
    for _ in range(3):
        reader.read(change("c", {"id": 1, "name": "a", "born": 1}))
    op, row = reader.read(change("c", {"id": 1, "name": "a", "joined": 2}, columns=added))
    assert len(reader._readers) == 2
    assert op == "c" and row["joined"] == date(1970, 1, 3)


def test_messages_of_two_schemas_in_turn_are_each_decoded_by_their_own_schema() -> None:
    """The reader of the last message's schema is reused only for the very same schema bytes:
    ``born`` a Date in one schema and, in the other (of the same length), of a type with no
    decoding, in alternation; then a third schema."""
    plain = [{**c, "name": "io.debeziux.time.Date"} if c["field"] == "born" else c
             for c in COLUMNS]
    longer = [*COLUMNS, {"type": "string", "optional": True, "field": "notes2"}]
    reader = EnvelopeReader(None)
    seen = [reader.read(change("c", {"id": 1, "name": "a", "born": 1}, columns=cols))[1]["born"]
            for cols in (COLUMNS, plain, COLUMNS, COLUMNS, plain, plain, longer, COLUMNS)]
    assert seen == [date(1970, 1, 2), 1, date(1970, 1, 2), date(1970, 1, 2), 1, 1,
                    date(1970, 1, 2), date(1970, 1, 2)]
    assert len(reader._readers) == 3


def test_a_schema_with_no_after_struct_decodes_nothing() -> None:
    assert row_reader({"type": "struct", "fields": []}) is None
    assert row_reader(None) is None


def test_the_declaration_from_a_change_events_schema_reads_its_events() -> None:
    fields, guesses, left_out = row_declaration(envelope_schema(
        [*COLUMNS, {"type": "struct", "optional": True, "name": "io.debezium.data.geometry"
                    ".Point", "field": "spot", "fields": []}]))
    assert left_out == ["spot: Debezium's io.debezium.data.geometry.Point has no column type "
                        "here (declare it as jsonb)"]
    assert {name: spec["type"] for name, spec in fields.items()} == {
        "id": "bigint", "name": "text", "balance": "numeric", "born": "date",
        "seen_at": "timestamp", "changed_at": "timestamptz", "opens": "time", "ref": "uuid",
        "profile": "jsonb", "notes": "text", "photo": "bytea"}
    assert (fields["balance"]["precision"], fields["balance"]["scale"]) == (12, 2)
    assert "required" not in fields["id"] and fields["born"]["required"] is False
    assert "born: io.debezium.time.Date -> date" in guesses
    key_section = key_declaration(json.loads(key(7))["schema"], fields)
    assert key_section == {"column": "id", "format": "json", "type": "bigint"}
    declared = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {
        "m": {**MIRROR, "record_key": key_section}}}, source="t.yaml")["m"]
    result = validate_chunk([Msg(0, change("c", dict(FULL_ROW)), key(7))], declared)
    assert len(result.rows) == 1 and not result.dead, result.dead


LINE: dict[str, Any] = {"fields": {
    "region": {"type": "text", "max_length": 8}, "order_no": {"type": "integer"},
    "notes": {"type": "text", "max_length": 100_000, "required": False}}}
LINE_COLUMNS: list[dict[str, Any]] = [
    {"type": "string", "optional": False, "field": "region"},
    {"type": "int32", "optional": False, "field": "order_no"},
    {"type": "string", "optional": True, "field": "notes"}]
LINE_KEY_SCHEMA: dict[str, Any] = {
    "type": "struct", "optional": False, "name": "pg.public.lines.Key",
    "fields": [{"type": "string", "optional": False, "field": "region"},
               {"type": "int32", "optional": False, "field": "order_no"}]}


def line_key(region: str, order_no: int) -> bytes:
    return json.dumps({"schema": LINE_KEY_SCHEMA,
                       "payload": {"region": region, "order_no": order_no}}).encode()


def lines(**body: Any) -> Any:
    return parse_pipelines({"contracts": {"line": LINE}, "pipelines": {"l": {
        "topic": "pg.public.lines", "contract": {"event_type": "line", "version": 1},
        "table": "lines", "dlq_topic": "lines-dlq", "envelope": "debezium",
        "identity": ["region", "order_no"], **body}}}, source="t.yaml")["l"]


def test_a_composite_primary_key_is_declared_as_the_identity_and_keys_the_mirror() -> None:
    """``schema from-topic``'s key of a primary key of two columns: the identity, whose
    fields become the table's key, in the key's order."""
    fields = {"a": {"type": "bigint", "required": True}, "b": {"type": "text"}}
    two = {"fields": [{"type": "string", "field": "b"}, {"type": "int64", "field": "a"}]}
    assert primary_key_declaration(two, fields) == {"identity": ["b", "a"]}
    assert "required" not in fields["a"]
    p = lines()
    assert (p.upsert.keys, p.conflict_columns, p.upsert.order_by) == (
        ("region", "order_no"), ("region", "order_no"), "source_offset")
    assert p.deletes and p.composite_key and p.record_key is None


def test_change_events_without_a_key_schema_have_no_key_to_declare() -> None:
    with pytest.raises(ValueError, match=r"0 columns \(the change events carry no key schema"):
        primary_key_declaration(None, {"a": {"type": "bigint"}})


@pytest.mark.parametrize(("body", "says"), [
    ({"identity": ["region", "notes"]}, "must be a required field"),
    ({"upsert": {"mode": "latest", "key": "region", "order_by": "source_offset"}},
     "keyed by its primary key"),
])
def test_a_composite_mirror_that_could_not_mirror_is_refused_at_load(body: dict[str, Any],
                                                                     says: str) -> None:
    with pytest.raises(ValueError, match=says):
        lines(**body)


def test_a_composite_key_of_a_column_type_a_delete_cannot_name_is_refused() -> None:
    dated = {"fields": {**LINE["fields"], "day": {"type": "date"}}}
    with pytest.raises(ValueError, match="primary key column 'day' is a date"):
        parse_pipelines({"contracts": {"line": dated}, "pipelines": {"l": {
            "topic": "t", "contract": {"event_type": "line", "version": 1}, "table": "lines",
            "dlq_topic": "lines-dlq", "envelope": "debezium",
            "identity": ["region", "day"]}}}, source="t.yaml")


def test_a_delete_of_a_composite_key_reads_its_fields_from_the_record_key() -> None:
    """The delete's key is the record key's fields in key order (with JsonConverter's
    schema or without); a key that lacks one, or holds another type, is dead-lettered."""
    schema = change("d", None, before={"region": "eu", "order_no": 1}, columns=LINE_COLUMNS)
    msgs = [Msg(0, schema, line_key("eu", 1)),
            Msg(1, schema, json.dumps({"order_no": 2, "region": "us"}).encode()),
            Msg(2, schema, json.dumps({"region": "eu"}).encode()),
            Msg(3, schema, json.dumps({"region": "eu", "order_no": "1"}).encode()),
            Msg(4, schema, json.dumps({"region": "eu", "order_no": 2**40}).encode()),
            Msg(5, schema, None)]
    result = validate_chunk(msgs, lines())
    assert [(t.key, t.offset) for t in result.deletes] == [(("eu", 1), 0), (("us", 2), 1)]
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (2, "bad_key"), (3, "bad_key"), (4, "bad_key"), (5, "bad_key")]
    assert "no field 'order_no'" in result.dead[0].error_detail


def test_a_mirror_keyed_by_one_identity_field_deletes_by_its_value() -> None:
    p = lines(identity=["order_no"])
    schema = change("d", None, before={"region": "eu", "order_no": 1}, columns=LINE_COLUMNS)
    result = validate_chunk([Msg(0, schema, line_key("eu", 4))], p)
    assert p.upsert.keys == ("order_no",) and [t.key for t in result.deletes] == [4]


def test_a_placeholder_of_a_composite_key_is_filled_from_its_earlier_change_in_the_chunk(
        ) -> None:
    msgs = [Msg(0, change("c", {"region": "eu", "order_no": 1, "notes": "long"},
                          columns=LINE_COLUMNS), line_key("eu", 1)),
            Msg(1, change("c", {"region": "us", "order_no": 1, "notes": "other"},
                          columns=LINE_COLUMNS), line_key("us", 1)),
            Msg(2, change("u", {"region": "eu", "order_no": 1, "notes": UNAVAILABLE},
                          columns=LINE_COLUMNS), line_key("eu", 1))]
    p = lines()
    result = validate_chunk(msgs, p)
    notes = p.column_names.index("notes")
    assert [r[notes] for r in result.rows] == ["long", "other", "long"]


def test_a_replay_filters_a_composite_mirrors_letters_by_the_fields_of_their_record_key(
        ) -> None:
    identity_of = letter_identity(lines())
    letter = DeadLetter("pg.public.lines", 0, 3, line_key("eu", 7), b"{}", None,
                        "contract_violation", "x", "line.v1", "lines-dlq")
    assert ReplayFilters(identity='["eu", 7]').matches(letter, identity_of)
    assert not ReplayFilters(identity='["eu", 8]').matches(letter, identity_of)


def test_a_replay_filters_a_mirrors_letters_by_the_primary_key_in_their_record_key() -> None:
    identity_of = letter_identity(mirror())
    letter = DeadLetter("pg.public.customers", 0, 3, key(7), change("c", {"id": 7}), None,
                        "contract_violation", "name: Field required", "customer.v1",
                        "customers-dlq")
    assert ReplayFilters(identity="7").matches(letter, identity_of)
    assert not ReplayFilters(identity="8").matches(letter, identity_of)


def test_a_column_added_dropped_or_retyped_at_the_source_stops_the_run() -> None:
    added = [*COLUMNS, {"type": "int32", "optional": True, "field": "score"},
             {"type": "struct", "optional": True, "name": "io.debezium.data.geometry.Point",
              "field": "spot", "fields": []}]  # a type no column has: left out, as from-topic
    with pytest.raises(SourceChanged, match=r"column 'score' added \(score: "
                       r"\{\"type\": \"integer\", \"required\": false\}\)") as info:
        validate_chunk([Msg(0, change("c", {"id": 1, "name": "a"}, columns=added), key(1))],
                       mirror())
    assert len(info.value.changes) == 1 and "schema plan m" in str(info.value)
    retyped = [{**c, "type": "string", "name": None} if c["field"] == "born" else c
               for c in COLUMNS]
    dropped = [c for c in COLUMNS if c["field"] not in ("name", "notes")]
    assert [source_changes(envelope_schema(cols), CUSTOMER["fields"])
            for cols in (retyped, dropped, COLUMNS)] == [
        ["column 'born' is text now, the contract's date"],
        ["column 'name' dropped (make it required: false)"],  # notes: optional, not filled
        []]


def test_a_schema_whose_text_holds_payload_as_a_key_is_read_whole() -> None:
    """JsonConverter's layout is read by its first ``,"payload":``, which a schema holds
    only inside an object (a parameter named so): then the whole value is parsed."""
    odd = [*COLUMNS[:1], {**COLUMNS[1], "parameters": {"a": "b", "payload": "c"}},
           *COLUMNS[2:]]
    reader = EnvelopeReader(None)
    assert b',"payload":"c"' in change("c", {"id": 1, "name": "a"}, columns=odd)
    op, row = reader.read(change("c", {"id": 1, "name": "a", "born": 2}, columns=odd))
    assert op == "c" and row == {"id": 1, "name": "a", "born": date(1970, 1, 3)}


@pytest.mark.parametrize("name", ["version", "event_id", "ingested_at", "source_offset"])
def test_a_source_column_named_like_a_column_every_table_has_is_mirrored_renamed(
        name: str) -> None:
    """A table with a ``version`` column (an ORM's optimistic lock: 5 is no contract
    version), an ``event_id``, or another name every table here has: the declaration
    renames its column and the mirror reads it there."""
    fields, guesses, _ = row_declaration(envelope_schema(
        [{"type": "int64", "optional": False, "field": "id"},
         {"type": "int32", "optional": True, "field": name}]))
    key_section = key_declaration(json.loads(key(7))["schema"], fields)
    declared = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {
        "m": {**MIRROR, "record_key": key_section}}}, source="t.yaml")["m"]
    result = validate_chunk([Msg(0, change("c", {"id": 7, name: 5}, columns=[
        {"type": "int64", "optional": False, "field": "id"},
        {"type": "int32", "optional": True, "field": name}]), key(7))], declared)
    assert not result.dead, result.dead
    row = dict(zip(declared.column_names, result.rows[0], strict=False))
    assert row[f"{name}_"] == 5 and any(f"column {name}_" in g for g in guesses)


@pytest.mark.parametrize(("column", "value"), [
    ({"type": "string", "name": "io.debezium.time.ZonedTime"}, "10:11:12+02"),
    ({"type": "string", "name": "io.debezium.data.Xml"}, "<a/>"),
    ({"type": "struct", "name": "io.debezium.data.geometry.Point", "fields": []},
     {"x": 1.0, "y": 2.0, "wkb": "AQ=="}),
])
def test_a_column_left_out_declared_as_its_note_says_reads_its_events(
        column: dict[str, Any], value: Any) -> None:
    """The note of a column ``schema from-topic`` leaves out names a type that takes its
    values (a string's is text: a jsonb takes only objects and arrays)."""
    columns = [{"type": "int64", "optional": False, "field": "id"},
               {**column, "optional": True, "field": "c"}]
    fields, _, (note,) = row_declaration(envelope_schema(columns))
    hinted = note.rsplit("declare it as ", 1)[1].rstrip(")")
    fields["c"] = {"type": hinted, "required": False,
                   **({"max_length": 100} if hinted == "text" else {})}
    declared = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {
        "m": {**MIRROR, "record_key": key_declaration(json.loads(key(7))["schema"],
                                                      fields)}}}, source="t.yaml")["m"]
    result = validate_chunk([Msg(0, change("c", {"id": 7, "c": value}, columns=columns),
                                 key(7))], declared)
    assert len(result.rows) == 1 and not result.dead, result.dead


@pytest.mark.parametrize("column", [
    {"type": "int32", "optional": False},  # NOT NULL at the source
    {"type": "string", "optional": True},
    {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "1", "connect.decimal.precision": "4"}},
])
def test_the_field_a_source_change_names_loads_as_a_new_version(
        column: dict[str, Any]) -> None:
    """The declaration ``SourceChanged`` gives for a column added at the source, with
    ``since: 2``, is a contract version that loads and reads the new events."""
    columns = [*COLUMNS, {**column, "field": "score"}]
    (change_note,) = source_changes(envelope_schema(columns), CUSTOMER["fields"])
    given = json.loads(change_note.split("(score: ", 1)[1][:-1])
    contract = {"version": 2, "fields": {**CUSTOMER["fields"], "score": {**given, "since": 2}}}
    declared = parse_pipelines({"contracts": {"customer": contract}, "pipelines": {
        "m": {**MIRROR, "contract": {"event_type": "customer", "version": 2}}}},
        source="t.yaml")["m"]
    value = b64(b"\x01") if column["type"] == "bytes" else 5 if column["type"] == "int32" \
        else "x"
    result = validate_chunk([Msg(0, change("c", {"id": 1, "name": "a", "score": value},
                                           columns=columns), key(1))], declared)
    assert len(result.rows) == 1 and not result.dead, result.dead


def test_a_declared_mirror_takes_the_empty_strings_its_source_holds() -> None:
    fields, _, _ = row_declaration(envelope_schema(COLUMNS))
    assert fields["name"]["min_length"] == 0 and fields["notes"]["min_length"] == 0
    declared = parse_pipelines({"contracts": {"customer": {"fields": fields}}, "pipelines": {
        "m": MIRROR}}, source="t.yaml")["m"]
    result = validate_chunk([Msg(0, change("c", {"id": 7, "name": "", "notes": ""}), key(7))],
                            declared)
    assert len(result.rows) == 1 and not result.dead, result.dead


def test_a_latest_key_of_several_columns_is_only_for_change_events() -> None:
    with pytest.raises(ValueError, match="is for envelope: debezium"):
        parse_pipelines({"contracts": {"line": LINE}, "pipelines": {"l": {
            "topic": "t", "contract": {"event_type": "line", "version": 1}, "table": "lines",
            "dlq_topic": "lines-dlq", "identity": ["region", "order_no"],
            "upsert": {"mode": "latest", "key": ["region", "order_no"],
                       "order_by": "order_no"}}}}, source="t.yaml")
