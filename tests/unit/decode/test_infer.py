"""What ``schema from-topic`` and ``schema from-registry`` guess: each field's type and
optionality from sampled JSON records, and what identifies a record (a field named as
the id, the record key, or the place in the log), as a pipelines-file document that
loads and reads the records it was made from."""

from __future__ import annotations

import json
from typing import Any

from kafka_ingest.config import Format, parse_pipelines
from kafka_ingest.decode.infer import (
    ProposedIdentity,
    declaration,
    id_candidates,
    infer_fields,
    sample_identity,
    text_bound,
)
from kafka_ingest.decode.schemas import (
    contract_from_schema,
    key_identity,
    schema_identity,
    schema_problems,
)
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.kafka.registry import WriterSchema
from tests.support.datagen import ORDERS, PAGEVIEWS, TRANSACTIONS, nested_past_parser_depth
from tests.support.fakes import Msg


def avro(schema: Any, subject: str = "s-value") -> WriterSchema:
    return WriterSchema(7, "AVRO", json.dumps(schema), subject=subject, version=1)


def test_each_field_type_is_guessed_from_the_sampled_values() -> None:
    records = [
        {"n": 1, "x": 1.5, "ok": True, "name": "Ada", "at": "2026-01-02T03:04:05Z",
         "day": "2026-01-02", "createdAt": 1_767_000_000_000, "sent_ts": 1_767_000_000,
         "addr": {"city": "London"}, "tags": ["a"], "note": "", "gone": None, "mixed": 1},
        {"n": 2, "x": 2, "ok": False, "name": "Grace Hopper", "at": "2026-01-02T03:04:05+01:00",
         "day": "2026-01-03", "createdAt": 1_767_000_000_001, "sent_ts": 1_767_000_001,
         "addr": {"city": "Arlington"}, "tags": [], "note": "n", "gone": None, "mixed": "1"},
    ]
    inferred = infer_fields(records)
    assert inferred.fields == {
        "n": {"type": "bigint"},
        "x": {"type": "float"},
        "ok": {"type": "boolean"},
        "name": {"type": "text", "max_length": 32},  # 12 characters, generously rounded up
        "at": {"type": "timestamptz"},
        "day": {"type": "date"},
        "createdAt": {"type": "timestamptz", "encoding": "epoch_millis",
                      "column": "created_at"},
        "sent_ts": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "addr": {"type": "jsonb"},
        "tags": {"type": "jsonb"},
        "note": {"type": "text", "max_length": 16, "min_length": 0},
    }
    assert inferred.left_out == ["gone: always null in the sample: no type to guess",
                                 "mixed: mixed types in the sample (int, str)"]
    assert inferred.unique == {"n", "name", "note"}


def test_a_field_missing_or_null_in_any_record_is_optional_and_a_number_not_named_a_time_stays_a_number() -> None:  # noqa: E501
    inferred = infer_fields([{"a": 1, "b": "x", "ordertime": 1_767_000_000_000,
                              "count": 1_767_000_000_000},
                             {"a": None, "ordertime": 1_767_000_000_001, "count": 5}])
    assert inferred.fields["a"] == {"type": "bigint", "required": False}
    assert inferred.fields["b"] == {"type": "text", "max_length": 16, "required": False}
    assert inferred.fields["ordertime"] == {"type": "timestamptz", "encoding": "epoch_millis"}
    assert inferred.fields["count"] == {"type": "bigint"}
    assert inferred.unique == {"count"}  # a time (timestamptz) is never an id candidate


def test_names_the_contract_cannot_take_are_left_out_with_why() -> None:
    inferred = infer_fields([{"version": 3, "source_offset": 1, "bad name": 1, "k": 1}])
    assert set(inferred.fields) == {"k"}
    assert [line.split(":")[0] for line in inferred.left_out] == [
        "version", "source_offset", "bad name"]


def test_text_bounds_are_generous() -> None:
    assert [text_bound(n) for n in (0, 1, 8, 9, 100, 6000)] == [16, 16, 16, 32, 256, 10_000]


def test_an_id_is_the_topics_own_id_then_id_then_a_lone_star_id() -> None:
    assert id_candidates(["ordertime", "orderid", "itemid"], topic="orders-3f") == [
        ("orderid", "'orderid' is named as the records' own id (order; topic 'orders-3f')")]
    assert [n for n, _ in id_candidates(
        ["card_id", "user_id", "transaction_id", "store_id"], topic="transactions")] == [
        "transaction_id"]
    assert id_candidates(["viewtime", "userid", "pageid"], topic="pageviews") == []
    assert [n for n, _ in id_candidates(["id", "name"], topic="x")] == ["id"]
    assert [n for n, _ in id_candidates(["payment_id", "amount"], topic="x")] == ["payment_id"]
    # several *_id fields, none the topic's: each may be another entity's
    assert id_candidates(["card_id", "user_id"], topic="x") == []
    # the last word of the topic says what its records are: user-events holds events
    assert id_candidates(["userid", "viewtime"], topic="shop.user-events.v1") == []
    assert [n for n, _ in id_candidates(["userid", "eventid"], topic="user-events")] == [
        "eventid"]
    # the record's name, when the topic's says nothing
    assert [n for n, _ in id_candidates(["paymentId", "card_id", "user_id"], topic="t-9d1",
                                        record="com.acme.Payment")] == ["paymentId"]


