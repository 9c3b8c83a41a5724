"""Event contracts and their registry.

Adding a contract: write the model in a module of its family, register it below, add a
migration for its table. Keys are ``<event_type>.v<version>``; pipelines name one.
"""

from __future__ import annotations

from typing import Any

from kafka_ingest.contracts.base import Contract
from kafka_ingest.contracts.orders import OrderCreatedV1
from kafka_ingest.contracts.telemetry import MetricEventV1, MetricEventV2

REGISTRY: dict[str, type[Contract]] = {
    model.key(): model for model in (MetricEventV1, MetricEventV2, OrderCreatedV1)
}


def get_contract(event_type: str, version: int) -> type[Contract]:
    """The contract model for ``event_type`` at ``version``; ``ValueError`` if unknown."""
    key = f"{event_type}.v{version}"
    try:
        return REGISTRY[key]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ValueError(f"unknown contract {key!r}; registered: {known}") from None


def json_schema(event_type: str, version: int) -> dict[str, Any]:
    """The JSON Schema of one contract (for producers, docs and schema registries)."""
    model = get_contract(event_type, version)
    schema = model.model_json_schema(mode="validation")
    schema["$id"] = f"urn:kafka-ingest:contract:{model.key()}"
    return schema


__all__ = [
    "REGISTRY",
    "Contract",
    "MetricEventV1",
    "MetricEventV2",
    "OrderCreatedV1",
    "get_contract",
    "json_schema",
]
