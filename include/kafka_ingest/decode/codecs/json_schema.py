"""JSON Schema: the payload after the wire header is JSON, validated as a JSON pipeline's
value is (the contract parses it); the schema's properties are its fields."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import unquote

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.base import (
    ANY,
    BOOL,
    DATE,
    DATETIME,
    FIELDS_DEPTH,
    FLOAT,
    INT,
    LIST,
    OBJECT,
    STR,
    UUID_,
    Codec,
    Fields,
    PayloadReader,
    WriterField,
)
from kafka_ingest.errors import Undecodable

if TYPE_CHECKING:
    from kafka_ingest.kafka.registry import Reference, WriterSchema


class JsonSchemaCodec(Codec):
    """``format: json_schema``."""

    format: ClassVar[Format] = Format.JSON_SCHEMA
    schema_type: ClassVar[str | None] = "JSON"

    def reader(self, schema: WriterSchema) -> PayloadReader:
        return _as_it_is

    def python_value(self, decoded: Any) -> Any:
        try:
            return json.loads(decoded)
        except (ValueError, RecursionError) as exc:
            raise Undecodable(f"not JSON: {exc}") from None

    def record_fields(self, schema: WriterSchema, record: str | None = None) -> list[Fields]:
        return [json_schema_fields(schema.text, schema.referenced())]


def _as_it_is(value: bytes, start: int = 0, /) -> bytes:
    return value[start:]


_JSON = {"string": STR, "integer": INT, "number": FLOAT, "boolean": BOOL, "object": OBJECT,
         "array": LIST}
#: A kind -> the JSON type name that says it.
_JSON_TYPES = {kind: name for name, kind in _JSON.items()}
_JSON_FORMATS = {"date-time": DATETIME, "date": DATE, "uuid": UUID_}
#: How many ``$ref`` / ``allOf`` / ``anyOf`` steps, all branches together, one property's
#: schema may take to say what it is: far beyond any real schema, and a bound on
#: references that loop or branch into themselves (``A: {anyOf: [A, A]}``).
_STEPS = 256
#: How many fields one schema's nested records may hold together: a ``$ref`` that fans out
#: into itself would otherwise make a tree of millions (deeper records: not described).
_FIELDS_MAX = 10_000


def json_schema_fields(text: str, references: Sequence[Reference] = ()) -> Fields:
    """The properties of an object schema (a property not ``required`` may be missing), as
    generators write them: ``$ref`` to a definition of the same document (``#/$defs/...``,
    ``#/definitions/...``, any JSON pointer) or of a schema it references in the registry
    (by the reference's name, as confluent-kafka's ``JSONSerializer`` registers them, or by
    that schema's ``$id``, with a pointer after ``#``); ``anyOf``/``oneOf`` of one type and
    ``null`` (an optional field, as pydantic writes one); ``allOf``; an ``enum`` or
    ``const`` without a ``type``. A property whose values the schema does not pin to one
    kind (no ``type``, several types, a ``$ref`` to nothing) is :data:`ANY`."""
    documents: dict[str, Any] = {}
    for ref in references:
        if ref.schema is not None and ref.schema.schema_type == "JSON":
            document = json.loads(ref.schema.text)
            documents[ref.name] = document
            if isinstance(document, dict) and isinstance(document.get("$id"), str):
                documents.setdefault(document["$id"], document)
    root = json.loads(text)
    resolver = _Resolver(documents)
    spec, document, _ = resolver.resolved(root, root)
    return resolver.properties(spec, document, 0)


class _Resolver:
    """One property's schema -> the schema that says what it is (its ``$ref``s followed,
    its ``allOf`` merged, its ``anyOf``/``oneOf`` of one type and ``null`` taken apart)."""

    def __init__(self, documents: dict[str, Any]) -> None:
        self.documents = documents
        self.steps_left = _STEPS
        self.fields_left = _FIELDS_MAX

    def resolved(self, spec: Any, document: Any) -> tuple[dict[str, Any], Any, bool]:
        """:meth:`effective` with a budget of :data:`_STEPS` of its own."""
        self.steps_left = _STEPS
        return self.effective(spec, document)

    def properties(self, schema: dict[str, Any], document: Any, depth: int) -> Fields:
        required = schema.get("required")
        required = set(required) if isinstance(required, list) else set()
        properties = schema.get("properties")
        fields = {}
        for name, prop in (properties.items() if isinstance(properties, dict) else ()):
            spec, home, nullable = self.resolved(prop, document)
            fields[name] = self.field(name, spec, home, depth,
                                      nullable or name not in required)
        return fields

    def field(self, name: str, spec: dict[str, Any], document: Any, depth: int,
              nullable: bool) -> WriterField:
        self.fields_left -= 1
        kind = _kind(spec)
        fmt = spec.get("format")
        if kind == STR and isinstance(fmt, str) and fmt in _JSON_FORMATS:
            kind = _JSON_FORMATS[fmt]
        items = None
        if kind == LIST and isinstance(spec.get("items"), dict):
            item_kind = _kind(self.resolved(spec["items"], document)[0])
            items = item_kind if item_kind in _JSON_TYPES else None
        nested = (self.properties(spec, document, depth + 1)
                  if kind == OBJECT and spec.get("properties") and depth < FIELDS_DEPTH
                  and self.fields_left > 0 else None)
        symbols = spec.get("enum") if kind == STR else None
        longest = (max(map(len, symbols)) if isinstance(symbols, list) and symbols
                   and all(isinstance(s, str) for s in symbols) else None)
        return WriterField(name, kind, nullable, items=items,
                           max_length=spec.get("maxLength") or longest, fields=nested)

    def effective(self, spec: Any, document: Any) -> tuple[dict[str, Any], Any, bool]:
        """(what ``spec`` says a value is, the document it says it in, whether null is
        allowed): :data:`ANY`'s empty schema when it cannot be told, or when it takes more
        than the steps left (:meth:`resolved`)."""
        nullable = False
        while (steps_left := self.steps_left - 1) >= 0:
            self.steps_left = steps_left
            if not isinstance(spec, dict):
                return {}, document, nullable  # ``true``: any value
            if "$ref" in spec:
                target = self.target(spec["$ref"], document)
                if target is None:
                    return {}, document, nullable
                resolved, document = target
                # the keys beside a ``$ref`` add to what it names (as an ``allOf`` of the
                # two would), their own values first
                spec = _merged({k: v for k, v in spec.items() if k != "$ref"}, resolved)
                continue
            if spec.get("allOf"):
                rest = {k: v for k, v in spec.items() if k != "allOf"}
                # (a part's own ``$ref``s are read from where ``spec`` is: one in another
                # document may then say any value)
                parts = [self.effective(part, document) for part in spec["allOf"]]
                merged = rest
                for part, _, _ in parts:
                    merged = _merged(merged, part)
                # null passes an ``allOf`` that passes it in every part: a part that says
                # so, or says nothing of the type
                nullable = nullable or (
                    any(admits for _, _, admits in parts)
                    and all(admits or _kind(part) == ANY for part, _, admits in parts)
                    and _admits_null(rest))
                spec = merged
                continue
            branches = spec.get("anyOf") or spec.get("oneOf")
            if branches:
                taken = [self.effective(b, document) for b in branches]
                values = [t for t in taken if _kind(t[0]) != "null"]
                nullable = nullable or len(values) < len(taken) or any(t[2] for t in values)
                rest = {k: v for k, v in spec.items() if k not in ("anyOf", "oneOf")}
                kinds = {_kind(t[0]) for t in values}
                if len(values) == 1:
                    spec, document = _merged(rest, values[0][0]), values[0][1]
                    continue
                one = ({**rest, "type": _JSON_TYPES[kinds.pop()]}
                       if len(kinds) == 1 and kinds <= _JSON_TYPES.keys() else {})
                return one, document, nullable
            types = spec.get("type")
            if isinstance(types, list):
                nullable = nullable or "null" in types
                values = [t for t in types if t != "null"]
                spec = {**spec, "type": values[0] if len(values) == 1 else values}
            return spec, document, nullable
        return {}, document, nullable

    def target(self, ref: str, document: Any) -> tuple[Any, Any] | None:
        """The schema a ``$ref`` names, and its document; None when nothing is there."""
        if not isinstance(ref, str):
            return None
        where, _, pointer = ref.partition("#")
        if pointer and not pointer.startswith("/"):
            return None  # an anchor (``#name``): not followed, the field says any value
        if where:
            document = self.documents.get(where)
            if document is None:
                return None
        found = document
        for quoted in (pointer.split("/")[1:] if pointer else ()):
            token = unquote(quoted).replace("~1", "/").replace("~0", "~")
            if isinstance(found, dict) and token in found:
                found = found[token]
            elif isinstance(found, list) and token.isdigit() and int(token) < len(found):
                found = found[int(token)]
            else:
                return None
        return found, document


def _kind(spec: dict[str, Any]) -> str:
    """What values of an :meth:`_Resolver.effective` schema arrive as: ``"null"`` for a
    schema of null alone, :data:`ANY` when it does not say."""
    kind = spec.get("type")
    if kind is None and "properties" in spec:
        kind = "object"
    if kind is None:
        values = spec["enum"] if isinstance(spec.get("enum"), list) else (
            [spec["const"]] if "const" in spec else [])
        kinds = {_VALUE_KINDS.get(type(v), ANY) for v in values}
        return kinds.pop() if len(kinds) == 1 else ANY
    if kind == "null":
        return "null"
    return _JSON.get(kind, ANY) if isinstance(kind, str) else ANY


_VALUE_KINDS = {str: STR, int: INT, float: FLOAT, bool: BOOL, type(None): "null"}


def _merged(spec: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``allOf``'s parts (or a branch and its siblings) as one schema: properties and
    ``required`` joined, any other key the first one's."""
    merged = {**part, **spec}
    if "properties" in spec or "properties" in part:
        merged["properties"] = {**_mapping(part.get("properties")),
                                **_mapping(spec.get("properties"))}
    if "required" in spec or "required" in part:
        merged["required"] = [*_listed(part.get("required")), *_listed(spec.get("required"))]
    return merged


def _admits_null(spec: dict[str, Any]) -> bool:
    """Whether a schema's own ``type`` lets null through (none said: it does)."""
    kind = spec.get("type")
    return kind is None or kind == "null" or (isinstance(kind, list) and "null" in kind)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


__all__ = ["JsonSchemaCodec", "json_schema_fields"]
