"""Declared contracts: a contract written in the pipelines file is as strict as one in Python.

First the two example contracts declared in YAML beside their hand-written models: the
same payloads pass and fail the same way, and their columns are the same (so the same
table fits both). Then every declared type at its edges, defaults, versions, renames, the
load errors, and the trip a pipeline with a declared contract makes to a spawned worker.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
import yaml
from pydantic import ValidationError

from kafka_ingest.config import Pipeline, declared_contracts, parse_pipelines
from kafka_ingest.contracts import Contract, MetricEventV2, OrderCreatedV1
from kafka_ingest.contracts.columns import Column, contract_columns, millis_to_pg, seconds_to_pg
from kafka_ingest.decode.validate import classify
from kafka_ingest.errors import ContractViolation, DataError, UnknownVersion

# The hand-written example contracts (contracts/telemetry.py, contracts/orders.py), as a
# user would declare them. Event types differ: a declared one may not shadow Python's.
EXAMPLES = yaml.safe_load("""
metric_reading:
  version: 2
  fields:
    device_id:    {type: text, max_length: 128}
    timestamp:    {type: timestamptz, encoding: epoch_seconds}
    metric_value: {type: float}
    status:       {type: text, max_length: 32, default: OK}
    unit:         {type: text, max_length: 32, required: false, since: 2}
order_placed:
  fields:
    order_id:    {type: bigint, ge: 1}
    customer_id: {type: text, max_length: 64}
    total:       {type: numeric, precision: 14, scale: 2, ge: 0}
    timestamp:   {type: timestamptz}
