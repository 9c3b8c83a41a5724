"""Change events: Debezium's envelope, between the codec and the contract.

A pipeline with ``envelope: debezium`` mirrors a table. Its record values are change
events (``before``, ``after``, ``source``, ``op``, ``ts_ms``), as Kafka Connect's
JsonConverter writes them with its schema in every message (``{"schema": ...,
"payload": ...}``) or without it, or as a registry format decodes them; its record keys
are the row's primary key (a JsonConverter key's ``payload`` is unwrapped,
:func:`~kafka_ingest.decode.message_columns.key_value`). Each event becomes:

- ``c`` (insert), ``r`` (a snapshot's read) and ``u`` (update): an upsert of ``after``,
  validated by the contract like any payload; with the schema in the message, Debezium's
  semantic types are decoded first to the Python value the contract's column takes
  (:func:`semantic`: ``Decimal`` bytes to a decimal, ``MicroTimestamp`` to a datetime, ...).
  A column Debezium left out of an update (a TOASTed value the update did not change:
  :data:`~kafka_ingest.config.UNAVAILABLE`) keeps its stored value (the writer's update skips it,
  :func:`~kafka_ingest.db.writers.latest.kept_columns`);
- ``d`` (delete): a delete of the record key's row (a composite key: the record key's
  fields, :func:`key_reader`), with a deletion marker, as a
  tombstone of ``on_tombstone: delete`` is (the null-valued tombstone after it is
  skipped: the delete was its change event);
- ``t`` (truncate): ``on_truncate`` says: skipped, or every row of the table placed before
  it in its partition deleted, and its place kept as the partition's truncate point
  (:data:`~kafka_ingest.records.EVERY_KEY`, :mod:`~kafka_ingest.db.writers.deleting`);
- anything else (no ``op``, an unknown one, an insert without ``after``, no object at
  all) is dead-lettered as ``bad_envelope``, and a row the contract refuses as any
  payload is.

A delete and a skipped truncate count as ``tombstones`` (records that write no row).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic_core import from_json, to_json

from kafka_ingest.config import (
    KEPT_ARRAYS,
    UNAVAILABLE,
    UNAVAILABLE_DATES,
    UNAVAILABLE_JSON,
    UNAVAILABLE_UUID,
)
from kafka_ingest.contracts.declared import RESERVED_COLUMNS, TEXT_MAX, FieldSpec
from kafka_ingest.decode.codecs.wire import HEADER_SIZE
from kafka_ingest.decode.decoder import RegistryDecoder
from kafka_ingest.errors import (
    BadEnvelope,
    BadKey,
    ReplicaIdentityNotFull,
    SourceChanged,
    Undecodable,
)

#: The operations that carry a row to write.
UPSERTS = frozenset({"c", "r", "u"})
_OPS = "c (insert), r (snapshot read), u (update), d (delete), t (truncate)"

_EPOCH_DAY = date(1970, 1, 1)
#: Debezium's ``Timestamp`` types are local times (a ``timestamp`` column): zone-less.
_EPOCH = datetime(1970, 1, 1)

#: A value of one column as the message carries it -> the value the contract validates.
Convert = Callable[[Any], Any]
#: A change event's ``after`` row, as the message carries it -> what the contract
#: validates (a dict of Python values, or the row's JSON bytes when no schema says more).
RowReader = Callable[[dict[str, Any]], Any]


def _unscaled(value: Any) -> int:
    """A Connect ``Decimal``'s unscaled value: big-endian two's complement bytes, as
    JsonConverter writes them (base64)."""
    raw = base64.b64decode(value, validate=True) if isinstance(value, str) else bytes(value)
    return int.from_bytes(raw, "big", signed=True)


def _decimal(scale: int) -> Convert:
    return lambda value: Decimal(_unscaled(value)).scaleb(-scale)


def _variable_decimal(value: Any) -> Decimal:
    return Decimal(_unscaled(value["value"])).scaleb(-int(value["scale"]))


def _time_of_day(per_second: int) -> Convert:
    def convert(value: Any) -> time:
        return (_EPOCH + timedelta(microseconds=value * 1_000_000 // per_second)).time()
    return convert


def _local_timestamp(per_second: int) -> Convert:
    def convert(value: Any) -> datetime:
        return _EPOCH + timedelta(microseconds=value * 1_000_000 // per_second)
    return convert


def _zoned(value: Any) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _json(value: Any) -> Any:
    return list(UNAVAILABLE_JSON) if value == UNAVAILABLE else json.loads(value)


#: The placeholder as a column's value reads: text, a jsonb column's (:func:`_json`) or a
#: text array's, bytea's decoded or (without a schema) base64, an integer array's (its
#: bytes), a date array's (those as days) and a uuid array's (decoded or as text).
_PLACEHOLDERS = (UNAVAILABLE, list(UNAVAILABLE_JSON), UNAVAILABLE.encode(),
                 base64.b64encode(UNAVAILABLE.encode()).decode(), list(UNAVAILABLE.encode()),
                 list(UNAVAILABLE_DATES), [UNAVAILABLE_UUID], [str(UNAVAILABLE_UUID)])


def unavailable(value: Any) -> bool:
    """Whether a column value of an ``after`` row is Debezium's placeholder."""
    return isinstance(value, str | bytes | list) and any(value == p for p in _PLACEHOLDERS)


