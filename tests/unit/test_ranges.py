"""Range planning: pure functions over watermarks and stored offsets; every range half-open."""

from __future__ import annotations

import json

import pytest

from kafka_ingest.config import OnOffsetGap, StartPolicy
from kafka_ingest.errors import IngestError, OffsetGapError, TriggerParamsError
from kafka_ingest.ranges import (
    Gap,
    Mode,
    OffsetRange,
    PartitionState,
    moves_cursor,
    plan_between,
    plan_explicit,
    plan_live,
)

T = "events"


def live(states: list[PartitionState], *, max_records: int = 1000,
         policy: StartPolicy = StartPolicy.EARLIEST,
         on_gap: OnOffsetGap = OnOffsetGap.FAIL) -> tuple[list[OffsetRange], list[Gap]]:
    return plan_live(T, states, max_records=max_records, start_policy=policy, on_gap=on_gap)


def spans(ranges: list[OffsetRange]) -> list[tuple[int, int, int]]:
    return [(r.partition, r.start, r.end) for r in ranges]


# --------------------------------------------------------------------------- plan_live


def test_live_starts_at_the_stored_offsets_in_partition_order() -> None:
    ranges, gaps = live([PartitionState(2, 0, 50, 40), PartitionState(0, 0, 100, 10),
                         PartitionState(1, 5, 30, 30)])
    # partition 1 is caught up (stored == high): no range
    assert spans(ranges) == [(0, 10, 100), (2, 40, 50)]
    assert gaps == []
    assert all(r.mode is Mode.LIVE and r.topic == T for r in ranges)
    assert [r.size for r in ranges] == [90, 10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (StartPolicy.EARLIEST, [(0, 20, 70)]),  # no stored offset: from the low watermark
        (StartPolicy.LATEST, []),  # from the high watermark: nothing to read yet
    ],
)
def test_start_policy_for_a_partition_without_stored_offset(
        policy: StartPolicy, expected: list[tuple[int, int, int]]) -> None:
    ranges, _ = live([PartitionState(0, 20, 70, None)], policy=policy)
    assert spans(ranges) == expected


def test_the_stored_offset_wins_over_the_start_policy() -> None:
    ranges, _ = live([PartitionState(0, 0, 70, 30)], policy=StartPolicy.LATEST)
    assert spans(ranges) == [(0, 30, 70)]


def test_max_records_caps_each_partition() -> None:
    ranges, _ = live([PartitionState(0, 0, 1000, 100), PartitionState(1, 0, 5, 0)],
                     max_records=250)
    assert spans(ranges) == [(0, 100, 350), (1, 0, 5)]


def test_empty_partitions_make_no_range() -> None:
    ranges, gaps = live([PartitionState(0, 0, 0, None), PartitionState(1, 7, 7, 7),
                         PartitionState(2, 9, 9, None)])
    assert ranges == []
    assert gaps == []


def test_gap_with_fail_raises_a_message_that_says_what_was_lost() -> None:
    with pytest.raises(OffsetGapError) as info:
        live([PartitionState(0, 0, 10, 0), PartitionState(3, 120, 200, 100)])
    err = info.value
    assert (err.topic, err.partition, err.start, err.low) == (T, 3, 100, 120)
    message = str(err)
    assert "events[3]" in message
    assert "[100, 120)" in message
    assert "20 messages" in message
    assert "on_offset_gap: skip" in message


def test_gap_with_skip_starts_at_low_and_returns_the_gap() -> None:
    ranges, gaps = live([PartitionState(0, 120, 200, 100), PartitionState(1, 0, 10, 4)],
                        on_gap=OnOffsetGap.SKIP)
    assert spans(ranges) == [(0, 120, 200), (1, 4, 10)]
    assert gaps == [Gap(partition=0, start=100, low=120)]


def test_gap_with_skip_on_a_fully_deleted_partition_still_reports_the_gap() -> None:
    # Retention deleted everything (low == high): no range, but never a silent skip.
    ranges, gaps = live([PartitionState(0, 50, 50, 10)], on_gap=OnOffsetGap.SKIP)
    assert ranges == []
    assert gaps == [Gap(0, 10, 50)]


def test_stored_offset_past_the_high_watermark_raises() -> None:
    with pytest.raises(IngestError, match=r"events\[1\]: stored offset 90 is past the high "
                                          r"watermark 50.*reset-offsets"):
        live([PartitionState(1, 0, 50, 90)])


# --------------------------------------------------------------------------- plan_explicit

MARKS = {0: (0, 100), 1: (50, 80)}


def test_explicit_ranges_are_checked_and_sorted() -> None:
    ranges = plan_explicit(T, {1: (50, 80), 0: (10, 20)}, MARKS)
    assert spans(ranges) == [(0, 10, 20), (1, 50, 80)]
    assert all(r.mode is Mode.BACKFILL and r.from_cursor is False for r in ranges)


def test_explicit_replay_mode_passes_through() -> None:
    [r] = plan_explicit(T, {0: (0, 5)}, MARKS, mode=Mode.REPLAY)
    assert (r.mode, r.from_cursor) == (Mode.REPLAY, False)


def test_explicit_empty_range_makes_no_range() -> None:
    assert plan_explicit(T, {0: (30, 30)}, MARKS) == []


