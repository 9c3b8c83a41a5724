"""Bytes -> valid rows | dead letters, one chunk at a time.

The hot path is one ``validate_json`` per message (pydantic-core parses and validates in
Rust; measured fastest here, see DESIGN §9), by the contract's fields' validator where
the model adds nothing to it (:func:`~kafka_ingest.contracts.base.hot_validation`: no
model instance per message). Everything that explains a failure (UTF-8 check, JSON type,
which field) runs only for the failures.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from pydantic import ValidationError
from pydantic_core import SchemaValidator

from kafka_ingest.config import OnTombstone, OnTruncate, Pipeline, ReplicaIdentity
from kafka_ingest.contracts.base import Contract, hot_validation, sink_getter
from kafka_ingest.contracts.columns import PG_EPOCH_MS
from kafka_ingest.decode.codecs import codec_for
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.decode.envelopes import (
    UPSERTS,
    EnvelopeReader,
    declared_fields,
    key_reader,
    source_name,
)
from kafka_ingest.decode.message_columns import column_reader, key_value
from kafka_ingest.errors import (
    ContractViolation,
    DataError,
    NotAnObject,
    TooLarge,
    Undecodable,
    UnknownVersion,
)
from kafka_ingest.kafka.dlq import DETAIL_MAX, DeadLetter
from kafka_ingest.records import (
    EVERY_KEY,
    MAX_TIMESTAMP_MS,
    CopyPayload,
    MessageLike,
    Row,
    Tombstone,
    kafka_timestamp_ms,
)

log = logging.getLogger(__name__)

#: The errors of a value that is no object at all: the model's validator says
#: ``model_type``, the fields' validator (a ``TypedDict``'s) ``dict_type``.
_NOT_AN_OBJECT = frozenset({"model_type", "dict_type"})
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


@dataclass
class ValidationResult:
    """One chunk, validated: rows for the target table, and dead letters with reasons."""

    rows: list[Row] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    #: The rows as a binary ``COPY`` payload, when encoded ahead of the transaction.
    encoded: CopyPayload | None = None
    tombstones: int = 0
    #: ``on_tombstone: delete``: the tombstones, each a delete of its key's row.
    deletes: list[Tombstone] = field(default_factory=list)
    read: int = 0
    #: The latest event time of the chunk in epoch ms (:func:`latest_event_ms`), set by
    #: the ingest writer's prepare step.
    latest_event_ms: int | None = None
    bytes: int = 0  # (named like the type: fields that use the type come before it)


#: A value the contract refused, and pydantic's reasons -> the data error to dead-letter.
Refusal = Callable[[bytes, ValidationError], DataError]


def _parser(validator: SchemaValidator,
            decoder: RegistryDecoder | None) -> tuple[Callable[[bytes], Any], Refusal]:
    """(bytes -> the validated event, and what a refusal is): ``validator``'s JSON
    validation straight from bytes (without a Python frame per message), or the registry
    format decoded first, in one frame (:meth:`RegistryDecoder.checking`); its refusal
    classified against the payload (decoded again: a refusal is the rare path), and
    explained by the writer schema when the contract cannot read that schema."""
    if decoder is None:
        return validator.validate_json, classify
    check = validator.validate_python if decoder.python else validator.validate_json

    def refusal(value: bytes, exc: ValidationError) -> DataError:
        payload = decoder.read(value)
        error = classify(payload if isinstance(payload, bytes) else b"{}", exc)
        return decoder.explained(value, error)

    return decoder.checking(check), refusal


def validate_chunk(messages: Iterable[MessageLike], pipeline: Pipeline,
                   decoder: RegistryDecoder | None = None) -> ValidationResult:
    """Validate each message against the pipeline's contract (a registry format decoded
    by ``decoder`` first); never raises a DataError."""
    if pipeline.envelope is not None:
        return validate_changes(messages, pipeline, decoder)
    model = pipeline.model
    validation = hot_validation(model)
    parse, refusal = _parser(validation.validator, decoder)
    max_bytes = pipeline.max_message_bytes
    extra = column_reader(pipeline, decoder)  # the key and header columns; None: none
    build = row_builder(model, by_key=validation.by_key)
    result = ValidationResult()
    rows_append = result.rows.append
    read = size = 0
    for msg in messages:  # the hot loop: no call per message that can be spared
        read += 1
        value = msg.value()
        if value is None:
            _tombstone(msg, pipeline, result, decoder)
            continue
        n = len(value)
        size += n
        if n > max_bytes:
            error: DataError = TooLarge(f"value is {n} bytes, over the limit {max_bytes}")
            result.dead.append(dead_letter(msg, pipeline, error))
            continue
        try:
            event = parse(value)
            more = () if extra is None else extra(msg)
        except ValidationError as exc:
            result.dead.append(dead_letter(msg, pipeline, refusal(value, exc)))
            continue
        except DataError as exc:  # the wire format, or the record key or a header
            result.dead.append(dead_letter(msg, pipeline, exc))
            continue
        rows_append(build(event, msg, more))
    result.read, result.bytes = read, size
    return result


def validate_changes(messages: Iterable[MessageLike], pipeline: Pipeline,
                     decoder: RegistryDecoder | None = None) -> ValidationResult:
    """:func:`validate_chunk` of a change-event pipeline (``envelope: debezium``, see
    :mod:`~kafka_ingest.decode.envelopes`): an upsert's ``after`` row validated by the
    contract, a delete (a truncate, by ``on_truncate``) a delete by key; never raises a
    DataError."""
    validation = hot_validation(pipeline.model)
    validator = validation.validator
    envelopes = EnvelopeReader(decoder, pipeline=pipeline.name,
                               declared=declared_fields(pipeline.model),
                               key_fields=change_key_fields(pipeline),
                               full=pipeline.replica_identity is ReplicaIdentity.FULL)
    delete_key = change_key(pipeline, decoder)
    extra = column_reader(pipeline, decoder)
    build = row_builder(pipeline.model, by_key=validation.by_key)
    truncates = pipeline.on_truncate is OnTruncate.TRUNCATE
    max_bytes = pipeline.max_message_bytes
    result = ValidationResult()
    for msg in messages:
        result.read += 1
        value, row = msg.value(), None
        if value is None:  # the tombstone after a delete: the delete was its change event
            result.tombstones += 1
            continue
        result.bytes += len(value)
        try:
            if len(value) > max_bytes:
                raise TooLarge(f"value is {len(value)} bytes, over the limit {max_bytes}")
            op, row = envelopes.read(value, (msg.topic(), msg.partition()))
            if op in UPSERTS:
                event = (validator.validate_json(row) if isinstance(row, bytes)
                         else validator.validate_python(row))
                result.rows.append(build(event, msg, () if extra is None else extra(msg)))
                continue
            if op == "d" or truncates:
                key = EVERY_KEY if op == "t" else delete_key(msg.key())
                result.deletes.append(Tombstone(key, msg.topic() or pipeline.topic,
                                                msg.partition() or 0, msg.offset() or 0))
            result.tombstones += 1
        except ValidationError as exc:
            payload = row if isinstance(row, bytes) else b"{}"
            result.dead.append(dead_letter(msg, pipeline, classify(payload, exc)))
        except DataError as exc:
            result.dead.append(dead_letter(msg, pipeline, exc))
    return result


def change_key_fields(pipeline: Pipeline) -> tuple[str, ...]:
    """A change-event pipeline's primary key columns as its rows (and record keys) name
    them: ``record_key.field``, or the source names of a composite key's fields."""
    if pipeline.composite_key:
        return tuple(source_name(path) for path in pipeline.identity_fields)
    return (pipeline.record_key.field or "",) if pipeline.record_key else ()


