"""Protobuf: messages built from the registry's descriptor, and their fields.

A writer schema is a serialized ``FileDescriptorProto`` (fetched ``serialized`` when the
registry holds ``.proto`` source); its message classes are built from it (no generated
``_pb2`` module). A payload starts with message indexes (which message of the file it is),
then the message, which becomes a dict field by field: 64-bit integers stay integers, a
field without presence holds its zero value, an unset ``optional`` or message field is
missing, enums are named, a ``Timestamp`` is an aware ``datetime``.

A file's imports are the files its ``references`` name (each registered under a subject
of its own, as confluent-kafka's ``ProtobufSerializer`` registers them, and fetched by
the registry client with their own references), and the well-known types the serializers
leave out (``skip.known.types``). An import neither defines is
:class:`~kafka_ingest.errors.SchemaUnreadable`: the records of that schema id are
dead-lettered, the others load.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar

from google.protobuf import (
    any_pb2,
    api_pb2,
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    empty_pb2,
    field_mask_pb2,
    json_format,
    message_factory,
    source_context_pb2,
    struct_pb2,
    timestamp_pb2,
    type_pb2,
    wrappers_pb2,
)
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.base import (
    BOOL,
    BYTES,
    DATETIME,
    DURATION,
    FIELDS_DEPTH,
    FLOAT,
    INT,
    LIST,
    OBJECT,
    STR,
    Codec,
    Fields,
    NoSuchRecord,
    PayloadReader,
    WriterField,
)
from kafka_ingest.errors import SchemaUnreadable, Undecodable

if TYPE_CHECKING:
    from kafka_ingest.kafka.registry import WriterSchema

#: The well-known types a writer schema imports without a registered reference (what
#: confluent-kafka's serializers skip: ``skip.known.types``), by file name: every
#: ``google/protobuf/*.proto`` the protobuf package ships (``descriptor.proto`` for custom
#: options). Taken from the modules, not from protobuf's default pool: that holds a file
#: only once some module imported it, so what a worker could read would depend on what it
#: happened to import. The other files the serializers skip (``google/type/*``,
#: ``confluent/*``) are not known: a schema importing one is ``schema_unreadable``.
WELL_KNOWN = {m.DESCRIPTOR.name: m.DESCRIPTOR for m in (
    any_pb2, api_pb2, descriptor_pb2, duration_pb2, empty_pb2, field_mask_pb2,
    source_context_pb2, struct_pb2, timestamp_pb2, type_pb2, wrappers_pb2)}


class ProtobufCodec(Codec):
    """``format: protobuf``."""

    format: ClassVar[Format] = Format.PROTOBUF
    schema_type: ClassVar[str | None] = "PROTOBUF"
    python: ClassVar[bool] = True
    serialized: ClassVar[bool] = True

    def reader(self, schema: WriterSchema) -> PayloadReader:
        return _protobuf_reader(schema)

    def record_fields(self, schema: WriterSchema, record: str | None = None) -> list[Fields]:
        """One set per top-level message of the file (a record says which it is in its
        message indexes, not the subject), or the one ``record`` names."""
        names = protobuf_messages(schema.text)
        if record is None:
            return [protobuf_fields(schema.text, i, schema) for i in range(len(names))]
        if record not in names:
            raise NoSuchRecord(f"message {record!r}: not a top-level message of the writer "
                             f"schema ({', '.join(names) or 'none'})")
        return [protobuf_fields(schema.text, names.index(record), schema)]


# --------------------------------------------------------------------------- decoding


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


def message_indexes(payload: bytes, start: int = 0) -> tuple[list[int], bytes]:
    """The message indexes at ``start``, after the header (a count, then the path; 0 alone
    is [0]), and the message's bytes after them."""
    count, pos = _zigzag_varint(payload, start)
    if count == 0:
        return [0], payload[pos:]
    if not 0 < count <= 64:
        raise Undecodable(f"Protobuf message index count {count} is not a path")
    indexes = []
    for _ in range(count):
        index, pos = _zigzag_varint(payload, pos)
        indexes.append(index)
    return indexes, payload[pos:]


