"""Writer schemas against contracts: what a registered schema's fields arrive as, the
check that a pipeline's contract can read a writer schema (at plan time, the subject's
versions; as records are decoded, the schema each carries), and a declared contract made
from a registered schema.

One table decides both: each writer field's *kind* (what the decoder hands the contract:
``str``, ``int``, ``Decimal``, ``datetime``, ...) and, per contract column, the kinds its
strict validation accepts. The check names every required contract field the writer does
not have, may leave null, or sends as a kind the contract refuses; the generator maps each
kind to the declared field type that accepts it, with the bounds the contract rules need
(a ``max_length`` on text, digits and scale on decimals).
"""

from __future__ import annotations

import base64
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from kafka_ingest.config import Format, Pipeline
from kafka_ingest.contracts.columns import contract_columns
from kafka_ingest.errors import ContractMismatch
from kafka_ingest.kafka.registry import SchemaRegistry, WriterSchema

log = logging.getLogger(__name__)

#: Kinds of values a decoded writer field arrives as.
STR, INT, FLOAT, BOOL, BYTES, DECIMAL, DATETIME, DATE, UUID_, OBJECT, LIST = (
    "string", "integer", "float", "boolean", "bytes", "decimal", "datetime", "date", "uuid",
    "object", "array")


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


# --------------------------------------------------------------------------- Avro

_AVRO_LOGICAL = {"timestamp-millis": DATETIME, "timestamp-micros": DATETIME, "date": DATE,
                 "uuid": UUID_, "decimal": DECIMAL}
_AVRO_PRIMITIVE = {"string": STR, "int": INT, "long": INT, "float": FLOAT, "double": FLOAT,
                   "boolean": BOOL, "bytes": BYTES, "fixed": BYTES, "record": OBJECT,
                   "map": OBJECT, "array": LIST, "enum": STR}


def _avro_kind(t: Any) -> WriterField:
    if isinstance(t, list):  # a union: [null, X] is an optional X
        rest = [x for x in t if x != "null"]
        inner = _avro_kind(rest[0]) if len(rest) == 1 else WriterField("", OBJECT)
        return WriterField("", inner.kind, nullable="null" in t, precision=inner.precision,
                           scale=inner.scale, items=inner.items, max_length=inner.max_length)
    if isinstance(t, str):
        return WriterField("", _AVRO_PRIMITIVE.get(t, OBJECT))
    logical = t.get("logicalType")
    if logical in _AVRO_LOGICAL:
        return WriterField("", _AVRO_LOGICAL[logical], precision=t.get("precision"),
                           scale=t.get("scale", 0))
    kind = _AVRO_PRIMITIVE.get(t.get("type"), OBJECT)
    if kind == LIST:
        return WriterField("", LIST, items=_avro_kind(t.get("items")).kind)
    if t.get("type") == "enum":
        return WriterField("", STR, max_length=max(map(len, t.get("symbols") or ["x"])))
    return WriterField("", kind)


def avro_fields(text: str) -> dict[str, WriterField]:
    schema = json.loads(text)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return {}
    fields = {}
    for f in schema.get("fields", []):
        kind = _avro_kind(f["type"])
        fields[f["name"]] = WriterField(f["name"], kind.kind, kind.nullable, kind.precision,
                                        kind.scale, kind.items, kind.max_length)
    return fields


# --------------------------------------------------------------------------- Protobuf

_PROTO = {FieldDescriptor.TYPE_STRING: STR, FieldDescriptor.TYPE_BOOL: BOOL,
          FieldDescriptor.TYPE_DOUBLE: FLOAT, FieldDescriptor.TYPE_FLOAT: FLOAT,
          FieldDescriptor.TYPE_BYTES: BYTES, FieldDescriptor.TYPE_ENUM: STR,
          FieldDescriptor.TYPE_MESSAGE: OBJECT}


def protobuf_fields(text: str, message_index: int = 0) -> dict[str, WriterField]:
    """The fields of the file's first message (a serialized ``FileDescriptorProto``)."""
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    if not file.message_type:
        return {}
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


# --------------------------------------------------------------------------- JSON Schema

_JSON = {"string": STR, "integer": INT, "number": FLOAT, "boolean": BOOL, "object": OBJECT,
         "array": LIST}
_JSON_FORMATS = {"date-time": DATETIME, "date": DATE, "uuid": UUID_}


