"""The Kafka Connect schema a registry writer schema stands for, as JsonConverter writes it.

A change-event topic written through a registry format (Kafka Connect's Avro converter,
Apicurio's or Confluent's, in front of Debezium) carries no Connect schema in its messages:
the registry holds an Avro schema that the converter made from the Connect schema, keeping
what Avro has no word for in the schema's own properties (``connect.name``,
``connect.parameters``, ``connect.type``, as Connect's ``AvroData`` writes them). Read back
into the Connect schema's JSON form (``{"type": "struct", "fields": [{"field": ...,
"type": ..., "optional": ..., "name": ..., "parameters": ...}]}``), one reading of the
change events serves every encoding: the row reader, the drift check and the declaration
of :mod:`~kafka_ingest.decode.envelopes` take that form only.

What the codec already decoded is marked: a field whose Avro type has a logical type
(``decimal``, ``date``, ``time-millis``, ``timestamp-millis``, and the others fastavro
decodes: ``uuid``, ``time-micros``, ``timestamp-micros``, ``local-timestamp-*``) arrives
typed from :mod:`~kafka_ingest.decode.codecs.avro` (a ``Decimal``, a ``date``, ...), and
carries ``"typed": true`` so that the row reader leaves it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Avro's primitive types -> Connect's (``connect.type`` says which of Connect's smaller
#: integer types an ``int`` was).
_PRIMITIVES = {"int": "int32", "long": "int64", "float": "float", "double": "double",
               "boolean": "boolean", "string": "string", "bytes": "bytes"}
#: Avro's logical types -> the Connect logical type the converter wrote them for.
_LOGICAL = {"decimal": "org.apache.kafka.connect.data.Decimal",
            "date": "org.apache.kafka.connect.data.Date",
            "time-millis": "org.apache.kafka.connect.data.Time",
            "timestamp-millis": "org.apache.kafka.connect.data.Timestamp",
            # the logical types Connect has none for, which the codec decodes too: named
            # by the Debezium type whose column takes the value the codec makes (a UUID, a
            # time, an aware or a zone-less datetime)
            "uuid": "io.debezium.data.Uuid",
            "time-micros": "io.debezium.time.MicroTime",
            "timestamp-micros": "io.debezium.time.ZonedTimestamp",
            "local-timestamp-millis": "io.debezium.time.Timestamp",
            "local-timestamp-micros": "io.debezium.time.MicroTimestamp"}
#: How deep records may nest (an envelope is two levels: the envelope, its row).
_MAX_DEPTH = 16


class _Names:
    """The named types (records, enums, fixed) of one Avro schema, by full name."""

    def __init__(self) -> None:
        self.types: dict[str, dict[str, Any]] = {}

    def define(self, t: dict[str, Any], namespace: str) -> str:
        name = str(t.get("name", ""))
        space = str(t.get("namespace", namespace) or "")
        full = name if "." in name or not space else f"{space}.{name}"
        self.types[full] = t
        return full.rpartition(".")[0]

    def find(self, name: str, namespace: str) -> dict[str, Any]:
        for full in (name, f"{namespace}.{name}" if namespace else name):
            if full in self.types:
                return self.types[full]
        raise ValueError(f"the Avro schema names type {name!r} before defining it")


def from_avro(schema: Any, references: Sequence[Any] = ()) -> dict[str, Any]:
    """The Connect schema (JsonConverter's JSON form) of the Avro schema ``schema`` (parsed
    JSON) that a Connect converter wrote; ``references``: the parsed schemas whose named
    types it may use by name (a registry's references, each after those it uses).
    :class:`ValueError` for what is no Avro schema."""
    names = _Names()
    for referenced in references:
        _connect(referenced, names, "", 0)
    return _connect(schema, names, "", 0)


def _connect(t: Any, names: _Names, namespace: str, depth: int) -> dict[str, Any]:
    if depth > _MAX_DEPTH:
        raise ValueError(f"the Avro schema nests deeper than {_MAX_DEPTH} levels")
    if isinstance(t, list):  # a union: Connect writes an optional field as [null, type]
        branches = [b for b in t if b != "null"]
        if len(branches) != 1:
            return {"type": "union", "optional": "null" in t}
        return {**_connect(branches[0], names, namespace, depth), "optional": "null" in t}
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return {"type": _PRIMITIVES[t], "optional": False}
        if t == "null":
            return {"type": "null", "optional": True}
        return _connect(names.find(t, namespace), names, namespace, depth + 1)
    if not isinstance(t, dict) or "type" not in t:
        raise ValueError(f"not an Avro type: {t!r}")
    return {**_of_kind(t, names, namespace, depth), **_properties(t), "optional": False}


def _of_kind(t: dict[str, Any], names: _Names, namespace: str, depth: int) -> dict[str, Any]:
    """The Connect type of the Avro type ``t`` (a JSON object), without its properties."""
    kind = t["type"]
    if kind == "record":
        inner = names.define(t, namespace)
        return {"type": "struct", "fields": [
            {**_connect(f.get("type"), names, inner, depth + 1), "field": f.get("name")}
            for f in t.get("fields") or () if isinstance(f, dict)]}
    if kind in ("enum", "fixed"):
        names.define(t, namespace)
        return {"type": "string" if kind == "enum" else "bytes"}
    if kind == "array":
        return {"type": "array", "items": _connect(t.get("items"), names, namespace, depth + 1)}
    if kind == "map":
        return {"type": "map", "keys": {"type": "string", "optional": False},
                "values": _connect(t.get("values"), names, namespace, depth + 1)}
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return {"type": t.get("connect.type") or _PRIMITIVES[kind]}
    return _connect(kind, names, namespace, depth + 1)  # {"type": {...}}: written in place


def _properties(t: dict[str, Any]) -> dict[str, Any]:
    """The Connect name and parameters the Avro type ``t`` keeps, and whether the codec
    decodes its values already (an Avro logical type)."""
    out: dict[str, Any] = {}
    logical = t.get("logicalType")
    name = t.get("connect.name") or _LOGICAL.get(logical or "")
    if name:
        out["name"] = name
    parameters = dict(t.get("connect.parameters") or {})
    if logical == "decimal":
        parameters.setdefault("scale", str(t.get("scale", 0)))
        if "precision" in t:
            parameters.setdefault("connect.decimal.precision", str(t["precision"]))
    if parameters:
        out["parameters"] = parameters
    if logical in _LOGICAL:
        out["typed"] = True
    return out


__all__ = ["from_avro"]
