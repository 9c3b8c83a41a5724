"""Dead letters: build them, produce them with every delivery checked, parse them back.

A DLQ record keeps the original key and value bytes unchanged and carries its provenance
and the reason in headers. Header keys are ASCII and values are bytes: confluent-kafka
segfaults on a str key with a lone surrogate and truncates str values at NUL.

Size policy: a value too large for the DLQ topic (``max_dlq_bytes``) is replaced by its
first ``max_dlq_bytes`` bytes and the header ``kafka-ingest.value.truncated`` gives the
original size; the batch never crashes on it. (The source still holds the whole value.)

Headers come in our own names (``kafka-ingest.*``), in Kafka Connect's
(``__connect.errors.*``, read by tools built for Connect DLQs, plus ours for the fields
Connect has no name for), or both; the source record's own headers come first, unchanged
(as Kafka Connect keeps them), so a replay fills header columns from them.

Delivery into the DLQ topic is at least once: a chunk whose transaction did not commit
(a kill, a failure after its dead letters were delivered) is read again and its dead
letters produced again, while the ``dead_letters`` table holds each once. Every copy of a
dead letter carries the same ``kafka-ingest.letter_id`` header (pipeline, source topic,
partition and offset, and the source topic's id), so a consumer of the DLQ topic can drop
the copies by it.

A letter names the source topic's id (``kafka-ingest.topic_id``): the same offset of a
topic deleted and created again is another record (see
:class:`~kafka_ingest.records.Source`), and a replay orders what it loads by the
incarnation the letter came from.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kafka_ingest.config import DlqHeaderStyle
from kafka_ingest.errors import DeliveryFailed, KafkaRefused
from kafka_ingest.kafka.clients import REFUSED_CODES
from kafka_ingest.records import LetterKey, Position

log = logging.getLogger(__name__)

PREFIX = "kafka-ingest."
DEFAULT_MAX_DLQ_BYTES = 900_000  # under the broker's default message.max.bytes (1 MiB)
#: How long to wait for the delivery reports when the producer does not say its
#: ``message.timeout.ms`` (producers from :class:`~kafka_ingest.kafka.clients.KafkaClients` do).
DEFAULT_DELIVERY_WAIT_S = 30.0
#: Beyond ``message.timeout.ms``: librdkafka reports a message that timed out on its next
#: timeout scan (about a second), so the wait ends after every verdict is in.
_DELIVERY_WAIT_MARGIN_S = 5.0
DETAIL_MAX = 1000

# Kafka Connect's DLQ header names (errors.deadletterqueue.context.headers.enable=true).
CONNECT = {
    "topic": "__connect.errors.topic",
    "partition": "__connect.errors.partition",
    "offset": "__connect.errors.offset",
    "error_class": "__connect.errors.exception.class.name",
    "error_detail": "__connect.errors.exception.message",
    "pipeline": "__connect.errors.connector.name",
    "stage": "__connect.errors.stage",
}


@dataclass(frozen=True)
class DeadLetter:
    """A message that could not be loaded, with where it came from and why."""

    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None
    error_class: str
    error_detail: str
    contract: str
    dlq_topic: str
    attempts: int = 1
    first_failed_at: datetime = field(default_factory=lambda: datetime.now(tz=UTC))
    # Where the record sits in the DLQ topic, when it was read from there.
    dlq_partition: int | None = None
    dlq_offset: int | None = None
    #: The source record's own headers.
    headers: tuple[tuple[str, bytes | None], ...] = ()
    #: The writer schema id of a registry-encoded value (its wire header's), else None.
    schema_id: int | None = None
    #: The source topic's id (None: a letter written before ids were kept) and the number
    #: of that incarnation (:class:`~kafka_ingest.records.Source`).
    source_topic_id: str | None = None
    source_incarnation: int = 1

    @property
    def source(self) -> Position:
        return (self.source_topic, self.source_partition, self.source_offset)

    @property
    def letter_key(self) -> LetterKey:
        """What ``dead_letters`` keys the letter by (with the pipeline)."""
        return (self.source_topic, self.source_incarnation, self.source_partition,
                self.source_offset)


def letter_id(letter: DeadLetter, pipeline: str) -> str:
    """The same for every copy of one dead letter in the DLQ topic (see the module doc)."""
    topic_id = f"/{letter.source_topic_id}" if letter.source_topic_id else ""
    return (f"{pipeline}/{letter.source_topic}/{letter.source_partition}/"
            f"{letter.source_offset}{topic_id}")


def headers_for(letter: DeadLetter, pipeline: str, style: DlqHeaderStyle,
                *, truncated_from: int | None = None,
                key_truncated_from: int | None = None) -> list[tuple[str, bytes | None]]:
    """The DLQ record's headers: the source record's own, then ours (ASCII keys, bytes
    values)."""
    fields: dict[str, str] = {
        "topic": letter.source_topic,
        "partition": str(letter.source_partition),
        "offset": str(letter.source_offset),
        "timestamp": "" if letter.timestamp_ms is None else str(letter.timestamp_ms),
        "pipeline": pipeline,
        "contract": letter.contract,
        "error_class": letter.error_class,
        "error_detail": letter.error_detail[:DETAIL_MAX],
        "attempts": str(letter.attempts),
        "first_failed_at": letter.first_failed_at.isoformat(),
        "letter_id": letter_id(letter, pipeline),
    }
    if letter.schema_id is not None:
        fields["schema_id"] = str(letter.schema_id)
    if letter.source_topic_id is not None:
        fields["topic_id"] = letter.source_topic_id
    headers: list[tuple[str, bytes | None]] = list(letter.headers)
    if style in (DlqHeaderStyle.NATIVE, DlqHeaderStyle.BOTH):
        headers += [(PREFIX + k, v.encode("utf-8", "backslashreplace")) for k, v in fields.items()]
    if style in (DlqHeaderStyle.CONNECT, DlqHeaderStyle.BOTH):
        connect_fields = {**fields, "stage": "VALUE_CONVERTER"}
        headers += [(CONNECT[k], connect_fields[k].encode("utf-8", "backslashreplace"))
                    for k in CONNECT]
    if style is DlqHeaderStyle.CONNECT:
        # Connect has no names for these, and replay needs them (the source timestamp of
        # the rows it loads, the attempt count, first-failed-at): keep them under ours.
        headers += [(PREFIX + k, v.encode("utf-8", "backslashreplace"))
                    for k, v in fields.items() if k not in CONNECT]
    if truncated_from is not None:
        headers.append((PREFIX + "value.truncated", str(truncated_from).encode()))
    if key_truncated_from is not None:
        headers.append((PREFIX + "key.truncated", str(key_truncated_from).encode()))
    return headers


def produce_dead_letters(producer: Any, letters: Sequence[DeadLetter], pipeline: str,
                         style: DlqHeaderStyle, *, max_dlq_bytes: int = DEFAULT_MAX_DLQ_BYTES,
                         timeout_s: float | None = None) -> list[tuple[int, int] | None]:
    """Produce every dead letter and wait for each delivery report.

    Returns the (partition, offset) of each record in the DLQ topic. Raises
    :class:`DeliveryFailed` if any report is an error or missing: ``flush()`` returning 0
    does not prove delivery. A retry re-produces the whole batch; the duplicates this makes
    in the DLQ are absorbed by the ``dead_letters`` table (keyed by source offset) and by
    the idempotent replay.

    The wait for the reports (``timeout_s``) defaults to the producer's
    ``message.timeout.ms`` plus a margin: librdkafka retries a delivery until then (a
    leader election, a broker restarting) and then reports it failed, so a broker that
    never answers fails the chunk after ``message.timeout.ms``, and a slow one is not
    given up on before librdkafka does.
    """
    if not letters:
        return []
    if timeout_s is None:
        timeout_s = (getattr(producer, "delivery_timeout_s", None)
                     or DEFAULT_DELIVERY_WAIT_S) + _DELIVERY_WAIT_MARGIN_S
    reports: dict[int, tuple[Any, Any]] = {}
    topic = letters[0].dlq_topic
    failures: list[str] = []
    queued = len(letters)
    for i, letter in enumerate(letters):
        error = _produce_one(producer, letter, pipeline, style, max_dlq_bytes,
                             _recorder(reports, i))
        if error is not None:
            queued = i
            failures.append(f"offset {letter.source_offset}: produce() raised {error}")
            failures += [f"offset {later.source_offset}: not attempted after that"
                         for later in letters[i + 1:]]
            break
    remaining = producer.flush(timeout_s)
    failures += _report_failures(letters[:queued], reports, remaining)
    refused = [err for err, _ in reports.values()
               if err is not None and (err.fatal() or err.code() in REFUSED_CODES)]
    if refused:  # no write ACL on the DLQ topic, a fenced producer: no retry cures it
        raise KafkaRefused(f"produce to {topic!r}", f"{refused[0].name()}: {refused[0].str()}")
    if failures:
        raise DeliveryFailed(topic, failures, len(letters))
    return [(reports[i][1].partition(), reports[i][1].offset()) for i in range(len(letters))]


def _recorder(reports: dict[int, tuple[Any, Any]], index: int) -> Any:
    def on_delivery(err: Any, msg: Any) -> None:
        reports[index] = (err, msg)
    return on_delivery


# What a record costs besides its key, value and header bytes (batch and record framing).
_RECORD_OVERHEAD = 512
# A record timestamp further ahead than this is not used for the DLQ record (Kafka 4 brokers
# reject timestamps over log.message.timestamp.after.max.ms, 1 h by default, in the future);
# the original stays in the kafka-ingest.timestamp header.
_MAX_FUTURE_MS = 30 * 60 * 1000


def _fit(letter: DeadLetter, pipeline: str, style: DlqHeaderStyle,
         max_dlq_bytes: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """Key, value and headers of the DLQ record, cut to fit ``max_dlq_bytes`` in all. The
    source record's own headers go first when even they do not fit beside ours (a header
    says how many went)."""
    key, value = letter.key, letter.value
    plain = headers_for(letter, pipeline, style, truncated_from=0, key_truncated_from=0)
    budget = max_dlq_bytes - _RECORD_OVERHEAD - sum(len(k) + len(v or b"") for k, v in plain)
    if budget < 0 and letter.headers:
        dropped = len(letter.headers)
        key, value, headers = _fit(replace(letter, headers=()), pipeline, style, max_dlq_bytes)
        return key, value, [*headers, (PREFIX + "headers.dropped", str(dropped).encode())]
    budget = max(budget, 0)
    key_cut = value_cut = None
    if key is not None and len(key) > budget // 4 and len(key) + len(value or b"") > budget:
        key, key_cut = key[: budget // 4], len(key)
    room = budget - len(key or b"")
    if value is not None and len(value) > room:
        value, value_cut = value[: max(room, 0)], len(value)
    return key, value, headers_for(letter, pipeline, style, truncated_from=value_cut,
                                   key_truncated_from=key_cut)


def _record_timestamp(ms: int | None) -> int:
    """The original timestamp, unless missing or too far in the future (then: now)."""
    if ms is None or ms <= 0 or ms > time.time() * 1000 + _MAX_FUTURE_MS:
        return 0
    return ms


def _produce_one(producer: Any, letter: DeadLetter, pipeline: str, style: DlqHeaderStyle,
                 max_dlq_bytes: int, on_delivery: Any) -> str | None:
    """Produce one record; return why it could not be queued, or ``None``."""
    key, value, headers = _fit(letter, pipeline, style, max_dlq_bytes)
    for _attempt in range(2):
        try:
            producer.produce(letter.dlq_topic, value=value, key=key, headers=headers,
                             timestamp=_record_timestamp(letter.timestamp_ms),
                             on_delivery=on_delivery)
        except BufferError:  # the local queue is full: serve delivery reports, try again
            producer.poll(1.0)
            continue
        except Exception as exc:  # KafkaException and friends: infrastructure, not data
            return repr(exc)
        producer.poll(0)
        return None
    return "BufferError: the producer's local queue stayed full"


def _report_failures(letters: Sequence[DeadLetter], reports: dict[int, tuple[Any, Any]],
                     remaining: int) -> list[str]:
    failures = []
    for i, letter in enumerate(letters):
        if i not in reports:
            failures.append(f"offset {letter.source_offset}: no delivery report "
                            f"({remaining} still queued)")
        elif reports[i][0] is not None:
            err = reports[i][0]
            failures.append(f"offset {letter.source_offset}: {err.name()}: {err.str()}")
    return failures


def _is_ours(name: str) -> bool:
    return name.startswith((PREFIX, "__connect.errors."))


def _header_map(headers: Sequence[tuple[str, bytes | None]] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers or ():
        out[k] = "" if v is None else v.decode("utf-8", "replace")
    return out


def parse_dlq_message(msg: Any) -> DeadLetter:
    """Rebuild a :class:`DeadLetter` from a DLQ record (either header style)."""
    h = _header_map(msg.headers())

    def pick(name: str) -> str:
        if PREFIX + name in h:
            return h[PREFIX + name]
        connect = CONNECT.get(name)
        if connect and connect in h:
            return h[connect]
        raise ValueError(f"DLQ record {msg.topic()}[{msg.partition()}]@{msg.offset()} "
                         f"has no {name!r} header; it was not written by kafka-ingest")

    ts = h.get(PREFIX + "timestamp", "")
    first = h.get(PREFIX + "first_failed_at")
    letter = DeadLetter(
        source_topic=pick("topic"),
        source_partition=int(pick("partition")),
        source_offset=int(pick("offset")),
        key=msg.key(),
        value=msg.value(),
        timestamp_ms=int(ts) if ts else None,
        error_class=pick("error_class"),
        error_detail=pick("error_detail"),
        contract=h.get(PREFIX + "contract", ""),
        dlq_topic=msg.topic(),
        attempts=int(h.get(PREFIX + "attempts", "1") or 1),
        dlq_partition=msg.partition(),
        dlq_offset=msg.offset(),
        headers=tuple((k, v) for k, v in msg.headers() or () if not _is_ours(k)),
        schema_id=int(h[PREFIX + "schema_id"]) if h.get(PREFIX + "schema_id") else None,
        source_topic_id=h.get(PREFIX + "topic_id") or None,
    )
    if first:
        letter = replace(letter, first_failed_at=datetime.fromisoformat(first))
    return letter


@dataclass(frozen=True)
class ReplayedMessage:
    """A dead letter presented to validation as if it were the original source message."""

    letter: DeadLetter

    def topic(self) -> str:
        return self.letter.source_topic

    def partition(self) -> int:
        return self.letter.source_partition

    def offset(self) -> int:
        return self.letter.source_offset

    def key(self) -> bytes | None:
        return self.letter.key

    def value(self) -> bytes | None:
        return self.letter.value

    def timestamp(self) -> tuple[int, int]:
        ts = self.letter.timestamp_ms
        return (0, -1) if ts is None else (1, ts)

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self.letter.headers)
