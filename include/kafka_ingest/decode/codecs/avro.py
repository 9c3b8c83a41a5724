"""Avro: records decoded against their writer schema, and that schema's fields.

A payload is decoded against the writer schema its id names, to a dict the contract
validates in Python mode (logical types arrive typed: ``Decimal``, aware ``datetime``,
``date``, ``UUID``). The contract is the reader: there is no reader-schema resolution
step, since what Avro's resolution would do (drop fields the reader does not know, fill a
missing optional field's default) the contract does already, and a second schema to keep
in step with it would be one more thing to drift.

Two readers. A record of primitives, unions of them and records of those defined in place
(the usual event, flattened or not) is read by straight-line code made once per schema id
(:func:`_flat_reader`: a local per field, no test of a field's type per message); any other
schema (a named type used by name, enums, arrays, maps, fixed, logical types), or one
whose reader would be over :data:`FLAT_MAX_LINES` lines, by fastavro's
``schemaless_reader``, which dispatches on each field's type for every message: on the
benchmark's 7-field event that dispatch made Avro's ``validate_chunk`` 22 % dearer than a
loop over a plan (fastavro 56,952 instructions a message, the loop 46,637), and the
straight-line code reads it in 1.04 µs against the loop's 1.49.

Named types from other subjects (the schema's ``references``, as confluent-kafka's
``AvroSerializer`` registers them) are defined first, each referenced schema after the
ones it references itself (:meth:`~kafka_ingest.kafka.registry.WriterSchema.referenced`);
a reference the registry has no version for, or a schema fastavro cannot parse with them,
is :class:`~kafka_ingest.errors.SchemaUnreadable`: the records of that schema id are
dead-lettered, the others load. A schema that is a union of records (one topic, several
event types, each a reference) offers each record to the contract, as a Protobuf file
offers each message.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import linecache
import logging
import struct
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import fastavro

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.base import (
    BOOL,
    BYTES,
    DATE,
    DATETIME,
    DECIMAL,
    FIELDS_DEPTH,
    FLOAT,
    INT,
    LIST,
    LOCAL_DATETIME,
    OBJECT,
    STR,
    TIME_,
    UUID_,
    Codec,
    Fields,
    NoSuchRecord,
    PayloadReader,
    WriterField,
)
from kafka_ingest.decode.connect_schema import from_avro
from kafka_ingest.errors import SchemaUnreadable, Undecodable

if TYPE_CHECKING:
    from kafka_ingest.kafka.registry import WriterSchema

log = logging.getLogger(__name__)


class AvroCodec(Codec):
    """``format: avro``."""

    format: ClassVar[Format] = Format.AVRO
    schema_type: ClassVar[str | None] = "AVRO"
    python: ClassVar[bool] = True

    def reader(self, schema: WriterSchema) -> PayloadReader:
        return _avro_reader(schema)

    def connect_schema(self, schema: WriterSchema) -> dict[str, Any] | None:
        """Connect's ``AvroData`` keeps a Connect schema in the Avro schema's properties
        (``connect.name``, ``connect.parameters``, ``connect.type``)."""
        parsed = _parsed(schema)
        try:
            return None if parsed is None else from_avro(parsed, [
                json.loads(ref.schema.text) for ref in schema.referenced()
                if ref.schema is not None])
        except ValueError as exc:
            raise SchemaUnreadable(schema.schema_id, str(exc)) from None

    def record_name(self, schema: WriterSchema) -> str | None:
        parsed = _parsed(schema)
        name = parsed.get("name") if isinstance(parsed, dict) else None
        return name.rsplit(".", 1)[-1] if isinstance(name, str) else None

    def primitive_kind(self, schema: WriterSchema) -> str | None:
        parsed = _parsed(schema)
        if isinstance(parsed, dict) and "logicalType" not in parsed:
            parsed = parsed.get("type")
        return {"string": STR, "int": INT, "long": INT}.get(parsed) if isinstance(
            parsed, str) else None

    def record_fields(self, schema: WriterSchema, record: str | None = None) -> list[Fields]:
        """One set, or one per record of a union (``record`` picks one by full name)."""
        named = _definitions(schema)
        records = _records(json.loads(schema.text), named)
        if record is None:
            return [avro_fields(r, named) for r in records] or [{}]
        by_name = {_full_name(r, ""): r for r in records}
        if record not in by_name:
            raise NoSuchRecord(f"record {record!r}: not a record of the writer schema "
                               f"({', '.join(by_name) or 'none'})")
        return [avro_fields(by_name[record], named)]


# --------------------------------------------------------------------------- decoding


def _parsed(schema: WriterSchema) -> Any:
    """The schema's JSON, or None when it is not JSON."""
    try:
        return json.loads(schema.text)
    except ValueError:
        return None