def json_schema_fields(text: str) -> dict[str, WriterField]:
    schema = json.loads(text)
    required = set(schema.get("required", []))
    fields = {}
    for name, prop in (schema.get("properties") or {}).items():
        types = prop.get("type", "object")
        types = types if isinstance(types, list) else [types]
        nullable = "null" in types or name not in required
        main = next((t for t in types if t != "null"), "object")
        kind = _JSON.get(main, OBJECT)
        if kind == STR and prop.get("format") in _JSON_FORMATS:
            kind = _JSON_FORMATS[prop["format"]]
        items = _JSON.get((prop.get("items") or {}).get("type", ""))
        fields[name] = WriterField(name, kind, nullable, items=items,
                                   max_length=prop.get("maxLength"))
    return fields


def writer_fields(fmt: Format, schema: WriterSchema) -> dict[str, WriterField]:
    if fmt is Format.AVRO:
        return avro_fields(schema.text)
    if fmt is Format.PROTOBUF:
        return protobuf_fields(schema.text)
    return json_schema_fields(schema.text)


# --------------------------------------------------------------------------- the check

#: Kinds a contract column's strict validation accepts, by the type its value travels in:
#: Python mode (Avro, Protobuf: values arrive typed) and JSON mode (JSON Schema).
_PYTHON_ACCEPTS = {"text": {STR}, "int2": {INT}, "int4": {INT}, "int8": {INT},
                   "float8": {FLOAT, INT}, "numeric": {DECIMAL}, "bool": {BOOL},
                   "timestamptz": {DATETIME}, "date": {DATE}, "uuid": {UUID_},
                   "jsonb": {OBJECT, LIST}}
_JSON_ACCEPTS = {**_PYTHON_ACCEPTS, "numeric": {STR, FLOAT, INT}, "timestamptz": {STR, DATETIME},
                 "date": {STR, DATE}, "uuid": {STR, UUID_}, "float8": {FLOAT, INT}}


def contract_problems(pipeline: Pipeline, fields: dict[str, WriterField]) -> list[str]:
    """Why the pipeline's contract cannot read records written with ``fields``: a field
    it requires that the writer does not have, or sends as a kind it refuses. (A field
    the writer *may* leave null is logged: records that do are dead-lettered one by one,
    the rest load; a proto3 message field, for one, is always optional.)"""
    accepts = _JSON_ACCEPTS if pipeline.format is Format.JSON_SCHEMA else _PYTHON_ACCEPTS
    model = pipeline.model
    problems = []
    for column in contract_columns(model):
        spec = model.model_fields[column.name]
        payload_name = spec.alias or column.name
        writer = fields.get(payload_name)
        required = spec.is_required()
        if writer is None:
            if required:
                problems.append(f"field {payload_name!r}: required by the contract, absent "
                                "from the writer schema")
            continue
        if writer.nullable and required and not column.nullable:
            log.warning("%s: field %r may be null or missing in the writer schema and the "
                        "contract requires it: such records are dead-lettered",
                        pipeline.name, payload_name)
        wanted = (accepts.get(column.copy_type) if not column.copy_type.endswith("[]")
                  else {LIST})
        if wanted is not None and writer.kind not in wanted:
            problems.append(f"field {payload_name!r}: the writer sends {writer.kind}, the "
                            f"contract's {column.ddl} column takes {', '.join(sorted(wanted))}")
    return problems


def schema_problems(pipeline: Pipeline, schema: WriterSchema) -> list[str]:
    """Why the pipeline's contract cannot read records written with ``schema`` ([]: it
    can; see :func:`contract_problems`)."""
    if pipeline.format is Format.PROTOBUF:
        return _protobuf_problems(pipeline, schema.text)
    return contract_problems(pipeline, writer_fields(pipeline.format, schema))


def check_subject(pipeline: Pipeline, registry: SchemaRegistry) -> WriterSchema | None:
    """Plan time: the contract must read at least one registered version of the subject,
    or :class:`ContractMismatch` names each field the latest lacks (no record written
    under the subject could load: a contract to fix before any data moves).

    A latest version the contract cannot read while an older one it can is a warning, not
    a failure: a version registered is not a version produced with, and the records carry
    their own schema id. Each is judged by it as it is decoded
    (:class:`~kafka_ingest.decode.formats.RegistryDecoder`): records of a readable version
    load, those of an unreadable one that the contract refuses are dead-lettered, their
    reason naming the schema id and the field. No subject yet (nothing produced with the
    registry) is a warning too."""
    if pipeline.format is Format.JSON or pipeline.schema_registry is None:
        return None
    subject = pipeline.schema_registry.subject(pipeline.topic)
    serialized = pipeline.format is Format.PROTOBUF
    latest = registry.latest(subject, serialized=serialized)
    if latest is None:
        log.warning("%s: subject %r is not registered yet; the contract is checked against "
                    "each writer schema as records arrive", pipeline.name, subject)
        return None
    problems = schema_problems(pipeline, latest)
    if not problems:
        return latest
    versions = [v for v in registry.versions(subject) if v != latest.version]
    for number in reversed(versions):  # newest first: the likeliest to be readable
        older = registry.version(subject, number, serialized=serialized)
        if older is not None and not schema_problems(pipeline, older):
            log.warning("%s: the contract cannot read version %s (schema id %s) of subject "
                        "%r, the latest: %s. Version %s (schema id %s) it reads: records "
                        "written with it load; those written with an unreadable version are "
                        "dead-lettered, naming the schema id", pipeline.name, latest.version,
                        latest.schema_id, subject, "; ".join(problems), older.version,
                        older.schema_id)
            return latest
    raise ContractMismatch(pipeline.name, subject, problems, versions=len(versions) + 1)


