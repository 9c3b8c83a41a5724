"""Registry formats: the Confluent wire format decoded in front of the contract.

A record of an ``avro``, ``protobuf`` or ``json_schema`` pipeline is ``0x00``, a 4-byte
big-endian schema id, then the payload (Protobuf: message indexes, then the message).
The header is parsed here; the writer schema is fetched once per id and kept, parsed, for
the slice; then:

- **Avro**: fastavro's ``schemaless_reader`` against the writer schema, to a dict the
  contract validates in Python mode (logical types arrive typed: ``Decimal``, aware
  ``datetime``, ``date``, ``UUID``). The contract is the reader: there is no reader-schema
  resolution step, since what Avro's resolution would do (drop fields the reader does not
  know, fill a missing optional field's default) the contract does already, and a second
  schema to keep in step with it would be one more thing to drift;
- **Protobuf**: a message class built from the registry's descriptor (``FileDescriptorProto``,
  no generated ``_pb2`` module), parsed, and turned into a dict field by field (64-bit
  integers stay integers, a field without presence holds its zero value, an unset
  ``optional`` or message field is missing);
- **JSON Schema**: the payload is JSON, validated as a JSON pipeline's value is.

Failures keep the split: no magic byte (:class:`NotWireFormat`), an id the registry does
not know (:class:`UnknownSchema`) and a payload the writer schema cannot decode
(:class:`Undecodable`) are data errors; the registry down is transient and raises, and so
is a chunk none of whose ids the registry knows (:class:`RegistryLacksSchemas`, see
:meth:`RegistryDecoder.require_a_known_id`); a writer schema this reader cannot build is
:class:`SchemaUnreadable` (permanent). A writer schema the *contract* cannot read is judged
record by record (:meth:`RegistryDecoder.explained`).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import struct
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC
from typing import Any

import fastavro
from google.protobuf import (
    any_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    message_factory,
    struct_pb2,
    timestamp_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kafka_ingest.config import Format, KeyFormat, Pipeline
from kafka_ingest.decode.schemas import schema_problems
from kafka_ingest.errors import (
    ContractViolation,
    DataError,
    NotWireFormat,
    RegistryLacksSchemas,
    SchemaUnreadable,
    SettingsError,
    Undecodable,
    UnknownSchema,
)
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry, WriterSchema
from kafka_ingest.records import MessageLike

log = logging.getLogger(__name__)

MAGIC = 0
_HEADER = struct.Struct(">bI")
#: What a schema's type must be for each format (the registry's ``schemaType``).
SCHEMA_TYPES = {Format.AVRO: "AVRO", Format.PROTOBUF: "PROTOBUF", Format.JSON_SCHEMA: "JSON"}
#: The well-known types a writer schema imports without a registered reference (what
#: confluent-kafka's serializers skip: ``skip.known.types``), by file name. Taken from the
#: modules, not from protobuf's default pool: that holds a file only once some module
#: imported it (confluent-kafka's serializers do; a worker that imports this package alone
#: does not).
WELL_KNOWN = {m.DESCRIPTOR.name: m.DESCRIPTOR for m in (
    any_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2, wrappers_pb2)}
#: A decoder: the value's payload -> what the contract validates (a dict, or JSON bytes).
PayloadReader = Callable[[bytes], Any]


def wire_schema_id(value: bytes | None) -> int | None:
    """The schema id of a wire-format value, or None when it is not one."""
    if value is None or len(value) < _HEADER.size or value[0] != MAGIC:
        return None
    return int(_HEADER.unpack_from(value)[1])


def split_header(value: bytes) -> tuple[int, bytes]:
    """(schema id, payload); :class:`NotWireFormat` when the header is not there."""
    if len(value) < _HEADER.size:
        raise NotWireFormat(f"value is {len(value)} bytes: too short for the wire format's "
                            "header (magic byte 0 and a 4-byte schema id)")
    if value[0] != MAGIC:
        raise NotWireFormat(f"no magic byte: the value starts with 0x{value[0]:02x}, not "
                            "0x00 (not written by a registry serializer)")
    return int(_HEADER.unpack_from(value)[1]), value[_HEADER.size:]


# --------------------------------------------------------------------------- Avro


def _avro_reader(schema: WriterSchema) -> PayloadReader:
    try:
        writer = fastavro.parse_schema(json.loads(schema.text))
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise SchemaUnreadable(schema.schema_id, f"not an Avro schema fastavro can parse "
                               f"(named references are not supported): {exc}") from None
    plan = _flat_plan(json.loads(schema.text))
    if plan is not None:
        return _flat_reader(schema.schema_id, plan)
    read = fastavro.schemaless_reader

    def decode(payload: bytes) -> Any:
        try:
            return read(io.BytesIO(payload), writer)
        except Exception as exc:  # fastavro raises what its reading met: EOF, index, value
            raise Undecodable(f"Avro payload does not decode with schema id "
                              f"{schema.schema_id}: {type(exc).__name__}: {exc}") from None

    return decode


# Flat records. fastavro's schemaless_reader walks the writer schema for every message,
# dispatching on each field's type: 2.2 µs of the 7-field telemetry event here, most of
# what the Avro path costs over JSON's. The usual event is a record of primitives and
# unions of them (["null", "string"]): its fields are planned once per schema id and read
# in one loop to the same dict, 1.2 µs. Any other schema (nested records, enums, arrays,
# maps, fixed, logical types) is left to fastavro.

#: Avro's primitives as the flat reader's codes (int and long are both zigzag varints),
#: in an order where one comparison picks string or bytes, and then float or double.
_NULL, _BOOLEAN, _VARINT, _FLOAT, _DOUBLE, _STRING, _BYTES = range(7)
_PRIMITIVES = {"null": _NULL, "boolean": _BOOLEAN, "int": _VARINT, "long": _VARINT,
               "float": _FLOAT, "double": _DOUBLE, "string": _STRING, "bytes": _BYTES}
#: The code of a field that is a union: its branch's code follows its index on the wire.
_UNION = -1
_IEEE = {_FLOAT: (struct.Struct("<f").unpack_from, 4),
         _DOUBLE: (struct.Struct("<d").unpack_from, 8)}
#: (field name, its code, a union's branch codes) per field, in the schema's order.
FlatPlan = tuple[tuple[str, int, tuple[int, ...]], ...]


def _primitive(avro_type: Any) -> int | None:
    """The code of a primitive type without a logical type (``"string"``, or
    ``{"type": "string", "avro.java.string": "String"}``), else None."""
    if isinstance(avro_type, dict) and "logicalType" not in avro_type:
        avro_type = avro_type.get("type")
    return _PRIMITIVES.get(avro_type) if isinstance(avro_type, str) else None


def _flat_plan(schema: Any) -> FlatPlan | None:
    """The plan of a record whose fields are primitives or unions of primitives; None for
    any other schema."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    plan: list[tuple[str, int, tuple[int, ...]]] = []
    for field in schema.get("fields", ()):
        kind = field["type"]
        if isinstance(kind, list):
            branches = [_primitive(branch) for branch in kind]
            if not branches or None in branches:
                return None
            plan.append((str(field["name"]), _UNION, tuple(b for b in branches if b is not None)))
        elif (code := _primitive(kind)) is not None:
            plan.append((str(field["name"]), code, ()))
        else:
            return None
    return tuple(plan)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (an int, a long, a length, a union index) and the
    position after it; IndexError past the end."""
    byte = data[pos]
    if byte < 0x80:  # one byte: every short string's length, every union index
        return (byte >> 1) ^ -(byte & 1), pos + 1
    value, shift = byte & 0x7F, 7
    while byte & 0x80:
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        shift += 7
    return (value >> 1) ^ -(value & 1), pos + 1


def _flat_reader(schema_id: int, plan: FlatPlan) -> PayloadReader:  # noqa: C901 (decode, below)
    """The reader of one planned schema: one loop, no call per field but for a varint
    longer than a byte (a call per field cost as much as fastavro's dispatch)."""
    ieee = _IEEE

    def decode(payload: bytes) -> dict[str, Any]:  # noqa: C901 (the hot loop, one frame)
        out: dict[str, Any] = {}
        pos = 0
        try:
            for name, code, branches in plan:
                if code == _UNION:
                    index, pos = _varint(payload, pos)
                    if index < 0:
                        raise IndexError(f"union index {index}")
                    code = branches[index]  # noqa: PLW2901 (the branch the writer wrote)
                if code >= _STRING:  # or _BYTES
                    byte = payload[pos]
                    if byte < 0x80:
                        size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
                    else:
                        size, pos = _varint(payload, pos)
                    end = pos + size
                    if size < 0 or end > len(payload):
                        raise ValueError(f"a length of {size} at byte {pos} of {len(payload)}")
                    raw = payload[pos:end]
                    out[name] = raw.decode() if code == _STRING else raw
                    pos = end
                elif code >= _FLOAT:  # or _DOUBLE
                    unpack, size = ieee[code]
                    out[name] = unpack(payload, pos)[0]
                    pos += size
                elif code == _VARINT:
                    byte = payload[pos]
                    if byte < 0x80:
                        out[name], pos = (byte >> 1) ^ -(byte & 1), pos + 1
                    else:
                        out[name], pos = _varint(payload, pos)
                elif code == _NULL:
                    out[name] = None
                else:  # _BOOLEAN: any byte but 0 is true, as fastavro reads it
                    out[name] = payload[pos] != 0
                    pos += 1
        except (IndexError, ValueError, struct.error) as exc:  # cut short, not UTF-8, ...
            raise Undecodable(f"Avro payload does not decode with schema id {schema_id}: "
                              f"{type(exc).__name__}: {exc}") from None
        return out

    return decode


# --------------------------------------------------------------------------- Protobuf


def _zigzag_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise Undecodable("Protobuf message indexes are cut short")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def message_indexes(payload: bytes) -> tuple[list[int], bytes]:
    """The message indexes after the header (a count, then the path; 0 alone is [0])."""
    count, pos = _zigzag_varint(payload, 0)
    if count == 0:
        return [0], payload[pos:]
    if not 0 < count <= 64:
        raise Undecodable(f"Protobuf message index count {count} is not a path")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(payload, pos)
        indexes.append(index)
    return indexes, payload[pos:]


def _proto_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == "google.protobuf.Timestamp":
            return value.ToDatetime(tzinfo=UTC)
        return proto_to_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        named = field.enum_type.values_by_number.get(value)
        return named.name if named is not None else value
    return value


def proto_to_dict(message: Message) -> dict[str, Any]:
    """A message as the contract reads it: every field with its value, repeated as lists,
    enums by name; an unset field with presence (``optional``, a message) is left out."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.is_repeated:
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                out[field.name] = {k: _proto_value(field.message_type.fields_by_name["value"], v)
                                   for k, v in value.items()}
            else:
                out[field.name] = [_proto_value(field, v) for v in value]
        elif field.has_presence and not message.HasField(field.name):
            continue
        else:
            out[field.name] = _proto_value(field, value)
    return out


def _message_type(file: Any, indexes: list[int]) -> Descriptor:
    types = list(file.message_types_by_name.values())
    found: Descriptor | None = None
    for index in indexes:
        if not 0 <= index < len(types):
            raise Undecodable(f"Protobuf message index path {indexes} names no message")
        found = types[index]
        types = list(found.nested_types)
    if found is None:
        raise Undecodable("Protobuf message index path is empty")
    return found


def _protobuf_reader(schema: WriterSchema) -> PayloadReader:
    try:
        proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema.text))
        pool = descriptor_pool.DescriptorPool()
        for dependency in proto.dependency:  # the well-known types it imports
            known = descriptor_pb2.FileDescriptorProto()
            (WELL_KNOWN.get(dependency)
             or descriptor_pool.Default().FindFileByName(dependency)).CopyToProto(known)
            pool.Add(known)
        pool.Add(proto)
        file = pool.FindFileByName(proto.name)
    except Exception as exc:  # not a serialized descriptor, or one with unknown imports
        raise SchemaUnreadable(schema.schema_id, f"not a Protobuf descriptor this reader can "
                               f"build (imports other than the well-known types are not "
                               f"supported): {exc}") from None
    classes: dict[tuple[int, ...], Any] = {}

    def decode(payload: bytes) -> Any:
        indexes, body = message_indexes(payload)
        key = tuple(indexes)
        cls = classes.get(key)
        if cls is None:
            cls = classes[key] = message_factory.GetMessageClass(_message_type(file, indexes))
        try:  # the message, then its values (a Timestamp past year 9999 refuses too)
            return proto_to_dict(cls.FromString(body))
        except Exception as exc:  # DecodeError and friends
            raise Undecodable(f"Protobuf payload does not decode as "
                              f"{cls.DESCRIPTOR.full_name} (schema id {schema.schema_id}): "
                              f"{exc}") from None

    return decode


# --------------------------------------------------------------------------- the decoder


class RegistryDecoder:
    """The wire format of one pipeline, for one slice: writer schemas fetched once per id.

    ``read(value)`` returns what the contract validates: a dict (Avro, Protobuf; validated
    in Python mode) or the payload's JSON bytes (JSON Schema); :attr:`python` says which.

    Records are judged by the writer schema they carry, not by the subject's latest: a
    record the contract accepts loads, whatever its schema; one it refuses is
    dead-lettered, and when its writer schema is one the contract cannot read (checked once
    per id, :func:`~kafka_ingest.decode.schemas.schema_problems`), the reason names that
    schema id and the fields (:meth:`explained`).
    """

    def __init__(self, pipeline: Pipeline, registry: SchemaRegistry) -> None:
        self.pipeline = pipeline
        self.format = pipeline.format
        self.registry = registry
        self.python = pipeline.format is not Format.JSON_SCHEMA
        self._readers: dict[int, PayloadReader] = {}
        #: The writer schemas behind ``_readers``.
        self._schemas: dict[int, WriterSchema] = {}
        #: Schema id -> why the contract cannot read it (None: it can), judged the first
        #: time the contract refuses a record of it.
        self._unreadable: dict[int, str | None] = {}
        #: Reads that met a schema id the registry does not know (see
        #: :func:`require_a_known_id`): counted on the slow path only.
        self.unknown_reads = 0
        #: Whether record keys are in the wire format too (``record_key.format: registry``).
        self.keys = (pipeline.record_key is not None
                     and pipeline.record_key.format is KeyFormat.REGISTRY)

    def read(self, value: bytes) -> Any:
        schema_id, payload = split_header(value)
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._readers[schema_id] = self._reader(schema_id)
        return reader(payload)

    def _schema(self, schema_id: int) -> WriterSchema | None:
        return self.registry.schema(schema_id, serialized=self.format is Format.PROTOBUF)

    def _reader(self, schema_id: int) -> PayloadReader:
        schema = self._schema(schema_id)
        if schema is None:
            self.unknown_reads += 1
            raise UnknownSchema(f"schema id {schema_id} is not registered (the registry "
                                "answered 404)")
        wanted = SCHEMA_TYPES[self.format]
        if schema.schema_type.upper() != wanted:
            raise UnknownSchema(f"schema id {schema_id} is a {schema.schema_type} schema, and "
                                f"this pipeline reads {self.format.value}")
        self._schemas[schema_id] = schema
        if self.format is Format.AVRO:
            return _avro_reader(schema)
        if self.format is Format.PROTOBUF:
            return _protobuf_reader(schema)
        return _json_payload

    def explained(self, value: bytes, error: DataError) -> DataError:
        """``error`` (the contract refused the record ``value``) with, when the record's
        writer schema is one the contract cannot read, that schema id and why."""
        schema_id = wire_schema_id(value)
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
        registry knows under another type counts as known (that record is poison)."""
        carried = {schema_id for msg in messages
                   for raw in (msg.value(), msg.key() if self.keys else None)
                   if (schema_id := wire_schema_id(raw)) is not None}
        if carried and all(self._schema(schema_id) is None for schema_id in carried):
            raise RegistryLacksSchemas(where, sorted(carried), self.registry.settings.url)

    def __repr__(self) -> str:
        return f"RegistryDecoder({self.format.value}, {self.registry.settings!r})"


def _json_payload(payload: bytes) -> bytes:
    return payload


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
    if pipeline.format is Format.JSON:
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


__all__ = [
    "MAGIC",
    "SCHEMA_TYPES",
    "RegistryDecoder",
    "message_indexes",
    "open_decoder",
    "open_registry",
    "proto_to_dict",
    "split_header",
    "wire_schema_id",
]