def _bytes(value: Any) -> bytes:
    return base64.b64decode(value, validate=True) if isinstance(value, str) else bytes(value)


#: Debezium's and Kafka Connect's semantic types (the field schema's ``name``) -> how a
#: value of it becomes the Python value its Postgres type takes.
SEMANTIC: dict[str, Convert] = {
    "io.debezium.data.VariableScaleDecimal": _variable_decimal,
    "io.debezium.time.Date": lambda days: _EPOCH_DAY + timedelta(days=days),
    "org.apache.kafka.connect.data.Date": lambda days: _EPOCH_DAY + timedelta(days=days),
    "io.debezium.time.Time": _time_of_day(1_000),
    "org.apache.kafka.connect.data.Time": _time_of_day(1_000),
    "io.debezium.time.MicroTime": _time_of_day(1_000_000),
    "io.debezium.time.NanoTime": _time_of_day(1_000_000_000),
    "io.debezium.time.Timestamp": _local_timestamp(1_000),
    "org.apache.kafka.connect.data.Timestamp": _local_timestamp(1_000),
    "io.debezium.time.MicroTimestamp": _local_timestamp(1_000_000),
    "io.debezium.time.NanoTimestamp": _local_timestamp(1_000_000_000),
    "io.debezium.time.ZonedTimestamp": _zoned,
    "io.debezium.time.MicroDuration": lambda micros: timedelta(microseconds=micros),
    "io.debezium.data.Json": _json,
    "io.debezium.data.Uuid": UUID,
    "io.debezium.data.Bits": _bytes,
}


def semantic(field: dict[str, Any]) -> Convert | None:
    """How a value of the Connect field schema ``field`` is decoded (None: as it is); one
    its codec decoded already (``"typed"``, an array's items included) by :func:`_typed`."""
    if field.get("typed"):
        return _typed(field)
    name, kind = field.get("name"), field.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        return _decimal(int((field.get("parameters") or {}).get("scale", 0)))
    if name in SEMANTIC:
        return SEMANTIC[name]
    if kind == "bytes":
        return _bytes
    if kind == "array" and isinstance(field.get("items"), dict):
        item = semantic(field["items"])
        if item is not None:
            return lambda values: [None if v is None else item(v) for v in values]
    return None


#: A column the row does not carry (:func:`row_reader` leaves it so).
_MISSING = object()