def protobuf_messages(text: str) -> list[str]:
    """The full names of a serialized ``FileDescriptorProto``'s top-level messages."""
    file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    return [f"{file.package}.{m.name}" if file.package else m.name for m in file.message_type]


def _protobuf_problems(pipeline: Pipeline, text: str) -> list[str]:
    """A Protobuf file may declare several top-level messages; its records say which one
    they are in their message indexes, not the subject. The pipeline's ``record`` names the
    message; without one, the contract must read one of the file's messages."""
    names = protobuf_messages(text)
    record = pipeline.schema_registry.record if pipeline.schema_registry else None
    if record is not None:
        if record not in names:
            return [f"message {record!r}: not a top-level message of the writer schema "
                    f"({', '.join(names) or 'none'})"]
        return contract_problems(pipeline, protobuf_fields(text, names.index(record)))
    found = [contract_problems(pipeline, protobuf_fields(text, i)) for i in range(len(names))]
    return [] if not found or any(not p for p in found) else found[0]


# --------------------------------------------------------------------------- the generator


#: The declared field type of each kind that needs no parameters.
_DECLARED = {INT: "bigint", FLOAT: "float", BOOL: "boolean", DATETIME: "timestamptz",
             DATE: "date", UUID_: "uuid", OBJECT: "jsonb"}


def _declared(field: WriterField, text_max_length: int) -> dict[str, Any] | None:
    kind = field.kind
    spec: dict[str, Any]
    if kind == STR:
        spec = {"type": "text", "max_length": field.max_length or text_max_length}
    elif kind in _DECLARED:
        spec = {"type": _DECLARED[kind]}
    elif kind == DECIMAL:
        spec = {"type": "numeric", "precision": field.precision or 38, "scale": field.scale or 0}
    elif kind == LIST and field.items in (STR, INT, FLOAT, BOOL):
        spec = {"type": "array", "items": _declared(WriterField("", field.items or STR),
                                                   text_max_length)}
    elif kind == LIST:
        spec = {"type": "jsonb"}
    else:
        return None  # bytes: no column type takes them as they are
    if field.nullable:
        spec["required"] = False
    return spec


def _column_name(name: str) -> str:
    """``updatedAt`` -> ``updated_at``, ``trace-id`` -> ``trace_id``."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return re.sub(r"[^a-z0-9_]", "_", snake)[:63]


def contract_from_schema(fmt: Format, schema: WriterSchema, *, text_max_length: int = 256,
                         record: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A declared contract (the ``contracts.<event_type>`` body) reading ``schema``, and
    the writer fields it leaves out (with why). ``event_id`` must be a writer field.
    ``record``: a Protobuf file's message to read (default: its first)."""
    if fmt is Format.PROTOBUF and record is not None:
        names = protobuf_messages(schema.text)
        if record not in names:
            raise ValueError(f"message {record!r} is not a top-level message of the schema "
                             f"({', '.join(names) or 'none'})")
        fields = protobuf_fields(schema.text, names.index(record))
    else:
        fields = writer_fields(fmt, schema)
    declared: dict[str, Any] = {}
    skipped = []
    if "event_id" not in fields:
        skipped.append("event_id: every contract needs one (the table's key); the writer "
                       "schema has none")
    for name, field in fields.items():
        if name in ("event_id", "version"):
            continue
        spec = _declared(field, text_max_length)
        if spec is None:
            skipped.append(f"{name}: {field.kind} has no column type (decode it yourself)")
            continue
        column = _column_name(name)
        if column != name:
            spec["column"] = column
        declared[name] = spec
    return {"version": 1, "doc": f"From subject {schema.subject!r} version {schema.version} "
            f"(schema id {schema.schema_id}).", "fields": declared}, skipped


__all__ = ["WriterField", "avro_fields", "check_subject", "contract_from_schema",
           "contract_problems", "json_schema_fields", "protobuf_fields", "protobuf_messages",
           "schema_problems", "writer_fields"]
