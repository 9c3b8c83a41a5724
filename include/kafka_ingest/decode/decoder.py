"""The registry formats' decoding for one slice: writer schemas fetched once per id.

A record of a registry format (``avro``, ``protobuf``, ``json_schema``) is the wire
header (:mod:`~kafka_ingest.decode.codecs.wire`), then the payload. The header is parsed
here; the writer schema is fetched once per id and kept, parsed, for the slice; then the
pipeline's codec (:mod:`~kafka_ingest.decode.codecs`) decodes the payload to what the
contract validates.

Failures keep the split: no magic byte (:class:`NotWireFormat`), an id the registry does
not know (:class:`UnknownSchema`), a writer schema the codec cannot build
(:class:`SchemaUnreadable`: a reference the registry does not serve, an import nothing
defines; judged once per id, its records dead-lettered, the others load) and a payload the
writer schema cannot decode (:class:`Undecodable`) are data errors; the registry down is
transient and raises (the schema's references included), and so is a chunk none of whose
ids the registry knows (:class:`RegistryLacksSchemas`, see
:meth:`RegistryDecoder.require_a_known_id`). A writer schema the *contract* cannot read is
judged record by record (:meth:`RegistryDecoder.explained`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from kafka_ingest.config import KeyFormat, Pipeline
from kafka_ingest.decode.codecs import PayloadReader, codec_for
from kafka_ingest.decode.codecs.wire import HEADER_SIZE, split_header
from kafka_ingest.decode.schemas import schema_problems
from kafka_ingest.errors import (
    ContractViolation,
    DataError,
    RegistryLacksSchemas,
    SchemaUnreadable,
    SettingsError,
    UnknownSchema,
)
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry, WriterSchema
from kafka_ingest.records import MessageLike

log = logging.getLogger(__name__)


class RegistryDecoder:
    """The wire format of one pipeline, for one slice: writer schemas fetched once per id.

    ``read(value)`` returns what the contract validates: a dict (validated in Python
    mode) or the payload's JSON bytes, as the pipeline's codec decodes it;
    :attr:`python` says which.

    Records are judged by the writer schema they carry, not by the subject's latest: a
    record the contract accepts loads, whatever its schema; one it refuses is
    dead-lettered, and when its writer schema is one the contract cannot read (checked once
    per id, :func:`~kafka_ingest.decode.schemas.schema_problems`), the reason names that
    schema id and the fields (:meth:`explained`).
    """

    def __init__(self, pipeline: Pipeline, registry: SchemaRegistry) -> None:
        self.pipeline = pipeline
        self.codec = codec_for(pipeline.format)
        self.registry = registry
        self.python = self.codec.python
        self._readers: dict[int, PayloadReader] = {}
        #: The same readers by the header bytes that carry their id (magic byte and id):
        #: the hot path's one lookup, without parsing the header (:meth:`read`); a header
        #: not met yet is parsed then (:class:`_ReadersByHeader`).
        self._by_header = _ReadersByHeader(self._header_reader)
        #: The writer schemas behind ``_readers``.
        self._schemas: dict[int, WriterSchema] = {}
        #: Schema id -> why the contract cannot read it (None: it can), judged the first
        #: time the contract refuses a record of it.
        self._unreadable: dict[int, str | None] = {}
        #: Reads that met a schema id the registry does not know (see
        #: :func:`require_a_known_id`): counted on the slow path only.
        self.unknown_reads = 0
        #: Whether record keys may be in the wire format too: ``record_key.format:
        #: registry``, or a mirror's composite key (read by its wire header when it has one:
        #: :func:`~kafka_ingest.decode.envelopes.key_reader`).
        self.keys = pipeline.composite_key or (
            pipeline.record_key is not None and pipeline.record_key.format is KeyFormat.REGISTRY)

    def read(self, value: bytes) -> Any:
        return self._by_header[value[:HEADER_SIZE]](value, HEADER_SIZE)

    def checking(self, check: Callable[[Any], Any]) -> Callable[[bytes], Any]:
        """value -> ``check`` of what :meth:`read` returns, in one frame a message (the hot
        path's: a frame is about 0.1 µs, the Avro path's time was 1.4x JSON's)."""
        by_header = self._by_header

        def read_and_check(value: bytes) -> Any:
            return check(by_header[value[:HEADER_SIZE]](value, HEADER_SIZE))

        return read_and_check

    def _header_reader(self, header: bytes) -> PayloadReader:
        """The reader of the schema id in ``header`` (a value's first bytes);
        :class:`NotWireFormat` when they are not the wire format's header."""
        schema_id, _ = split_header(header)
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._readers[schema_id] = self._reader(schema_id)
        return reader

    def writer_schema(self, value: bytes) -> WriterSchema:
        """The writer schema of ``value``, a value :meth:`read` has read."""
        return self._schemas[split_header(value[:HEADER_SIZE])[0]]

    def read_python(self, value: bytes) -> Any:
        """A value in the wire format decoded to a Python value, whatever the codec hands
        the contract: a record key, or a dead letter's payload that a replay's filter
        reads."""
        return self.codec.python_value(self.read(value))

    def _schema(self, schema_id: int) -> WriterSchema | None:
        return self.codec.schema(self.registry, schema_id)

    def _reader(self, schema_id: int) -> PayloadReader:
        schema = self._schema(schema_id)
        if schema is None:
            self.unknown_reads += 1
            raise UnknownSchema(f"schema id {schema_id} is not registered (the registry "
                                "answered 404)")
        if not self.codec.reads(schema):
            raise UnknownSchema(f"schema id {schema_id} is a {schema.schema_type} schema, and "
                                f"this pipeline reads {self.codec.format.value}")
        self._schemas[schema_id] = schema
        try:
            return self.codec.reader(schema)
        except SchemaUnreadable as exc:
            log.warning("%s: %s; its records are dead-lettered (schema_unreadable), the others "
                        "load", self.pipeline.name, exc)
            return _refusing(exc)

    def explained(self, value: bytes, error: DataError) -> DataError:
        """``error`` (the contract refused the record ``value``) with, when the record's
        writer schema is one the contract cannot read, that schema id and why."""
        schema_id = self.codec.schema_id(value)
        if schema_id is None or not isinstance(error, ContractViolation):
            return error
        if schema_id not in self._unreadable:
            self._unreadable[schema_id] = self._judge(schema_id)
        why = self._unreadable[schema_id]
        if why is None:
            return error
        return ContractViolation(f"written with schema id {schema_id}, which the contract "
                                 f"cannot read ({why}): {error.detail}")

    def _judge(self, schema_id: int) -> str | None:
        """Why the contract cannot read a value's writer schema (None: it can), once per
        id, on the first record of it the contract refuses."""
        schema = self._schemas.get(schema_id)
        if schema is None:  # not decoded: the refusal is not about the payload
            return None
        try:
            problems = schema_problems(self.pipeline, schema)
        except Exception as exc:  # best effort: the record's own reason stands
            log.warning("%s: schema id %d could not be compared with the contract: %s",
                        self.pipeline.name, schema_id, exc)
            return None
        if not problems:
            return None
        log.warning("%s: the contract cannot read schema id %d: %s; its records that the "
                    "contract refuses are dead-lettered (contract_violation), the others load",
                    self.pipeline.name, schema_id, "; ".join(problems))
        return "; ".join(problems)

    def require_a_known_id(self, messages: Sequence[MessageLike], where: str) -> None:
        """Raise :class:`RegistryLacksSchemas` when the records of a chunk carry schema ids
        and the registry knows none of them (called once its validation met an unknown id).

        The chunk is the unit of the judgement, and it is one-sided on purpose. That the
        registry served the ids of earlier chunks proves nothing about this one's: a
        replica that lags, or a registry restored from an older backup, misses exactly the
        newest ids, and records arrive in runs of one schema, so a chunk whose every id is
        unknown (a chunk of one record included) fails, and the retry reads it again. A
        record whose id is truly gone (another cluster's, a deleted schema) costs a delay,
        not a loss: the next run's chunk starts at it, and as soon as a record whose id the
        registry knows shares that chunk, it is dead-lettered as ``unknown_schema``. Records
        without the wire header carry no id and count for nothing either way; an id the
        registry knows under another type counts as known (that record is poison).

        Values and record keys (``record_key.format: registry``) are judged apart: a key
        subject's schema is the same for a topic's whole life (a table's primary key), so
        its old id, which a lagging registry knows, vouches for none of the values' new
        ones."""
        values = self._ids(msg.value() for msg in messages)
        keys = self._ids(msg.key() for msg in messages) if self.keys else set()
        unknown = {schema_id for schema_id in values | keys if self._schema(schema_id) is None}
        if any(part and part <= unknown for part in (values, keys)):
            raise RegistryLacksSchemas(where, sorted(unknown), self.registry.settings.url)

    def _ids(self, raws: Iterable[bytes | None]) -> set[int]:
        return {schema_id for raw in raws if (schema_id := self.codec.schema_id(raw)) is not None}

    def __repr__(self) -> str:
        return f"RegistryDecoder({self.codec.format.value}, {self.registry.settings!r})"


class _ReadersByHeader(dict[bytes, PayloadReader]):
    """Readers by a value's header bytes: one the dict lacks is found by ``find`` (which
    raises for a header that is none: nothing is kept then) and kept."""

    def __init__(self, find: Callable[[bytes], PayloadReader]) -> None:
        super().__init__()
        self._find = find

    def __missing__(self, header: bytes) -> PayloadReader:
        reader = self[header] = self._find(header)
        return reader


def _refusing(exc: SchemaUnreadable) -> PayloadReader:
    """The reader of a schema id the codec could not build: each of its records is refused
    for the same reason, without building it again."""
    schema_id, reason = exc.schema_id, exc.reason

    def refuse(value: bytes, start: int = 0, /) -> Any:
        raise SchemaUnreadable(schema_id, reason)

    return refuse


@contextlib.contextmanager
def open_decoder(pipeline: Pipeline,
                 settings: RegistrySettings | None) -> Iterator[RegistryDecoder | None]:
    """The pipeline's decoder for one slice (its registry client closed after), or None
    for plain JSON (validated straight from bytes)."""
    with open_registry(pipeline, settings) as registry:
        yield None if registry is None else RegistryDecoder(pipeline, registry)


@contextlib.contextmanager
def open_registry(pipeline: Pipeline,
                  settings: RegistrySettings | None) -> Iterator[SchemaRegistry | None]:
    """A client of the pipeline's registry, closed after; None for plain JSON; a
    :class:`SettingsError` when the format needs a registry and none is configured."""
    if not pipeline.format.registry:
        yield None
        return
    if settings is None:
        conn_id = pipeline.schema_registry.conn_id if pipeline.schema_registry else "?"
        raise SettingsError(f"pipeline {pipeline.name} reads {pipeline.format.value} from a "
                            "schema registry, and no registry is configured: set "
                            "KAFKA_INGEST_SCHEMA_REGISTRY_URL (the CLI) or the Airflow "
                            f"connection {conn_id!r}")
    registry = SchemaRegistry(settings)
    try:
        yield registry
    finally:
        registry.close()


__all__ = ["RegistryDecoder", "open_decoder", "open_registry"]
