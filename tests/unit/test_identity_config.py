"""A pipeline's identity (#33): what makes a record the same record twice, declared in the
pipelines file (a field by any name or path, several, the record key, the source
position), checked when the file loads, and what follows from it (the model, the primary
key, a chunk's dedup key, a replay filter's match). No service is touched."""

from __future__ import annotations

import json
import pickle
import random
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from pydantic import AliasPath, Field

from kafka_ingest.config import IdentitySource, Pipeline, parse_pipelines
from kafka_ingest.contracts import Contract
from kafka_ingest.contracts.base import short_text
from kafka_ingest.db.copy import write_order
from kafka_ingest.db.tables import create_statements
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import RegistryUnavailable, Undecodable
from kafka_ingest.kafka.dlq import DeadLetter
from kafka_ingest.requests import ReplayFilters, letter_identity

#: Orders whose payloads carry no event_id: an id by another name, a region and a number.
ORDER: dict[str, Any] = {"fields": {
    "orderid": {"type": "text", "max_length": 32},
    "region": {"type": "text", "max_length": 8},
    "order_no": {"type": "bigint"},
    "note": {"type": "text", "max_length": 64, "required": False},
    "total": {"type": "numeric", "precision": 10, "scale": 2},
}}
BASE: dict[str, Any] = {"topic": "orders", "contract": {"event_type": "order", "version": 1},
                        "table": "orders", "dlq_topic": "orders-dlq"}
STATE: dict[str, Any] = {"record_key": {"column": "account_id", "max_length": 64},
                         "upsert": {"mode": "latest", "key": "account_id",
                                    "order_by": "source_offset"},
                         "on_tombstone": "delete"}


class _NestedOrderV1(Contract):
    """Orders whose id sits inside an object: ``{"order": {"id": ...}, "total": ...}``."""

    EVENT_TYPE: ClassVar[str] = "nested_order"
    VERSION: ClassVar[int] = 1
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (("order_id", "text"),
                                                          ("total", "int8"))
    order_id: short_text(32) = Field(  # type: ignore[valid-type]
        validation_alias=AliasPath("order", "id"))
    total: int


def pipeline(contracts: dict[str, Any] | None = None, **body: Any) -> Pipeline:
    declared = {"order": ORDER} if contracts is None else contracts
    return parse_pipelines({"contracts": declared, "pipelines": {"p": {**BASE, **body}}},
                           source="test.yaml")["p"]


def refusal(**body: Any) -> str:
    with pytest.raises(ValueError, match=r"^test\.yaml: pipelines\.p") as info:
        pipeline(**body)
    return str(info.value)


def nested(**body: Any) -> Pipeline:
    return Pipeline.model_validate(
        {"name": "p", **BASE, "contract": {"event_type": "nested_order", "version": 1},
         **body}, context={"contracts": {_NestedOrderV1.key(): _NestedOrderV1}})


# --------------------------------------------------------------------------- declared

IDENTITIES = [
    # one field by another name than event_id (short form, and the long one)
    ("orderid", IdentitySource.PAYLOAD, ("orderid",)),
    ({"fields": ["orderid"]}, IdentitySource.PAYLOAD, ("orderid",)),
    # several fields together, in the order given
    (["region", "order_no"], IdentitySource.PAYLOAD, ("region", "order_no")),
    # the record key's column
    ("record_key", IdentitySource.RECORD_KEY, ("order_key",)),
    # the source position: topic, its incarnation (offsets restart in a re-created
    # topic), partition, offset
    ("source_position", IdentitySource.SOURCE_POSITION,
     ("source_topic", "source_incarnation", "source_partition", "source_offset")),
]


@pytest.mark.parametrize(("identity", "source", "key"), IDENTITIES)
def test_an_identity_is_the_append_tables_key_and_payloads_need_no_event_id(
        identity: Any, source: IdentitySource, key: tuple[str, ...], message: Any) -> None:
    orders = pipeline(identity=identity, record_key={"column": "order_key"})

    assert orders.identity_source is source
    assert orders.conflict_columns == key
    # the declared contract's event_id identifies nothing: optional (a NULL column)
    [event_id] = [c for c in orders.sink_columns if c.name == "event_id"]
    assert event_id.nullable
    [create] = create_statements(orders)
    quoted = ", ".join(f'"{c}"' for c in key)
    assert f"PRIMARY KEY ({quoted})" in create.statement
    value = json.dumps({"orderid": "o-1", "region": "eu", "order_no": 7, "total": "9.50"})
    result = validate_chunk([message(value.encode(), key_=b"k-1")], orders)
    assert [d.error_detail for d in result.dead] == [] and len(result.rows) == 1


