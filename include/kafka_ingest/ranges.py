"""Planning bounded offset ranges: from the stored cursor, explicit offsets, or a time window.

Pure functions over watermarks and stored offsets; the I/O that feeds them lives in
:mod:`kafka_ingest.engine.planning`. Every range is half-open, ``[start, end)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from kafka_ingest.config import OnOffsetGap, StartPolicy
from kafka_ingest.errors import OffsetGapError, OffsetOutOfRange, TriggerParamsError


class Mode(StrEnum):
    """``live`` moves the stored offset; ``backfill`` and ``replay`` ranges never do
    (a replay from its own cursor moves the replay cursor, not the ingest one)."""

    LIVE = "live"
    BACKFILL = "backfill"
    REPLAY = "replay"


@dataclass(frozen=True)
class OffsetRange:
    """One partition's slice of one run. Travels through XCom as a dict."""

    topic: str
    partition: int
    start: int
    end: int
    mode: Mode = Mode.LIVE
    #: Whether this slice moves its stored cursor (and so the consumer group's offset):
    #: live slices do, backfills never, replays from the replay cursor do. Unset: live.
    advance_cursor: bool | None = None

    def __post_init__(self) -> None:
        if self.advance_cursor is None:
            object.__setattr__(self, "advance_cursor", self.mode is Mode.LIVE)

    @property
    def moves_cursor(self) -> bool:
        return bool(self.advance_cursor)

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mode": str(self.mode)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffsetRange:
        return cls(**{**data, "mode": Mode(data.get("mode", "live"))})


@dataclass(frozen=True)
class PartitionState:
    partition: int
    low: int
    high: int
    stored: int | None


@dataclass(frozen=True)
class Gap:
    """Offsets ``[start, low)`` that retention deleted before they were read."""

    partition: int
    start: int
    low: int


def start_offset(state: PartitionState, policy: StartPolicy) -> int:
    if state.stored is not None:
        return state.stored
    return state.low if policy is StartPolicy.EARLIEST else state.high


def plan_live(topic: str, states: list[PartitionState], *, max_records: int,
              start_policy: StartPolicy, on_gap: OnOffsetGap,
              mode: Mode = Mode.LIVE) -> tuple[list[OffsetRange], list[Gap]]:
    """Ranges from the stored cursor (or the start policy) to the high watermark; each
    one moves the cursor.

    A start below the low watermark follows ``on_gap``: ``fail`` raises
    :class:`OffsetGapError`, ``skip`` starts at the low watermark and returns the gap so
    the caller records it. Never silently. Empty ranges are left out.
    """
    ranges: list[OffsetRange] = []
    gaps: list[Gap] = []
    for s in sorted(states, key=lambda s: s.partition):
        start = start_offset(s, start_policy)
        if start < s.low:
            if on_gap is OnOffsetGap.FAIL:
                raise OffsetGapError(topic, s.partition, start, s.low)
            gaps.append(Gap(s.partition, start, s.low))
            start = s.low
        if start > s.high:
            raise OffsetOutOfRange(f"{topic}[{s.partition}]", f"stored offset {start} is past "
                                   f"the high watermark {s.high}")
        end = min(s.high, start + max_records)
        if end > start:
            ranges.append(OffsetRange(topic, s.partition, start, end, mode, True))
    return ranges, gaps


def plan_explicit(topic: str, requested: Mapping[int, tuple[int, int]],
                  marks: Mapping[int, tuple[int, int]], *, mode: Mode = Mode.BACKFILL,
                  advance_cursor: bool = False) -> list[OffsetRange]:
    """Ranges given by hand ``{partition: (start, end)}``, checked against the topic."""
    ranges = []
    for partition, (start, end) in sorted(requested.items()):
        if partition not in marks:
            raise TriggerParamsError(
                f"partition {partition} does not exist in {topic!r} "
                f"(partitions: {', '.join(map(str, sorted(marks)))})"
            )
        low, high = marks[partition]
        if start < 0:
            raise TriggerParamsError(f"partition {partition}: start {start} is negative; "
                                     "offsets start at 0")
        if end < start:
            raise TriggerParamsError(
                f"partition {partition}: end {end} is before start {start}; give [start, end) "
                "with start <= end"
            )
        if end > high:
            raise TriggerParamsError(
                f"partition {partition}: end {end} is past the high watermark {high}"
            )
        if start < low:
            raise TriggerParamsError(
                f"partition {partition}: start {start} is below the low watermark {low} "
                "(deleted by retention); start at or above it"
            )
        if end > start:
            ranges.append(OffsetRange(topic, partition, start, end, mode, advance_cursor))
    return ranges


def plan_between(topic: str, starts: Mapping[int, int], ends: Mapping[int, int], *,
                 mode: Mode = Mode.BACKFILL, advance_cursor: bool = False) -> list[OffsetRange]:
    """Ranges between two offset maps (e.g. from ``offsets_for_times`` at t0 and t1)."""
    return [
        OffsetRange(topic, p, starts[p], ends[p], mode, advance_cursor)
        for p in sorted(starts)
        if ends[p] > starts[p]
    ]
