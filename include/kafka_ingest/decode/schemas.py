"""Writer schemas against contracts: the check that a pipeline's contract can read a
writer schema (at plan time, the subject's versions; as records are decoded, the schema
each carries), and a declared contract made from a registered schema.

Both work on what the pipeline's codec says of a writer schema
(:meth:`~kafka_ingest.decode.codecs.base.Codec.record_fields`): each top-level field's
*kind* (what the decoder hands the contract: ``str``, ``int``, ``Decimal``, ``datetime``,
...), and, per contract column, the kinds its strict validation accepts
(:attr:`~kafka_ingest.decode.codecs.base.Codec.kinds`). The check names every required
contract field the writer does not have, may leave null, or sends as a kind the contract
refuses; the generator maps each kind to the declared field type that accepts it, with the
bounds the contract rules need (a ``max_length`` on text, digits and scale on decimals).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from kafka_ingest.config import Format, Pipeline
from kafka_ingest.contracts.columns import contract_columns, payload_paths
from kafka_ingest.contracts.declared import NESTING_MAX
from kafka_ingest.decode.codecs import Fields, NoSuchRecord, WriterField, codec_for
from kafka_ingest.decode.codecs.base import (
    ANY,
    BOOL,
    BYTES,
    DATE,
    DATETIME,
    DECIMAL,
    DURATION,
    FLOAT,
    INT,
    LIST,
    LOCAL_DATETIME,
    OBJECT,
    STR,
    TIME_,
    UUID_,
)
from kafka_ingest.decode.infer import ProposedIdentity, column_name, id_candidates, key_column
from kafka_ingest.errors import ContractMismatch
from kafka_ingest.kafka.registry import SchemaRegistry, WriterSchema

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- the check


def contract_problems(pipeline: Pipeline, fields: Fields) -> list[str]:
    """Why the pipeline's contract cannot read records written with ``fields``: a field
    it requires that the writer does not have, or sends as a kind it refuses. (A field
    the writer *may* leave null is logged: records that do are dead-lettered one by one,
    the rest load; a proto3 message field, for one, is always optional.)"""
    accepts = codec_for(pipeline.format).kinds
    model = pipeline.model
    paths = {column: path for path, column in reversed(payload_paths(model).items())}
    problems = []
    for column in contract_columns(model):
        spec = model.model_fields[column.name]
        payload_name = paths.get(column.name, column.name)
        writer = writer_field(fields, payload_name)
        if writer is _UNKNOWN or (writer is not None and writer.kind == ANY):
            continue  # inside an object the writer schema does not describe (a map), or
            # a field it lets be any value: the contract's validation judges each record
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
        wanted = (accepts.get(column.value_type) if not column.value_type.endswith("[]")
                  else {LIST})
        if wanted is not None and writer.kind not in wanted:
            problems.append(f"field {payload_name!r}: the writer sends {writer.kind}, the "
                            f"contract's {column.ddl} column takes {', '.join(sorted(wanted))}")
    return problems


#: A field inside an object whose fields the writer schema does not say.
_UNKNOWN = WriterField("", OBJECT)


def writer_field(fields: Fields, path: str) -> WriterField | None:
    """The writer's field at a dotted ``path`` (``address.city``: the field ``city`` of the
    record ``address``), nullable when a record on the way is; None when the writer has no
    such field, :data:`_UNKNOWN` when an object on the way has fields the schema does not
    say (a map, a JSON Schema object without properties)."""
    if path in fields:  # a top-level field, even one whose name has a dot
        return fields[path]
    first, *rest = path.split(".")
    found = fields.get(first)
    nullable = False
    for part in rest:
        if found is not None and found.kind == ANY:
            return _UNKNOWN  # an object, maybe: the schema does not say
        if found is None or found.kind != OBJECT:
            return None
        if found.fields is None:
            return _UNKNOWN
        nullable = nullable or found.nullable
        found = found.fields.get(part)
    if found is not None and nullable and not found.nullable:
        found = replace(found, nullable=True)
    return found


def schema_problems(pipeline: Pipeline, schema: WriterSchema) -> list[str]:
    """Why the pipeline's contract cannot read records written with ``schema`` ([]: it
    can; see :func:`contract_problems`). A schema of several record types (a Protobuf
    file's messages: the records say which they are, not the subject) is read when the
    contract reads the one the pipeline's ``record`` names, or without one, any of them."""
    if pipeline.envelope is not None:  # change events: their rows are compared with the
        return []  # contract schema by schema as they are read (envelopes.source_changes)
    record = pipeline.schema_registry.record if pipeline.schema_registry else None
    try:
        candidates = codec_for(pipeline.format).record_fields(schema, record)
    except NoSuchRecord as exc:
        return [str(exc)]
    except RecursionError:  # its records are dead-lettered as schema_unreadable
        return [f"schema id {schema.schema_id} is nested deeper than it can be read"]
    found = [contract_problems(pipeline, fields) for fields in candidates]
    return [] if not found or any(not problems for problems in found) else found[0]


def check_subject(pipeline: Pipeline, registry: SchemaRegistry) -> WriterSchema | None:
    """Plan time: the contract must read at least one registered version of the subject,
    or :class:`ContractMismatch` names each field the latest lacks (no record written
    under the subject could load: a contract to fix before any data moves).

    A latest version the contract cannot read while an older one it can is a warning, not
    a failure: a version registered is not a version produced with, and the records carry
    their own schema id. Each is judged by it as it is decoded
    (:class:`~kafka_ingest.decode.decoder.RegistryDecoder`): records of a readable version
    load, those of an unreadable one that the contract refuses are dead-lettered, their
    reason naming the schema id and the field. No subject yet (nothing produced with the
    registry) is a warning too."""
    if not pipeline.format.registry or pipeline.schema_registry is None:
        return None
    codec = codec_for(pipeline.format)
    subject = pipeline.schema_registry.subject(pipeline.topic)
    latest = codec.latest(registry, subject)
    if latest is None:
        log.warning("%s: subject %r is not registered yet; the contract is checked against "
                    "each writer schema as records arrive", pipeline.name, subject)
        return None
    problems = schema_problems(pipeline, latest)
    if not problems:
        return latest
    versions = [v for v in registry.versions(subject) if v != latest.version]
    for number in reversed(versions):  # newest first: the likeliest to be readable
        older = codec.version(registry, subject, number)
        if older is not None and not schema_problems(pipeline, older):
            log.warning("%s: the contract cannot read version %s (schema id %s) of subject "
                        "%r, the latest: %s. Version %s (schema id %s) it reads: records "
                        "written with it load; those written with an unreadable version are "
                        "dead-lettered, naming the schema id", pipeline.name, latest.version,
                        latest.schema_id, subject, "; ".join(problems), older.version,
                        older.schema_id)
            return latest
    raise ContractMismatch(pipeline.name, subject, problems, versions=len(versions) + 1)


# --------------------------------------------------------------------------- the generator


#: The declared field type of each kind that needs no parameters.
_DECLARED = {INT: "bigint", FLOAT: "float", BOOL: "boolean", DATETIME: "timestamptz",
             DATE: "date", UUID_: "uuid", OBJECT: "jsonb", BYTES: "bytea",
             LOCAL_DATETIME: "timestamp", TIME_: "time", DURATION: "interval"}


def _declared(field: WriterField, text_max_length: int,
              depth: int = 1, skipped: list[str] | None = None,
              path: str = "") -> dict[str, Any] | None:
    """The declared field reading ``field`` at nesting ``depth`` (a top-level field's is
    1): a record whose fields the schema says is a ``record`` while ``depth`` is within
    :data:`~kafka_ingest.contracts.declared.NESTING_MAX`, else ``jsonb``."""
    kind = field.kind
    spec: dict[str, Any]
    if kind == STR:
        spec = {"type": "text", "max_length": field.max_length or text_max_length}
    elif kind == INT and field.bits == 32:
        spec = {"type": "integer"}
    elif kind == OBJECT and field.fields and depth <= NESTING_MAX:
        spec = {"type": "record", "fields": _declared_fields(
            field.fields, text_max_length, depth + 1, [] if skipped is None else skipped,
            f"{path}.")}
    elif kind in _DECLARED:
        spec = {"type": _DECLARED[kind]}
    elif kind == DECIMAL:
        spec = {"type": "numeric", "precision": field.precision or 38, "scale": field.scale or 0}
    elif kind == LIST and field.items in (STR, INT, FLOAT, BOOL):
        spec = {"type": "array", "items": _declared(WriterField("", field.items or STR),
                                                   text_max_length)}
    elif kind == LIST:
        spec = {"type": "jsonb"}  # an array of records, or of arrays
    else:
        return None
    if field.nullable:
        spec["required"] = False
    return spec


def _declared_fields(fields: Fields, text_max_length: int, depth: int, skipped: list[str],
                     prefix: str) -> dict[str, Any]:
    declared: dict[str, Any] = {}
    for name, field in fields.items():
        spec = _declared(field, text_max_length, depth, skipped, f"{prefix}{name}")
        if spec is None:
            skipped.append(f"{prefix}{name}: {field.kind} has no column type (decode it "
                           "yourself)")
            continue
        column = column_name(name)
        if column != name:
            spec["column"] = column
        if spec["type"] == "record" and not spec["fields"]:
            spec = {"type": "jsonb", **({"required": False} if field.nullable else {})}
        declared[name] = spec
    return declared


def _fitted(spec: dict[str, Any], column: str) -> dict[str, Any]:
    """A ``record`` whose path columns would be longer than Postgres' 63-character names
    kept whole as ``jsonb`` instead (its own ``column`` and ``required`` kept)."""
    if spec["type"] != "record":
        return spec
    fields = {}
    for name, child in spec["fields"].items():
        path_column = f"{column}_{child.get('column', name)}"
        if len(path_column) > 63:
            return {"type": "jsonb", **{k: spec[k] for k in ("required", "column") if k in spec}}
        fields[name] = _fitted(child, path_column)
    return {**spec, "fields": fields}


def contract_from_schema(fmt: Format, schema: WriterSchema, *, text_max_length: int = 256,
                         record: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A declared contract (the ``contracts.<event_type>`` body) reading ``schema``, and
    the writer fields it leaves out (with why). ``event_id`` is the contract's implicit
    field: without it in the writer schema, the pipeline says what identifies a record
    (``identity``: :func:`schema_identity`).
    ``record``: which record type of a schema of several to read (a Protobuf file's
    message, by its full name; default: the first); :class:`ValueError` when there is
    no such one."""
    fields: Fields = next(iter(codec_for(fmt).record_fields(schema, record)), {})
    skipped: list[str] = []
    declared = _declared_fields({n: f for n, f in fields.items()
                                 if n not in ("event_id", "version")},
                                text_max_length, 1, skipped, "")
    declared = {name: _fitted(spec, spec.get("column", name)) for name, spec in declared.items()}
    return {"version": 1, "doc": f"From subject {schema.subject!r} version {schema.version} "
            f"(schema id {schema.schema_id}).", "fields": declared}, skipped


# --------------------------------------------------------------------------- the identity


def key_identity(fmt: Format, key: WriterSchema, *, topic: str, text_max_length: int,
                 fields: dict[str, Any]) -> ProposedIdentity | None:
    """The record key as the identity, from the key subject's schema: a string or an
    integer key, or the id field of a record key (:func:`id_candidates`); None when the
    key schema holds nothing a column takes. ``fields``: the contract's, whose columns the
    key's must not take."""
    codec = codec_for(fmt)
    section: dict[str, Any] = {"column": key_column(fields), "format": "registry"}
    primitive = codec.primitive_kind(key)
    if primitive == INT:
        section["type"] = "bigint"
        return ProposedIdentity("record_key", f"the key subject {key.subject!r} holds an "
                                              "integer key", section)
    if primitive == STR:
        section["max_length"] = text_max_length
        return ProposedIdentity("record_key", f"the key subject {key.subject!r} holds a "
                                              "string key", section)
    key_fields = next(iter(codec.record_fields(key)), {})
    usable = {n: f for n, f in key_fields.items() if f.kind in (INT, STR) and not f.nullable}
    chosen = next(iter(id_candidates(usable, topic=topic,
                                     record=codec.record_name(key))), None)
    if chosen is None and len(usable) == 1:
        chosen = (next(iter(usable)), "the key's only field")
    if chosen is None:
        return None
    name, why = chosen
    section["field"] = name
    if usable[name].kind == INT:
        section["type"] = "bigint"
    else:
        section["max_length"] = usable[name].max_length or text_max_length
    return ProposedIdentity("record_key", f"the key subject {key.subject!r} holds a "
                                          f"record; its field {why}", section)


def schema_identity(fmt: Format, schema: WriterSchema, *, topic: str,
                    key: ProposedIdentity | None = None,
                    record: str | None = None) -> ProposedIdentity:
    """What identifies a record written with ``schema``: its ``event_id`` (the default),
    else the record key its key subject describes (``key``), else a required field that
    names itself an id (:func:`id_candidates`), else its place in the log."""
    codec = codec_for(fmt)
    fields: Fields = next(iter(codec.record_fields(schema, record)), {})
    own = fields.get("event_id")
    if own is not None and own.kind == STR and not own.nullable:
        return ProposedIdentity(None, "'event_id' (the default): the writer schema has one, "
                                      "required")
    if key is not None:
        return ProposedIdentity(key.value, f"{key.why}. A second record with the same key is "
                                           "taken for the same record and not loaded again: "
                                           "where keys repeat (an entity's events), name a "
                                           "field or source_position instead", key.record_key)
    usable = [n for n, f in fields.items() if f.kind in (INT, STR) and not f.nullable]
    for name, why in id_candidates(usable, topic=topic, record=codec.record_name(schema)):
        return ProposedIdentity(name, f"{why}; a required field. A second record with the "
                                      "same value is taken for the same record and not "
                                      "loaded again")
    return ProposedIdentity("source_position", "no key subject, and no required field names "
                                               "itself the record's id: each record is "
                                               "identified by its place in the log")


__all__ = ["check_subject", "contract_from_schema", "contract_problems", "key_identity",
           "schema_identity", "schema_problems"]
