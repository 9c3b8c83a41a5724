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
    """What a range is read for (kept in pinned plans and audit rows): ``live`` ingest from
    the stored cursor, a ``backfill`` window of the source topic, a ``replay`` of the DLQ
    topic (from the replay cursor, or a window). Whether a slice moves its cursor is
    :func:`moves_cursor`'s to say."""

    LIVE = "live"
    BACKFILL = "backfill"
    REPLAY = "replay"


def moves_cursor(*, from_cursor: bool, dry_run: bool, filtered: bool) -> bool:
    """Whether a slice moves its stored cursor (and, after it, the consumer group's offset
    for lag tools): the one place this is decided, for the planner and the slice engine.

    ==================================  ===========  =======  ========  =====
    run                                 from cursor  dry run  filtered  moves
    ==================================  ===========  =======  ========  =====
    live ingest                         yes          no       no        yes
    backfill (offsets or times)         no           no       no        no
    replay from the replay cursor       yes          no       no        yes
    replay of a window (offsets/times)  no           no       no        no
    replay with filters                 yes          no       yes       no
    any dry run                         either       yes      either    no
    ==================================  ===========  =======  ========  =====

    Only a range planned from the cursor may move it (a window is read beside the cursor,
    and moving it there would skip or re-read what lies between); a dry run commits
    nothing; a filtered replay acts on some letters only, so moving the cursor past the
    others would skip them for good. A slice that moves its cursor owns it for the slice
    (its advisory lock) and resumes from it; one that does not takes no lock.
    """
    return from_cursor and not dry_run and not filtered


@dataclass(frozen=True)
class OffsetRange:
    """One partition's slice of one run. Travels through XCom as a dict."""

    topic: str
    partition: int
    start: int
    end: int
    mode: Mode = Mode.LIVE
    #: Planned from the stored cursor (a live run, a replay from the replay cursor), not
    #: from a window of offsets or times: see :func:`moves_cursor`. Unset: a live range is.
    from_cursor: bool | None = None

    def __post_init__(self) -> None:
        if self.from_cursor is None:
            object.__setattr__(self, "from_cursor", self.mode is Mode.LIVE)

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mode": str(self.mode)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffsetRange:
        fields = {k: v for k, v in data.items() if k != _LEGACY_CURSOR_KEY}
        if "from_cursor" not in fields and data.get(_LEGACY_CURSOR_KEY) is not None:
            # a range planned before this release (XCom of a run in flight): its flag said
            # "moves the cursor", which only a range from the cursor ever did
            fields["from_cursor"] = bool(data[_LEGACY_CURSOR_KEY])
        return cls(**{**fields, "mode": Mode(data.get("mode", "live"))})


#: The key older releases gave a range's cursor flag in its dict.
_LEGACY_CURSOR_KEY = "advance_cursor"


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
    """Ranges from the stored cursor (or the start policy) to the high watermark.

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
            ranges.append(OffsetRange(topic, s.partition, start, end, mode, from_cursor=True))
    return ranges, gaps


def plan_explicit(topic: str, requested: Mapping[int, tuple[int, int]],
                  marks: Mapping[int, tuple[int, int]], *,
                  mode: Mode = Mode.BACKFILL) -> list[OffsetRange]:
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
            ranges.append(OffsetRange(topic, partition, start, end, mode, from_cursor=False))
    return ranges


def plan_between(topic: str, starts: Mapping[int, int], ends: Mapping[int, int], *,
                 mode: Mode = Mode.BACKFILL) -> list[OffsetRange]:
    """Ranges between two offset maps (e.g. from ``offsets_for_times`` at t0 and t1)."""
    return [
        OffsetRange(topic, p, starts[p], ends[p], mode, from_cursor=False)
        for p in sorted(starts)
        if ends[p] > starts[p]
    ]
