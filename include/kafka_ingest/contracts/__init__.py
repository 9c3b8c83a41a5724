"""Event contracts and their registry.

A contract is written in Python (a module of its family, registered below) or declared in
the pipelines file (:mod:`~kafka_ingest.contracts.declared`); either way it is a
:class:`Contract` subclass. Keys are ``<event_type>.v<version>``; pipelines name one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import AliasPath

from kafka_ingest.contracts.base import Contract, EventContract
from kafka_ingest.contracts.orders import OrderCreatedV1
from kafka_ingest.contracts.telemetry import MetricEventV1, MetricEventV2

REGISTRY: dict[str, type[Contract]] = {
    model.key(): model for model in (MetricEventV1, MetricEventV2, OrderCreatedV1)
}


def get_contract(event_type: str, version: int,
                 declared: Mapping[str, type[Contract]] | None = None) -> type[Contract]:
    """The contract model for ``event_type`` at ``version``, written in Python or among
    ``declared`` (a pipelines file's); ``ValueError`` if unknown."""
    key = f"{event_type}.v{version}"
    found = REGISTRY.get(key) or (declared or {}).get(key)
    if found is None:
        known = ", ".join(sorted({*REGISTRY, *(declared or {})}))
        raise ValueError(f"unknown contract {key!r}; registered: {known}")
    return found


def json_schema(event_type: str, version: int,
                declared: Mapping[str, type[Contract]] | None = None) -> dict[str, Any]:
    """The JSON Schema of one contract (for producers, docs and schema registries)."""
    model = get_contract(event_type, version, declared)
    schema = model.model_json_schema(mode="validation")
    _nest_paths(schema, model)
    schema["$id"] = f"urn:kafka-ingest:contract:{model.key()}"
    return schema


def _nest_paths(schema: dict[str, Any], model: type[Contract]) -> None:
    """A field read through a path (``validation_alias=AliasPath("address", "city")``: a
    declared ``record``'s column) moved to where the payload holds it: pydantic lists it
    under its column's name, which no producer writes."""
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        if not isinstance(alias, AliasPath) or name not in schema.get("properties", {}):
            continue
        *parents, last = [str(part) for part in alias.path]
        prop = schema["properties"].pop(name)
        prop.pop("title", None)
        required = name in schema.get("required", ())
        if required:
            schema["required"].remove(name)
        node = schema
        for part in parents:
            if required and part not in node.setdefault("required", []):
                node["required"].append(part)
            node = node.setdefault("properties", {}).setdefault(
                part, {"type": "object", "properties": {}})
        node.setdefault("properties", {})[last] = prop
        if required:
            node.setdefault("required", []).append(last)


__all__ = [
    "REGISTRY",
    "Contract",
    "EventContract",
    "MetricEventV1",
    "MetricEventV2",
    "OrderCreatedV1",
    "get_contract",
    "json_schema",
]
