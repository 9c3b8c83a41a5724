"""JSON Schema: the payload after the wire header is JSON, validated as a JSON pipeline's
value is (the contract parses it); the schema's properties are its fields."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, ClassVar

from kafka_ingest.config import Format
from kafka_ingest.decode.codecs.base import (
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
    from kafka_ingest.kafka.registry import WriterSchema


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
        return [json_schema_fields(schema.text)]


def _as_it_is(value: bytes, start: int = 0, /) -> bytes:
    return value[start:]


_JSON = {"string": STR, "integer": INT, "number": FLOAT, "boolean": BOOL, "object": OBJECT,
         "array": LIST}
_JSON_FORMATS = {"date-time": DATETIME, "date": DATE, "uuid": UUID_}


def json_schema_fields(text: str) -> Fields:
    """The properties of an object schema (a property not ``required`` may be missing)."""
    return _properties(json.loads(text), 0)


def _properties(schema: dict[str, Any], depth: int) -> Fields:
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
        nested = (_properties(prop, depth + 1) if kind == OBJECT and prop.get("properties")
                  and depth < FIELDS_DEPTH else None)
        fields[name] = WriterField(name, kind, nullable, items=items,
                                   max_length=prop.get("maxLength"), fields=nested)
    return fields


__all__ = ["JsonSchemaCodec", "json_schema_fields"]