def _typed(field: dict[str, Any]) -> Convert | None:
    """How a value the codec decoded already (``"typed"``: an Avro logical type) becomes
    the value the JSON path gives: Connect's ``Timestamp`` a zone-less datetime (a
    ``timestamp`` column's), as :func:`semantic` makes it from milliseconds."""
    if field.get("name") == "org.apache.kafka.connect.data.Timestamp":
        return lambda value: value.replace(tzinfo=None) - (value.utcoffset() or _NO_OFFSET)
    return None


_NO_OFFSET = timedelta(0)


def row_reader(schema: Any) -> RowReader | None:
    """The reader of ``after`` rows of the envelope schema ``schema`` (a Connect schema,
    JSON, or one a registry format's schema stands for:
    :mod:`~kafka_ingest.decode.connect_schema`): each column of a semantic type decoded
    (one its codec decoded already, ``"typed"``, left as it is); None when the schema says
    nothing of the row (no ``after`` struct)."""
    after = _after(schema)
    if after is None:
        return None
    converts = tuple({f["field"]: c for f in after if isinstance(f, dict) and "field" in f
                      and (c := semantic(f)) is not None}.items())

    def read(row: dict[str, Any]) -> dict[str, Any]:
        for name, convert in converts:  # per column of every message: the guard inline
            raw = row.get(name, _MISSING)
            # null and the placeholder pass as they are (a jsonb column's placeholder
            # becomes UNAVAILABLE_JSON: _json's own)
            if raw is _MISSING or raw is None or (raw == UNAVAILABLE and convert is not _json):
                continue
            try:
                row[name] = convert(raw)
            except (ValueError, TypeError, KeyError, OverflowError, binascii.Error) as exc:
                raise BadEnvelope(f"after.{name}: not a value of its schema's type "
                                  f"({exc})") from None
        return row

    return read


#: The source columns whose names every contract reads as its own (a payload's contract
#: version, its event id): the contract reads them as these.
_RENAMED = {"version": "version_", "event_id": "event_id_"}


def payload_name(column: str) -> str:
    """The name the contract reads a source column by (see :data:`_RENAMED`)."""
    return _RENAMED.get(column, column)


def source_name(path: str) -> str:
    """The source column a contract's field reads (:func:`payload_name` undone)."""
    return next((column for column, name in _RENAMED.items() if name == path), path)


#: The range of each integer type of :data:`~kafka_ingest.config.KEY_VALUE_TYPES` (checked:
#: a delete's keys travel as one array, which a value out of range would fail whole).
_INT_BOUNDS = {"int2": (-(2**15), 2**15 - 1), "int4": (-(2**31), 2**31 - 1),
               "int8": (-(2**63), 2**63 - 1)}
#: The declared field types of those key columns (``schema from-topic``'s).
_KEY_FIELD_TYPES = ("smallint", "integer", "bigint", "text", "uuid")


def _key_part(name: str, value: Any, kind: str) -> Any:
    bounds = _INT_BOUNDS.get(kind)
    if bounds is not None:
        if type(value) is not int or not bounds[0] <= value <= bounds[1]:
            raise BadKey(f"record key field {name!r} is not an integer its column holds")
        return value
    if not isinstance(value, str) or "\x00" in value:
        raise BadKey(f"record key field {name!r} is not a string (without NUL)")
    if kind == "uuid":
        try:
            return UUID(value)
        except ValueError:
            raise BadKey(f"record key field {name!r} is not a UUID") from None
    return value