@pytest.mark.parametrize(
    ("requested", "message"),
    [
        # a partition the topic does not have; the message lists the ones it has
        ({7: (0, 1)}, r"partition 7 does not exist in 'events' \(partitions: 0, 1\)"),
        # end before start
        ({0: (20, 10)}, r"partition 0: end 10 is before start 20"),
        # end past the high watermark
        ({0: (10, 101)}, r"partition 0: end 101 is past the high watermark 100"),
        # start below the low watermark (deleted by retention)
        ({1: (40, 60)}, r"partition 1: start 40 is below the low watermark 50"),
        # a negative start is not an offset
        ({0: (-1, 5)}, r"partition 0: start -1 is negative"),
    ],
)
def test_explicit_range_errors_say_what_to_fix(requested: dict[int, tuple[int, int]],
                                               message: str) -> None:
    with pytest.raises(TriggerParamsError, match=message):
        plan_explicit(T, requested, MARKS)


def test_trigger_params_error_is_a_value_error() -> None:
    # Airflow's param validation and the CLI both treat ValueError as "fix your input".
    assert issubclass(TriggerParamsError, ValueError)


# --------------------------------------------------------------------------- plan_between


def test_between_two_offset_maps() -> None:
    ranges = plan_between(T, {2: 40, 0: 10, 1: 30}, {0: 25, 1: 30, 2: 41})
    assert spans(ranges) == [(0, 10, 25), (2, 40, 41)]  # partition 1 is empty
    assert all(r.mode is Mode.BACKFILL and r.from_cursor is False for r in ranges)


def test_between_with_replay_mode() -> None:
    [r] = plan_between(T, {0: 1}, {0: 2}, mode=Mode.REPLAY)
    assert (r.mode, r.from_cursor) == (Mode.REPLAY, False)


# --------------------------------------------------------------------------- OffsetRange


@pytest.mark.parametrize("mode", list(Mode))
def test_offset_range_round_trips_through_a_json_dict(mode: Mode) -> None:
    original = OffsetRange(T, 3, 100, 250, mode, from_cursor=False)
    data = json.loads(json.dumps(original.to_dict()))  # what XCom stores
    assert data["mode"] == str(mode)
    assert OffsetRange.from_dict(data) == original


def test_offset_range_from_dict_defaults_to_live() -> None:
    r = OffsetRange.from_dict({"topic": T, "partition": 0, "start": 1, "end": 3})
    assert (r.mode, r.from_cursor, r.size) == (Mode.LIVE, True, 2)


@pytest.mark.parametrize(("legacy", "from_cursor"), [(True, True), (False, False)])
def test_a_range_planned_by_the_release_before_still_reads(legacy: bool,
                                                           from_cursor: bool) -> None:
    # A run in flight across an upgrade: its mapped tasks get their range from XCom as the
    # release before wrote it, with the flag "advance_cursor" (True only for cursor ranges).
    data = {"topic": T, "partition": 0, "start": 1, "end": 3, "mode": "replay",
            "advance_cursor": legacy}
    assert OffsetRange.from_dict(data) == OffsetRange(T, 0, 1, 3, Mode.REPLAY,
                                                      from_cursor=from_cursor)


# --------------------------------------------------------------------------- moves_cursor


def _cursor_range(mode: Mode) -> OffsetRange:
    [r], _ = plan_live(T, [PartitionState(0, 0, 10, 2)], max_records=100,
                       start_policy=StartPolicy.EARLIEST, on_gap=OnOffsetGap.FAIL, mode=mode)
    return r


def _offsets_window(mode: Mode) -> OffsetRange:
    [r] = plan_explicit(T, {0: (2, 5)}, MARKS, mode=mode)
    return r


def _time_window(mode: Mode) -> OffsetRange:
    [r] = plan_between(T, {0: 2}, {0: 5}, mode=mode)
    return r


@pytest.mark.parametrize(
    ("rng", "dry_run", "filtered", "moves"),
    [
        pytest.param(_cursor_range(Mode.LIVE), False, False, True, id="live ingest"),
        pytest.param(OffsetRange(T, 0, 2, 5), False, False, True, id="a live range by hand"),
        pytest.param(_offsets_window(Mode.BACKFILL), False, False, False,
                     id="backfill by offsets"),
        pytest.param(_time_window(Mode.BACKFILL), False, False, False, id="backfill by times"),
        pytest.param(_cursor_range(Mode.REPLAY), False, False, True,
                     id="replay from the replay cursor"),
        pytest.param(_offsets_window(Mode.REPLAY), False, False, False,
                     id="replay of offsets"),
        pytest.param(_time_window(Mode.REPLAY), False, False, False, id="replay of times"),
        pytest.param(_cursor_range(Mode.REPLAY), False, True, False,
                     id="filtered replay from the cursor"),
        pytest.param(_cursor_range(Mode.REPLAY), True, False, False,
                     id="dry-run replay from the cursor"),
        pytest.param(_cursor_range(Mode.REPLAY), True, True, False,
                     id="dry-run filtered replay"),
        pytest.param(_offsets_window(Mode.REPLAY), True, False, False,
                     id="dry-run replay of offsets"),
    ],
)
def test_which_slices_move_their_cursor(rng: OffsetRange, dry_run: bool, filtered: bool,
                                        moves: bool) -> None:
    # The one place that decides; the planner and the slice engine both ask it (their own
    # tables: test_planning_and_the_engine_ask_the_same_rule, test_slices).
    assert moves_cursor(from_cursor=bool(rng.from_cursor), dry_run=dry_run,
                        filtered=filtered) is moves