""")
DECLARED = declared_contracts(EXAMPLES, source="test.yaml")
METRIC_DECLARED = DECLARED["metric_reading.v2"]
ORDER_DECLARED = DECLARED["order_placed.v1"]

#: METRIC's timestamp (2026-01-01T00:00:00.25Z) as it travels: µs since 2000-01-01.
TS_PG = 820_540_800_250_000
METRIC: dict[str, Any] = {"event_id": "m-1", "device_id": "device-0001",
                          "timestamp": 1_767_225_600.25, "metric_value": 21.5}
ORDER: dict[str, Any] = {"event_id": "o-1", "order_id": 1_000_001,
                         "customer_id": "customer-00042", "total": "19.90",
                         "timestamp": "2026-01-01T00:00:03Z"}


def encode(base: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps({**base, **changes}).encode()


def without(base: dict[str, Any], key: str) -> bytes:
    return json.dumps({k: v for k, v in base.items() if k != key}).encode()


def with_literal(base: dict[str, Any], field: str, literal: str) -> bytes:
    """JSON whose ``field`` is a literal json.dumps would never write (NaN, Infinity)."""
    return encode(base, **{field: "@@"}).replace(b'"@@"', literal.encode())


def rejection(model: type[Contract], raw: bytes) -> DataError:
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(raw)
    return classify(raw, info.value)


def contracts(text: str) -> dict[str, type[Contract]]:
    """The models a ``contracts:`` section (YAML) declares, by registry key."""
    return declared_contracts(yaml.safe_load(text), source="test.yaml")


def one_field(spec: dict[str, Any], *, name: str = "v") -> type[Contract]:
    """The model of a contract with the one field ``name``: ``spec``."""
    event_type = "probe_" + json.dumps(spec, sort_keys=True).encode().hex()[:40]
    found = declared_contracts({event_type: {"fields": {name: spec}}}, source="test.yaml")
    return found[f"{event_type}.v1"]


def load_error(document: dict[str, Any]) -> str:
    with pytest.raises(ValueError, match=r"^test\.yaml: ") as info:
        parse_pipelines(document, source="test.yaml")
    return str(info.value)


# --------------------------------------------------------------------------- as strict


def test_declared_examples_have_the_hand_written_columns() -> None:
    # The same Column objects (type as format_type() prints it, nullability, how the
    # value travels): a table made for one takes the other's rows.
    assert contract_columns(METRIC_DECLARED) == contract_columns(MetricEventV2)
    assert contract_columns(ORDER_DECLARED) == contract_columns(OrderCreatedV1)
    assert METRIC_DECLARED.CONVERTED == MetricEventV2.CONVERTED
    # and what the two spell out, checked against the migration's table (0002)
    assert contract_columns(ORDER_DECLARED) == (
        Column("event_id", "character varying(128)", "text", False),
        Column("order_id", "bigint", "int8", False),
        Column("customer_id", "character varying(64)", "text", False),
        Column("total", "numeric(14,2)", "numeric", False),
        Column("timestamp", "timestamp with time zone", "timestamptz", False),
    )
    assert contract_columns(METRIC_DECLARED)[2] == Column(
        "timestamp", "timestamp with time zone", "float8", False, seconds_to_pg)
    assert contract_columns(METRIC_DECLARED)[-1] == Column(
        "unit", "character varying(32)", "text", True)


def test_declared_models_are_contracts_with_their_key() -> None:
    assert issubclass(METRIC_DECLARED, Contract)
    assert METRIC_DECLARED.key() == "metric_reading.v2"
    assert METRIC_DECLARED.DECLARATION is not None and MetricEventV2.DECLARATION is None
    assert sorted(DECLARED) == ["metric_reading.v1", "metric_reading.v2", "order_placed.v1"]


METRIC_CASES = [
    # a good event, status defaulted
    ("good", encode(METRIC), ("m-1", "device-0001", TS_PG, 21.5, "OK", None)),
    # a v1 payload is a v2 event without a unit
    ("v1_payload", encode(METRIC, version=1, status="WARN"),
     ("m-1", "device-0001", TS_PG, 21.5, "WARN", None)),
    ("v2_payload", encode(METRIC, version=2, unit="celsius"),
     ("m-1", "device-0001", TS_PG, 21.5, "OK", "celsius")),
    # NaN and Infinity are no readings
    ("nan", with_literal(METRIC, "metric_value", "NaN"), ("metric_value", "finite_number")),
    ("infinity", with_literal(METRIC, "metric_value", "-Infinity"),
     ("metric_value", "finite_number")),
    # a string spelling a number is not one
    ("string_for_float", encode(METRIC, metric_value="21.5"), ("metric_value", "float_type")),
    # an epoch past 9999-12-31 has no timestamptz
    ("epoch_too_big", encode(METRIC, timestamp=1e20), ("timestamp", "less_than")),
    ("epoch_negative", encode(METRIC, timestamp=-1), ("timestamp", "greater_than_equal")),
    # Postgres text holds no NUL
    ("nul", encode(METRIC, device_id="a\x00b"), ("device_id", "string_pattern_mismatch")),
    # 129 characters in a varchar(128)
    ("too_long", encode(METRIC, device_id="d" * 129), ("device_id", "string_too_long")),
    ("empty", encode(METRIC, device_id=""), ("device_id", "string_too_short")),
    # a default is no licence for null
    ("null_status", encode(METRIC, status=None), ("status", "string_type")),
    ("missing", without(METRIC, "device_id"), ("device_id", "missing")),
    # "2" is not a version
    ("version_string", encode(METRIC, version="2"), ("version", "int_type")),
    # a version above the contract's: unknown_version, not a violation
    ("version_3", encode(METRIC, version=3), "unknown_version"),
]

ORDER_CASES = [
    ("good", encode(ORDER), ("o-1", 1_000_001, "customer-00042", Decimal("19.90"),
                             datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC))),
    # money has two places
    ("three_places", encode(ORDER, total="19.999"), ("total", "decimal_max_places")),
    # and 12 digits before the point
    ("thirteen_digits", encode(ORDER, total="1234567890123.00"),
     ("total", "decimal_whole_digits")),
    # a float that is not two places
    ("inexact_float", encode(ORDER, total=0.1 + 0.2), ("total", "decimal_max_digits")),
    ("nan_total", encode(ORDER, total="NaN"), ("total", "finite_number")),
    ("infinite_total", encode(ORDER, total="Infinity"), ("total", "finite_number")),
    ("negative_total", encode(ORDER, total="-0.01"), ("total", "greater_than_equal")),
    # "2" is not an int, nor is true
    ("string_for_int", encode(ORDER, order_id="2"), ("order_id", "int_type")),
    ("bool_for_int", encode(ORDER, order_id=True), ("order_id", "int_type")),
    ("int_past_bigint", encode(ORDER, order_id=2**63), ("order_id", "less_than_equal")),
    ("order_id_zero", encode(ORDER, order_id=0), ("order_id", "greater_than_equal")),
    # which zone?
    ("naive_timestamp", encode(ORDER, timestamp="2026-01-01T00:00:03"),
     ("timestamp", "timezone_aware")),
    ("nul", encode(ORDER, customer_id="c\x00"), ("customer_id", "string_pattern_mismatch")),
    ("too_long", encode(ORDER, customer_id="c" * 65), ("customer_id", "string_too_long")),
    ("empty", encode(ORDER, customer_id=""), ("customer_id", "string_too_short")),
    ("missing", without(ORDER, "total"), ("total", "missing")),
    ("version_2", encode(ORDER, version=2), "unknown_version"),
]


def _same_outcome(hand: type[Contract], declared: type[Contract], raw: bytes,
                  expected: Any) -> None:
    if isinstance(expected, tuple) and len(expected) == 2:  # (field, error type)
        field, error_type = expected
        for model in (hand, declared):
            error = rejection(model, raw)
            assert isinstance(error, ContractViolation), (model.__name__, error.detail)
            assert f"{field}: " in error.detail and f"[{error_type}]" in error.detail, (
                model.__name__, error.detail)
        assert rejection(declared, raw).detail == rejection(hand, raw).detail
    elif expected == "unknown_version":
        for model in (hand, declared):
            error = rejection(model, raw)
            assert isinstance(error, UnknownVersion), (model.__name__, error.detail)
            assert error.error_class == "unknown_version"
    else:  # the row's values, in SINK_COLUMNS order
        assert hand.model_validate_json(raw).sink_values() == expected
        assert declared.model_validate_json(raw).sink_values() == expected


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in METRIC_CASES],
                         ids=[c[0] for c in METRIC_CASES])
def test_declared_metric_is_as_strict_as_metric_event_v2(raw: bytes, expected: Any) -> None:
    _same_outcome(MetricEventV2, METRIC_DECLARED, raw, expected)


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in ORDER_CASES],
                         ids=[c[0] for c in ORDER_CASES])
def test_declared_order_is_as_strict_as_order_created_v1(raw: bytes, expected: Any) -> None:
    _same_outcome(OrderCreatedV1, ORDER_DECLARED, raw, expected)


# --------------------------------------------------------------------------- every type


def outcome(model: type[Contract], value_literal: str) -> Any:
    """The sink value of ``v`` for a payload whose ``v`` is the JSON ``value_literal``,
    or the error types of the rejection."""
    raw = b'{"event_id": "e", "v": ' + value_literal.encode() + b"}"
    try:
        return model.model_validate_json(raw).sink_values()[1]
    except ValidationError as exc:
        error = classify(raw, exc)
        assert isinstance(error, ContractViolation), error.detail
        return {e["type"] for e in exc.errors()}


INTEGER_CASES = [
    # the width's edges, both sides
    ("smallint", "32767", 32767),
    ("smallint", "32768", {"less_than_equal"}),
    ("smallint", "-32768", -32768),
    ("smallint", "-32769", {"greater_than_equal"}),
    ("integer", "2147483647", 2147483647),
    ("integer", "2147483648", {"less_than_equal"}),
    ("integer", "-2147483648", -2147483648),
    ("integer", "-2147483649", {"greater_than_equal"}),
    ("bigint", "9223372036854775807", 9223372036854775807),
    ("bigint", "9223372036854775808", {"less_than_equal"}),
    ("bigint", "-9223372036854775808", -9223372036854775808),
    ("bigint", "-9223372036854775809", {"greater_than_equal"}),
    # a 400-digit integer is no bigint (and no crash)
    ("bigint", "1" + "0" * 400, {"less_than_equal"}),
    # strict: a string, a bool and a float are not ints
    ("integer", '"2"', {"int_type"}),
    ("integer", "true", {"int_type"}),
    ("integer", "2.0", {"int_type"}),
]


@pytest.mark.parametrize(("kind", "literal", "expected"), INTEGER_CASES)
def test_integers_are_bounded_by_their_width(kind: str, literal: str, expected: Any) -> None:
    assert outcome(one_field({"type": kind}), literal) == expected


@pytest.mark.parametrize(
    ("kind", "ddl", "travel"),
    [("smallint", "smallint", "int2"), ("integer", "integer", "int4"),
     ("bigint", "bigint", "int8")],
)
def test_integer_columns(kind: str, ddl: str, travel: str) -> None:
    assert contract_columns(one_field({"type": kind}))[1] == Column("v", ddl, travel, False)


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("0", 0), ("100", 100), ("-1", {"greater_than_equal"}), ("101", {"less_than_equal"})],
)
def test_ge_le_narrow_an_integer(literal: str, expected: Any) -> None:
    assert outcome(one_field({"type": "smallint", "ge": 0, "le": 100}), literal) == expected


def test_ge_le_wider_than_the_width_stay_inside_it() -> None:
    # le above smallint's top: the column still cannot hold 32768
    model = one_field({"type": "smallint", "ge": -(10**9), "le": 10**9})
    assert outcome(model, "32767") == 32767
    assert outcome(model, "32768") == {"less_than_equal"}
    assert outcome(model, "-32769") == {"greater_than_equal"}


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("1", {"greater_than_equal"}), ("2", 2), ("3", 3), ("4", {"less_than_equal"})],
)
def test_fractional_ge_le_of_an_integer_are_its_whole_numbers_inside(literal: str,
                                                                     expected: Any) -> None:
    # an integer validator takes no fractional bound: 1.5..3.5 is 2..3
    assert outcome(one_field({"type": "integer", "ge": 1.5, "le": 3.5}), literal) == expected


def test_ge_le_that_leave_no_value_are_a_load_error_naming_the_field() -> None:
    # smallint tops out at 32767: ge 40000 leaves nothing
    message = load_error({"contracts": {"gauge": {"fields": {
        "reading": {"type": "smallint", "ge": 40000}}}},
        "pipelines": {}})
    assert "contracts.gauge" in message and "no smallint value" in message
    assert "reading" in message, (
        f"the load error does not name the field whose bounds leave no value: {message!r}")


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("1.5", 1.5), ("2", 2.0),  # a JSON integer is a float8 value
     ("-0.5", {"greater_than_equal"}),
     ("NaN", {"finite_number"}), ("Infinity", {"finite_number"}),
     ("1e400", {"finite_number"}),  # overflows to inf
     ('"1.5"', {"float_type"}), ("true", {"float_type"})],
)
def test_float(literal: str, expected: Any) -> None:
    model = one_field({"type": "float", "ge": 0})
    assert contract_columns(model)[1] == Column("v", "double precision", "float8", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [('"123.45"', Decimal("123.45")),
     ("1.5", Decimal("1.5")),
     ('"-999.99"', Decimal("-999.99")),
     ('"1.234"', {"decimal_max_places"}),  # a third place in numeric(5,2)
     ('"1234.5"', {"decimal_whole_digits"}),  # four digits before the point: 3 at most
     ('"NaN"', {"finite_number"}),
     ('"Infinity"', {"finite_number"}),
     ("true", {"decimal_type"})],
)
def test_numeric(literal: str, expected: Any) -> None:
    model = one_field({"type": "numeric", "precision": 5, "scale": 2})
    assert contract_columns(model)[1] == Column("v", "numeric(5,2)", "numeric", False)
    assert outcome(model, literal) == expected


def test_numeric_scale_defaults_to_zero() -> None:
    model = one_field({"type": "numeric", "precision": 3})
    assert contract_columns(model)[1].ddl == "numeric(3,0)"
    assert outcome(model, "999") == Decimal(999)
    assert outcome(model, '"1.5"') == {"decimal_max_places"}


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("true", True), ("false", False),
     # strict: 1 is not true, nor is "true"
     ("1", {"bool_type"}), ("0", {"bool_type"}), ('"true"', {"bool_type"})],
)
def test_boolean_is_strict(literal: str, expected: Any) -> None:
    model = one_field({"type": "boolean"})
    assert contract_columns(model)[1] == Column("v", "boolean", "bool", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [('"2026-01-01T00:00:00Z"', datetime(2026, 1, 1, tzinfo=UTC)),
     ('"2026-01-01T02:00:00+02:00"', datetime(2026, 1, 1, tzinfo=UTC)),
     ('"2026-01-01T00:00:00"', {"timezone_aware"}),  # naive: which zone?
     ("1767225600", {"datetime_type"}),  # an epoch is not ISO-8601
     ('"not a time"', {"datetime_parsing"})],
)
def test_timestamptz_iso8601(literal: str, expected: Any) -> None:
    model = one_field({"type": "timestamptz"})
    assert contract_columns(model)[1] == Column("v", "timestamp with time zone",
                                                "timestamptz", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    # the value travels as a binary timestamptz: microseconds since 2000-01-01
    [("1767225600.5", 820_540_800_500_000), ("0", -946_684_800_000_000),
     ("253402300799", 252_455_615_999_000_000),  # 9999-12-31T23:59:59Z
     ("253402300799.5", 252_455_615_999_500_000),  # 9999-12-31T23:59:59.5Z
     # the last double below 10000-01-01 (a 2**-15 s step): 9999-12-31T23:59:59.999968Z
     ("253402300799.99997", 252_455_615_999_999_968),
     ("253402300800", {"less_than"}),  # 10000-01-01T00:00:00Z
     ("-1", {"greater_than_equal"}),
     ('"2026-01-01T00:00:00Z"', {"float_type"}),
     ("NaN", {"finite_number"})],
)
def test_timestamptz_epoch_seconds(literal: str, expected: Any) -> None:
    model = one_field({"type": "timestamptz", "encoding": "epoch_seconds"})
    # the number is converted into the timestamptz it travels as
    assert contract_columns(model)[1] == Column("v", "timestamp with time zone", "float8",
                                                False, seconds_to_pg)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("1767225600123", 820_540_800_123_000), ("0", -946_684_800_000_000),
     ("253402300799000", 252_455_615_999_000_000),  # 9999-12-31T23:59:59Z
     # the rest of that second: a bound on its start refused these 999 milliseconds
     ("253402300799001", 252_455_615_999_001_000),  # 9999-12-31T23:59:59.001Z
     ("253402300799999", 252_455_615_999_999_000),  # 9999-12-31T23:59:59.999Z
     ("253402300800000", {"less_than_equal"}),  # 10000-01-01T00:00:00.000Z
     ("-1", {"greater_than_equal"}),
     ("1767225600123.5", {"int_type"}),  # milliseconds are whole
     ('"1767225600123"', {"int_type"})],
)
def test_timestamptz_epoch_millis(literal: str, expected: Any) -> None:
    model = one_field({"type": "timestamptz", "encoding": "epoch_millis"})
    assert contract_columns(model)[1] == Column("v", "timestamp with time zone", "int8",
                                                False, millis_to_pg)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [('"2026-02-28"', date(2026, 2, 28)),
     ('"2026-02-29"', {"date_parsing"}),  # not a leap year
     ('"2026-01-01T10:00:00Z"', {"date_parsing"}),  # a time is not a date
     ('"2026-01-01T00:00:00Z"', {"date_parsing"}),  # not even midnight
     ("20260101", {"date_type"})],
)
def test_date(literal: str, expected: Any) -> None:
    model = one_field({"type": "date"})
    assert contract_columns(model)[1] == Column("v", "date", "date", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [('"12345678-1234-5678-1234-567812345678"', UUID("12345678-1234-5678-1234-567812345678")),
     ('"12345678123456781234567812345678"', UUID("12345678-1234-5678-1234-567812345678")),
     ('"not-a-uuid"', {"uuid_parsing"}),
     ("5", {"uuid_type"})],
)
def test_uuid(literal: str, expected: Any) -> None:
    model = one_field({"type": "uuid"})
    assert contract_columns(model)[1] == Column("v", "uuid", "uuid", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    ("literal", "expected"),
    [('{"a": [1, {"b": null}]}', {"a": [1, {"b": None}]}),
     ('[1, "x"]', [1, "x"]),
     # a scalar, even a JSON string holding an object, is not a document
     ('"{}"', {"dict_type", "list_type"}),
     ("1", {"dict_type", "list_type"}),
     ("null", {"dict_type", "list_type"})],
)
def test_jsonb_takes_objects_and_arrays(literal: str, expected: Any) -> None:
    model = one_field({"type": "jsonb"})
    assert contract_columns(model)[1] == Column("v", "jsonb", "jsonb", False)
    assert outcome(model, literal) == expected


@pytest.mark.parametrize(
    "literal",
    [
        # Postgres' jsonb has no NaN or Infinity (json.dumps would send the bare word)
        '{"reading": NaN}',
        '[1, Infinity]',
        '{"reading": 1e400}',  # parsed as inf
        # nor \u0000 ("unsupported Unicode escape sequence")
        '{"note": "a\\u0000b"}',
    ],
)
def test_jsonb_refuses_what_postgres_jsonb_cannot_hold(literal: str) -> None:
    result = outcome(one_field({"type": "jsonb"}), literal)
    assert isinstance(result, set), (
        f"jsonb let {literal} through as {result!r}: Postgres rejects it at COPY time, "
        "failing the whole chunk (then bisected to rejected_by_database) instead of a "
        "contract_violation")


@pytest.mark.parametrize(
    ("literal", "expected"),
    [("[]", []),
     ('["abc", "d"]', ["abc", "d"]),
     ('["a", "b", "c"]', {"too_long"}),  # max_items 2
     ('["abcd"]', {"string_too_long"}),  # an item over max_length 3
     ('[""]', {"string_too_short"}),
     ('["a\\u0000"]', {"string_pattern_mismatch"}),
     ('"abc"', {"list_type"}),  # a string is not an array of one
     ("[1]", {"string_type"})],
)
def test_array_of_text(literal: str, expected: Any) -> None:
    model = one_field({"type": "array", "items": {"type": "text", "max_length": 3},
                       "max_items": 2})
    assert contract_columns(model)[1] == Column("v", "text[]", "text[]", False)
    assert outcome(model, literal) == expected


def test_array_items_are_as_strict_as_fields() -> None:
    ints = one_field({"type": "array", "items": {"type": "smallint"}})
    assert contract_columns(ints)[1] == Column("v", "smallint[]", "int2[]", False)
    assert outcome(ints, "[1, 32767]") == [1, 32767]
    assert outcome(ints, "[32768]") == {"less_than_equal"}
    assert outcome(ints, '["1"]') == {"int_type"}
    floats = one_field({"type": "array", "items": {"type": "float"}})
    assert outcome(floats, "[1.0, NaN]") == {"finite_number"}


# --------------------------------------------------------------------------- defaults


DEFAULTS = contracts("""
reading_defaults:
  fields:
    status: {type: text, max_length: 8, default: OK}
    tags:   {type: array, items: {type: text, max_length: 8}, default: []}
    note:   {type: text, max_length: 8, default: null}
    level:  {type: smallint, default: 3}