def test_a_source_position_table_keeps_the_incarnation_of_its_rows() -> None:
    [create] = create_statements(pipeline(identity="source_position"))
    assert '"source_incarnation" integer NOT NULL DEFAULT 1' in create.statement


def test_a_nested_path_names_the_column_its_field_fills() -> None:
    orders = nested(identity="order.id")
    assert orders.conflict_columns == ("order_id",)


def test_a_partitioned_table_keys_the_identity_and_the_partitioning_column() -> None:
    contracts = {"order": {"fields": {**ORDER["fields"], "at": {"type": "timestamptz"}}}}
    orders = pipeline(contracts, identity=["region", "order_no"],
                      partition_by={"column": "at"})
    assert orders.conflict_columns == ("region", "order_no", "at")


def test_without_an_identity_event_id_stays_the_key(shipped: dict[str, Pipeline]) -> None:
    for name in ("telemetry_metrics", "orders_created"):
        assert shipped[name].conflict_columns == ("event_id",)
        assert shipped[name].identity_columns == ("event_id",)
    declared = pipeline()
    assert declared.identity_columns == ("event_id",)
    assert declared.sink_columns[0].name == "event_id"
    assert not declared.sink_columns[0].nullable


def test_a_latest_pipeline_keyed_by_its_record_key_reads_values_without_an_id(
        shipped: dict[str, Pipeline], message: Any) -> None:
    # the shipped compacted state topic: its values are a balance, nothing else; every one
    # was a contract_violation (event_id: Field required) before
    balances = shipped["account_balances"]
    value = json.dumps({"balance": "10.00", "currency": "EUR", "updatedAt": 1_767_225_600_000})

    result = validate_chunk([message(value.encode(), key_=b"acc-1")], balances)

    assert [d.error_detail for d in result.dead] == []
    assert len(result.rows) == 1
    assert balances.identity_source is IdentitySource.RECORD_KEY


def test_a_pipeline_without_event_id_travels_to_another_process_as_it_is() -> None:
    orders = pipeline(identity=["region", "order_no"])
    again = pickle.loads(pickle.dumps(orders))  # noqa: S301 - our own bytes
    assert not again.model.model_fields["event_id"].is_required()
    assert again.sink_columns == orders.sink_columns


@pytest.mark.parametrize("identity", [["region", "order_no"], "record_key",
                                      "source_position", None])
def test_a_pipeline_dumped_and_loaded_again_keeps_its_identity(identity: Any) -> None:
    # as a pipelines file is written for a DAG run in another process
    orders = pipeline(identity=identity, record_key={"column": "order_key"})
    body = orders.model_dump(mode="json", exclude={"name"})
    assert pipeline(**body).conflict_columns == orders.conflict_columns