#: Well-known message types that arrive as the value they stand for: a ``Timestamp`` an
#: aware ``datetime``, a ``Duration`` a ``timedelta``, a wrapper (``StringValue``, ...) its
#: value (an unset one is missing: NULL), ``Struct``/``ListValue``/``Value`` their JSON.
_WELL_KNOWN_VALUES: dict[str, Callable[[Any], Any]] = {
    "google.protobuf.Timestamp": lambda m: m.ToDatetime(tzinfo=UTC),
    "google.protobuf.Duration": lambda m: m.ToTimedelta(),
    **dict.fromkeys((f"google.protobuf.{w}Value" for w in (
        "Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes")),
        attrgetter("value")),
    **dict.fromkeys(("google.protobuf.Struct", "google.protobuf.ListValue",
                     "google.protobuf.Value"), json_format.MessageToDict),
}


def _proto_value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        known = _WELL_KNOWN_VALUES.get(field.message_type.full_name)
        return proto_to_dict(value) if known is None else known(value)
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


def _descriptor(text: str) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))


def _imports(schema: WriterSchema) -> dict[str, descriptor_pb2.FileDescriptorProto | str]:
    """The files ``schema``'s references define, by import name; a reference the registry
    does not serve, or one that is no descriptor, maps to why."""
    files: dict[str, descriptor_pb2.FileDescriptorProto | str] = {}
    for ref in schema.referenced():
        if ref.schema is None:
            files.setdefault(ref.name, f"its reference {ref.name!r} names version "
                                       f"{ref.version} of subject {ref.subject!r}, which "
                                       "the registry does not serve")
            continue
        try:
            files.setdefault(ref.name, _descriptor(ref.schema.text))
        except Exception as exc:  # DecodeError, binascii.Error: not a serialized descriptor
            files.setdefault(ref.name, f"its reference {ref.name!r} (subject {ref.subject!r} "
                                       f"version {ref.version}) is no descriptor: {exc}")
    return files


def _known(name: str) -> descriptor_pb2.FileDescriptorProto:
    """An import no reference defines: a well-known type (:data:`WELL_KNOWN`), else
    ValueError."""
    file = WELL_KNOWN.get(name)
    if file is None:
        raise ValueError(f"it imports {name!r}, which none of its references defines and "
                         "which is no well-known type")
    found = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(found)
    return found


