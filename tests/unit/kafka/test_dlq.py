"""Dead letters: headers, delivery bookkeeping, and parsing them back.

``produce_dead_letters`` is tested here with a recording producer: the unit under test is
our bookkeeping of delivery reports (every report checked, a missing one is a failure),
not Kafka. The real broker path is in tests/integration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_ingest.config import DlqHeaderStyle
from kafka_ingest.errors import DeliveryFailed, KafkaRefused
from kafka_ingest.kafka.dlq import (
    CONNECT,
    DETAIL_MAX,
    PREFIX,
    DeadLetter,
    headers_for,
    parse_dlq_message,
    produce_dead_letters,
)

NATIVE_FIELDS = ["topic", "partition", "offset", "timestamp", "pipeline", "contract",
                 "error_class", "error_detail", "attempts", "first_failed_at"]


def letter(offset: int = 42, **changes: Any) -> DeadLetter:
    base = DeadLetter(
        source_topic="telemetry-metrics",
        source_partition=3,
        source_offset=offset,
        key=b"device-\x00\xff",
        value=b'{"event_id": "x", "metric_value": "12"}',
        timestamp_ms=1_767_225_600_123,
        error_class="contract_violation",
        error_detail="metric_value: Input should be a valid number [float_type]",
        contract="metric_event.v2",
        dlq_topic="telemetry-metrics-dlq",
        attempts=2,
        first_failed_at=datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
    )
    return replace(base, **changes)


# --------------------------------------------------------------------------- headers


# Fields Connect has no header name for; the connect style keeps them under ours.
ONLY_NATIVE = [f for f in NATIVE_FIELDS if f not in CONNECT]


@pytest.mark.parametrize(
    ("style", "native", "connect"),
    [
        (DlqHeaderStyle.NATIVE, True, False),  # only kafka-ingest.* names
        (DlqHeaderStyle.CONNECT, False, True),  # __connect.errors.* (+ ours Connect lacks)
        (DlqHeaderStyle.BOTH, True, True),  # both sets, for both kinds of tools
    ],
)
def test_headers_for_each_style(style: DlqHeaderStyle, native: bool, connect: bool) -> None:
    headers = headers_for(letter(), "telemetry_metrics", style)
    keys = [k for k, _ in headers]
    for k, v in headers:
        assert isinstance(k, str)
        assert k.isascii()
        assert isinstance(v, bytes)
    assert len(keys) == len(set(keys))
    assert ({PREFIX + f for f in NATIVE_FIELDS} <= set(keys)) is native
    assert (set(CONNECT.values()) <= set(keys)) is connect
    assert {PREFIX + f for f in ONLY_NATIVE} <= set(keys)  # every style keeps these
    h = dict(headers)
    assert h[PREFIX + "timestamp"] == b"1767225600123"
    assert h[PREFIX + "contract"] == b"metric_event.v2"
    assert h[PREFIX + "attempts"] == b"2"
    assert h[PREFIX + "first_failed_at"] == b"2026-01-02T03:04:05.678000+00:00"
    if native:
        assert h[PREFIX + "offset"] == b"42"
        assert h[PREFIX + "error_class"] == b"contract_violation"
    if connect:
        assert h["__connect.errors.topic"] == b"telemetry-metrics"
        assert h["__connect.errors.partition"] == b"3"
        assert h["__connect.errors.exception.class.name"] == b"contract_violation"
        assert h["__connect.errors.connector.name"] == b"telemetry_metrics"
        assert h["__connect.errors.stage"] == b"VALUE_CONVERTER"


def test_nul_and_non_ascii_in_details_survive_as_bytes() -> None:
    detail = "device_id: 'a\x00b' — café 🚀, lone \udc80"
    h = dict(headers_for(letter(error_detail=detail), "p", DlqHeaderStyle.BOTH))
    expected = detail.encode("utf-8", "backslashreplace")
    assert h[PREFIX + "error_detail"] == expected
    assert h["__connect.errors.exception.message"] == expected
    assert b"a\x00b" in expected
    assert "café 🚀".encode() in expected
    assert b"\\udc80" in expected  # a lone surrogate cannot be UTF-8: escaped, not a crash


def test_details_are_truncated() -> None:
    h = dict(headers_for(letter(error_detail="x" * (DETAIL_MAX + 500)), "p",
                         DlqHeaderStyle.NATIVE))
    assert h[PREFIX + "error_detail"] == b"x" * DETAIL_MAX


@pytest.mark.parametrize("style", list(DlqHeaderStyle))
def test_truncation_header(style: DlqHeaderStyle) -> None:
    h = dict(headers_for(letter(), "p", style, truncated_from=2_000_000))
    assert h[PREFIX + "value.truncated"] == b"2000000"
    assert PREFIX + "value.truncated" not in dict(headers_for(letter(), "p", style))


def test_a_missing_timestamp_is_an_empty_header() -> None:
    h = dict(headers_for(letter(timestamp_ms=None), "p", DlqHeaderStyle.NATIVE))
    assert h[PREFIX + "timestamp"] == b""


# --------------------------------------------------------------------------- produce


@dataclass
class Report:
    """What confluent-kafka passes to ``on_delivery``: an error (or None) and a message."""

    partition_: int
    offset_: int

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_


@dataclass
class RecordingProducer:
    """Records produce() calls; flush() fires the delivery callbacks ``outcome`` decides.

    ``outcome(i)`` returns ``(err, msg)`` for the i-th record, or ``None`` to never fire
    its callback (the "flush returned 0 but no report" case).
    """

    outcome: Callable[[int], tuple[Any, Any] | None]
    produced: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.produced.append({"topic": topic, **kwargs})

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0

    def flush(self, timeout: float) -> int:
        for i, record in enumerate(self.produced):
            report = self.outcome(i)
            if report is not None:
                record["on_delivery"](*report)
        return 0


def delivered(i: int) -> tuple[Any, Any]:
    return (None, Report(i % 2, 1000 + i))


def test_all_reports_ok_returns_locations_in_order() -> None:
    letters = [letter(offset=o) for o in (7, 8, 9)]
    producer = RecordingProducer(delivered)
    locations = produce_dead_letters(producer, letters, "telemetry_metrics",
                                     DlqHeaderStyle.BOTH)
    assert locations == [(0, 1000), (1, 1001), (0, 1002)]
    assert [r["topic"] for r in producer.produced] == ["telemetry-metrics-dlq"] * 3
    first = producer.produced[0]
    assert (first["key"], first["value"]) == (letters[0].key, letters[0].value)
    assert first["timestamp"] == letters[0].timestamp_ms
    assert first["headers"] == headers_for(letters[0], "telemetry_metrics", DlqHeaderStyle.BOTH)


def test_nothing_to_produce() -> None:
    producer = RecordingProducer(delivered)
    assert produce_dead_letters(producer, [], "p", DlqHeaderStyle.BOTH) == []
    assert producer.produced == []


def test_one_failed_report_raises_delivery_failed_naming_it() -> None:
    def outcome(i: int) -> tuple[Any, Any]:
        if i == 1:
            return (KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out"), None)
        return delivered(i)

    letters = [letter(offset=o) for o in (7, 8, 9)]
    with pytest.raises(DeliveryFailed) as info:
        produce_dead_letters(RecordingProducer(outcome), letters, "p", DlqHeaderStyle.NATIVE)
    err = info.value
    assert (err.topic, err.total) == ("telemetry-metrics-dlq", 3)
    assert err.failures == ["offset 8: _MSG_TIMED_OUT: Local: Message timed out"]
    assert "1 of 3 dead letters were not delivered" in str(err)
    assert "nothing was committed" in str(err)


def test_a_refused_delivery_is_permanent() -> None:
    # No write ACL on the DLQ topic: retrying the task cannot deliver it, so say so now.
    def outcome(i: int) -> tuple[Any, Any]:
        if i == 0:
            return (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not authorized"), None)
        return delivered(i)

    with pytest.raises(KafkaRefused) as info:
        produce_dead_letters(RecordingProducer(outcome), [letter(offset=o) for o in (7, 8)],
                             "p", DlqHeaderStyle.NATIVE)
    assert "TOPIC_AUTHORIZATION_FAILED: not authorized" in str(info.value)


def test_a_missing_report_is_a_failure_even_when_flush_returns_zero() -> None:
    letters = [letter(offset=o) for o in (7, 8)]
    producer = RecordingProducer(lambda i: None if i == 0 else delivered(i))
    with pytest.raises(DeliveryFailed) as info:
        produce_dead_letters(producer, letters, "p", DlqHeaderStyle.NATIVE)
    assert info.value.failures == ["offset 7: no delivery report (0 still queued)"]


def test_produce_raising_stops_and_fails_the_batch() -> None:
    class FullProducer(RecordingProducer):
        def produce(self, topic: str, **kwargs: Any) -> None:
            if len(self.produced) == 1:
                raise BufferError("Local: Queue full")
            super().produce(topic, **kwargs)

    letters = [letter(offset=o) for o in (7, 8, 9)]
    with pytest.raises(DeliveryFailed) as info:
        produce_dead_letters(FullProducer(delivered), letters, "p", DlqHeaderStyle.NATIVE)
    failures = info.value.failures
    # one line per undelivered letter: the one that raised, the one never attempted
    assert failures[0].startswith("offset 8: produce() raised BufferError")
    assert failures[1:] == ["offset 9: not attempted after that"]
    assert str(info.value).startswith("2 of 3 dead letters were not delivered")


def test_an_oversized_value_is_truncated_with_a_header() -> None:
    big = letter(value=b"v" * 5000)
    producer = RecordingProducer(delivered)
    produce_dead_letters(producer, [big, letter(offset=43)], "p", DlqHeaderStyle.NATIVE,
                         max_dlq_bytes=1200)
    truncated, intact = producer.produced
    # the whole record (key, value, headers) fits the budget; the value is cut, not mangled
    size = (len(truncated["key"] or b"") + len(truncated["value"])
            + sum(len(k) + len(v) for k, v in truncated["headers"]))
    assert 0 < len(truncated["value"]) < 1200 and size <= 1200
    assert truncated["value"] == b"v" * len(truncated["value"])
    assert dict(truncated["headers"])[PREFIX + "value.truncated"] == b"5000"
    assert intact["value"] == letter().value
    assert PREFIX + "value.truncated" not in dict(intact["headers"])


@pytest.mark.parametrize(
    ("key_len", "value_len", "key_cut"),
    [
        (100_000, 899_000, False),  # key and value over the budget together: the value is cut
        (500_000, 600_000, True),  # a key over a quarter of the budget is cut as well
        (10, 100, False),  # small: nothing is cut
    ],
)
def test_the_whole_record_fits_the_dlq_budget(key_len: int, value_len: int,
                                              key_cut: bool) -> None:
    big = letter(key=b"k" * key_len, value=b"v" * value_len)
    producer = RecordingProducer(delivered)
    produce_dead_letters(producer, [big], "p", DlqHeaderStyle.BOTH)
    (record,) = producer.produced
    size = (len(record["key"]) + len(record["value"])
            + sum(len(k) + len(v) for k, v in record["headers"]))
    assert size <= 900_000
    headers = dict(record["headers"])
    assert (PREFIX + "key.truncated" in headers) is key_cut
    if key_cut:
        assert headers[PREFIX + "key.truncated"] == str(key_len).encode()
    # a value is either intact, or cut and marked with its original size
    if PREFIX + "value.truncated" in headers:
        assert headers[PREFIX + "value.truncated"] == str(value_len).encode()
        assert len(record["value"]) < value_len
    else:
        assert record["value"] == b"v" * value_len
    assert (PREFIX + "value.truncated" in headers) is (key_len == 100_000)


def test_a_tombstone_dead_letter_is_produced_with_a_null_value() -> None:
    producer = RecordingProducer(delivered)
    produce_dead_letters(producer, [letter(value=None)], "p", DlqHeaderStyle.NATIVE,
                         max_dlq_bytes=10)
    assert producer.produced[0]["value"] is None


# --------------------------------------------------------------------------- parse


def dlq_record(message: Any, headers: list[tuple[str, bytes]], key: bytes | None,
               value: bytes | None) -> Any:
    """A record as read back from the DLQ topic (partition 1, offset 77)."""
    return message(value, topic_="telemetry-metrics-dlq", partition_=1, offset_=77, key_=key,
                   headers_=tuple(headers))


@pytest.mark.parametrize("style", list(DlqHeaderStyle))
def test_parse_round_trips_headers_for(style: DlqHeaderStyle, message: Any) -> None:
    # Every style carries what replay needs: provenance, reason, timestamp, attempts.
    original = letter(error_detail="a\x00b café")
    record = dlq_record(message, headers_for(original, "p", style), original.key, original.value)
    parsed = parse_dlq_message(record)
    assert parsed == replace(original, dlq_partition=1, dlq_offset=77)


def test_parse_reads_connect_only_headers(message: Any) -> None:
    # A record from a tool that writes only Connect's names: provenance and reason suffice.
    original = letter()
    connect_only = [(k, v) for k, v in headers_for(original, "p", DlqHeaderStyle.CONNECT)
                    if not k.startswith(PREFIX)]
    parsed = parse_dlq_message(dlq_record(message, connect_only, original.key, original.value))
    assert parsed.source == original.source
    assert (parsed.error_class, parsed.error_detail) == (original.error_class,
                                                         original.error_detail)
    assert (parsed.timestamp_ms, parsed.contract, parsed.attempts) == (None, "", 1)
    assert (parsed.dlq_topic, parsed.dlq_partition, parsed.dlq_offset) == (
        "telemetry-metrics-dlq", 1, 77)


def test_parse_a_null_timestamp_round_trips(message: Any) -> None:
    original = letter(timestamp_ms=None, key=None)
    headers = headers_for(original, "p", DlqHeaderStyle.NATIVE)
    record = dlq_record(message, headers, None, original.value)
    assert parse_dlq_message(record).timestamp_ms is None


def test_parse_a_record_not_written_by_us(message: Any) -> None:
    with pytest.raises(ValueError, match=r"telemetry-metrics-dlq\[1\]@77 has no 'topic' header"):
        parse_dlq_message(dlq_record(message, [("other", b"x")], None, b"{}"))
