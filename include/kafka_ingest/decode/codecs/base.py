"""The interface every codec implements, and the words its answers are made of.

A :class:`Codec` knows one value format: how a record carries its writer schema's id,
how the registry holds the format's schemas (and how to fetch them), how a payload
decodes, and what each top-level field of a writer schema arrives as (its *kind*, below),
which is what the plan-time check and ``kafka-ingest schema from-registry`` compare with
the contract. Callers hold a codec and never ask which format it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.wire import wire_schema_id

if TYPE_CHECKING:
    from kafka_ingest.kafka.registry import SchemaRegistry, WriterSchema

#: Kinds of values a decoded writer field arrives as.
STR, INT, FLOAT, BOOL, BYTES, DECIMAL, DATETIME, DATE, UUID_, OBJECT, LIST = (
    "string", "integer", "float", "boolean", "bytes", "decimal", "datetime", "date", "uuid",
    "object", "array")
#: ... a date and time without a zone, a time of day, a duration.
LOCAL_DATETIME, TIME_, DURATION = "local datetime", "time", "duration"
#: ... any value: the schema does not pin the field to one kind (JSON Schema's ``{}``, a
#: union of several types); no contract type is checked against it.
ANY = "any"

#: Kinds a contract column's strict validation accepts (by its ``value_type``), when the
#: decoded values arrive typed and are validated in Python mode (Avro, Protobuf)...
PYTHON_KINDS: Mapping[str, frozenset[str]] = {
    "text": frozenset({STR}), "int2": frozenset({INT}), "int4": frozenset({INT}),
    "int8": frozenset({INT}), "float8": frozenset({FLOAT, INT}),
    "numeric": frozenset({DECIMAL}), "bool": frozenset({BOOL}),
    "timestamptz": frozenset({DATETIME}), "date": frozenset({DATE}),
    "uuid": frozenset({UUID_}), "jsonb": frozenset({OBJECT, LIST}),
    "bytea": frozenset({BYTES}), "timestamp": frozenset({LOCAL_DATETIME}),
    "time": frozenset({TIME_}), "interval": frozenset({DURATION})}
#: ... and when the payload is JSON, validated as JSON (JSON Schema): text parses.
JSON_KINDS: Mapping[str, frozenset[str]] = {
    **PYTHON_KINDS, "numeric": frozenset({STR, FLOAT, INT}),
    "timestamptz": frozenset({STR, DATETIME}), "date": frozenset({STR, DATE}),
    "uuid": frozenset({STR, UUID_}), "timestamp": frozenset({STR, LOCAL_DATETIME}),
    "time": frozenset({STR, TIME_}), "interval": frozenset({STR, DURATION})}

class PayloadReader(Protocol):
    """A decoder: a record's value and where its payload starts (after the wire header:
    read in place, not copied out first) -> what the contract validates (a dict in Python
    mode, or the payload's JSON bytes)."""

    def __call__(self, value: bytes, start: int = 0, /) -> Any: ...


@dataclass(frozen=True)
class WriterField:
    """One top-level field of a writer schema: its kind, whether it may be null or
    missing, and what the generator needs (decimal digits, enum symbols, item kind)."""

    name: str
    kind: str
    nullable: bool = False
    precision: int | None = None
    scale: int | None = None
    items: str | None = None
    max_length: int | None = None
    #: A record's (an Avro record, a Protobuf message, a JSON Schema object) own fields,
    #: read to a depth of :data:`FIELDS_DEPTH`; None for any other kind, or deeper.
    fields: Fields | None = None
    #: An integer's width in bits when the schema says it (Avro ``int``: 32).
    bits: int | None = None


#: The top-level fields of one record type of a writer schema, by name.
Fields = dict[str, WriterField]
#: How deep the codecs read a record's nested records' fields (a record that contains
#: itself ends there).
FIELDS_DEPTH = 8


class NoSuchRecord(ValueError):
    """The record type a pipeline (``schema_registry.record``) or ``schema
    from-registry --record`` names is not in the writer schema."""


class Codec:
    """One value format. The registry formats (``format.registry``) implement every
    method; plain JSON has no writer schema, so only :meth:`schema_id` (None) and
    :attr:`python` (False: its bytes are the contract's JSON) apply to it."""

    #: The ``format`` of the pipelines it reads.
    format: ClassVar[Format]
    #: The registry's ``schemaType`` of this format's schemas (None: no registry).
    schema_type: ClassVar[str | None] = None
    #: Whether a decoded value is validated in Python mode (typed values in a dict), or
    #: as JSON (the payload's bytes).
    python: ClassVar[bool] = False
    #: Whether the registry is asked for the schema as a serialized descriptor
    #: (Protobuf; see :func:`~kafka_ingest.kafka.registry.is_descriptor`).
    serialized: ClassVar[bool] = False

    @property
    def kinds(self) -> Mapping[str, frozenset[str]]:
        """The kinds each contract column accepts, by how values travel."""
        return PYTHON_KINDS if self.python else JSON_KINDS

    def schema_id(self, value: bytes | None) -> int | None:
        """The writer schema id ``value`` carries in its wire header (kept with its dead
        letter), or None when it carries none."""
        return wire_schema_id(value)

    # ----------------------------------------------------------------- the registry

    def schema(self, registry: SchemaRegistry, schema_id: int) -> WriterSchema | None:
        """The writer schema registered under ``schema_id`` (None: the registry has none)."""
        return registry.schema(schema_id, serialized=self.serialized)

    def latest(self, registry: SchemaRegistry, subject: str) -> WriterSchema | None:
        """The subject's latest version (None: no such subject)."""
        return registry.latest(subject, serialized=self.serialized)

    def version(self, registry: SchemaRegistry, subject: str,
                number: int) -> WriterSchema | None:
        """Version ``number`` of the subject (None: no such version)."""
        return registry.version(subject, number, serialized=self.serialized)

    def reads(self, schema: WriterSchema) -> bool:
        """Whether ``schema`` is one of this format's (the registry holds every type)."""
        return schema.schema_type.upper() == self.schema_type

    # ----------------------------------------------------------------- payloads

    def reader(self, schema: WriterSchema) -> PayloadReader:
        """The decoder of payloads written with ``schema`` (made once per schema id);
        it raises :class:`~kafka_ingest.errors.Undecodable` for a payload it cannot read,
        and :class:`~kafka_ingest.errors.SchemaUnreadable` when the schema itself cannot
        be built."""
        raise NotImplementedError(f"{self.format.value} payloads carry no writer schema")

    def python_value(self, decoded: Any) -> Any:
        """A decoded payload as a Python value (a registry-encoded record key is read
        from it): what :meth:`reader` returned, unless that is JSON bytes."""
        return decoded

    # ----------------------------------------------------------------- schemas

    def connect_schema(self, schema: WriterSchema) -> dict[str, Any] | None:
        """The Kafka Connect schema ``schema`` was made from by a Connect converter, in
        JsonConverter's JSON form (:mod:`~kafka_ingest.decode.connect_schema`), or None
        when the format keeps no trace of it: the change events of such a format are read
        as their codec decodes them."""
        return None

    def record_fields(self, schema: WriterSchema, record: str | None = None) -> list[Fields]:
        """The fields a record written with ``schema`` may have: one set, or one per
        record type the schema declares when a record names which it is (a Protobuf
        file's messages; ``record`` picks one by its full name, :class:`NoSuchRecord`
        naming the ones there are when it is not there)."""
        raise NotImplementedError(f"{self.format.value} has no writer schema")

    def record_name(self, schema: WriterSchema) -> str | None:
        """The name of the record ``schema`` describes (its last part), when the format
        names its records; a guess of what the records are (an ``orders`` record's
        ``orderid`` names itself its id)."""
        return None

    def primitive_kind(self, schema: WriterSchema) -> str | None:
        """The kind of a schema of one primitive value (a key subject's ``"string"`` or
        ``"long"``: ``str``, ``int``); None for a record."""
        return None


__all__ = ["ANY", "BOOL", "BYTES", "DATE", "DATETIME", "DECIMAL", "DURATION", "FIELDS_DEPTH",
           "FLOAT", "INT", "JSON_KINDS", "LIST", "LOCAL_DATETIME", "OBJECT", "PYTHON_KINDS", "STR",
           "TIME_", "UUID_", "Codec", "Fields", "NoSuchRecord", "PayloadReader", "WriterField"]
