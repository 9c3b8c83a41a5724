"""Columns from the record itself: its key and its headers, checked like contract fields.

A key or header that cannot fill its column is a dead letter (``bad_key``, ``bad_header``)
that keeps the record's own headers, so a replay can fill the columns once fixed. A
tombstone of a deleting pipeline becomes a delete of its key's row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kafka_ingest.config import KeyFormat, KeyType, Pipeline, RecordKey, parse_pipelines
from kafka_ingest.decode.message_columns import column_reader, key_value
from kafka_ingest.decode.validate import validate_chunk
from kafka_ingest.errors import BadHeader, BadKey
from kafka_ingest.records import Tombstone, row_source, row_values
from tests.support.fakes import Msg

Message = Callable[..., Msg]

BASE: dict[str, Any] = {
    "topic": "readings",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "readings",
    "dlq_topic": "readings-dlq",
}
EVENT = {"event_id": "e-1", "device_id": "dev-1", "timestamp": 1_767_225_600.5,
         "metric_value": 21.5}
VALUE = json.dumps(EVENT).encode()
# MetricEventV2's values for EVENT, in SINK_COLUMNS order (status defaulted, no unit)
# the timestamp 2026-01-01T00:00:00.5Z as it travels: µs since 2000-01-01
EVENT_VALUES = ("e-1", "dev-1", 820_540_800_500_000, 21.5, "OK", None)
# the message fixture's broker timestamp (1_767_225_600_123 ms), as it travels
KAFKA_TS = 820_540_800_123_000


def pipeline(**body: Any) -> Pipeline:
    return parse_pipelines({"pipelines": {"p": {**BASE, **body}}}, source="test.yaml")["p"]


# With a record-key column and two header columns (one required).
KEYED = pipeline(record_key={"column": "entity", "max_length": 8},
                 headers={"trace-id": "trace_id",
                          "tenant": {"column": "tenant", "required": True, "max_length": 4}})
# Latest state by the record key, in log order; a tombstone deletes the key's row.
DELETING = pipeline(record_key={"column": "entity"}, on_tombstone="delete",
                    upsert={"mode": "latest", "key": "entity", "order_by": "source_offset"})
DELETING_BY_ID = pipeline(record_key={"column": "account_id", "format": "json",
                                      "type": "bigint"},
                          on_tombstone="delete",
                          upsert={"mode": "latest", "key": "account_id",
                                  "order_by": "source_offset"})


def string_key(max_length: int = 5) -> RecordKey:
    return RecordKey(column="k", max_length=max_length)


def json_key(*, key_type: KeyType = KeyType.TEXT, field: str | None = None,
             max_length: int = 5) -> RecordKey:
    return RecordKey(column="k", format=KeyFormat.JSON, type=key_type, field=field,
                     max_length=max_length)


# --------------------------------------------------------------------------- record key


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"cust1", "cust1"),
        # five characters in seven bytes: the bound counts characters, as varchar(n) does
        ("clé-ü".encode(), "clé-ü"),
        # the key's bytes as they are: no JSON unquoting
        (b'"ab"', '"ab"'),
    ],
)
def test_a_string_key_is_its_utf8_text(raw: bytes, expected: str) -> None:
    assert key_value(string_key(), raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"ab\xffc", "not UTF-8: byte 0xff at position 2"),
        (b"", "empty"),
        (b"cust12", "6 characters, over its column's 5"),
        (b"a\x00b", "NUL"),
        # no key at all (None, not empty bytes)
        (None, "the record has no key"),
    ],
    ids=["not_utf8", "empty", "too_long", "nul", "missing"],
)
def test_a_bad_string_key_is_bad_key(raw: bytes | None, reason: str) -> None:
    with pytest.raises(BadKey, match=reason) as info:
        key_value(string_key(), raw)
    assert info.value.error_class == "bad_key"


@pytest.mark.parametrize(
    ("spec", "raw", "expected"),
    [
        # a JSON string: unquoted
        (json_key(), b'"ab"', "ab"),
        (json_key(), b'"cl\\u00e9"', "clé"),
        (json_key(key_type=KeyType.BIGINT), b"42", 42),
        (json_key(key_type=KeyType.BIGINT), b"-9223372036854775808", -(2**63)),
        (json_key(key_type=KeyType.BIGINT), b"9223372036854775807", 2**63 - 1),
        # one field of an object key
        (json_key(key_type=KeyType.BIGINT, field="id"), b'{"id": 7, "region": "eu"}', 7),
        (json_key(field="region"), b'{"id": 7, "region": "eu"}', "eu"),
    ],
    ids=["string", "escaped_string", "bigint", "bigint_min", "bigint_max",
         "object_field_bigint", "object_field_text"],
)
def test_a_json_key(spec: RecordKey, raw: bytes, expected: str | int) -> None:
    value = key_value(spec, raw)
    assert (value, type(value)) == (expected, type(expected))


@pytest.mark.parametrize(
    ("spec", "raw", "reason"),
    [
        (json_key(key_type=KeyType.BIGINT), b"9223372036854775808",
         "not an integer a bigint holds"),
        (json_key(key_type=KeyType.BIGINT), b"-9223372036854775809",
         "not an integer a bigint holds"),
        # true is 1 to Python, not to a bigint column
        (json_key(key_type=KeyType.BIGINT), b"true", "not an integer a bigint holds"),
        (json_key(key_type=KeyType.BIGINT), b"42.0", "not an integer a bigint holds"),
        (json_key(key_type=KeyType.BIGINT), b'"42"', "not an integer a bigint holds"),
        # a number is not a text key
        (json_key(), b"42", "not a JSON string"),
        (json_key(), b"null", "not a JSON string"),
        (json_key(), b'""', "empty"),
        (json_key(), b'"abcdef"', "over its column's 5"),
        (json_key(), b'"a\\u0000"', "NUL"),
        (json_key(), b"cust1", "not JSON"),
        (json_key(), b"\xff", "not JSON"),
        (json_key(field="id"), b'{"region": "eu"}', "not a JSON object with the field 'id'"),
        (json_key(field="id"), b'["id"]', "not a JSON object with the field 'id'"),
        (json_key(field="id"), b'{"id": 7}', "record key field 'id' is not a JSON string"),
        (json_key(), None, "the record has no key"),
    ],
    ids=["past_bigint", "below_bigint", "bool_for_bigint", "float_for_bigint",
         "string_for_bigint", "number_for_text", "null", "empty", "too_long", "nul",
         "not_json", "not_utf8", "object_without_field", "array_not_object",
         "field_of_wrong_type", "missing"],
)
def test_a_bad_json_key_is_bad_key(spec: RecordKey, raw: bytes | None, reason: str) -> None:
    with pytest.raises(BadKey, match=reason):
        key_value(spec, raw)


# --------------------------------------------------------------------------- headers


def read_columns(headers: list[tuple[str, bytes | None]] | None,
                 key: bytes | None = b"k") -> tuple[Any, ...]:
    reader = column_reader(KEYED)
    assert reader is not None
    return reader(Msg(0, VALUE, key, headers_=None if headers is None else tuple(headers)))


def test_a_pipeline_without_key_or_header_columns_reads_nothing() -> None:
    assert column_reader(pipeline()) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # record key column, then the headers in the pipeline's order
        ([("tenant", b"acme"), ("trace-id", b"t-1")], ("k", "t-1", "acme")),
        # an optional header missing: NULL
        ([("tenant", b"acme")], ("k", None, "acme")),
        # repeated: the last one wins (Kafka keeps all of them, in order)
        ([("tenant", b"old"), ("trace-id", b"t-1"), ("tenant", b"new")], ("k", "t-1", "new")),
        # other headers are no business of the columns
        ([("tenant", b"acme"), ("other", b"\xff")], ("k", None, "acme")),
    ],
    ids=["present", "optional_missing", "last_wins", "unrelated"],
)
def test_header_columns(headers: list[tuple[str, bytes | None]],
                        expected: tuple[Any, ...]) -> None:
    assert read_columns(headers) == expected


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ([("trace-id", b"t-1")], "header 'tenant' is missing"),
        # names are case-sensitive, as Kafka's are
        ([("Tenant", b"acme")], "header 'tenant' is missing"),
        # a header with a null value is no value
        ([("tenant", None)], "header 'tenant' is missing"),
        (None, "header 'tenant' is missing"),
        ([("tenant", b"ac\xe9")], "header 'tenant' is not UTF-8: byte 0xe9 at position 2"),
        ([("tenant", b"acme!")], "header 'tenant' is 5 characters, over its column's 4"),
        ([("tenant", b"a\x00")], "NUL"),
        # an optional header is checked too when it is there
        ([("tenant", b"acme"), ("trace-id", b"\xff")], "header 'trace-id' is not UTF-8"),
    ],
    ids=["required_missing", "case_differs", "null_value", "no_headers", "not_utf8",
         "too_long", "nul", "optional_not_utf8"],
)
def test_bad_header_columns(headers: list[tuple[str, bytes | None]] | None,
                            reason: str) -> None:
    with pytest.raises(BadHeader, match=reason) as info:
        read_columns(headers)
    assert info.value.error_class == "bad_header"


# --------------------------------------------------------------------------- validate_chunk


def test_rows_carry_key_and_header_values_between_the_contract_and_the_provenance(
        message: Message) -> None:
    msg = message(VALUE, topic_="readings", partition_=2, offset_=41, key_=b"dev-1",
                  headers_=(("tenant", b"acme"), ("trace-id", b"t-1")))

    result = validate_chunk([msg], KEYED)

    assert result.dead == []
    assert KEYED.column_names[-3:] == ("entity", "trace_id", "tenant")
    assert tuple(result.rows[0]) == (*EVENT_VALUES, "dev-1", "t-1", "acme",
                                     "readings", 2, 41, b"dev-1", KAFKA_TS)
    assert row_values(result.rows[0]) == (*EVENT_VALUES, "dev-1", "t-1", "acme")
    assert row_source(result.rows[0]).position == ("readings", 2, 41)


def test_bad_keys_and_headers_are_dead_letters_that_keep_the_record_headers(
        message: Message) -> None:
    good = (("tenant", b"acme"),)
    msgs = [
        message(VALUE, offset_=1, key_=b"dev-1", headers_=good),
        message(VALUE, offset_=2, key_=None, headers_=good),  # no key
        message(VALUE, offset_=3, key_=b"much-too-long", headers_=good),
        message(VALUE, offset_=4, key_=b"dev-1", headers_=(("trace-id", b"t-4"),)),
        message(VALUE, offset_=5, key_=b"dev-1", headers_=(("tenant", b"\xff"),
                                                           ("trace-id", b"t-5"))),
    ]

    result = validate_chunk(msgs, KEYED)

    assert [row_source(row).offset for row in result.rows] == [1]
    assert [(d.source_offset, d.error_class) for d in result.dead] == [
        (2, "bad_key"), (3, "bad_key"), (4, "bad_header"), (5, "bad_header")]
    letters = {d.source_offset: d for d in result.dead}
    assert "no key" in letters[2].error_detail
    assert "header 'tenant' is missing" in letters[4].error_detail
    # the source record's own headers, bytes as they were: a replay refills the columns
    assert letters[2].headers == (("tenant", b"acme"),)
    assert letters[5].headers == (("tenant", b"\xff"), ("trace-id", b"t-5"))
    assert (letters[3].key, letters[3].value) == (b"much-too-long", VALUE)
    assert (result.read, result.tombstones, result.deletes) == (5, 0, [])


def test_a_contract_violation_keeps_the_headers_too(message: Message) -> None:
    bad = json.dumps({**EVENT, "metric_value": "high"}).encode()
    msg = message(bad, key_=b"dev-1", headers_=(("tenant", b"acme"),))
    [letter] = validate_chunk([msg], KEYED).dead
    assert (letter.error_class, letter.headers) == ("contract_violation",
                                                    (("tenant", b"acme"),))


def test_tombstones_of_a_deleting_pipeline_are_deletes(message: Message) -> None:
    msgs = [
        message(VALUE, topic_="readings", partition_=1, offset_=10, key_=b"dev-1"),
        message(None, topic_="readings", partition_=1, offset_=11, key_=b"dev-1"),
        message(None, topic_="readings", partition_=1, offset_=12, key_=b"dev-2"),
    ]

    result = validate_chunk(msgs, DELETING)

    assert result.deletes == [Tombstone("dev-1", "readings", 1, 11),
                              Tombstone("dev-2", "readings", 1, 12)]
    # each tombstone is counted once, as a tombstone: neither a row nor a dead letter
    assert (result.read, len(result.rows), result.dead, result.tombstones) == (3, 1, [], 2)
    assert result.bytes == len(VALUE)


def test_a_tombstone_key_is_read_like_any_key(message: Message) -> None:
    msgs = [message(None, offset_=1, key_=b"42"),
            message(None, offset_=2, key_=b"9223372036854775808")]  # past bigint

    result = validate_chunk(msgs, DELETING_BY_ID)

    assert result.deletes == [Tombstone(42, "source-topic", 0, 1)]
    assert [(d.source_offset, d.error_class) for d in result.dead] == [(2, "bad_key")]
    assert result.tombstones == 1


def test_a_tombstone_without_a_key_cannot_delete_and_is_bad_key(message: Message) -> None:
    msg = message(None, offset_=7, key_=None, headers_=(("trace-id", b"t-7"),))

    result = validate_chunk([msg], DELETING)

    assert (result.deletes, result.tombstones, result.rows) == ([], 0, [])
    [letter] = result.dead
    assert (letter.error_class, letter.source_offset, letter.key, letter.value) == (
        "bad_key", 7, None, None)
    assert letter.headers == (("trace-id", b"t-7"),)


def test_tombstones_of_a_keyed_pipeline_that_skips_them_are_not_read(
        message: Message) -> None:
    # on_tombstone skip (the default): a keyless tombstone is counted, not dead-lettered
    result = validate_chunk([message(None, key_=None)], KEYED)
    assert (result.tombstones, result.dead, result.deletes) == (1, [], [])