def change_key(pipeline: Pipeline,
               decoder: RegistryDecoder | None) -> Callable[[bytes | None], Any]:
    """What reads a change event's record key as the key of a delete: ``record_key``'s
    column, or a composite key's fields (:func:`~kafka_ingest.decode.envelopes.key_reader`,
    a tuple in key order)."""
    if pipeline.composite_key:
        types = {c.name: c.value_type for c in pipeline.sink_columns}
        read = key_reader(change_key_fields(pipeline),
                          tuple(types[k] for k in pipeline.upsert.keys), decoder)
        if len(pipeline.upsert.keys) == 1:  # one field named by identity: its value
            return lambda raw: read(raw)[0]
        return read
    spec = pipeline.record_key
    if spec is None:  # refused when the pipeline loads
        raise ValueError(f"{pipeline.name}: a change-event pipeline reads deletes' keys from "
                         "its record key")
    return lambda raw: key_value(spec, raw, decoder)


#: A validated event (the validator's result), its message and its key and header
#: column values -> its row.
RowBuilder = Callable[[Any, MessageLike, tuple[Any, ...]], Row]


def row_builder(model: type[Contract], *, by_key: bool) -> RowBuilder:
    """What makes a message's row: the contract's values (read from the fields dict when
    ``by_key``, else from the model instance; :func:`~kafka_ingest.contracts.base.sink_getter`),
    the key and header columns, then the provenance with the Kafka timestamp as the binary
    timestamptz it travels as (:func:`~kafka_ingest.records.kafka_timestamp_ms`, then
    :func:`~kafka_ingest.contracts.columns.millis_to_pg`, both inline). One flat tuple: it
    goes to ``COPY`` as it is."""
    values = sink_getter(model, by_key=by_key)

    def row(event: Any, msg: MessageLike, more: tuple[Any, ...]) -> Row:
        kind, ms = msg.timestamp()
        # tuples added, not unpacked into a display (which builds a list first): 2 % of
        # validate_chunk's instructions
        return values(event) + more + (
            msg.topic(), msg.partition(), msg.offset(), msg.key(),
            (ms - PG_EPOCH_MS) * 1000 if kind and 0 <= ms <= MAX_TIMESTAMP_MS else None)

    return row


