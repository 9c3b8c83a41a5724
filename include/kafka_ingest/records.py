"""The values that travel between reading, validation and the database, typed.

A :class:`Row` is one valid event on its way to the target table: the contract's column
values and where the message came from. :class:`ChunkCounts` is what one chunk did, the
figures the audit row, the reports and the reconciliation all use.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

#: 9999-12-31T23:59:59.999Z: past it Python (and most clients) have no date.
MAX_TIMESTAMP_MS = 253_402_300_799_999

#: Source position of a message: (topic, partition, offset).
Position = tuple[str, int, int]
#: A dead letter's identity: (source topic, its incarnation, partition, offset).
LetterKey = tuple[str, int, int, int]


class Source(NamedTuple):
    """One incarnation of a source topic: what a chunk's offsets are offsets of.

    A topic deleted and created again under its name is a new incarnation (Kafka gives it
    a new topic id; ``topic_incarnations`` numbers them 1, 2, ... as first seen), whose
    offsets start at 0 again: (incarnation, offset) orders a partition's records across
    re-creations, the offset alone does not."""

    topic: str
    #: Kafka's topic id (KIP-516), as ``kafka-topics --describe`` prints it.
    topic_id: str | None
    incarnation: int


class CopyPayload(NamedTuple):
    """A chunk's rows as a binary ``COPY`` payload, encoded ahead of its transaction (see
    :class:`~kafka_ingest.db.copy.CopyEncoder`): the bytes, and how many rows they hold.
    An append chunk's payload holds one row per event (its copies left out), so ``rows``
    is the number of distinct events the writer checks its counts against."""

    data: bytes
    rows: int


class MessageLike(Protocol):
    """What validation needs of a Kafka message (confluent_kafka.Message fits)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...


class _EveryKey:
    """The key of a truncate: every key of the table placed before it (see
    :data:`EVERY_KEY`)."""

    def __repr__(self) -> str:
        return "EVERY_KEY"


#: A :class:`Tombstone`'s key when it is a truncate of the source table (a change event's
#: ``op: t``): every row placed before it in its partition goes, each as if by a tombstone
#: of its own key at the truncate's place.
EVERY_KEY: Any = _EveryKey()


class Tombstone(NamedTuple):
    """A record of a pipeline that deletes (a null value, a change event's delete or
    truncate): its key's row goes, unless the table holds a newer version (by log
    order)."""

    key: Any
    topic: str
    partition: int
    offset: int


def kafka_timestamp_ms(message: MessageLike) -> int | None:
    """The message's timestamp in ms, or ``None`` when it has none or none a date can hold
    (old brokers accept any long; a bad one must not fail the batch)."""
    kind, ms = message.timestamp()
    return ms if kind and 0 <= ms <= MAX_TIMESTAMP_MS else None


def ms_to_datetime(ms: int | None) -> datetime | None:
    if ms is None or not 0 <= ms <= MAX_TIMESTAMP_MS:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class Provenance(NamedTuple):
    """Where a row came from: the provenance columns of every target table, in order
    (:data:`PROVENANCE_COLUMNS`: one column per field; the Kafka timestamp as binary
    ``COPY`` sends a ``timestamptz``: microseconds since Postgres' epoch,
    :func:`~kafka_ingest.contracts.columns.millis_to_pg`)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    kafka_timestamp: int | None

    @property
    def position(self) -> Position:
        return (self.topic, self.partition, self.offset)


class ProvenanceColumn(NamedTuple):
    """One provenance column of every target table."""

    name: str
    #: Its Postgres type (as binary ``COPY`` names it).
    type: str
    #: NULL when the record has none (no key, no usable timestamp).
    nullable: bool = False
    #: The value is epoch milliseconds, made into the column's binary ``timestamptz`` as
    #: the row is built (:func:`~kafka_ingest.contracts.columns.millis_to_pg`).
    epoch_ms: bool = False


#: The provenance columns, in :class:`Provenance` order (one per field): the one
#: definition the target tables' DDL, the rows, the staging table and the reserved column
#: names are made from.
PROVENANCE_COLUMNS: tuple[ProvenanceColumn, ...] = (
    ProvenanceColumn("source_topic", "text"),
    ProvenanceColumn("source_partition", "int4"),
    ProvenanceColumn("source_offset", "int8"),
    ProvenanceColumn("kafka_key", "bytea", nullable=True),
    ProvenanceColumn("kafka_timestamp", "timestamptz", nullable=True, epoch_ms=True),
)
#: Every target table's own column besides the provenance: when the row was written
#: (filled by its default).
INGESTED_AT = "ingested_at"
_SOURCE = len(PROVENANCE_COLUMNS)


#: One valid event for the target table, flat in COPY order: the contract's column values,
#: then the provenance columns (:class:`Provenance` order). A plain tuple, because it is
#: built once per message on the hot path and goes to ``COPY`` as it is (a tuple subclass
#: cost a second object a message); :func:`row_values` and :func:`row_source` name its
#: two parts.
Row = tuple[Any, ...]


def row_values(row: Row) -> tuple[Any, ...]:
    """The row's contract (and key and header) column values."""
    return row[:-_SOURCE]