""")["reading_defaults.v1"]


def test_defaults_fill_missing_fields_and_set_nullability() -> None:
    event = DEFAULTS.model_validate_json(b'{"event_id": "e"}')
    assert event.sink_values() == ("e", "OK", [], None, 3)
    # a default other than null keeps the column NOT NULL; null makes it nullable
    assert [c.nullable for c in contract_columns(DEFAULTS)] == [False, False, False, True,
                                                                False]
    given = DEFAULTS.model_validate_json(
        b'{"event_id": "e", "status": "WARN", "tags": ["x"], "note": "n", "level": 4}')
    assert given.sink_values() == ("e", "WARN", ["x"], "n", 4)


@pytest.mark.parametrize(
    "field",
    [
        {"type": "integer", "default": "three"},  # not an integer
        {"type": "smallint", "default": 40000},  # past the width
        {"type": "text", "max_length": 2, "default": "toolong"},  # past max_length
        {"type": "text", "max_length": 8, "default": ""},  # empty text
        {"type": "boolean", "default": 1},  # strict: 1 is not true
        {"type": "float", "default": float("nan")},  # YAML's .nan
    ],
    ids=["string_for_integer", "past_smallint", "too_long", "empty", "int_for_bool", "nan"],
)
def test_a_bad_default_is_a_load_error(field: dict[str, Any]) -> None:
    document = {"contracts": {"bad_default": {"fields": {"level": field}}}, "pipelines": {}}
    try:
        parse_pipelines(document, source="test.yaml")
        message = None
    except ValueError as exc:
        message = str(exc)
    assert message is not None, (
        f"default {field['default']!r} of a {field['type']} field loaded: every payload "
        "without the field is dead-lettered instead")
    assert "contracts.bad_default" in message and "level" in message, message


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        # YAML has no decimal: a numeric default is written as an int, a float or a string
        ("{type: numeric, precision: 5, scale: 2, default: 0}", Decimal(0)),
        ('{type: numeric, precision: 5, scale: 2, default: "1.50"}', Decimal("1.50")),
        # quoted: a string, as a payload would carry it
        ('{type: date, default: "2026-01-01"}', date(2026, 1, 1)),
        ('{type: timestamptz, default: "2026-01-01T00:00:00Z"}',
         datetime(2026, 1, 1, tzinfo=UTC)),
        ('{type: uuid, default: "12345678-1234-5678-1234-567812345678"}',
         UUID("12345678-1234-5678-1234-567812345678")),
    ],
    ids=["numeric_int", "numeric_string", "date_string", "timestamptz_string", "uuid_string"],
)
def test_a_default_spelled_as_yaml_can_spell_it_fills_the_field(field: str,
                                                               expected: Any) -> None:
    model = contracts(f"good_default:\n  fields:\n    at: {field}\n")["good_default.v1"]
    try:
        values: Any = model.model_validate_json(b'{"event_id": "e"}').sink_values()
    except ValidationError as exc:
        values = exc.errors()[0]["msg"]
    assert values == ("e", expected), (
        f"the default of {field} loaded but fails every payload that lacks the field "
        f"(validated in strict Python mode, where a string is no {type(expected).__name__}): "
        f"{values}")


# --------------------------------------------------------------------------- versions


VERSIONED = contracts("""
account_event:
  version: 2
  fields:
    account: {type: text, max_length: 16}
    nickName: {type: text, max_length: 16, column: nick_name, since: 2, required: false}