#: What fastavro raises for a schema it cannot parse (UnknownType is a ValueError).
_UNPARSABLE = (ValueError, TypeError, KeyError, AttributeError, RecursionError,
               fastavro.schema.SchemaParseException)


def _named_schemas(schema: WriterSchema) -> dict[str, Any]:
    """The named types of the schemas ``schema`` references, parsed for fastavro.

    Each referenced schema is parsed after those it references; one that names a type a
    sibling reference defines (without referencing it itself) is parsed again once the
    others are in."""
    named: dict[str, Any] = {}
    pending = []
    for ref in schema.referenced():
        if ref.schema is None:
            raise SchemaUnreadable(schema.schema_id, f"its reference {ref.name!r} names version "
                                   f"{ref.version} of subject {ref.subject!r}, which the "
                                   "registry does not serve")
        pending.append(ref)
    while pending:
        failed, last = [], ""
        for ref in pending:
            trial = dict(named)  # a failed parse may leave half a definition behind
            try:
                fastavro.parse_schema(json.loads(ref.schema.text),  # type: ignore[union-attr]
                                      named_schemas=trial)
            except _UNPARSABLE as exc:
                failed.append(ref)
                last = f"{type(exc).__name__}: {exc}"
                continue
            named = trial
        if len(failed) == len(pending):
            raise SchemaUnreadable(schema.schema_id, f"its reference {failed[0].name!r} "
                                   f"(subject {failed[0].subject!r} version "
                                   f"{failed[0].version}) does not parse: {last}")
        pending = failed
    return named


def _avro_reader(schema: WriterSchema) -> PayloadReader:
    named = _named_schemas(schema)
    try:
        writer = fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
    except _UNPARSABLE as exc:
        refs = f" with its {len(named)} referenced named types" if named else ""
        raise SchemaUnreadable(schema.schema_id, f"not an Avro schema fastavro can parse"
                               f"{refs}: {type(exc).__name__}: {exc}") from None
    plan = _flat_plan(json.loads(schema.text))
    flat = None if plan is None else _flat_reader(schema.schema_id, plan)
    if flat is not None:
        return flat
    read = fastavro.schemaless_reader

    def decode(value: bytes, start: int = 0, /) -> Any:
        stream = io.BytesIO(value)
        stream.seek(start)
        try:
            return read(stream, writer)
        except Exception as exc:  # fastavro raises what its reading met: EOF, index, value
            raise Undecodable(f"Avro payload does not decode with schema id "
                              f"{schema.schema_id}: {type(exc).__name__}: {exc}") from None

    return decode


# Flat records: a record of primitives, unions of them (["null", "string"]) and records of
# those (defined in place) has its fields planned once per schema id and read by code made
# from the plan to the dict fastavro would make (see the module docstring for what it saves).

#: Avro's primitives as the flat reader's codes (int and long are both zigzag varints).
_NULL, _BOOLEAN, _VARINT, _FLOAT, _DOUBLE, _STRING, _BYTES = range(7)
_PRIMITIVES = {"null": _NULL, "boolean": _BOOLEAN, "int": _VARINT, "long": _VARINT,
               "float": _FLOAT, "double": _DOUBLE, "string": _STRING, "bytes": _BYTES}
