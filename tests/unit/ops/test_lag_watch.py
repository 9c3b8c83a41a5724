"""The lag trigger's decision (``LagWatch``) with the clock passed in: when an ``on_data``
pipeline starts a run, and why it stays quiet while the run it caused is in flight.

Rows are shaped like :func:`kafka_ingest.ops.status.lag`'s; every expected fire is
written out (time, reason, total, partitions, waited), never recomputed from the rows.
"""

from __future__ import annotations

import json
from typing import Any

from kafka_ingest.config import OnData
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.watch import Fire, LagWatch

#: Fire at 100 waiting messages, or after 30 s of any lag; re-arm after 600 s regardless.
SETTINGS = OnData(min_batch=100, max_wait_seconds=30, poll_seconds=2, rearm_seconds=600)


def row(partition: int, lag: int, stored: int | None = 1000) -> LagRow:
    """One partition's row (high = stored + lag)."""
    base = stored if stored is not None else 0
    return LagRow(pipeline="p1", topic="t-in", partition=partition, stored_offset=stored,
                  group_offset=stored, low=0, high=base + lag)


Reading = tuple[float, list[LagRow]]


def play(watch: LagWatch, readings: list[Reading]) -> list[tuple[float, Fire]]:
    """Each reading in turn; the fires, with when they happened."""
    fires = []
    for now, rows in readings:
        fire = watch.observe(now, rows)
        if fire is not None:
            fires.append((now, fire))
    return fires


def fired(watch: LagWatch, now: float, rows: list[dict[str, Any]]) -> Fire:
    fire = watch.observe(now, rows)
    assert fire is not None, (now, rows)
    return fire


# --------------------------------------------------------------------------- armed


def test_no_fire_while_there_is_no_lag() -> None:
    watch = LagWatch(SETTINGS)
    # hours of readings without lag (and one partition ahead of its high watermark)
    readings = [(float(t), [row(0, 0), row(1, 0), row(2, -3)]) for t in range(0, 7200, 2)]
    assert play(watch, readings) == []
    assert watch.armed and watch.lag_since is None


def test_fires_min_batch_as_soon_as_the_total_reaches_it() -> None:
    watch = LagWatch(SETTINGS)
    assert watch.observe(0.0, [row(0, 60), row(1, 39)]) is None  # 99: one short
    assert watch.observe(2.0, [row(0, 60), row(1, 40)]) == Fire(
        "min_batch", 100, {0: 60, 1: 40}, 2.0)
    assert not watch.armed


def test_a_first_reading_at_min_batch_fires_at_once_having_waited_nothing() -> None:
    watch = LagWatch(SETTINGS)
    assert watch.observe(50.0, [row(0, 0), row(1, 250)]) == Fire("min_batch", 250, {1: 250}, 0.0)


def test_negative_lag_is_ignored_not_subtracted() -> None:
    """A stored offset past the high watermark (a recreated topic) gives a negative lag: it
    neither offsets the others' lag nor appears among the lagging partitions."""
    watch = LagWatch(SETTINGS)
    # summed with the -500, the total would be -400 and nothing would fire
    fire = fired(watch, 0.0, [row(0, 60), row(1, 40), row(2, -500), row(3, 0)])
    assert (fire.reason, fire.total_lag, dict(fire.partitions)) == ("min_batch", 100,
                                                                  {0: 60, 1: 40})


def test_only_negative_lag_is_no_lag() -> None:
    watch = LagWatch(SETTINGS)
    assert play(watch, [(float(t), [row(0, -5)]) for t in range(0, 120, 2)]) == []
    assert watch.lag_since is None


def test_fires_max_wait_once_the_lag_stayed_for_max_wait_from_its_first_reading() -> None:
    watch = LagWatch(SETTINGS)
    readings: list[Reading] = [
        (0.0, [row(0, 0)]),
        (10.0, [row(0, 5)]),    # first seen: the wait counts from here, not from 0
        (20.0, [row(0, 7)]),
        (39.9, [row(0, 9)]),    # 29.9 s: not yet
        (40.0, [row(0, 9)]),    # 30 s
    ]
    assert play(watch, readings) == [(40.0, Fire("max_wait", 9, {0: 9}, 30.0))]