""")
ACCOUNT_V1, ACCOUNT_V2 = VERSIONED["account_event.v1"], VERSIONED["account_event.v2"]


def test_each_version_is_a_model_and_v1_lacks_the_later_field() -> None:
    assert (ACCOUNT_V1.VERSION, ACCOUNT_V2.VERSION) == (1, 2)
    assert ACCOUNT_V1.SINK_COLUMNS == (("event_id", "text"), ("account", "text"))
    assert ACCOUNT_V2.SINK_COLUMNS == (("event_id", "text"), ("account", "text"),
                                       ("nick_name", "text"))
    assert "nick_name" not in ACCOUNT_V1.model_fields
    # a v1 payload that carries the v2 field anyway: ignored by v1, like any extra key
    event = ACCOUNT_V1.model_validate_json(b'{"event_id": "e", "account": "a", '
                                           b'"nickName": "n"}')
    assert event.sink_values() == ("e", "a")


def test_v2_accepts_v1_payloads_and_v1_refuses_v2_as_unknown_version() -> None:
    v1_payload = b'{"event_id": "e", "account": "a", "version": 1}'
    assert ACCOUNT_V2.model_validate_json(v1_payload).sink_values() == ("e", "a", None)
    v2_payload = b'{"event_id": "e", "account": "a", "version": 2, "nickName": "n"}'
    assert ACCOUNT_V2.model_validate_json(v2_payload).sink_values() == ("e", "a", "n")
    error = rejection(ACCOUNT_V1, v2_payload)
    assert (type(error), error.error_class) == (UnknownVersion, "unknown_version")
    error = rejection(ACCOUNT_V2, b'{"event_id": "e", "account": "a", "version": 3}')
    assert (type(error), error.error_class) == (UnknownVersion, "unknown_version")


def test_a_pipeline_pinned_to_version_1_gets_the_v1_model() -> None:
    document = {"contracts": yaml.safe_load(
        "account_event:\n  version: 2\n  fields:\n    account: {type: text, max_length: 16}\n"
        "    nick: {type: text, max_length: 16, since: 2, required: false}\n"),
        "pipelines": {"old": {"topic": "acc", "table": "accounts", "dlq_topic": "acc-dlq",
                              "contract": {"event_type": "account_event", "version": 1}}}}
    pipeline = parse_pipelines(document, source="test.yaml")["old"]
    assert pipeline.model.key() == "account_event.v1"
    assert pipeline.column_names == ("event_id", "account")


def test_column_renames_a_payload_key() -> None:
    # the payload says nickName, the table nick_name; the column's name is not read
    assert [c.name for c in contract_columns(ACCOUNT_V2)] == ["event_id", "account",
                                                              "nick_name"]
    by_key = ACCOUNT_V2.model_validate_json(b'{"event_id": "e", "account": "a", '
                                            b'"nickName": "n"}')
    by_column = ACCOUNT_V2.model_validate_json(b'{"event_id": "e", "account": "a", '
                                               b'"nick_name": "n"}')
    assert (by_key.sink_values(), by_column.sink_values()) == (("e", "a", "n"),
                                                               ("e", "a", None))
    # a violation names the payload's key, what the producer can find
    error = rejection(ACCOUNT_V2, b'{"event_id": "e", "account": "a", "nickName": 7}')
    assert error.detail.startswith("nickName: "), error.detail


# --------------------------------------------------------------------------- load errors


def _contract(fields: dict[str, Any], *, version: int = 1) -> dict[str, Any]:
    return {"contracts": {"ledger_entry": {"version": version, "fields": fields}},
            "pipelines": {}}


LOAD_ERRORS = [
    # a typo in a field's key
    ("unknown_key", _contract({"amount": {"type": "text", "max_length": 9, "maxlen": 3}}),
     ["contracts.ledger_entry.fields.amount.maxlen", "unknown key"]),
    ("unknown_type", _contract({"amount": {"type": "varchar"}}),
     ["contracts.ledger_entry.fields.amount.type"]),
    # a key of another type
    ("max_length_on_int", _contract({"amount": {"type": "bigint", "max_length": 3}}),
     ["contracts.ledger_entry.fields.amount", "'max_length' does not apply"]),
    # every text column is bounded
    ("text_without_max_length", _contract({"memo": {"type": "text"}}),
     ["contracts.ledger_entry.fields.memo", "needs max_length"]),
    ("numeric_without_precision", _contract({"amount": {"type": "numeric"}}),
     ["contracts.ledger_entry.fields.amount", "needs precision"]),
    ("scale_over_precision", _contract({"amount": {"type": "numeric", "precision": 3,
                                                   "scale": 4}}),
     ["contracts.ledger_entry.fields.amount", "at most precision"]),
    # nested structure belongs in jsonb
    ("array_of_arrays", _contract({"grid": {"type": "array", "items": {
        "type": "array", "items": {"type": "integer"}}}}),
     ["contracts.ledger_entry.fields.grid", "not an array or jsonb"]),
    ("array_without_items", _contract({"grid": {"type": "array"}}),
     ["contracts.ledger_entry.fields.grid", "an array needs items"]),
    # every table has source_offset
    ("reserved_column", _contract({"source_offset": {"type": "bigint"}}),
     ["contracts.ledger_entry", "'source_offset'", "reserved"]),
    ("reserved_by_rename", _contract({"offset": {"type": "bigint", "column": "event_id"}}),
     ["contracts.ledger_entry", "'offset'", "'event_id' is reserved"]),
    # every table has the system columns: CREATE TABLE would fail with 42701
    ("system_column", _contract({"xmin": {"type": "bigint"}}),
     ["contracts.ledger_entry", "field 'xmin'", "name of a Postgres system column",
      "give it another with 'column'"]),
    ("system_column_by_rename", _contract({"rowId": {"type": "text", "max_length": 9,
                                                     "column": "ctid"}}),
     ["contracts.ledger_entry", "field 'rowId'", "column 'ctid' is the name of a Postgres"]),
    *((f"system_column_{name}", _contract({name: {"type": "bigint"}}),
       [f"column {name!r} is the name of a Postgres system column"])
      for name in ("tableoid", "cmin", "xmax", "cmax")),
    # bounds that admit no value: every record would be dead-lettered
    ("float_ge_over_le", _contract({"ratio": {"type": "float", "ge": 2.5, "le": 1}}),
     ["contracts.ledger_entry.fields.ratio", "ge 2.5 and le 1 leave no float value"]),
    ("float_ge_infinity", _contract({"ratio": {"type": "float", "ge": float("inf")}}),
     ["contracts.ledger_entry.fields.ratio", "infinity leaves no finite value"]),
    ("float_le_nan", _contract({"ratio": {"type": "float", "le": float("nan")}}),
     ["contracts.ledger_entry.fields.ratio", "le is NaN"]),
    ("numeric_ge_over_le", _contract({"amount": {"type": "numeric", "precision": 8,
                                                 "scale": 2, "ge": 10, "le": 5}}),
     ["contracts.ledger_entry.fields.amount", "ge 10 and le 5 leave no numeric value of "
      "numeric(8,2)"]),
    # numeric(4,2) holds at most 99.99
    ("numeric_ge_past_precision", _contract({"amount": {"type": "numeric", "precision": 4,
                                                        "scale": 2, "ge": 100}}),
     ["contracts.ledger_entry.fields.amount", "ge 100 leave no numeric value"]),
    # no whole number between 0.2 and 0.8
    ("numeric_between_steps", _contract({"amount": {"type": "numeric", "precision": 4,
                                                    "scale": 0, "ge": 0.2, "le": 0.8}}),
     ["contracts.ledger_entry.fields.amount", "leave no numeric value of numeric(4,0)"]),
    ("integer_between_steps", _contract({"count": {"type": "integer", "ge": 1.2,
                                                   "le": 1.8}}),
     ["contracts.ledger_entry.fields.count", "leave no integer value"]),
    ("min_length_over_max_length", _contract({"memo": {"type": "text", "max_length": 3,
                                                       "min_length": 4}}),
     ["contracts.ledger_entry.fields.memo", "min_length 4 is over max_length 3"]),
    ("array_items_admit_nothing", _contract({"tags": {"type": "array", "items": {
        "type": "text", "max_length": 2, "min_length": 3}}}),
     ["contracts.ledger_entry.fields.tags.items", "min_length 3 is over max_length 2"]),
    ("two_fields_one_column", _contract({"amount": {"type": "bigint"},
                                         "amountCents": {"type": "bigint",
                                                         "column": "amount"}}),
     ["contracts.ledger_entry", "'amount'", "'amountCents'", "both make column"]),
    # a payload key that is no column name needs a column
    ("not_a_column_name", _contract({"amountCents": {"type": "bigint"}}),
     ["contracts.ledger_entry", "'amountCents'", "give it one with 'column'"]),
    # older payloads lack a later field: it cannot be required
    ("required_since_2", _contract({"amount": {"type": "bigint"},
                                    "memo": {"type": "text", "max_length": 9, "since": 2}},
                                   version=2),
     ["contracts.ledger_entry", "'memo'", "must be optional"]),
    ("since_after_version", _contract({"memo": {"type": "text", "max_length": 9, "since": 2,
                                                "required": False}}),
     ["contracts.ledger_entry", "'memo'", "after the contract's version 1"]),
    ("default_and_required", _contract({"amount": {"type": "bigint", "default": 0,
                                                   "required": True}}),
     ["contracts.ledger_entry.fields.amount", "drop 'required: true'"]),
    ("no_fields", _contract({}), ["contracts.ledger_entry", "at least one field"]),
    # a declared event type may not shadow a hand-written one
    ("shadows_python", {"contracts": {"metric_event": {"fields": {"x": {"type": "bigint"}}}},
                        "pipelines": {}},
     ["metric_event.v1", "written in Python"]),
    ("bad_event_type", {"contracts": {"Ledger": {"fields": {"x": {"type": "bigint"}}}},
                        "pipelines": {}},
     ["contracts.Ledger", "lower case"]),
]


@pytest.mark.parametrize(("document", "needles"), [c[1:] for c in LOAD_ERRORS],
                         ids=[c[0] for c in LOAD_ERRORS])
def test_load_errors_name_the_contract_and_the_key(document: dict[str, Any],
                                                    needles: list[str]) -> None:
    message = load_error(document)
    for needle in needles:
        assert needle in message, message


@pytest.mark.parametrize("field", [
    {"type": "float", "ge": 1.5, "le": 1.5},  # one value
    {"type": "numeric", "precision": 4, "scale": 2, "ge": 99.99},  # numeric(4,2)'s top
    {"type": "numeric", "precision": 4, "scale": 1, "ge": 0.1, "le": 0.1},  # one step
    {"type": "integer", "ge": 1.5, "le": 2},  # 2
    {"type": "integer", "ge": float("-inf"), "le": 3},  # -inf leaves every low value
    {"type": "text", "max_length": 3, "min_length": 3},  # three characters exactly
    {"type": "text", "max_length": 3, "min_length": 0},  # the empty string too
    # the oid column: a system column until Postgres 12 only
    {"type": "bigint", "column": "oid"},
])
def test_constraints_that_admit_a_value_load(field: dict[str, Any]) -> None:
    assert one_field(field).model_fields["oid" if "column" in field else "v"] is not None


def test_a_pipeline_naming_an_undeclared_version_is_a_load_error() -> None:
    document = {**_contract({"amount": {"type": "bigint"}}),
                "pipelines": {"p": {"topic": "t", "table": "t", "dlq_topic": "t-dlq",
                                    "contract": {"event_type": "ledger_entry",
                                                 "version": 2}}}}
    message = load_error(document)
    assert "pipelines.p" in message and "ledger_entry.v2" in message


# --------------------------------------------------------------------------- workers

PIPELINES_FILE = """
contracts:
  sensor_sample:
    version: 2
    fields:
      sensor: {type: text, max_length: 16}
      takenAt: {type: timestamptz, encoding: epoch_millis, column: taken_at}
      reading: {type: numeric, precision: 6, scale: 2}
      flags: {type: array, items: {type: smallint}, max_items: 4, default: []}
      site: {type: text, max_length: 8, since: 2, required: false}
