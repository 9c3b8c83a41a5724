"""What a run reads, typed: from the stored cursor (:class:`LiveRun`), by offsets
(:class:`OffsetWindow`) or by time (:class:`TimeWindow`); a replay's filters and dry run
(:class:`ReplayRequest`); and the key a run's plan is pinned under (:func:`request_key`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
)

from kafka_ingest.errors import TriggerParamsError
from kafka_ingest.kafka.dlq import DeadLetter


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LiveRun(_Request):
    """Read from the stored cursor to the high watermark (capped per partition)."""

    kind: Literal["live"] = "live"


class OffsetWindow(_Request):
    """Read exactly these offsets, ``{partition: (start, end)}``, half-open."""

    kind: Literal["offsets"] = "offsets"
    partitions: dict[int, tuple[int, int]]


class TimeWindow(_Request):
    """Read what was written in ``[from_ms, to_ms)``, mapped to offsets per partition."""

    kind: Literal["time"] = "time"
    from_ms: int
    to_ms: int

    @classmethod
    def between(cls, start: datetime, end: datetime, *, now: datetime) -> TimeWindow:
        """A window checked: aware, ordered, already ended."""
        if start.tzinfo is None or end.tzinfo is None:
            raise TriggerParamsError("from and to need a UTC offset, e.g. 2026-01-01T00:00:00Z")
        if end <= start:
            raise TriggerParamsError(f"'to' ({end.isoformat()}) must be after 'from' "
                                     f"({start.isoformat()})")
        if end > now:
            raise TriggerParamsError(f"'to' ({end.isoformat()}) is in the future; the window "
                                     "must have ended")
        return cls(from_ms=int(start.timestamp() * 1000), to_ms=int(end.timestamp() * 1000))


RangeRequest = LiveRun | OffsetWindow | TimeWindow


def request_key(request: RangeRequest, **extra: Any) -> str:
    """A stable name for a plan request: ``live`` or canonical JSON of what was asked.

    Plans are pinned per (run, request): a retry of the same request finishes the same
    slice, while the same run id asked for something else (Airflow's backfill re-running
    a cleared scheduled run) plans anew. ``extra`` (a replay's ``dry_run``) is part of it.
    """
    body: dict[str, Any] = {}
    if isinstance(request, OffsetWindow):
        body["partitions"] = {str(p): list(v) for p, v in sorted(request.partitions.items())}
    elif isinstance(request, TimeWindow):
        body.update(from_ms=request.from_ms, to_ms=request.to_ms)
    body.update(extra)
    if not body:
        return "live"
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class ReplayFilters:
    """Which dead letters a replay considers; the others are counted ``filtered_out``."""

    error_classes: frozenset[str] = frozenset()
    source_partition: int | None = None
    event_id: str | None = None

    @property
    def active(self) -> bool:
        return bool(self.error_classes or self.source_partition is not None
                    or self.event_id is not None)

    def matches(self, letter: DeadLetter) -> bool:
        if self.error_classes and letter.error_class not in self.error_classes:
            return False
        if self.source_partition is not None and letter.source_partition != self.source_partition:
            return False
        return self.event_id is None or _event_id_of(letter.value) == self.event_id

    def to_dict(self) -> dict[str, Any]:
        return {"error_classes": sorted(self.error_classes),
                "source_partition": self.source_partition, "event_id": self.event_id}


def _event_id_of(value: bytes | None) -> str | None:
    """A JSON peek at ``event_id``; anything unparseable has none (matches no filter)."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return None
    found = doc.get("event_id") if isinstance(doc, dict) else None
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class ReplayRequest:
    """A DLQ replay: which DLQ range, whether it writes, which dead letters."""

    range: RangeRequest
    dry_run: bool = False
    filters: ReplayFilters = ReplayFilters()

    @property
    def key(self) -> str:
        return request_key(self.range, dry_run=self.dry_run)


__all__ = ["LiveRun", "OffsetWindow", "RangeRequest", "ReplayFilters", "ReplayRequest",
           "TimeWindow", "request_key"]