def _tombstone(msg: MessageLike, pipeline: Pipeline, result: ValidationResult,
               decoder: RegistryDecoder | None) -> None:
    """A null value: skipped (counted), dead-lettered, or a delete of its key's row."""
    rule = pipeline.on_tombstone
    if rule is OnTombstone.DELETE and pipeline.record_key is not None:
        try:
            key = key_value(pipeline.record_key, msg.key(), decoder)
        except DataError as exc:
            result.dead.append(dead_letter(msg, pipeline, exc))
            return
        result.deletes.append(Tombstone(key, msg.topic() or pipeline.topic,
                                        msg.partition() or 0, msg.offset() or 0))
        result.tombstones += 1
    elif rule is OnTombstone.DEAD_LETTER:
        result.dead.append(dead_letter(msg, pipeline, DataError("tombstone (null value)")))
    else:
        result.tombstones += 1


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def latest_event_ms(result: ValidationResult, pipeline: Pipeline) -> int | None:
    """The latest event time of a validated chunk, in epoch ms (rounded down), for the
    run's event-time watermark (:mod:`kafka_ingest.ops.lineage`); None if no record has one.

    By ``pipeline.event_time``: the greatest value of that column over the chunk's rows
    (a ``timestamptz`` as the row holds it: a datetime, or microseconds since Postgres'
    epoch when the contract converts it). Without it, by the Kafka timestamp: over the rows
    and the dead letters (a poison record was handled too, as it is by log order). One
    pass over one column of the rows.

    The watermark is a report: a value it cannot read (none should reach a row) costs this
    chunk's contribution and a log line, never the chunk. Leaving a chunk out can only
    hold the watermark back.
    """
    try:
        ms = _latest_ms(map(itemgetter(pipeline.event_time_index), result.rows))
    except (TypeError, ValueError, OverflowError) as exc:
        log.warning("%s: this chunk's event times (%s) could not be compared, so it does not "
                    "advance the watermark: %s", pipeline.name, pipeline.event_time_column, exc)
        return None
    if pipeline.event_time is None:
        ms = max(filter(None, (ms, *(d.timestamp_ms for d in result.dead))), default=None)
    return ms


def _latest_ms(values: Iterable[Any]) -> int | None:
    latest = max((v for v in values if v is not None), default=None)
    if latest is None:
        return None
    if isinstance(latest, datetime):
        return (latest - _EPOCH) // _MS
    return int(latest) // 1000 + PG_EPOCH_MS


def dead_letter(msg: MessageLike, pipeline: Pipeline, error: DataError) -> DeadLetter:
    return DeadLetter(
        source_topic=msg.topic() or pipeline.topic,
        source_partition=msg.partition() or 0,
        source_offset=msg.offset() or 0,
        key=msg.key(),
        value=msg.value(),
        headers=_original_headers(msg),
        schema_id=codec_for(pipeline.format).schema_id(msg.value()),
        timestamp_ms=kafka_timestamp_ms(msg),
        error_class=error.error_class,
        error_detail=error.detail[:DETAIL_MAX],
        contract=pipeline.model.key(),
        dlq_topic=pipeline.dlq_topic,
    )


def _original_headers(msg: MessageLike) -> tuple[tuple[str, bytes | None], ...]:
    """The record's own headers, kept in its dead letter (a replay reads its header
    columns from them)."""
    return tuple(msg.headers() or ())


def classify(value: bytes, exc: ValidationError) -> DataError:
    """Turn a pydantic failure into the precise data error a person can act on."""
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return _undecodable(value, first["msg"])
    if first["type"] in _NOT_AN_OBJECT and not first["loc"]:
        return NotAnObject(f"JSON value is {_json_type(value)}, not an object")
    version_errors = [e for e in errors if e["loc"][:1] == ("version",)]
    if version_errors and version_errors[0]["type"] in {"less_than_equal", "greater_than_equal"}:
        return UnknownVersion(f"payload version is not accepted: {version_errors[0]['msg']}")
    parts = [f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']} [{e['type']}]"
             for e in errors]
    return ContractViolation("; ".join(parts)[:DETAIL_MAX])


def _undecodable(value: bytes, msg: str) -> Undecodable:
    if not value.strip():
        return Undecodable("empty value")
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as err:
        return Undecodable(f"not UTF-8: byte 0x{value[err.start]:02x} at position {err.start}")
    if "recursion limit" in msg:
        return Undecodable(f"JSON nested too deeply: {msg}")
    return Undecodable(f"not JSON: {msg}")


def _json_type(value: bytes) -> str:
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return "not an object"
    return _JSON_TYPES.get(type(parsed), type(parsed).__name__)