def row_source(row: Row) -> Provenance:
    """Where the row's event came from."""
    return Provenance(*row[-_SOURCE:])


@dataclass(frozen=True, kw_only=True)
class CounterInfo:
    """What one counter of :class:`ChunkCounts` means, and where it shows (the field's
    ``metadata["counter"]``)."""

    #: What it counts, in words.
    help: str
    #: One of the terms every message read is exactly one of (they sum to ``read``).
    accounted: bool = False
    #: Summed by a replay's report too (a replay re-validates letters: it dead-letters
    #: nothing new, and meets no tombstone and no known letter).
    replayed: bool = False
    #: Its Prometheus counter of the ledger's totals (without the ``kafka_ingest_`` prefix
    #: and the ``_total`` suffix) and the counter's help; empty: not exported.
    metric: str = ""
    metric_help: str = ""


def _counter(spec: CounterInfo) -> Any:
    return field(default=0, metadata={"counter": spec})


@dataclass(kw_only=True)
class ChunkCounts:
    """What happened to the messages of one chunk (or, summed, of a slice, a run, the
    ledger): the one definition of the counters. The audit row (``ingest_runs``), the
    ledger's totals (``ingest_totals``), the run reports, the Airflow and Prometheus
    metrics, ``kafka-ingest status`` and the reconciliation all take their counters from
    its fields (:data:`COUNTERS`, :func:`counter`).

    Every message read is exactly one of inserted, duplicates, stale, dead-lettered,
    known dead (a backfill met a poison pill already dead-lettered earlier: neither
    produced nor recorded again) or tombstones; :func:`kafka_ingest.engine.ingest.reconcile`
    checks that they add up.
    """

    read: int = _counter(CounterInfo(
        help="messages read", replayed=True, metric="messages_read",
        metric_help="Messages read by committed chunks, from the ledger"))
    inserted: int = _counter(CounterInfo(
        help="rows inserted or updated", accounted=True, replayed=True,
        metric="rows_inserted",
        metric_help="Rows inserted or updated by committed chunks, from the ledger"))
    duplicates: int = _counter(CounterInfo(
        help="messages whose row was already there", accounted=True, replayed=True,
        metric="duplicates",
        metric_help="Messages whose row was already there (replays), from the ledger"))
    stale: int = _counter(CounterInfo(
        help="messages older than the stored version of their key (`latest` pipelines)",
        accounted=True, replayed=True))
    dead_lettered: int = _counter(CounterInfo(
        help="messages dead-lettered", accounted=True, metric="dead_letters",
        metric_help="Messages dead-lettered by committed chunks, from the ledger"))
    known_dead: int = _counter(CounterInfo(
        help="messages a backfill found dead-lettered already (neither produced nor "
             "recorded again)", accounted=True))
    tombstones: int = _counter(CounterInfo(
        help="tombstones (null values), skipped or deleting their key's row", accounted=True))
    #: Rows the tombstones deleted (informational: each tombstone is one of ``tombstones``).
    deleted: int = _counter(CounterInfo(
        help="rows the tombstones deleted", replayed=True, metric="rows_deleted",
        metric_help="Rows deleted by tombstones in committed chunks, from the ledger"))
    bytes: int = _counter(CounterInfo(help="bytes of the values read"))

    def add(self, other: ChunkCounts) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def accounted(self) -> dict[str, int]:
        """What the messages read became (the terms that must sum to ``read``)."""
        return {name: getattr(self, name) for name in ACCOUNTED}

    def as_dict(self) -> dict[str, int]:
        """The counters by name, in :data:`COUNTERS` order."""
        return {name: getattr(self, name) for name in COUNTERS}


def counter(name: str) -> CounterInfo:
    """The :class:`CounterInfo` of a field of :class:`ChunkCounts`."""
    spec: CounterInfo = _COUNTER_OF[name]
    return spec


_COUNTER_OF: dict[str, CounterInfo] = {f.name: f.metadata["counter"] for f in fields(ChunkCounts)}
#: The counters, in field order: the columns of ``ingest_runs`` and ``ingest_totals``,
#: the sums of a run's report.
COUNTERS: tuple[str, ...] = tuple(_COUNTER_OF)
#: The terms every message read is exactly one of.
ACCOUNTED: tuple[str, ...] = tuple(n for n, c in _COUNTER_OF.items() if c.accounted)
#: The counters a replay's report sums.
REPLAYED: tuple[str, ...] = tuple(n for n, c in _COUNTER_OF.items() if c.replayed)
#: The counters exported as Prometheus counters of the ledger's totals.
EXPORTED: tuple[str, ...] = tuple(n for n, c in _COUNTER_OF.items() if c.metric)


__all__ = [
    "ACCOUNTED",
    "COUNTERS",
    "EXPORTED",
    "INGESTED_AT",
    "MAX_TIMESTAMP_MS",
    "PROVENANCE_COLUMNS",
    "REPLAYED",
    "ChunkCounts",
    "CopyPayload",
    "CounterInfo",
    "LetterKey",
    "MessageLike",
    "Position",
    "Provenance",
    "ProvenanceColumn",
    "Row",
    "Source",
    "Tombstone",
    "counter",
    "kafka_timestamp_ms",
    "ms_to_datetime",
    "row_source",
    "row_values",
]