def key_reader(fields: tuple[str, ...], kinds: tuple[str, ...],
               decoder: RegistryDecoder | None = None) -> Callable[[bytes | None],
                                                               tuple[Any, ...]]:
    """The reader of a change event's record key of several fields: a JSON object (with
    JsonConverter's schema or without), or with a ``decoder``, a record in its registry
    format (a key with the wire header: a Connect converter of that format writes keys as
    it writes values) -> the values of ``fields`` (the source's column names), in that
    order, each checked as its column's value type (``kinds``, one of
    :data:`~kafka_ingest.config.KEY_VALUE_TYPES`): the key of a delete. :class:`BadKey`
    when it is none."""
    parts = tuple(zip(fields, kinds, strict=True))

    def read(raw: bytes | None) -> tuple[Any, ...]:
        if raw is None:
            raise BadKey("the record has no key: a delete names its row by the record key")
        if decoder is not None and decoder.codec.schema_id(raw) is not None:
            key = decoder.read_python(raw)
        else:
            try:
                key = from_json(raw)
            except ValueError:
                raise BadKey("record key is not JSON") from None
            # JsonConverter's with its schema (a record's fields are the key's own)
            if isinstance(key, dict) and key.keys() == {"schema", "payload"} \
                    and set(fields) != {"schema", "payload"}:
                key = key["payload"]
        if not isinstance(key, dict):
            raise BadKey(f"record key is not an object of the fields {list(fields)}")
        missing = [name for name in fields if name not in key]
        if missing:
            raise BadKey(f"record key has no field {missing[0]!r} (the primary key's fields "
                         f"are {list(fields)})")
        return tuple(_key_part(name, key[name], kind) for name, kind in parts)

    return read


def _renamed(row: dict[str, Any]) -> dict[str, Any]:
    """An ``after`` row with the columns of :data:`_RENAMED` under their contract names
    (the row's ``version`` is no contract version)."""
    for column, name in _RENAMED.items():
        if column in row:
            row[name] = row.pop(column)
    return row


def _schemaless(row: dict[str, Any]) -> bytes:
    """An ``after`` row without a schema: validated as JSON, as a plain payload is."""
    return to_json(row)


def source_changes(schema: Any, declared: dict[str, Any]) -> list[str]:
    """How the rows of the envelope schema ``schema`` differ from the contract's declared
    fields ``declared`` (a declaration's ``fields``): columns added (of a type a column can
    have: the others are left out, as ``schema from-topic`` leaves them), required columns
    dropped, columns of another type. Empty: the contract follows the source."""
    after = _after(schema)
    if after is None:
        return []
    columns = {payload_name(f["field"]): f for f in after
               if isinstance(f, dict) and "field" in f}
    changes = []
    for name, field in columns.items():
        spec, _ = _field_spec(field)
        if spec is None:
            continue
        # as a new contract version takes it: optional (older events lack it)
        wanted = {**spec, "required": False}
        if name not in declared:
            changes.append(f"column {name!r} added ({name}: {json.dumps(wanted)})")
        elif declared[name].get("type") not in (spec["type"], "record"):
            changes.append(f"column {name!r} is {spec['type']} now, the contract's "
                           f"{declared[name].get('type')}")
    changes += [f"column {name!r} dropped (make it required: false)"
                for name, spec in declared.items()
                if name not in columns and spec.get("required", True) is not False]
    return changes


def declared_fields(model: Any) -> dict[str, Any] | None:
    """The fields of a declared contract's version (its declaration's, up to the version),
    by payload name; None for a contract written in Python."""
    if model.DECLARATION is None:
        return None
    fields = json.loads(model.DECLARATION)["fields"]
    return {name: spec for name, spec in fields.items()
            if spec.get("since", 1) <= model.VERSION}


def _after(schema: Any) -> list[Any] | None:
    """The row's field schemas of an envelope schema (None: it has no ``after`` struct)."""
    if not isinstance(schema, dict):
        return None
    after = next((f for f in schema.get("fields") or () if isinstance(f, dict)
                  and f.get("field") == "after"), None)
    if after is None or not isinstance(after.get("fields"), list):
        return None
    return list(after["fields"])