def test_the_wait_restarts_after_the_lag_went_back_to_zero() -> None:
    watch = LagWatch(SETTINGS)
    readings: list[Reading] = [
        (0.0, [row(0, 5)]),
        (20.0, [row(0, 0), row(1, 0)]),  # caught up (a safety run): the wait is over
        (25.0, [row(1, 3)]),             # new lag: counts from 25
        (50.0, [row(1, 4)]),             # 50 s after the first lag, 25 s after this one
        (54.9, [row(1, 4)]),
        (55.0, [row(1, 4)]),
    ]
    assert play(watch, readings) == [(55.0, Fire("max_wait", 4, {1: 4}, 30.0))]


# --------------------------------------------------------------------------- fired


def test_quiet_after_firing_while_the_stored_offsets_stand_still() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100, stored=1000)])
    # the run has not committed yet: the lag grows, past min_batch many times over
    readings = [(float(t), [row(0, 100 + 1000 * t, stored=1000)]) for t in range(2, 600, 2)]
    assert play(watch, readings) == []
    assert not watch.armed


def test_rearms_when_every_partition_that_lagged_has_moved() -> None:
    watch = LagWatch(SETTINGS)
    # p0 stored 1000, p1 never stored (None), p2 not lagging: not waited for
    fired(watch, 0.0, [row(0, 80, stored=1000), row(1, 20, stored=None), row(2, 0, stored=7)])
    assert watch.observe(5.0, [row(0, 0, stored=1080), row(1, 0, stored=20),
                               row(2, 0, stored=7)]) is None  # moved, nothing new
    assert watch.armed and watch.lag_since is None


def test_none_to_a_value_is_a_move_and_a_value_to_none_is_not() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 150, stored=None)])
    assert watch.observe(2.0, [row(0, 150, stored=None)]) is None
    assert not watch.armed  # still None: not moved
    watch.observe(4.0, [row(0, 0, stored=150)])
    assert watch.armed

    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 150, stored=1000)])
    watch.observe(2.0, [row(0, 1150, stored=None)])  # the stored offset deleted: no run did it
    assert not watch.armed


def test_not_rearmed_while_only_some_lagging_partitions_moved() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 60, stored=1000), row(1, 40, stored=None), row(2, 30, stored=500)])
    readings: list[Reading] = [
        # the run's slices commit one by one; the lag is over min_batch all the while
        (4.0, [row(0, 500, stored=1060), row(1, 500, stored=None), row(2, 500, stored=500)]),
        (6.0, [row(0, 500, stored=1060), row(1, 500, stored=40), row(2, 500, stored=500)]),
        # a partition missing from the reading has not moved either
        (8.0, [row(0, 500, stored=1060), row(1, 500, stored=40)]),
    ]
    assert play(watch, readings) == []
    assert not watch.armed
    # the last slice commits: armed, and the lag waiting since fires the follow-up
    assert watch.observe(10.0, [row(0, 500, stored=1060), row(1, 500, stored=40),
                                row(2, 500, stored=530)]) == Fire(
        "min_batch", 1500, {0: 500, 1: 500, 2: 500}, 0.0)


def test_a_lag_at_min_batch_when_rearmed_fires_exactly_one_follow_up() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100, stored=1000)])
    readings: list[Reading] = [
        (30.0, [row(0, 120, stored=1100)]),  # the run moved it; 120 more came meanwhile
        (32.0, [row(0, 130, stored=1100)]),  # the follow-up has not committed yet
        (34.0, [row(0, 140, stored=1100)]),
    ]
    assert play(watch, readings) == [(30.0, Fire("min_batch", 120, {0: 120}, 0.0))]


def test_a_lag_below_min_batch_when_rearmed_waits_max_wait_again() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100, stored=1000)])
    readings: list[Reading] = [
        (40.0, [row(0, 7, stored=1100)]),  # re-armed with 7 waiting: the wait starts here
        (69.9, [row(0, 7, stored=1100)]),
        (70.0, [row(0, 8, stored=1100)]),
    ]
    assert play(watch, readings) == [(70.0, Fire("max_wait", 8, {0: 8}, 30.0))]


def test_rearms_after_rearm_seconds_without_a_move_and_fires_if_the_lag_is_still_there(
) -> None:
    """A failed run or a paused DAG moves nothing: the lag is not forgotten."""
    watch = LagWatch(SETTINGS)
    fired(watch, 100.0, [row(0, 150, stored=1000)])
    readings: list[Reading] = [
        (699.9, [row(0, 150, stored=1000)]),  # 599.9 s after the fire: still quiet
        (700.0, [row(0, 150, stored=1000)]),  # 600 s: armed, and 150 >= min_batch
        (702.0, [row(0, 150, stored=1000)]),  # fired again: quiet again
    ]
    assert play(watch, readings) == [(700.0, Fire("min_batch", 150, {0: 150}, 600.0))]
    assert not watch.armed


