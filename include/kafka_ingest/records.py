"""The values that travel between reading, validation and the database, typed.

A :class:`Row` is one valid event on its way to the target table: the contract's column
values and where the message came from. :class:`ChunkCounts` is what one chunk did, the
figures the audit row, the reports and the reconciliation all use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
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


class MessageLike(Protocol):
    """What validation needs of a Kafka message (confluent_kafka.Message fits)."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...


class Tombstone(NamedTuple):
    """A null-valued record of a pipeline that deletes: its key's row goes, unless the
    table holds a newer version (by log order)."""

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


@dataclass(kw_only=True)
class ChunkCounts:
    """What happened to the messages of one chunk (or, summed, of a slice).

    Every message read is exactly one of inserted, duplicates, stale, dead-lettered,
    known dead (a backfill met a poison pill already dead-lettered earlier: neither
    produced nor recorded again) or tombstones; :func:`kafka_ingest.engine.ingest.reconcile`
    checks that they add up.
    """

    read: int = 0
    inserted: int = 0
    duplicates: int = 0
    stale: int = 0
    dead_lettered: int = 0
    known_dead: int = 0
    tombstones: int = 0
    bytes: int = 0
    #: Rows the tombstones deleted (informational: each tombstone is one of ``tombstones``).
    deleted: int = 0

    def add(self, other: ChunkCounts) -> None:
        for f in fields(ChunkCounts):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def accounted(self) -> dict[str, int]:
        """What the messages read became (the terms that must sum to ``read``)."""
        return {"inserted": self.inserted, "duplicates": self.duplicates, "stale": self.stale,
                "dead_lettered": self.dead_lettered, "known_dead": self.known_dead,
                "tombstones": self.tombstones}


__all__ = [
    "INGESTED_AT",
    "MAX_TIMESTAMP_MS",
    "PROVENANCE_COLUMNS",
    "ChunkCounts",
    "LetterKey",
    "MessageLike",
    "Position",
    "Provenance",
    "ProvenanceColumn",
    "Row",
    "Source",
    "Tombstone",
    "kafka_timestamp_ms",
    "ms_to_datetime",
    "row_source",
    "row_values",
]
