"""The choices a pipeline makes by name (string enums), and the patterns its names follow.
"""

from __future__ import annotations

import hashlib
from datetime import date, timedelta
from enum import StrEnum
from uuid import UUID

NAME_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
DOTTED_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
POOL_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}$"
#: Airflow's own pool, used when a pipeline names none.
DEFAULT_POOL = "default_pool"
#: The size of a pipeline's pool when no pipeline naming it says ``pool_slots``.
DEFAULT_POOL_SLOTS = 8


class StartPolicy(StrEnum):
    """Where a partition with no stored offset starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


class OnOffsetGap(StrEnum):
    """What to do when retention deleted offsets that were never ingested."""

    FAIL = "fail"
    SKIP = "skip"


class OnTombstone(StrEnum):
    """What to do with a record whose value is null. ``delete``: the record key's row is
    deleted (``latest`` pipelines keyed by the record key, in log order)."""

    SKIP = "skip"
    DEAD_LETTER = "dead_letter"
    DELETE = "delete"


class Envelope(StrEnum):
    """What a record value is wrapped in. ``debezium``: Debezium's change-event envelope
    (``before``, ``after``, ``op``, ``source``), as Kafka Connect's JsonConverter (with or
    without its schema) or a registry format writes it."""

    DEBEZIUM = "debezium"


#: What Debezium writes in place of a column it did not read (a TOASTed value an update
#: left unchanged; ``unavailable.value.placeholder``'s default): the column keeps its
#: stored value.
UNAVAILABLE = "__debezium_unavailable_value"
#: The same in a ``jsonb`` column (Debezium's ``Json`` is text, and the placeholder is no
#: JSON): a one-element array, which the writer recognises.
UNAVAILABLE_JSON = (UNAVAILABLE,)
#: The same in a ``date[]`` column: the placeholder's bytes, each as Debezium's days.
UNAVAILABLE_DATES = tuple(date(1970, 1, 1) + timedelta(days=b) for b in UNAVAILABLE.encode())
#: The same in a ``uuid[]`` column (its one element): the name-based (version 3) UUID of
#: the placeholder's bytes, as Java's ``UUID.nameUUIDFromBytes`` makes it.
UNAVAILABLE_UUID = UUID(bytes=hashlib.md5(UNAVAILABLE.encode(), usedforsecurity=False).digest(),
                        version=3)
#: The array types of a mirror's columns whose placeholder Debezium's Postgres connector
#: tells apart from a value (``[placeholder]`` for text; the placeholder's bytes as the
#: integers of an ``integer[]``, ``bigint[]`` or ``date[]``, Debezium's days; for a
#: ``uuid[]``, the name-based UUID of those bytes): such a column keeps its stored value.
#: An array of another type left out of an update arrives as null, which cannot be told
#: from a NULL: a mirror refuses such a column (``text``, ``bytea`` and ``jsonb`` have
#: placeholders too; no other type is stored out of line).
KEPT_ARRAYS = ("text[]", "int4[]", "int8[]", "date[]", "uuid[]")
#: The value types a mirror's primary key column may have, one column or several (its
#: deletes' keys travel as one array per column, checked per value against the type).
KEY_VALUE_TYPES = ("int2", "int4", "int8", "text", "uuid")


class OnTruncate(StrEnum):
    """A change event's truncate (``op: t``): ``skip`` it (counted), or ``truncate``: delete
    every row of the table that came before it in the log (in its partition, or in an older
    incarnation of the topic) and keep its place as the partition's truncate point, so a
    replay or a backfill of older offsets cannot bring a row back."""

    SKIP = "skip"
    TRUNCATE = "truncate"


class ReplicaIdentity(StrEnum):
    """A mirror's source table's ``REPLICA IDENTITY`` (Postgres), which decides what an
    update's change event carries: ``default`` (the key only as the old row; an array or
    other value stored out of line that the update left unchanged is Debezium's placeholder,
    or for most arrays a null, see :data:`KEPT_ARRAYS`), or ``full`` (the whole old row, and
    every value of the new one: a column of any array type can be mirrored)."""

    DEFAULT = "default"
    FULL = "full"


class KeyFormat(StrEnum):
    """How the record key is read: UTF-8 text, JSON (a string or integer, or one ``field``
    of a JSON object), or ``registry``: the pipeline's registry format (Avro, Protobuf or
    JSON Schema in the wire format: a primitive, or one ``field`` of a record)."""

    STRING = "string"
    JSON = "json"
    REGISTRY = "registry"


class KeyType(StrEnum):
    """The record key's column: ``text`` (``character varying(max_length)``) or ``bigint``
    (read from JSON or the registry format)."""

    TEXT = "text"
    BIGINT = "bigint"


#: The order of a pipeline's log: ``upsert.order_by`` may name it instead of a field.
LOG_ORDER = "source_offset"


class Format(StrEnum):
    """How a record's value is encoded. ``avro``, ``protobuf`` and ``json_schema`` are the
    Confluent wire format (magic byte 0, a 4-byte schema id, the payload) with the writer's
    schema in a schema registry. Each is read by its codec
    (:func:`kafka_ingest.decode.codecs.codec_for`), which knows everything else about it."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "json_schema"

    @property
    def registry(self) -> bool:
        """Whether writer schemas come from a schema registry: every format but plain
        JSON. (One of the two facts about formats kept here: the pipelines file is checked
        against them when it loads, below the codecs.)"""
        return self is not Format.JSON

    @property
    def change_events(self) -> bool:
        """Whether Debezium's change events of this format can be mirrored: the format
        keeps the Connect schema their column types and a column added at the source are
        read from (JsonConverter's in the message; a Connect converter's Avro schema:
        :meth:`~kafka_ingest.decode.codecs.base.Codec.connect_schema`)."""
        return self in (Format.JSON, Format.AVRO)


class SubjectStrategy(StrEnum):
    """The registry subject a topic's schemas are under: ``topic``: ``<topic>-value``
    (TopicNameStrategy, the default); ``record``: the record's full name
    (RecordNameStrategy); ``topic_record``: ``<topic>-<record>``."""

    TOPIC = "topic"
    RECORD = "record"
    TOPIC_RECORD = "topic_record"


class IdentitySource(StrEnum):
    """What identifies a record (a pipeline's ``identity``): fields of its ``payload``, its
    ``record_key``, or its ``source_position`` in the log (Kafka Connect's
    ``pk.mode=kafka``: the topic, its incarnation, the partition and the offset)."""

    PAYLOAD = "payload"
    RECORD_KEY = "record_key"
    SOURCE_POSITION = "source_position"


#: The columns of a source-position identity, in key order: the provenance's topic,
#: partition and offset, and the incarnation of the topic (offsets start again at 0 in a
#: topic deleted and created again).
SOURCE_POSITION_COLUMNS = ("source_topic", "source_incarnation", "source_partition",
                           "source_offset")


class UpsertMode(StrEnum):
    """``append``: events are immutable, ``ON CONFLICT (<identity>) DO NOTHING``.
    ``latest``: keep the newest event per key (by event timestamp, then source offset)."""

    APPEND = "append"
    LATEST = "latest"


class DlqHeaderStyle(StrEnum):
    """Header names of dead letters: ours, Kafka Connect's ``__connect.errors.*``, or both."""

    NATIVE = "native"
    CONNECT = "connect"
    BOTH = "both"
