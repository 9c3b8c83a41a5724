"""Contracts are strict: what Postgres would reject never passes validation.

Each case feeds raw JSON bytes to ``model_validate_json`` (the hot path of validation) and,
for failures, checks the data error :func:`kafka_ingest.decode.validate.classify` derives.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from kafka_ingest.contracts import (
    REGISTRY,
    Contract,
    MetricEventV1,
    MetricEventV2,
    OrderCreatedV1,
    get_contract,
    json_schema,
)
from kafka_ingest.contracts.columns import seconds_to_pg
from kafka_ingest.decode.validate import classify
from kafka_ingest.errors import ContractViolation, DataError, UnknownVersion
from tests.support import pg_to_datetime

METRIC: dict[str, Any] = {
    "event_id": "m-1",
    "device_id": "device-0001",
    "timestamp": 1_767_225_600.25,
    "metric_value": 21.5,
    "status": "WARN",
}
ORDER: dict[str, Any] = {
    "event_id": "o-1",
    "order_id": 1_000_001,
    "customer_id": "customer-00042",
    "total": "19.90",
    "timestamp": "2026-01-01T00:00:03Z",
}


def encode(base: dict[str, Any], **changes: Any) -> bytes:
    return json.dumps({**base, **changes}).encode()


def with_literal(base: dict[str, Any], field: str, literal: str) -> bytes:
    """JSON whose ``field`` is a raw literal json.dumps would never write (NaN, 1e400...)."""
    return encode(base, **{field: "@@"}).replace(b'"@@"', literal.encode())


def rejection(model: type[Contract], raw: bytes) -> DataError:
    with pytest.raises(ValidationError) as info:
        model.model_validate_json(raw)
    return classify(raw, info.value)


# --------------------------------------------------------------------------- good events


def test_metric_v1_accepts_a_good_event() -> None:
    event = MetricEventV1.model_validate_json(encode(METRIC))
    assert (event.event_id, event.device_id, event.metric_value, event.status) == (
        "m-1", "device-0001", 21.5, "WARN")
    assert event.version == 1  # absent version means 1
    # the epoch travels as the binary timestamptz it becomes (CONVERTED): microseconds since
    # 2000-01-01, 2026-01-01T00:00:00.25Z here
    assert event.sink_values() == ("m-1", "device-0001", 820_540_800_250_000, 21.5, "WARN")
    assert {"timestamp": ("float8", seconds_to_pg)} == MetricEventV1.CONVERTED
    assert pg_to_datetime(event.sink_values()[2]) == datetime(2026, 1, 1, 0, 0, 0, 250_000,
                                                              tzinfo=UTC)


def test_metric_v2_accepts_v1_and_v2_payloads() -> None:
    v1 = MetricEventV2.model_validate_json(encode(METRIC, version=1))
    v2 = MetricEventV2.model_validate_json(encode(METRIC, version=2, unit="celsius"))
    assert (v1.version, v1.unit) == (1, None)
    assert (v2.version, v2.unit) == (2, "celsius")
    assert v2.sink_values()[-1] == "celsius"
    assert len(v2.sink_values()) == len(MetricEventV2.SINK_COLUMNS)


def test_metric_v1_rejects_version_2_as_unknown_version() -> None:
    error = rejection(MetricEventV1, encode(METRIC, version=2, unit="celsius"))
    assert isinstance(error, UnknownVersion)
    assert "version" in error.detail


def test_order_accepts_a_good_event() -> None:
    event = OrderCreatedV1.model_validate_json(encode(ORDER))
    assert event.total == Decimal("19.90")
    assert event.timestamp == datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)
    assert event.sink_values() == ("o-1", 1_000_001, "customer-00042", Decimal("19.90"),
                                   event.timestamp)


def test_order_accepts_total_as_json_number_and_other_utc_offsets() -> None:
    event = OrderCreatedV1.model_validate_json(
        encode(ORDER, total=19.9, timestamp="2026-01-01T02:00:03+02:00"))
    assert event.total == Decimal("19.9")
    assert event.timestamp == datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)


def test_extra_fields_are_ignored_not_rejected() -> None:
    # Documented choice (contracts/base.py): producers may add fields before the contract
    # learns them; rejecting them would dead-letter good data.
    event = MetricEventV2.model_validate_json(encode(METRIC, unexpected=1, nested={"a": [1]}))
    assert "unexpected" not in event.model_dump()
    assert OrderCreatedV1.model_validate_json(encode(ORDER, coupon="X")).event_id == "o-1"


# --------------------------------------------------------------------------- strictness

METRIC_REJECTS = [
    # a JSON string is not a float, even when it spells one
    ("string_for_float", encode(METRIC, metric_value="21.5"), "metric_value", "float_type"),
    # true is not a number
    ("bool_for_float", encode(METRIC, metric_value=True), "metric_value", "float_type"),
    # NaN cannot be compared or indexed sensibly; Postgres float8 would take it, we do not
    ("nan", with_literal(METRIC, "metric_value", "NaN"), "metric_value", "finite_number"),
    # Infinity: same
    ("infinity", with_literal(METRIC, "metric_value", "Infinity"), "metric_value",
     "finite_number"),
    # 1e400 overflows a double to inf
    ("overflow_float", with_literal(METRIC, "metric_value", "1e400"), "metric_value",
     "finite_number"),
    # a 400-digit integer is no float8 either
    ("huge_int_for_float", with_literal(METRIC, "metric_value", "1" + "0" * 400),
     "metric_value", "finite_number"),
    # an epoch past year 9999 cannot become a timestamptz
    ("epoch_too_big", encode(METRIC, timestamp=1e20), "timestamp", "less_than"),
    # 10000-01-01T00:00:00Z: the first instant past 9999's last second
    ("epoch_year_10000", encode(METRIC, timestamp=253_402_300_800), "timestamp", "less_than"),
    # a negative epoch is refused by the contract
    ("epoch_negative", encode(METRIC, timestamp=-1.0), "timestamp", "greater_than_equal"),
    # Postgres text cannot hold NUL
    ("nul_in_text", encode(METRIC, device_id="a\x00b"), "device_id",
     "string_pattern_mismatch"),
    # a number is not a string
    ("int_for_text", encode(METRIC, device_id=7), "device_id", "string_type"),
    # null is not the default
    ("null_status", encode(METRIC, status=None), "status", "string_type"),
    # the key column must not be empty
    ("event_id_empty", encode(METRIC, event_id=""), "event_id", "string_too_short"),
    # nor longer than 128 characters
    ("event_id_too_long", encode(METRIC, event_id="e" * 129), "event_id", "string_too_long"),
    # the string "2" is not a version
    ("version_as_string", encode(METRIC, version="2"), "version", "int_type"),
    # nor is true
    ("version_as_bool", encode(METRIC, version=True), "version", "int_type"),
    # a required field is required
    ("missing_field", json.dumps({k: v for k, v in METRIC.items() if k != "device_id"}).encode(),
     "device_id", "missing"),
]


@pytest.mark.parametrize(("raw", "field", "error_type"),
                         [c[1:] for c in METRIC_REJECTS], ids=[c[0] for c in METRIC_REJECTS])
def test_metric_contract_is_strict(raw: bytes, field: str, error_type: str) -> None:
    error = rejection(MetricEventV2, raw)
    assert isinstance(error, ContractViolation)
    assert f"{field}: " in error.detail
    assert f"[{error_type}]" in error.detail


ORDER_REJECTS = [
    # "2" is not an int
    ("string_for_int", encode(ORDER, order_id="2"), "order_id", "int_type"),
    # true is not an int
    ("bool_for_int", encode(ORDER, order_id=True), "order_id", "int_type"),
    # 2.0 is a float, not an int
    ("float_for_int", encode(ORDER, order_id=2.0), "order_id", "int_type"),
    # one past BIGINT
    ("int_past_bigint", encode(ORDER, order_id=2**63), "order_id", "less_than_equal"),
    # a 400-digit integer
    ("int_400_digits", with_literal(ORDER, "order_id", "1" + "0" * 400), "order_id",
     "less_than_equal"),
    # money has two decimal places
    ("three_places", encode(ORDER, total="19.999"), "total", "decimal_max_places"),
    # and at most 12 integer digits
    ("thirteen_digits", encode(ORDER, total="1234567890123.00"), "total",
     "decimal_whole_digits"),
    # a float that is not exactly two places, e.g. 0.1 + 0.2
    ("inexact_float", encode(ORDER, total=0.1 + 0.2), "total", "decimal_max_digits"),
    # negative totals are refused
    ("negative_total", encode(ORDER, total="-1.00"), "total", "greater_than_equal"),
    # "NaN" as a decimal string
    ("nan_total", encode(ORDER, total="NaN"), "total", "finite_number"),
    # "Infinity" as a decimal string
    ("infinite_total", encode(ORDER, total="Infinity"), "total", "finite_number"),
    # a naive timestamp is ambiguous: which zone?
    ("naive_timestamp", encode(ORDER, timestamp="2026-01-01T00:00:03"), "timestamp",
     "timezone_aware"),
    # an epoch number is not ISO-8601
    ("epoch_timestamp", encode(ORDER, timestamp=1_767_225_603), "timestamp", "datetime_type"),
    # nor is free text
    ("text_timestamp", encode(ORDER, timestamp="not-a-date"), "timestamp", "datetime"),
    # NUL in text
    ("nul_in_text", encode(ORDER, customer_id="a\x00b"), "customer_id",
     "string_pattern_mismatch"),
    # customer_id is at most 64 characters
    ("customer_too_long", encode(ORDER, customer_id="c" * 65), "customer_id", "string_too_long"),
]


@pytest.mark.parametrize(("raw", "field", "error_type"),
                         [c[1:] for c in ORDER_REJECTS], ids=[c[0] for c in ORDER_REJECTS])
def test_order_contract_is_strict(raw: bytes, field: str, error_type: str) -> None:
    error = rejection(OrderCreatedV1, raw)
    assert isinstance(error, ContractViolation)
    assert f"{field}: " in error.detail
    assert f"[{error_type}" in error.detail


@pytest.mark.parametrize(("timestamp", "expected"), [
    # 9999-12-31T23:59:59Z, the last second's start
    (253_402_300_799.0, datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
    # half-way through it: a bound on the second's start refused the rest of the second
    (253_402_300_799.5, datetime(9999, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC)),
    # the last double below 253402300800 (a 2**-15 s step), rounded to the microsecond
    (253_402_300_799.99997, datetime(9999, 12, 31, 23, 59, 59, 999_968, tzinfo=UTC)),
])
def test_metric_accepts_the_whole_last_second_of_year_9999(timestamp: float,
                                                            expected: datetime) -> None:
    event = MetricEventV1.model_validate_json(encode(METRIC, timestamp=timestamp))
    assert pg_to_datetime(seconds_to_pg(event.timestamp)) == expected


def test_event_id_of_exactly_128_characters_is_accepted() -> None:
    assert OrderCreatedV1.model_validate_json(encode(ORDER, event_id="e" * 128)).event_id


@pytest.mark.parametrize(
    ("model", "base", "version"),
    [
        (MetricEventV2, METRIC, 99),  # far future version
        (MetricEventV2, METRIC, 3),  # the next version, not yet known
        (MetricEventV1, METRIC, 2),  # a v1 pipeline meets a v2 payload
        (OrderCreatedV1, ORDER, 99),  # orders have only version 1
        (OrderCreatedV1, ORDER, 0),  # versions start at 1
    ],
)
def test_unknown_version_is_a_data_error_not_a_crash(model: type[Contract],
                                                     base: dict[str, Any], version: int) -> None:
    error = rejection(model, encode(base, version=version))
    assert isinstance(error, UnknownVersion)
    assert error.error_class == "unknown_version"


def test_unknown_version_wins_over_other_field_errors() -> None:
    # The version decides which contract applies, so it is the reason a person acts on.
    raw = json.dumps({"event_id": "x", "version": 99}).encode()
    assert isinstance(rejection(MetricEventV2, raw), UnknownVersion)


# --------------------------------------------------------------------------- registry


def test_registry_keys_match_the_models() -> None:
    assert set(REGISTRY) == {"metric_event.v1", "metric_event.v2", "order_created.v1"}
    for key, model in REGISTRY.items():
        assert model.key() == key
        assert get_contract(model.EVENT_TYPE, model.VERSION) is model
        assert model.SINK_COLUMNS[0][0] == "event_id"


@pytest.mark.parametrize(
    ("event_type", "version"),
    [
        ("metric_event", 3),  # a version that is not registered
        ("no_such_event", 1),  # an event type that is not registered
    ],
)
def test_get_contract_names_the_key_and_what_is_registered(event_type: str,
                                                            version: int) -> None:
    with pytest.raises(ValueError, match="unknown contract") as info:
        get_contract(event_type, version)
    message = str(info.value)
    assert f"{event_type}.v{version}" in message
    for key in REGISTRY:
        assert key in message


@pytest.mark.parametrize("key", sorted(REGISTRY))
def test_json_schema_export(key: str) -> None:
    model = REGISTRY[key]
    schema = json_schema(model.EVENT_TYPE, model.VERSION)
    assert schema["$id"] == f"urn:kafka-ingest:contract:{key}"
    assert schema["type"] == "object"
    sink_fields = {c for c, _ in model.SINK_COLUMNS}
    assert sink_fields <= set(schema["properties"])
    assert "event_id" in schema["required"]
    assert "version" not in schema["required"]
    json.dumps(schema)  # serialisable as is, for producers and schema registries