#: The code of a field that is a union: its branch's code follows its index on the wire.
_UNION = -1
#: The code of a field that is a record: its fields' steps follow, then :data:`_END_RECORD`.
_RECORD = -2
#: The step after a record's last field: on with the fields of the record around it.
_END_RECORD = -3
#: (field name, its code, a union's branch codes) per step, in the order the fields are
#: on the wire: a record's fields between its own step and an :data:`_END_RECORD` step.
FlatPlan = tuple[tuple[str, int, tuple[int, ...]], ...]


def _primitive(avro_type: Any) -> int | None:
    """The code of a primitive type without a logical type (``"string"``, or
    ``{"type": "string", "avro.java.string": "String"}``), else None."""
    if isinstance(avro_type, dict) and "logicalType" not in avro_type:
        avro_type = avro_type.get("type")
    return _PRIMITIVES.get(avro_type) if isinstance(avro_type, str) else None


def _flat_plan(schema: Any) -> FlatPlan | None:
    """The plan of a record whose fields are primitives, unions of primitives or records
    (defined in place) of those; None for any other schema, and for what Avro does not
    allow but fastavro reads (a name that is not text, a union naming a type twice)."""
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return None
    plan: list[tuple[str, int, tuple[int, ...]]] = []
    for field in schema.get("fields", ()):
        kind, name = field["type"], field["name"]
        if not isinstance(name, str):
            return None
        if isinstance(kind, list):
            branches = [_primitive(branch) for branch in kind]
            types = [b.get("type") if isinstance(b, dict) else b for b in kind]
            if not branches or None in branches or len(set(map(str, types))) < len(types):
                return None
            plan.append((name, _UNION, tuple(b for b in branches if b is not None)))
        elif (code := _primitive(kind)) is not None:
            plan.append((name, code, ()))
        elif (inner := _flat_plan(kind)) is not None:
            plan += [(name, _RECORD, ()), *inner, ("", _END_RECORD, ())]
        else:
            return None
    return tuple(plan)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (an int, a long, a length, a union index) and the
    position after it; IndexError past the end, ValueError for more than 10 bytes or 64
    bits (as Avro's Java decoder refuses them)."""
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
    if value >> 64:  # a tenth byte over 1: no long of Avro's (fastavro keeps the low bits)
        raise ValueError("a varint of over 64 bits")
    return (value >> 1) ^ -(value & 1), pos + 1


#: The most lines of source compiled for one schema (a string field takes 13, a union 6
#: and its branches'): compiling takes about 10 µs and 4 KB a line, once per schema id
#: and slice, so at most about 0.1 s and 45 MB for the while; fastavro reads a wider
#: schema (over about 770 text fields).
FLAT_MAX_LINES = 10_000


class _TooLong(Exception):
    """The source of a plan would be over :data:`FLAT_MAX_LINES`."""


def _flat_reader(schema_id: int, plan: FlatPlan) -> PayloadReader | None:
    """The reader of one planned schema: straight-line code made for it (:class:`_FlatSource`),
    with no loop over the fields, no test of a field's type per message, and each record's
    dict made whole once its fields are read. None, for fastavro's reader to take the
    schema, when its source would be over :data:`FLAT_MAX_LINES` or Python cannot
    compile it (logged: not expected).

    The one function of the package compiled from source it makes (rows and validators are
    plain Python, #32), for what it saves: the benchmark's 7-field event read in 1.04 µs
    against 1.49 by a loop over the plan, the Avro path's ``validate_chunk`` 11 % cheaper
    in an interleaved A/B (benchmarks/README.md). Of the schema's text the source holds
    each field name, as a ``repr`` literal: no text of the schema runs, and the code calls
    only the names it is given here and builtins. Its lines are in
    :mod:`linecache` under the name its code carries, so a traceback shows them and a
    debugger steps through them.
    """
    names: dict[str, Any] = {"varint": _varint, "struct_error": struct.error,
                             "Undecodable": Undecodable, "schema_id": schema_id}
    try:
        source = _FlatSource(plan, names).source()
    except _TooLong:
        return None
    digest = hashlib.blake2b(source.encode(), digest_size=6).hexdigest()
    filename = f"<avro reader of schema id {schema_id} ({digest})>"
    try:
        code = compile(source, filename, "exec")
    except (SyntaxError, RecursionError, MemoryError, ValueError, OverflowError) as exc:
        log.warning("schema id %d: its Avro reader does not compile (%s: %s); fastavro "
                    "reads it", schema_id, type(exc).__name__, exc)
        return None
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(code, names)  # noqa: S102 (source made above from codes and repr literals only)
    decode = names["decode"]
    decode.__qualname__ = f"_flat_reader.<schema id {schema_id}>"
    return cast(PayloadReader, decode)


class _FlatSource:
    """The source of ``decode(payload, pos=0, /)`` for a plan: each field read into a local
    of its own in wire order, runs of floats and doubles unpacked by one struct each, and a
    length or union index of one byte (every string shorter than 64 bytes, every union
    index under 64) read in place (``not byte & 0x81``: under 0x80 and even, a zigzag of 0
    to 63); the struct unpackers it calls go into ``names``. The function raises
    :class:`~kafka_ingest.errors.Undecodable` for a payload cut short, a length or union
    index out of range, or text that is not UTF-8. :class:`_TooLong` past
    :data:`FLAT_MAX_LINES`."""

    INDENT = " " * 8  # inside the function's ``try``

    def __init__(self, plan: FlatPlan, names: dict[str, Any]) -> None:
        self.plan, self.names = plan, names
        self.body: list[str] = []
        #: The records being made, innermost last: their fields' (name, local).
        self.records: list[list[tuple[str, str]]] = [[]]
        #: A run of floats and doubles not unpacked yet: (struct code, local).
        self.fixed: list[tuple[str, str]] = []

    def source(self) -> str:
        for n, (name, code, branches) in enumerate(self.plan):
            local = f"v{n}"
            if code == _END_RECORD:  # the record's dict, into the local its step named
                fields = self.records.pop()
                _, record_local = self.records[-1][-1]  # the record's own step: last around it
                self.flush(self.INDENT)
                self.body.append(f"{self.INDENT}{record_local} = {_display(fields)}")
                continue
            self.records[-1].append((name, local))
            if code == _RECORD:
                self.records.append([])
            elif code == _UNION:
                self.union(local, branches)
            else:
                self.read(code, local, self.INDENT)
            if len(self.body) > FLAT_MAX_LINES:
                raise _TooLong
        self.flush(self.INDENT)
        return "\n".join([
            "def decode(p, i=0, /):",
            "    size = len(p)",
            "    try:",
            *(self.body or [self.INDENT + "pass"]),
            "    except (IndexError, ValueError, struct_error) as exc:  # cut short, not UTF-8",
            "        raise Undecodable(f'Avro payload does not decode with schema id "
            "{schema_id}: '",
            "                          f'{type(exc).__name__}: {exc}') from None",
            f"    return {_display(self.records[0])}",
            ""])

    def flush(self, indent: str) -> None:
        """The run of floats and doubles so far, unpacked by one struct."""
        if not self.fixed:
            return
        fmt = "".join(f for f, _ in self.fixed)
        self.names.setdefault(f"unpack_{fmt}", struct.Struct("<" + fmt).unpack_from)
        targets = ", ".join(v for _, v in self.fixed) + ("," if len(self.fixed) == 1 else "")
        self.body += [f"{indent}{targets} = unpack_{fmt}(p, i)",
                      f"{indent}i += {struct.calcsize('<' + fmt)}"]
        self.fixed.clear()

    def union(self, local: str, branches: tuple[int, ...]) -> None:
        """The branch's index, then its value into ``local``."""
        indent = self.INDENT
        self.flush(indent)
        self.body += [f"{indent}{line}" for line in (
            "b = p[i]", "if not b & 0x81:", "    i += 1", "    x = b >> 1", "else:",
            "    x, i = varint(p, i)")]
        for index, branch in enumerate(branches):
            self.body.append(f"{indent}{'if' if index == 0 else 'elif'} x == {index}:")
            self.read(branch, local, indent + "    ")
            self.flush(indent + "    ")
        self.body += [f"{indent}else:", f"{indent}    raise IndexError(f'union index {{x}}')"]

    def read(self, code: int, local: str, indent: str) -> None:
        """One value of primitive ``code`` into ``local``."""
        if code in (_FLOAT, _DOUBLE):
            self.fixed.append(("f" if code == _FLOAT else "d", local))
            return
        self.flush(indent)
        if code == _NULL:
            lines = [f"{local} = None"]
        elif code == _BOOLEAN:  # any byte but 0 is true, as fastavro reads it
            lines = [f"{local} = p[i] != 0", "i += 1"]
        elif code == _VARINT:
            lines = ["b = p[i]", "if b < 0x80:", f"    {local} = (b >> 1) ^ -(b & 1)",
                     "    i += 1", "else:", f"    {local}, i = varint(p, i)"]
        else:  # _STRING, _BYTES: a length, then the bytes
            lines = ["b = p[i]", "if not b & 0x81:", "    i += 1", "    e = i + (b >> 1)",
                     "else:", "    e, i = varint(p, i)", "    if e < 0:",
                     "        raise ValueError(f'a length of {e} at byte {i}')",
                     "    e += i", "if e > size:",
                     "    raise ValueError(f'a length of {e - i} at byte {i} of {size}')",
                     f"{local} = {'p[i:e].decode()' if code == _STRING else 'p[i:e]'}",
                     "i = e"]
        self.body += [indent + line for line in lines]


def _display(fields: list[tuple[str, str]]) -> str:
    """A dict display of a record's fields: each name as a ``repr`` literal, its local."""
    return "{" + ", ".join(f"{name!r}: {local}" for name, local in fields) + "}"


# --------------------------------------------------------------------------- the writer's fields

_AVRO_LOGICAL = {"timestamp-millis": DATETIME, "timestamp-micros": DATETIME, "date": DATE,
                 "uuid": UUID_, "decimal": DECIMAL, "local-timestamp-millis": LOCAL_DATETIME,
                 "local-timestamp-micros": LOCAL_DATETIME, "time-millis": TIME_,
                 "time-micros": TIME_}
_AVRO_PRIMITIVE = {"string": STR, "int": INT, "long": INT, "float": FLOAT, "double": FLOAT,
                   "boolean": BOOL, "bytes": BYTES, "fixed": BYTES, "record": OBJECT,
                   "map": OBJECT, "array": LIST, "enum": STR}


#: Named Avro types by full name (``test.ref.Customer``), as their JSON definitions.
Named = dict[str, dict[str, Any]]
_NAMED_TYPES = frozenset({"record", "error", "enum", "fixed"})


def _full_name(t: dict[str, Any], namespace: str) -> str:
    name = str(t.get("name", ""))
    if "." in name:
        return name
    space = t.get("namespace", namespace) or ""
    return f"{space}.{name}" if space else name


def _define(t: Any, namespace: str, out: Named) -> None:
    """Every named type defined in ``t`` (a schema, or a part of one), by full name."""
    if isinstance(t, list):
        for branch in t:
            _define(branch, namespace, out)
        return
    if not isinstance(t, dict):
        return
    if t.get("type") in _NAMED_TYPES and "name" in t:
        full = _full_name(t, namespace)
        out.setdefault(full, t)
        namespace = full.rpartition(".")[0]
    for f in t.get("fields", ()) if isinstance(t.get("fields"), list) else ():
        if isinstance(f, dict):
            _define(f.get("type"), namespace, out)
    for key in ("items", "values"):
        _define(t.get(key), namespace, out)
    if isinstance(t.get("type"), dict | list):
        _define(t["type"], namespace, out)


def _definitions(schema: WriterSchema) -> Named:
    """The named types a writer schema can use: its references' and its own."""
    named: Named = {}
    for ref in schema.referenced():
        if ref.schema is not None:
            with contextlib.suppress(ValueError):
                _define(json.loads(ref.schema.text), "", named)
    _define(json.loads(schema.text), "", named)
    return named


def _lookup(name: str, named: Named) -> dict[str, Any] | None:
    """A named type by its full name, or by its short name when one type has it."""
    if name in named:
        return named[name]
    short = [t for full, t in named.items() if full.rpartition(".")[2] == name]
    return short[0] if len(short) == 1 else None


def _records(schema: Any, named: Named) -> list[dict[str, Any]]:
    """The record types a value of ``schema`` may be: the record, or each of a union's."""
    branches = schema if isinstance(schema, list) else [schema]
    out = []
    for branch in branches:
        if isinstance(branch, str):
            branch = _lookup(branch, named) or branch  # noqa: PLW2901 (the named record)
        if isinstance(branch, dict) and branch.get("type") in ("record", "error"):
            out.append(branch)
    return out


def _avro_kind(t: Any, named: Named, depth: int = 0) -> WriterField:
    if isinstance(t, list):  # a union: [null, X] is an optional X
        rest = [x for x in t if x != "null"]
        inner = (_avro_kind(rest[0], named, depth) if len(rest) == 1
                 else WriterField("", OBJECT))
        return replace(inner, nullable="null" in t)
    if isinstance(t, str):
        if t in _AVRO_PRIMITIVE:
            return WriterField("", _AVRO_PRIMITIVE[t], bits=32 if t == "int" else None)
        defined = _lookup(t, named)  # a named type, defined before or by a reference
        return WriterField("", OBJECT) if defined is None else _avro_kind(defined, named,
                                                                         depth)
    logical = t.get("logicalType")
    if logical in _AVRO_LOGICAL:
        return WriterField("", _AVRO_LOGICAL[logical], precision=t.get("precision"),
                           scale=t.get("scale", 0))
    if isinstance(t.get("type"), list | str) and t.get("type") not in _AVRO_PRIMITIVE:
        return _avro_kind(t["type"], named, depth)  # {"type": "a.Named"}, {"type": [...]}
    kind = _AVRO_PRIMITIVE.get(t.get("type"), OBJECT)
    if kind == LIST:
        return WriterField("", LIST, items=_avro_kind(t.get("items"), named, depth).kind)
    if t.get("type") == "enum":
        return WriterField("", STR, max_length=max(map(len, t.get("symbols") or ["x"])))
    if t.get("type") in ("record", "error") and depth < FIELDS_DEPTH:
        return WriterField("", OBJECT, fields=_record_fields(t, named, depth + 1))
    return WriterField("", kind, bits=32 if t.get("type") == "int" else None)


def _record_fields(schema: dict[str, Any], named: Named, depth: int) -> Fields:
    fields = {}
    for f in schema.get("fields", []):
        fields[f["name"]] = replace(_avro_kind(f["type"], named, depth), name=f["name"])
    return fields


def avro_fields(schema: str | dict[str, Any], named: Named | None = None) -> Fields:
    """The top-level fields of a record schema (its text or its JSON; none for any other
    schema); ``named``: the named types it may use by name (:func:`_definitions`)."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return {}
    if named is None:
        named = {}
        _define(schema, "", named)
    return _record_fields(schema, named, 0)


__all__ = ["AvroCodec", "avro_fields"]