class EnvelopeReader:
    """Change events' bytes -> (op, the row to validate or None), for one slice: the row
    reader of each envelope schema built once (JsonConverter repeats the schema in every
    message; it is looked up by its bytes, not parsed again), after checking that the
    contract follows it (``declared``: the contract's declared fields; None: a Python
    contract, not compared; :class:`~kafka_ingest.errors.SourceChanged` when it does not).
    """

    #: How JsonConverter's messages with their schema begin, and where the payload starts.
    _HEAD, _PAYLOAD = b'{"schema":', b',"payload":'

    def __init__(self, decoder: RegistryDecoder | None, *, pipeline: str = "",
                 declared: dict[str, Any] | None = None,
                 key_fields: tuple[str, ...] = (), full: bool = False) -> None:
        self.decoder = decoder
        #: The source table is ``REPLICA IDENTITY FULL`` (``replica_identity: full``): an
        #: update without the old row is :class:`ReplicaIdentityNotFull`.
        self.full = full
        #: The primary key's columns as the row names them (none: rows are left as they are).
        self.pipeline, self.declared, self.key_fields = pipeline, declared, key_fields
        self._readers: dict[bytes, RowReader | None] = {}
        #: A registry format's row readers, by the wire header of the writer schema id.
        self._by_header: dict[bytes, RowReader] = {}
        #: The last row read of each (partition, key): see :meth:`_filled`.
        self._last: dict[Any, dict[str, Any]] = {}
        #: The schema bytes the last message with its schema carried, and their reader.
        self._last_schema: tuple[bytes, RowReader | None] = (b"", None)

    def _row_reader(self, schema: Any) -> RowReader | None:
        if self.declared is not None:
            changes = source_changes(schema, self.declared)
            if changes:
                name = schema.get("name") if isinstance(schema, dict) else None
                raise SourceChanged(self.pipeline, f"change events of schema {name!r}",
                                    changes)
        return row_reader(schema)

    def read(self, value: bytes, within: Any = None) -> tuple[str, Any]:
        """``value``'s operation and row; ``within``: where it was read (its topic and
        partition), for :meth:`_filled` (None: each row as it is)."""
        payload, reader = self._payload(value)
        if not isinstance(payload, dict):
            raise BadEnvelope("the value is not a change event (an object with 'op', 'before' "
                              "and 'after')")
        op = payload.get("op")
        if op in UPSERTS:
            after = payload.get("after")
            if not isinstance(after, dict):
                raise BadEnvelope(f"op {op!r} without an 'after' row")
            if self.full and op == "u" and payload.get("before") is None:
                raise ReplicaIdentityNotFull(self.pipeline, _where(within))
            if reader is None:
                return op, _schemaless(_renamed(self._filled(after, within)))
            return op, _renamed(self._filled(reader(after), within))
        if op in ("d", "t"):
            return op, None
        raise BadEnvelope(f"op {op!r} is not one of Debezium's: {_OPS}" if op is not None
                          else f"no 'op': not a change event ({_OPS})")

    def _filled(self, row: dict[str, Any], within: Any) -> dict[str, Any]:
        """``row`` with each column Debezium left out (its placeholder) taken from the last
        row of its key read before it in this partition, if any: a chunk writes each key's
        newest row only, so the value an earlier change of the chunk wrote would be lost."""
        if not self.key_fields or within is None:
            return row
        if len(self.key_fields) == 1:
            key = row.get(self.key_fields[0])
            if not isinstance(key, int | str | UUID):
                return row
        else:
            key = tuple(row.get(name) for name in self.key_fields)
            if not all(isinstance(part, int | str | UUID) for part in key):
                return row
        last = self._last.get((within, key))
        if last is not None:
            for name, value in row.items():
                if name in last and unavailable(value):
                    row[name] = last[name]
        self._last[(within, key)] = row
        return row

    def _payload(self, value: bytes) -> tuple[Any, RowReader | None]:
        if self.decoder is not None:
            decoded = self.decoder.read(value)
            if isinstance(decoded, bytes | bytearray):  # JSON Schema: the payload's JSON
                return _parsed(bytes(decoded)), None
            # Avro, Protobuf: typed by their codec, and read by the Connect schema their
            # writer schema stands for, made once per schema id
            header = value[:HEADER_SIZE]
            reader = self._by_header.get(header)
            if reader is None:
                reader = self._by_header[header] = self._registry_reader(self.decoder, value)
            return decoded, reader
        schema, reader = self._last_schema
        at = len(self._HEAD) + len(schema)
        # The last message's schema again, compared in place (no search, copy or hash of its
        # bytes): then ',"payload":' is at ``at`` (the split that read that schema parsed).
        if (schema and value.startswith(self._HEAD) and value.startswith(schema, len(self._HEAD))
                and value.startswith(self._PAYLOAD, at) and value.endswith(b"}")):
            try:
                return from_json(value[at + len(self._PAYLOAD):-1]), reader
            except ValueError:
                pass  # the whole value's parse says what is wrong
        else:
            at = value.find(self._PAYLOAD) if value.startswith(self._HEAD) else -1
            if at > 0 and value.endswith(b"}"):
                found = self._split(value, at)
                if found is not None:
                    return found
        document = _parsed(value)
        if isinstance(document, dict) and document.keys() == {"schema", "payload"}:
            return document["payload"], self._row_reader(document["schema"])
        return document, None

    def _registry_reader(self, decoder: RegistryDecoder, value: bytes) -> RowReader:
        """The row reader of the writer schema of ``value`` (a value ``decoder`` read):
        by the Connect schema it stands for, checked against the contract; the rows as
        the codec decodes them when its format keeps no Connect schema."""
        connect = decoder.codec.connect_schema(decoder.writer_schema(value))
        return (None if connect is None else self._row_reader(connect)) or _as_is

    def _split(self, value: bytes, at: int) -> tuple[Any, RowReader | None] | None:
        """JsonConverter's layout read in two parts, the schema by its bytes (its reader
        made once); None when the first ``,"payload":`` was not where the schema ends (a
        schema's text holds it only inside an object: a struct's default, a parameter),
        which the whole value's parse then reads."""
        schema = value[len(self._HEAD):at]
        reader = self._readers.get(schema, _UNSEEN)
        if reader is _UNSEEN:
            try:
                parsed = from_json(schema)
            except ValueError:
                return None
            reader = self._readers[schema] = self._row_reader(parsed)
        try:
            payload = from_json(value[at + len(self._PAYLOAD):-1])
        except ValueError:
            return None
        self._last_schema = (schema, reader)
        return payload, reader