def test_the_sample_identity_is_a_distinct_id_field_else_distinct_keys_else_the_position() -> None:
    records = [{"orderid": i, "n": 1} for i in range(3)]
    assert sample_identity(infer_fields(records), [b"k"] * 3, topic="orders").value == "orderid"
    repeated = [{"orderid": 1, "n": i} for i in range(3)]
    keyed = sample_identity(infer_fields(repeated), [b"a", b"b", b"c"], topic="orders")
    assert (keyed.value, keyed.record_key) == ("record_key", {"column": "record_key",
                                                              "max_length": 16})
    for keys in ([b"a", b"a", b"b"], [b"a", None, b"c"]):
        assert sample_identity(infer_fields(repeated), keys, topic="orders").value == (
            "source_position")
    with_event_id = infer_fields([{"event_id": f"e{i}", "n": 1} for i in range(3)])
    assert sample_identity(with_event_id, [None] * 3, topic="t").value is None
    assert "event_id" not in with_event_id.fields  # the contract's own, implicit


def _from_registry(schema: dict[str, Any], topic: str, key: ProposedIdentity | None = None
                   ) -> dict[str, Any]:
    writer = avro(schema, f"{topic}-value")
    body, _ = contract_from_schema(Format.AVRO, writer)
    identity = schema_identity(Format.AVRO, writer, topic=topic, key=key)
    document = declaration(event_type="e", contract=body, pipeline="p", topic=topic,
                           identity=identity, extra={"format": "avro", "schema_registry": {}})
    (pipeline,) = parse_pipelines(document).values()
    assert schema_problems(pipeline, writer) == []  # reads what it was made from
    return document["pipelines"]["p"]


def test_a_writer_schema_nested_past_the_parsers_depth_is_a_problem_named_not_a_crash() -> None:
    # the plan's check of the subject's latest schema: a ContractMismatch naming it, where a
    # RecursionError's traceback failed the plan
    text = nested_past_parser_depth()
    document = declaration(event_type="e", contract={"version": 1, "fields": {
        "x": {"type": "integer"}}}, pipeline="p", topic="t", identity=ProposedIdentity(
        "source_position", "t"), extra={"format": "avro", "schema_registry": {}})
    (pipeline,) = parse_pipelines(document).values()
    assert schema_problems(pipeline, WriterSchema(8, "AVRO", text)) == [
        "schema id 8 is nested deeper than it can be read"]


def test_a_contract_from_a_schema_without_event_id_is_identified_and_reads_the_schema() -> None:
    assert _from_registry(ORDERS, "orders")["identity"] == "orderid"
    assert _from_registry(TRANSACTIONS, "transactions")["identity"] == "transaction_id"
    assert _from_registry(PAGEVIEWS, "pageviews")["identity"] == "source_position"
    with_id = {**PAGEVIEWS, "fields": [{"name": "event_id", "type": "string"},
                                       *PAGEVIEWS["fields"]]}
    assert "identity" not in _from_registry(with_id, "pageviews")  # the default


def test_a_key_subject_makes_the_record_key_the_identity() -> None:
    fields: dict[str, Any] = {}
    string_key = key_identity(Format.AVRO, avro("string", "orders-key"), topic="orders",
                              text_max_length=64,
                              fields=fields)
    assert string_key is not None and string_key.record_key == {
        "column": "record_key", "format": "registry", "max_length": 64}
    long_key = key_identity(Format.AVRO, avro({"type": "long"}, "orders-key"),
                            topic="orders", text_max_length=64, fields=fields)
    assert long_key is not None and long_key.record_key == {
        "column": "record_key", "format": "registry", "type": "bigint"}
    record_key = key_identity(Format.AVRO, avro({"type": "record", "name": "OrderKey",
                                                 "fields": [{"name": "orderid", "type": "int"},
                                                            {"name": "region", "type": "string"}]},
                                                "orders-key"), topic="orders",
                              text_max_length=64, fields=fields)
    assert record_key is not None and record_key.record_key == {
        "column": "record_key", "format": "registry", "field": "orderid", "type": "bigint"}
    pipeline = _from_registry(PAGEVIEWS, "pageviews", key=string_key)
    assert (pipeline["identity"], pipeline["record_key"]["column"]) == ("record_key",
                                                                        "record_key")


def test_a_guessed_json_contract_loads_every_sampled_record() -> None:
    values = [{"orderid": 1, "item": "a", "at": "2026-01-02T03:04:05Z", "extra": {"k": [1]}},
              {"orderid": 2, "item": "", "at": "2026-01-02T03:04:06+02:00", "extra": None}]
    inferred = infer_fields(values)
    identity = sample_identity(inferred, [None, None], topic="orders")
    document = declaration(event_type="e", pipeline="p", topic="orders", identity=identity,
                           contract={"version": 1, "fields": inferred.fields})
    (pipeline,) = parse_pipelines(document).values()
    result = validate_chunk([Msg(i, value_=json.dumps(v).encode())
                             for i, v in enumerate(values)], pipeline)
    assert (len(result.rows), result.dead) == (2, [])
    assert document["pipelines"]["p"]["identity"] == "orderid"
