"""Telemetry metrics from devices (topic ``telemetry-metrics``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field

from kafka_ingest.contracts.base import EPOCH_END, EventContract, short_text
from kafka_ingest.contracts.columns import seconds_to_pg


class MetricEventV1(EventContract):
    """One metric reading of one device.

    ``timestamp`` is seconds since the epoch (a float); it is stored as ``timestamptz``,
    converted before it travels (``CONVERTED``).
    """

    EVENT_TYPE: ClassVar[str] = "metric_event"
    VERSION: ClassVar[int] = 1
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("event_id", "text"),
        ("device_id", "text"),
        ("timestamp", "timestamptz"),
        ("metric_value", "float8"),
        ("status", "text"),
    )
    CONVERTED: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        "timestamp": ("float8", seconds_to_pg)}

    version: int = Field(default=1, ge=1, le=1)
    device_id: short_text(128)  # type: ignore[valid-type]
    timestamp: float = Field(ge=0, lt=EPOCH_END)
    metric_value: float
    status: short_text(32) = "OK"  # type: ignore[valid-type]



class MetricEventV2(MetricEventV1):
    """Version 2 adds the optional ``unit`` of the reading (e.g. ``"celsius"``)."""

    VERSION: ClassVar[int] = 2
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (
        *MetricEventV1.SINK_COLUMNS,
        ("unit", "text"),
    )

    version: int = Field(default=1, ge=1, le=2)
    unit: short_text(32) | None = None  # type: ignore[valid-type]