REFUSED = [
    # a path that is not in the contract, named with the contract's fields
    ("unknown field", {"identity": "order_id"},
     "identity field 'order_id' is not a field of contract order.v1"),
    ("unknown part", {"identity": ["region", "orderno"]},
     "identity field 'orderno' is not a field of contract order.v1"),
    # a field that may be missing or null identifies nothing
    ("nullable", {"identity": "note"},
     "identity field 'note' must be a required field of contract order.v1"),
    # the source position of a latest table: its versions are different positions
    ("position of latest", {"identity": "source_position", **STATE},
     "identity 'source_position' is for append pipelines"),
    ("record key without one", {"identity": "record_key"},
     "identity 'record_key' needs record_key"),
    ("record key of another latest key", {
        "identity": "record_key", "record_key": {"column": "account_id"},
        "upsert": {"mode": "latest", "key": "orderid", "order_by": "source_offset"}},
     "identity 'record_key' of a latest pipeline needs upsert.key to be the record key's"),
    ("fields of the record key", {"identity": {"source": "record_key", "fields": ["x"]}},
     "identity.fields names payload fields"),
    ("a field twice", {"identity": ["region", "region"]}, "names a field twice"),
    ("no field", {"identity": []}, "identity.fields needs at least one field"),
    ("not a path", {"identity": "order..id"}, "pipelines.p.identity.fields.0"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_a_bad_identity_is_refused_at_load_naming_the_key(body: dict[str, Any],
                                                         reason: str) -> None:
    assert reason in refusal(**body)


def test_a_python_contract_without_event_id_needs_an_identity() -> None:
    with pytest.raises(ValueError, match=r"contract nested_order\.v1 has no event_id: say "
                                         r"what identifies a record with `identity`"):
        nested()


def test_append_pipelines_sharing_a_table_must_share_its_identity() -> None:
    doc = {"contracts": {"order": ORDER}, "pipelines": {
        "a": {**BASE, "identity": "orderid"},
        "b": {**BASE, "topic": "more-orders", "dlq_topic": "b-dlq",
              "identity": ["region", "order_no"]}}}
    with pytest.raises(ValueError, match=r"pipelines a \(orderid\), b \(region, order_no\) "
                                         r"all write table 'orders' but identify its records"):
        parse_pipelines(doc)
    doc["pipelines"]["b"]["identity"] = "orderid"
    assert set(parse_pipelines(doc)) == {"a", "b"}


# --------------------------------------------------------------------------- the chunk


def test_a_chunk_keeps_one_copy_of_each_composite_identity() -> None:
    orders = pipeline(identity=["region", "order_no"])
    columns = [*orders.column_names, "source_topic", "source_partition", "source_offset",
               "kafka_key", "kafka_timestamp"]

    def row(region: str, no: int, offset: int) -> tuple[Any, ...]:
        values = {"event_id": None, "orderid": f"o-{offset}", "region": region,
                  "order_no": no, "note": None, "total": 1, "source_topic": "t",
                  "source_partition": 0,
                  "source_offset": offset, "kafka_key": None, "kafka_timestamp": None}
        return tuple(values[c] for c in columns)

    rows = [row("eu", 1, 5), row("us", 1, 6), row("eu", 1, 2), row("eu", 2, 3)]
    # the same region and number twice: the lowest offset stays; "eu" 1 and "us" 1 differ
    assert write_order(orders)(rows) == [rows[2], rows[3], rows[1]]


def test_a_composite_identitys_chunk_is_in_the_order_of_its_tuples_whatever_it_arrives_in(
        ) -> None:
    """The columns are sorted one at a time (see ``write_order``): the result must be
    what sorting by the identity's tuples gives, with the lowest place of each event."""
    orders = pipeline(identity=["region", "order_no"])
    columns = [*orders.column_names, "source_topic", "source_partition", "source_offset",
               "kafka_key", "kafka_timestamp"]
    at = {name: i for i, name in enumerate(columns)}
    rnd = random.Random(5)

    def row(region: str, no: int, partition: int, offset: int) -> tuple[Any, ...]:
        values = {"event_id": None, "orderid": "o", "region": region, "order_no": no,
                  "note": None, "total": 1, "source_topic": "t", "source_partition": partition,
                  "source_offset": offset, "kafka_key": None, "kafka_timestamp": None}
        return tuple(values[c] for c in columns)

    def place(r: tuple[Any, ...]) -> tuple[Any, ...]:
        return r[at["source_topic"]], r[at["source_partition"]], r[at["source_offset"]]

    for _ in range(300):
        # numbers that fall and rise, regions that tie (and one that is another's prefix),
        # a copy of an event in another partition and the same letter twice
        rows = [row(rnd.choice(["eu", "us", "é", "eu-2"]), rnd.randrange(-3, 6),
                    rnd.randrange(2), rnd.randrange(30)) for _ in range(rnd.randrange(40))]
        rows += rnd.sample(rows, min(len(rows), 3))
        best: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for r in rows:
            key = (r[at["region"]], r[at["order_no"]])
            if key not in best or place(r) < place(best[key]):
                best[key] = r
        assert write_order(orders)(list(rows)) == [best[k] for k in sorted(best)]


# --------------------------------------------------------------------------- replay


def _letter(value: dict[str, Any] | None, *, key: bytes | None = b"k",
            partition: int = 0, offset: int = 7) -> DeadLetter:
    return DeadLetter("orders", partition, offset, key,
                      None if value is None else json.dumps(value).encode(), None,
                      "contract_violation", "detail", "order.v1", "orders-dlq")


LETTERS = [
    # one field: its value as text, a number too
    ({"identity": "orderid"}, _letter({"orderid": "o-17"}), "o-17", "o-18"),
    ({"identity": "order_no"}, _letter({"order_no": 42}), "42", "43"),
    # several: a JSON array, spaces or not
    ({"identity": ["region", "order_no"]}, _letter({"region": "eu", "order_no": 42}),
     '["eu", 42]', '["eu", 43]'),
    # the record key, as text
    ({"identity": "record_key", "record_key": {"column": "order_key"}},
     _letter({}, key=b"acc-9"), "acc-9", "acc-1"),
    # the source position: partition:offset
    ({"identity": "source_position"}, _letter({}, partition=2, offset=1045), "2:1045",
     "2:1046"),
]


@pytest.mark.parametrize(("body", "letter", "same", "other"), LETTERS)
def test_a_replay_filters_letters_by_the_pipelines_identity(
        body: dict[str, Any], letter: DeadLetter, same: str, other: str) -> None:
    identity_of = letter_identity(pipeline(**body))
    assert ReplayFilters(identity=same).matches(letter, identity_of)
    assert not ReplayFilters(identity=other).matches(letter, identity_of)


def test_a_nested_identity_is_read_from_inside_the_payload() -> None:
    identity_of = letter_identity(nested(identity="order.id"))
    letter = _letter({"order": {"id": "o-3"}, "total": 1})
    assert ReplayFilters(identity="o-3").matches(letter, identity_of)
    assert not ReplayFilters(identity="o-3").matches(_letter({"order": "o-3"}), identity_of)


def test_the_event_id_filter_keeps_its_meaning() -> None:
    letter = _letter({"event_id": "e-1", "orderid": "o-1"})
    assert ReplayFilters(event_id="e-1").matches(letter)
    assert not ReplayFilters(event_id="o-1").matches(letter)


def _wire(doc: Any) -> bytes:
    """A stand-in for a registry's wire format in these tests: a marker byte, then JSON."""
    return b"W" + json.dumps(doc).encode()


def _read(raw: bytes) -> Any:
    """The stand-in's decoder: what a registry format's ``read_python`` is to the filters."""
    if not raw.startswith(b"W"):
        raise Undecodable("not the wire format")
    return json.loads(raw[1:])


def test_a_registry_formats_letters_are_filtered_by_what_its_decoder_reads() -> None:
    orders = pipeline(identity="orderid")
    letter = replace(_letter(None), value=_wire({"orderid": "o-17", "event_id": "e-1"}))
    assert ReplayFilters(identity="o-17").matches(letter, letter_identity(orders, _read), _read)
    assert not ReplayFilters(identity="o-17").matches(letter, letter_identity(orders))
    assert ReplayFilters(event_id="e-1").matches(letter, read=_read)
    assert not ReplayFilters(event_id="e-1").matches(letter)
    # a payload the decoder cannot read matches no filter
    unreadable = replace(letter, value=b'{"orderid": "o-17"}')
    assert not ReplayFilters(identity="o-17").matches(unreadable, letter_identity(orders, _read),
                                                      _read)
    # a registry-encoded record key, by the same decoder
    keyed = pipeline(identity="record_key", format="avro", schema_registry={},
                     record_key={"format": "registry", "column": "order_key"})
    by_key = replace(letter, key=_wire("acc-9"))
    assert ReplayFilters(identity="acc-9").matches(by_key, letter_identity(keyed, _read))
    assert not ReplayFilters(identity="acc-9").matches(by_key, letter_identity(keyed))


def test_a_registry_out_of_reach_fails_the_filter_instead_of_filtering_the_letter_out() -> None:
    def unreachable(raw: bytes) -> Any:
        raise RegistryUnavailable("GET /schemas/ids/1", "connection refused")

    letter = replace(_letter(None), value=_wire({"orderid": "o-17"}))
    with pytest.raises(RegistryUnavailable):
        ReplayFilters(identity="o-17").matches(
            letter, letter_identity(pipeline(identity="orderid"), unreachable), unreachable)