def _where(within: Any) -> str:
    """Where a change event was read, for a message: its topic and partition."""
    if isinstance(within, tuple) and len(within) == 2:
        return f"topic {within[0]!r} partition {within[1]}"
    return "a change event"


#: A schema not seen yet (its reader may be None).
_UNSEEN: Any = object()


def _as_is(row: dict[str, Any]) -> dict[str, Any]:
    return row


def _parsed(value: bytes) -> Any:
    try:
        return from_json(value)
    except ValueError as exc:
        raise Undecodable(f"not JSON: {exc}") from None


# --------------------------------------------------------------------------- declarations

#: Connect's primitive types, as JsonConverter names them in a schema (``float`` and
#: ``double``: Connect's FLOAT32 and FLOAT64) -> the declared field type (a string's width:
#: the source column's length when Debezium propagates it, else the widest a declared text
#: takes).
_PRIMITIVE = {"int8": "smallint", "int16": "smallint", "int32": "integer",
              "int64": "bigint", "float": "float", "double": "float",
              "boolean": "boolean", "string": "text", "bytes": "bytea"}
#: Semantic types -> the declared field type of the column they came from.
_SEMANTIC_TYPES = {
    "io.debezium.time.Date": "date", "org.apache.kafka.connect.data.Date": "date",
    "io.debezium.time.Time": "time", "org.apache.kafka.connect.data.Time": "time",
    "io.debezium.time.MicroTime": "time", "io.debezium.time.NanoTime": "time",
    "io.debezium.time.Timestamp": "timestamp",
    "org.apache.kafka.connect.data.Timestamp": "timestamp",
    "io.debezium.time.MicroTimestamp": "timestamp",
    "io.debezium.time.NanoTimestamp": "timestamp",
    "io.debezium.time.ZonedTimestamp": "timestamptz",
    "io.debezium.time.MicroDuration": "interval", "io.debezium.data.Json": "jsonb",
    "io.debezium.data.Uuid": "uuid", "io.debezium.data.Enum": "text",
    "io.debezium.data.Bits": "bytea"}