pipelines:
  samples:
    topic: sensor-samples
    contract: {event_type: sensor_sample, version: 2}
    table: sensor_samples
    dlq_topic: sensor-samples-dlq
"""

# Runs in a fresh interpreter: nothing of this process' declared models exists there.
UNPICKLE = """
import json, pickle, sys
pipeline = pickle.loads(sys.stdin.buffer.read())
model = pipeline.model
fields = {name: [f.alias, f.is_required()] for name, f in model.model_fields.items()}
out = {"class": model.__name__, "key": model.key(), "declared": model.DECLARATION is not None,
       "fields": fields, "sink_columns": model.SINK_COLUMNS,
       "staged": {c: [t, f.__name__] for c, (t, f) in model.CONVERTED.items()},
       "columns": pipeline.column_names}
for payload in sys.argv[1:]:
    try:
        out.setdefault("rows", []).append(
            [str(v) for v in model.model_validate_json(payload).sink_values()])
    except Exception as exc:
        out.setdefault("rows", []).append(type(exc).__name__)
print(json.dumps(out))
"""


def in_a_fresh_process(pipeline: Pipeline, *payloads: bytes) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", UNPICKLE, *map(bytes.decode, payloads)],
                          input=pickle.dumps(pipeline), capture_output=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_a_pipeline_with_a_declared_contract_survives_pickling_into_a_worker() -> None:
    pipeline = parse_pipelines(yaml.safe_load(PIPELINES_FILE), source="test.yaml")["samples"]
    good = (b'{"event_id": "e", "sensor": "s1", "takenAt": 1767225600123, '
            b'"reading": "12.50", "version": 2, "site": "lab"}')
    poison = b'{"event_id": "e", "sensor": "s1", "takenAt": 1767225600123, "reading": 1e9}'

    found = in_a_fresh_process(pipeline, good, poison)

    assert found == {
        "class": "SensorSampleV2", "key": "sensor_sample.v2", "declared": True,
        "fields": {"event_id": [None, True], "version": [None, False],
                   "sensor": [None, True], "taken_at": ["takenAt", True],
                   "reading": [None, True], "flags": [None, False], "site": [None, False]},
        "sink_columns": [["event_id", "text"], ["sensor", "text"],
                         ["taken_at", "timestamptz"], ["reading", "numeric"],
                         ["flags", "int2[]"], ["site", "text"]],
        "staged": {"taken_at": ["int8", "millis_to_pg"]},
        "columns": ["event_id", "sensor", "taken_at", "reading", "flags", "site"],
        "rows": [["e", "s1", "820540800123000", "12.50", "[]", "lab"], "ValidationError"],
    }
    # and in this process, the same pipeline copied: the same model class
    assert pickle.loads(pickle.dumps(pipeline)).model is pipeline.model  # noqa: S301 (ours)


def test_a_date_default_is_the_same_default_in_a_worker() -> None:
    # YAML reads an unquoted date as a date; the worker gets the declaration as JSON, where
    # it is a string.
    document = yaml.safe_load("""
contracts:
  daily_total:
    fields:
      day: {type: date, default: 2026-01-01}
pipelines:
  totals: {topic: totals, table: totals, dlq_topic: totals-dlq,
           contract: {event_type: daily_total, version: 1}}
""")
    pipeline = parse_pipelines(document, source="test.yaml")["totals"]
    payload = b'{"event_id": "e"}'
    assert pipeline.model.model_validate_json(payload).sink_values() == ("e", date(2026, 1, 1))

    found = in_a_fresh_process(pipeline, payload)

    assert found["rows"] == [["e", "2026-01-01"]], (
        "the parent fills the default, the spawned worker dead-letters the same payload: "
        f"{found['rows']}")