def _build(proto: descriptor_pb2.FileDescriptorProto,
           files: dict[str, descriptor_pb2.FileDescriptorProto | str]) -> Any:
    """The file ``proto`` in a pool of its own, each import added before the file that
    imports it: a referenced file, else a known one (:func:`_known`)."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor_pb2.FileDescriptorProto, path: tuple[str, ...]) -> None:
        for name in file.dependency:
            if name in added or name in path:
                continue
            found = files.get(name)
            if isinstance(found, str):
                raise ValueError(found)
            if found is None:
                found = _known(name)
            elif found.name != name:  # imported by the reference's name, whatever its own
                found = descriptor_pb2.FileDescriptorProto()
                found.CopyFrom(files[name])
                found.name = name
            add(found, (*path, name))
        pool.Add(file)
        added.add(file.name)

    add(proto, (proto.name,))
    return pool.FindFileByName(proto.name)


def _protobuf_reader(schema: WriterSchema) -> PayloadReader:
    try:
        proto = _descriptor(schema.text)
    except Exception as exc:  # DecodeError, binascii.Error
        raise SchemaUnreadable(schema.schema_id, f"not a serialized Protobuf descriptor: "
                               f"{exc}") from None
    try:
        file = _build(proto, _imports(schema))
    except Exception as exc:  # an import nothing defines, a type no file declares
        raise SchemaUnreadable(schema.schema_id, f"the Protobuf file {proto.name!r} cannot be "
                               f"built: {exc}") from None
    classes: dict[tuple[int, ...], Any] = {}

    def decode(value: bytes, start: int = 0, /) -> Any:
        indexes, body = message_indexes(value, start)
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


# --------------------------------------------------------------------------- the writer's fields

_PROTO = {FieldDescriptor.TYPE_STRING: STR, FieldDescriptor.TYPE_BOOL: BOOL,
          FieldDescriptor.TYPE_DOUBLE: FLOAT, FieldDescriptor.TYPE_FLOAT: FLOAT,
          FieldDescriptor.TYPE_BYTES: BYTES, FieldDescriptor.TYPE_ENUM: STR,
          FieldDescriptor.TYPE_MESSAGE: OBJECT}


#: Well-known message types by the kind of value they arrive as (see
#: :data:`_WELL_KNOWN_VALUES`).
_WELL_KNOWN_KINDS = {
    "google.protobuf.Timestamp": DATETIME, "google.protobuf.Duration": DURATION,
    "google.protobuf.DoubleValue": FLOAT, "google.protobuf.FloatValue": FLOAT,
    "google.protobuf.Int64Value": INT, "google.protobuf.UInt64Value": INT,
    "google.protobuf.Int32Value": INT, "google.protobuf.UInt32Value": INT,
    "google.protobuf.BoolValue": BOOL, "google.protobuf.StringValue": STR,
    "google.protobuf.BytesValue": BYTES, "google.protobuf.Struct": OBJECT,
    "google.protobuf.ListValue": LIST, "google.protobuf.Value": OBJECT}
#: Integer types of 32 bits whose values fit an ``integer`` (``uint32`` does not).
_INT32 = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32,
          FieldDescriptor.TYPE_SFIXED32}


def protobuf_fields(text: str, message_index: int = 0,
                    schema: WriterSchema | None = None) -> Fields:
    """The fields of the file's first message, or of its ``message_index``-th (a serialized
    ``FileDescriptorProto``), each nested message's own (``schema``: the writer schema
    whose references define the files it imports)."""
    proto = _descriptor(text)
    if not proto.message_type:
        return {}
    try:
        file = _build(proto, {} if schema is None else _imports(schema))
    except Exception:  # an import nothing defines: what the file itself says
        return _declared_fields(proto, message_index)
    return _message_fields(list(file.message_types_by_name.values())[message_index], 0)


def _message_fields(message: Descriptor, depth: int) -> Fields:
    fields = {}
    for f in message.fields:
        field = _field_kind(f, depth)
        is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
        if f.is_repeated and not is_map:  # a map is an object, anything else a list
            field = WriterField(f.name, LIST, items=field.kind)
        fields[f.name] = replace(field, name=f.name, nullable=f.has_presence)
    return fields


def _field_kind(f: FieldDescriptor, depth: int) -> WriterField:
    if f.type == FieldDescriptor.TYPE_ENUM:
        return WriterField(f.name, STR, max_length=max((len(v.name) for v in f.enum_type.values),
                                                       default=1))
    if f.type != FieldDescriptor.TYPE_MESSAGE:
        return WriterField(f.name, _PROTO.get(f.type, INT),
                           bits=32 if f.type in _INT32 else None)
    name = f.message_type.full_name
    if name in _WELL_KNOWN_KINDS:
        return WriterField(f.name, _WELL_KNOWN_KINDS[name])
    if f.message_type.GetOptions().map_entry or depth >= FIELDS_DEPTH:
        return WriterField(f.name, OBJECT)
    return WriterField(f.name, OBJECT, fields=_message_fields(f.message_type, depth + 1))


def _declared_fields(file: descriptor_pb2.FileDescriptorProto, message_index: int) -> Fields:
    """The fields a file's message declares, read from the file alone (its imports not
    built): a message field is an object, a ``Timestamp`` a datetime."""
    fields = {}
    for f in file.message_type[message_index].field:
        repeated = f.label == FieldDescriptor.LABEL_REPEATED
        kind = _PROTO.get(f.type, INT)
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.type_name == ".google.protobuf.Timestamp":
            kind = DATETIME
        # proto3: a field without presence always arrives (its zero value); optional ones
        # and messages may be missing
        nullable = f.proto3_optional or f.type == FieldDescriptor.TYPE_MESSAGE
        fields[f.name] = WriterField(f.name, LIST if repeated else kind, nullable,
                                     items=kind if repeated else None)
    return fields


def protobuf_messages(text: str) -> list[str]:
    """The full names of a serialized ``FileDescriptorProto``'s top-level messages."""
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    return [f"{file.package}.{m.name}" if file.package else m.name for m in file.message_type]


__all__ = ["WELL_KNOWN", "ProtobufCodec", "message_indexes", "proto_to_dict", "protobuf_fields",
           "protobuf_messages"]