def test_after_rearm_seconds_a_lag_still_there_fires_at_once_and_no_lag_stays_armed() -> None:
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100, stored=1000)])
    assert watch.observe(600.0, [row(0, 0, stored=1000)]) is None  # caught up another way
    assert watch.armed

    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100, stored=1000)])
    readings: list[Reading] = [(599.9, [row(0, 9, stored=1000)]),
                               (600.0, [row(0, 9, stored=1000)]),
                               (630.0, [row(0, 9, stored=1000)])]
    # below min_batch, but it has waited since the fire at 0: max_wait is long past
    assert play(watch, readings) == [(600.0, Fire("max_wait", 9, {0: 9}, 600.0))]


def test_a_burst_during_a_run_starts_one_follow_up_and_then_waits_for_its_move() -> None:
    watch = LagWatch(SETTINGS)
    # a burst: 150 waiting on p0, 50 on p1
    burst = [(0.0, [row(0, 150, stored=1000), row(1, 50, stored=2000)])]
    # the run reads [1000, 1150) and [2000, 2050) while 3 more per second arrive on each
    during_run = [(float(t), [row(0, 150 + 3 * t, stored=1000), row(1, 50 + 3 * t, stored=2000)])
                  for t in range(2, 21, 2)]
    # it commits: 66 new wait on each partition, 132 together: one follow-up
    committed = [(22.0, [row(0, 66, stored=1150), row(1, 66, stored=2050)])]
    # the follow-up runs; more arrives; nothing moves yet
    during_follow_up = [(float(t), [row(0, 66 + 3 * (t - 22), stored=1150),
                                    row(1, 66 + 3 * (t - 22), stored=2050)])
                        for t in range(24, 41, 2)]
    # it commits what it planned; 10 remain: armed, but under min_batch
    caught_up = [(42.0, [row(0, 5, stored=1216), row(1, 5, stored=2116)]),
                 (71.9, [row(0, 5, stored=1216), row(1, 5, stored=2116)]),
                 (72.0, [row(0, 5, stored=1216), row(1, 5, stored=2116)])]
    fires = play(watch, burst + during_run + committed + during_follow_up + caught_up)
    assert fires == [
        (0.0, Fire("min_batch", 200, {0: 150, 1: 50}, 0.0)),
        (22.0, Fire("min_batch", 132, {0: 66, 1: 66}, 0.0)),
        (72.0, Fire("max_wait", 10, {0: 5, 1: 5}, 30.0)),
    ]


# --------------------------------------------------------------------------- Fire


def test_fire_to_dict_is_the_asset_events_extra() -> None:
    extra = Fire("max_wait", 7, {10: 3, 2: 4}, 30.12345).to_dict()
    assert extra == {"reason": "max_wait", "total_lag": 7,
                     "partitions": {"2": 4, "10": 3}, "waited_seconds": 30.123}
    assert list(extra["partitions"]) == ["2", "10"]  # by partition number, not as text
    assert json.loads(json.dumps(extra)) == extra  # JSON as it is: keys already strings


def test_a_run_committing_chunk_by_chunk_re_arms_only_at_its_end() -> None:
    # fired with 100,000 waiting; the run commits 20,000 at a time while more arrives
    watch = LagWatch(SETTINGS)
    fired(watch, 0.0, [row(0, 100_000, stored=0)])
    assert play(watch, [(float(t), [row(0, 100_000 - 20_000 * t + 500 * t, stored=20_000 * t)])
                        for t in range(1, 5)]) == []  # its first commits are not its end
    assert not watch.armed
    assert play(watch, [(5.0, [row(0, 2_500, stored=100_000)])]) == [
        (5.0, Fire("min_batch", 2_500, {0: 2_500}, 0.0))]  # the end: one follow-up


def test_a_run_capped_by_max_records_ends_there() -> None:
    watch = LagWatch(SETTINGS, max_records=30_000)
    fired(watch, 0.0, [row(0, 100_000, stored=0)])
    assert watch.observe(1.0, [row(0, 80_000, stored=20_000)]) is None
    assert not watch.armed
    fire = watch.observe(2.0, [row(0, 70_000, stored=30_000)])  # the run's cap: it ended
    assert fire == Fire("min_batch", 70_000, {0: 70_000}, 0.0)