def _field_spec(field: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The declared field of one Connect field schema of a row, and what it is (or None
    and why it is left out)."""
    name, kind = field.get("name"), field.get("type")
    params = field.get("parameters") or {}
    spec, why = _column_type(field, name, kind, params)
    if spec is None:
        return None, why
    if spec["type"] == "text":  # a source's text may be empty, and as wide as it says
        length = params.get("__debezium.source.column.length")
        spec["max_length"] = int(length) if length else TEXT_MAX
        spec["min_length"] = 0
    if field.get("optional", False):
        spec["required"] = False
    return spec, f"{name or kind} -> {spec['type']}"


def _column_type(field: dict[str, Any], name: Any, kind: Any,
                 params: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    if name == "org.apache.kafka.connect.data.Decimal":
        precision = params.get("connect.decimal.precision")
        if precision is None:
            return None, "a decimal without a precision (declare it: numeric needs one)"
        return {"type": "numeric", "precision": int(precision),
                "scale": int(params.get("scale", 0))}, ""
    if name in _SEMANTIC_TYPES:
        return {"type": _SEMANTIC_TYPES[name]}, ""
    if name == "io.debezium.data.VariableScaleDecimal":
        return None, f"Debezium's {name} has no precision (declare it as numeric with one)"
    if name is not None and name.startswith("io.debezium."):  # a string: a jsonb takes none
        return None, (f"Debezium's {name} has no column type here (declare it as "
                      f"{'text' if kind == 'string' else 'jsonb'})")
    if kind == "array" and isinstance(field.get("items"), dict):
        return _array_type(field["items"])
    if kind in _PRIMITIVE:
        return {"type": _PRIMITIVE[kind]}, ""
    return None, f"a {kind} has no column type here (declare it as jsonb)"


def _array_type(items: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """An array column of Connect items ``items``, or None and why: a type whose
    placeholder Debezium does not tell apart (:data:`~kafka_ingest.config.KEPT_ARRAYS`)."""
    spec, why = _field_spec({**items, "optional": False})
    if spec is None:
        return None, f"an array of {why}"
    if spec["type"] in ("jsonb", "bytea"):
        return None, f"an array of {spec['type']} (declare it as jsonb)"
    array = {"type": "array", "items": spec}
    kind = FieldSpec.model_validate(array).value_type
    if kind not in KEPT_ARRAYS:
        return None, (f"{kind}, an array Debezium sends as null when an update leaves it "
                      "out (stored out of line and unchanged), which a mirror cannot tell "
                      "from a NULL; a source table with REPLICA IDENTITY FULL sends it "
                      "whole: declare it then, with replica_identity: full")
    return array, ""


def row_declaration(envelope: dict[str, Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The declared fields of the rows a change event's schema (``envelope``: the
    JsonConverter schema of the value) describes: (fields, what each is, what was left
    out and why)."""
    after = _after(envelope)
    if after is None:
        raise ValueError("the schema has no 'after' row: not a change event's")
    fields: dict[str, Any] = {}
    guesses, left_out = [], []
    for field in after:
        spec, what = _field_spec(field)
        if spec is None:
            left_out.append(f"{field.get('field')}: {what}")
            continue
        name = field["field"]
        if name in RESERVED_COLUMNS:  # a column every table has: this one renamed
            what += f" (column {name}_: every table has a {name})"
            if payload_name(name) == name:
                spec["column"] = f"{name}_"
        fields[payload_name(name)] = spec
        guesses.append(f"{name}: {what}")
    return fields, guesses, left_out


def rows_declaration(envelopes: list[Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """:func:`row_declaration` of the newest of ``envelopes`` (change events' schemas,
    oldest first) that also reads the older ones: a column some of them lack (added or
    dropped at the source meanwhile) is optional, so no sampled event stops the run."""
    fields, guesses, left_out = row_declaration(envelopes[-1])
    seen: list[str] = []
    for older in reversed(envelopes[:-1]):
        text = json.dumps(older, sort_keys=True)
        if text in seen:
            continue
        seen.append(text)
        columns, _, _ = row_declaration(older)
        for name, spec in columns.items():
            if name not in fields:  # dropped at the source since
                fields[name] = {**spec, "required": False}
                guesses.append(f"{name}: {spec['type']} (in older events only)")
        for name, spec in fields.items():
            if name not in columns:
                spec["required"] = False
    return fields, guesses, left_out


def primary_key_declaration(key_schema: Any, fields: dict[str, Any], *,
                            key_format: str = "json") -> dict[str, Any]:
    """The settings that key a mirror whose record keys have the Connect schema
    ``key_schema`` (the primary key's struct): ``record_key`` for one column
    (:func:`key_declaration`), ``identity`` (the row's fields, in key order) for several
    (a composite primary key, read from the key's fields); ``key_format``: how the record
    keys are written (``json``, or ``registry``: in the pipeline's registry format)."""
    columns = [f.get("field") for f in (key_schema or {}).get("fields") or ()]
    if len(columns) < 2:
        return {"record_key": key_declaration(key_schema, fields, key_format=key_format)}
    names = []
    for column in columns:
        spec = fields.get(payload_name(str(column)))
        if spec is None or spec["type"] not in _KEY_FIELD_TYPES:
            raise ValueError(f"the primary key column {column!r} is not an integer, text or "
                             "uuid column of the row")
        spec.pop("required", None)  # a key's column is never null
        names.append(payload_name(str(column)))
    return {"identity": names}


def key_declaration(key_schema: Any, fields: dict[str, Any], *,
                    key_format: str = "json") -> dict[str, Any]:
    """The ``record_key`` section of a mirror whose record keys have the Connect schema
    ``key_schema`` (the primary key's struct): its one field, a column of the row."""
    columns = [f.get("field") for f in (key_schema or {}).get("fields") or ()]
    if not columns:
        raise ValueError("the primary key has 0 columns (the change events carry no key "
                         "schema: a table without a primary key?): a mirror deletes and "
                         "orders rows by the primary key its record keys carry")
    if len(columns) != 1:  # primary_key_declaration's: the identity
        raise ValueError(f"the primary key has {len(columns)} columns "
                         f"({', '.join(map(str, columns))}): declare them as the identity")
    column = columns[0]
    spec = fields.get(payload_name(column))
    if spec is None or spec["type"] not in _KEY_FIELD_TYPES:
        raise ValueError(f"the primary key column {column!r} is not an integer, text or uuid "
                         "column of the row")
    spec.pop("required", None)
    numeric = spec["type"] in ("smallint", "integer", "bigint")
    named = spec.get("column", payload_name(column))
    section = {"column": named, "format": key_format, "type": "bigint" if numeric else "text"}
    if named != column:
        section["field"] = column
    if not numeric:
        section["max_length"] = min(spec.get("max_length", 36), 10_000)
    return section


__all__ = ["SEMANTIC", "UPSERTS", "EnvelopeReader", "declared_fields",
           "key_declaration", "key_reader", "payload_name", "primary_key_declaration",
           "row_declaration", "row_reader",
           "rows_declaration", "semantic", "source_changes", "source_name", "unavailable"]
