"""The Prometheus metrics without services: snapshots built by hand, rendered to the text
exposition format and parsed back the way Prometheus reads them; the bearer-token check;
and the snapshot cache's one-look-at-a-time promise (a fake clock, and threads held inside
a slow look)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops import observe
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.metrics import (
    METRICS,
    describe,
    exposition,
    families,
    registry_of,
    token_matches,
)
from kafka_ingest.ops.monitor import CheckResult, Figures, evaluate
from kafka_ingest.ops.observe import PipelineView, RunOutcome, Snapshot, SnapshotCache
from kafka_ingest.records import ChunkCounts

BODY: dict[str, Any] = {
    "topic": "orders-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "orders_rows",
    "dlq_topic": "orders-in-dlq",
}
#: Limits unlike the defaults (100000, 3, 0.05, 30, 1000), so a default leaking through shows.
ALERTS = {"max_lag": 50, "lag_growth_checks": 2, "max_dlq_rate": 0.1, "freshness_minutes": 15,
          "max_parked": 4}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
T = NOW.timestamp()


def pipelines() -> dict[str, Pipeline]:
    return parse_pipelines({"pipelines": {
        "orders": {**BODY, "alerts": ALERTS},
        "quiet": {**BODY, "topic": "quiet-in", "table": "quiet_rows",
                  "dlq_topic": "quiet-in-dlq"},
    }})


def lag_row(pipeline: str, topic: str, partition: int, *, stored: int | None, group: int | None,
            low: int, high: int) -> LagRow:
    return LagRow(pipeline=pipeline, topic=topic, partition=partition, stored_offset=stored,
                  group_offset=group, low=low, high=high)


def judged(p: Pipeline, **figures: Any) -> CheckResult:
    f = Figures(**{"pipeline": p.name, "now": NOW, "total_lag": 0, **figures})
    return CheckResult(f, tuple(evaluate(p.alerts, f)))


def orders_view() -> PipelineView:
    """``orders``: 3 partitions; 0 is 70 behind (its oldest unread message read 90 s
    before ``T``; the group 80 behind), 1 is caught up, 2's stored offset is ahead of the
    high watermark (lag -5, as after the topic was recreated) and its group has no offset.
    Breaches max_lag and max_parked; the ledger has live and replay runs."""
    p = pipelines()["orders"]
    rows = (lag_row("orders", "orders-in", 0, stored=30, group=20, low=0, high=100),
            lag_row("orders", "orders-in", 1, stored=40, group=40, low=0, high=40),
            lag_row("orders", "orders-in", 2, stored=15, group=None, low=0, high=10))
    result = judged(p, total_lag=70, group_lag=None, partitions=3,
                    partition_lags={0: 70, 1: 0, 2: 0}, lag_history=(70,), read=200,
                    dead_lettered=10, last_live_commit=NOW - timedelta(minutes=3),
                    watched_since=NOW - timedelta(hours=1), parked=6)
    return PipelineView(
        pipeline=p, lag_rows=rows, oldest_unread={0: T - 90.0}, result=result,
        totals={"live": ChunkCounts(read=200, inserted=180, duplicates=0, dead_lettered=10,
                                    deleted=2),
                "replay": ChunkCounts(read=7, inserted=3, duplicates=4, dead_lettered=0,
                                      deleted=0)},
        parked_by_reason={"contract_violation": 5, "undecodable": 1},
        outcome=RunOutcome("failed", "scheduled__2026-03-01T11:55:00+00:00", T - 60))


def snap(*views: PipelineView, up: dict[tuple[str, str], bool] | None = None) -> Snapshot:
    return Snapshot(views, up or {("kafka", "kafka_default"): True,
                                  ("postgres", "postgres_default"): True}, T - 2.0, 0.25)


class _Fixed(Collector):
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snapshot, self.now = snapshot, now

    def collect(self) -> Iterator[Metric]:
        yield from families(self.snapshot, now=self.now)


def scrape(snapshot: Snapshot, *, now: float = T) -> dict[str, Metric]:
    """``snapshot`` as Prometheus reads it: exposition text, parsed; families by name."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(snapshot, now))
    text = exposition(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def values(found: dict[str, Metric], name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The samples of ``kafka_ingest_<name>`` keyed by the values of ``labels``."""
    family = found.get("kafka_ingest_" + name)
    if family is None:
        return {}
    return {tuple(s.labels[k] for k in labels): s.value for s in family.samples}


def of(found: dict[str, Metric], name: str, pipeline: str,
       *labels: str) -> dict[tuple[str, ...], float]:
    """Like :func:`values`, for one pipeline's samples."""
    family = found.get("kafka_ingest_" + name)
    if family is None:
        return {}
    return {tuple(s.labels[k] for k in labels): s.value for s in family.samples
            if s.labels.get("pipeline") == pipeline}


# --------------------------------------------------------------------------- names


def test_every_name_has_the_prefix_and_counters_end_in_total() -> None:
    found = scrape(snap(orders_view()))

    assert found, "nothing exported"
    for family in found.values():
        assert family.name.startswith("kafka_ingest_"), family.name
        for sample in family.samples:
            assert sample.name.startswith("kafka_ingest_"), sample.name
            if family.type == "counter":
                assert sample.name.endswith("_total"), sample.name
    counters = sorted(f.name for f in found.values() if f.type == "counter")
    assert counters == ["kafka_ingest_dead_letters", "kafka_ingest_duplicates",
                        "kafka_ingest_messages_read", "kafka_ingest_rows_deleted",
                        "kafka_ingest_rows_inserted"]


def test_describe_lists_every_metric_with_its_exposed_name_and_type() -> None:
    table = {row["name"]: row for row in describe()}

    assert len(table) == len(METRICS)
    assert sorted(table) == sorted([
        "kafka_ingest_up", "kafka_ingest_snapshot_seconds", "kafka_ingest_snapshot_age_seconds",
        "kafka_ingest_pipeline_info", "kafka_ingest_lag_known", "kafka_ingest_lag_messages",
        "kafka_ingest_group_lag_messages", "kafka_ingest_stored_offset",
        "kafka_ingest_high_watermark", "kafka_ingest_oldest_unread_age_seconds",
        "kafka_ingest_messages_read_total", "kafka_ingest_rows_inserted_total",
        "kafka_ingest_duplicates_total", "kafka_ingest_dead_letters_total",
        "kafka_ingest_rows_deleted_total", "kafka_ingest_dlq_ratio",
        "kafka_ingest_parked_letters", "kafka_ingest_last_live_commit_timestamp_seconds",
        "kafka_ingest_last_live_commit_age_seconds", "kafka_ingest_last_run_success",
        "kafka_ingest_last_run_end_timestamp_seconds", "kafka_ingest_alert_limit",
        "kafka_ingest_alert_breached"])
    assert table["kafka_ingest_lag_messages"]["labels"] == "pipeline,topic,partition"
    assert table["kafka_ingest_messages_read_total"]["type"] == "counter"
    assert all(row["help"] for row in table.values())
    # what a scrape exposes is what the table says, sample names included
    for family in scrape(snap(orders_view())).values():
        for sample in family.samples:
            assert table[sample.name]["type"] == family.type, sample.name


# --------------------------------------------------------------------------- lag


def test_lag_metrics_carry_pipeline_topic_partition_and_clamp_a_negative_lag() -> None:
    found = scrape(snap(orders_view()))
    key = ("pipeline", "topic", "partition")

    assert values(found, "lag_messages", *key) == {
        ("orders", "orders-in", "0"): 70.0,
        ("orders", "orders-in", "1"): 0.0,
        ("orders", "orders-in", "2"): 0.0,  # -5 (stored ahead of the watermark) shows as 0
    }
    assert values(found, "group_lag_messages", *key) == {
        ("orders", "orders-in", "0"): 80.0,
        ("orders", "orders-in", "1"): 0.0,
        # partition 2: the group has no offset, so no series (not a made-up 0)
    }
    assert values(found, "stored_offset", *key) == {
        ("orders", "orders-in", "0"): 30.0, ("orders", "orders-in", "1"): 40.0,
        ("orders", "orders-in", "2"): 15.0}
    assert values(found, "high_watermark", *key) == {
        ("orders", "orders-in", "0"): 100.0, ("orders", "orders-in", "1"): 40.0,
        ("orders", "orders-in", "2"): 10.0}
    assert values(found, "lag_known", "pipeline") == {("orders",): 1.0}


def test_no_stored_offset_no_stored_offset_series() -> None:
    p = pipelines()["orders"]
    rows = (lag_row("orders", "orders-in", 0, stored=None, group=None, low=5, high=12),)
    view = PipelineView(pipeline=p, lag_rows=rows, oldest_unread={0: T - 4.0},
                        result=judged(p, total_lag=7, partitions=1))
    found = scrape(snap(view))

    assert values(found, "stored_offset", "partition") == {}
    assert values(found, "group_lag_messages", "partition") == {}
    assert values(found, "lag_messages", "partition") == {("0",): 7.0}  # from the low mark


def test_oldest_unread_age_is_now_minus_its_timestamp_and_zero_when_caught_up() -> None:
    found = scrape(snap(orders_view()), now=T + 10.0)

    assert values(found, "oldest_unread_age_seconds", "partition") == {
        ("0",): 100.0,  # read 90 s before T, scraped 10 s after
        ("1",): 0.0,  # caught up
        ("2",): 0.0,  # lag -5: nothing unread
    }


def test_a_lagging_partition_whose_oldest_message_was_not_read_has_no_age() -> None:
    view = orders_view()
    found = scrape(snap(replace(view, oldest_unread={})))

    # partition 0 lags but its first timestamp is unknown: absent rather than 0
    assert values(found, "oldest_unread_age_seconds", "partition") == {("1",): 0.0,
                                                                       ("2",): 0.0}


def test_unknown_lag_exports_lag_known_0_and_no_partition_series() -> None:
    p = pipelines()["quiet"]
    view = PipelineView(pipeline=p, lag_rows=None, lag_error="lag not known: topic missing",
                        result=judged(p, total_lag=None, read=10, dead_lettered=5, parked=0))
    found = scrape(snap(orders_view(), view))

    assert of(found, "lag_known", "quiet") == {(): 0.0}
    for name in ("lag_messages", "group_lag_messages", "stored_offset", "high_watermark",
                 "oldest_unread_age_seconds"):
        assert of(found, name, "quiet") == {}, name
        assert of(found, name, "orders", "partition"), name  # the other pipeline's remain
    # the lag rules cannot be judged without a lag; the database's can
    assert of(found, "alert_breached", "quiet", "rule") == {
        ("max_dlq_rate",): 1.0, ("max_parked",): 0.0}


# --------------------------------------------------------------------------- ledger, rules


def test_ledger_counters_per_mode() -> None:
    found = scrape(snap(orders_view()))
    key = ("pipeline", "mode")

    assert values(found, "messages_read", *key) == {("orders", "live"): 200.0,
                                                     ("orders", "replay"): 7.0}
    assert values(found, "rows_inserted", *key) == {("orders", "live"): 180.0,
                                                     ("orders", "replay"): 3.0}
    assert values(found, "duplicates", *key) == {("orders", "live"): 0.0,
                                                  ("orders", "replay"): 4.0}
    assert values(found, "dead_letters", *key) == {("orders", "live"): 10.0,
                                                    ("orders", "replay"): 0.0}
    assert values(found, "rows_deleted", *key) == {("orders", "live"): 2.0,
                                                    ("orders", "replay"): 0.0}


def test_alert_limits_are_the_pipelines_own() -> None:
    quiet = pipelines()["quiet"]
    found = scrape(snap(orders_view(), PipelineView(pipeline=quiet)))

    assert of(found, "alert_limit", "orders", "rule") == {
        ("max_lag",): 50.0, ("lag_growth_checks",): 2.0, ("max_dlq_rate",): 0.1,
        ("freshness_minutes",): 15.0, ("max_parked",): 4.0}
    # the other pipeline keeps the built-in defaults, even with nothing else known
    assert of(found, "alert_limit", "quiet", "rule") == {
        ("max_lag",): 100_000.0, ("lag_growth_checks",): 3.0, ("max_dlq_rate",): 0.05,
        ("freshness_minutes",): 30.0, ("max_parked",): 1000.0}


def test_alert_breached_is_1_exactly_for_the_breached_rules() -> None:
    view = orders_view()
    assert view.result is not None
    # lag 70 > 50, 10/200 = 5 % under 10 %, 3 min since a live chunk under 15, 6 parked > 4
    assert view.breached == {"max_lag", "max_parked"}
    found = scrape(snap(view))

    assert of(found, "alert_breached", "orders", "rule") == {
        ("max_lag",): 1.0, ("lag_growth_checks",): 0.0, ("max_dlq_rate",): 0.0,
        ("freshness_minutes",): 0.0, ("max_parked",): 1.0}
    assert of(found, "dlq_ratio", "orders") == {(): 0.05}
    assert of(found, "parked_letters", "orders", "reason") == {
        ("contract_violation",): 5.0, ("undecodable",): 1.0}
    assert of(found, "last_live_commit_age_seconds", "orders") == {(): 180.0}
    assert of(found, "last_live_commit_timestamp_seconds", "orders") == {(): T - 180.0}


def test_without_the_database_no_rule_is_judged_and_no_figure_is_made_up() -> None:
    p = pipelines()["quiet"]
    view = PipelineView(pipeline=p, lag_error="lag not known: the database is out of reach")
    found = scrape(snap(view, up={("kafka", "kafka_default"): True,
                                  ("postgres", "warehouse"): False}))

    for name in ("alert_breached", "dlq_ratio", "parked_letters",
                 "last_live_commit_age_seconds", "messages_read"):
        assert of(found, name, "quiet") == {}, name
    assert of(found, "pipeline_info", "quiet", "topic", "table", "format") == {
        ("quiet-in", "quiet_rows", "json"): 1.0}


# --------------------------------------------------------------------------- up, last run


def test_a_down_component_is_up_0_with_its_connection() -> None:
    found = scrape(snap(orders_view(), up={("kafka", "kafka_default"): True,
                                           ("postgres", "warehouse"): False,
                                           ("kafka", "kafka_eu"): False}))

    assert values(found, "up", "component", "connection") == {
        ("kafka", "kafka_default"): 1.0, ("kafka", "kafka_eu"): 0.0,
        ("postgres", "warehouse"): 0.0}
    assert values(found, "snapshot_seconds") == {(): 0.25}
    assert values(found, "snapshot_age_seconds") == {(): 2.0}


def test_last_run_success_only_when_an_outcome_is_known() -> None:
    quiet = pipelines()["quiet"]
    ok = PipelineView(pipeline=quiet, outcome=RunOutcome("success", "manual__1", T - 5))
    found = scrape(snap(orders_view(), ok))

    assert values(found, "last_run_success", "pipeline") == {("orders",): 0.0,  # failed
                                                             ("quiet",): 1.0}
    assert values(found, "last_run_end_timestamp_seconds", "pipeline") == {
        ("orders",): T - 60, ("quiet",): T - 5}

    unknown = scrape(snap(PipelineView(pipeline=quiet)))  # the CLI exporter: no Airflow
    assert "kafka_ingest_last_run_success" not in unknown
    assert "kafka_ingest_last_run_end_timestamp_seconds" not in unknown


def test_the_registry_serves_the_caches_snapshot() -> None:
    """The path the exporter and the plugin serve: a registry over a cache, the clock real."""
    calls: list[int] = []

    def take() -> Snapshot:
        calls.append(1)
        return snap(orders_view())

    registry = registry_of(SnapshotCache(take, max_age_s=3600))
    first = exposition(registry).decode()
    second = exposition(registry).decode()

    assert len(calls) == 1  # two scrapes, one look
    found = {f.name: f for f in text_string_to_metric_families(second)}
    assert values(found, "lag_messages", "partition") == {("0",): 70.0, ("1",): 0.0,
                                                          ("2",): 0.0}
    assert 'kafka_ingest_lag_messages{partition="0",pipeline="orders",topic="orders-in"}' \
        in first


# --------------------------------------------------------------------------- token


@pytest.mark.parametrize(("header", "token", "expected"), [
    ("Bearer s3cret", "s3cret", True),
    ("bearer s3cret", "s3cret", True),  # the scheme is case-insensitive (RFC 7235)
    ("BEARER s3cret", "s3cret", True),
    ("Bearer wrong", "s3cret", False),
    ("Bearer s3cret-and-more", "s3cret", False),  # not a prefix match
    ("Bearer ", "s3cret", False),
    ("Bearer s3cret", None, False),  # no token configured: nothing is let in
    ("Bearer s3cret", "", False),
    ("Bearer ", "", False),
    (None, "s3cret", False),  # no Authorization header
    ("", "s3cret", False),
    ("Basic s3cret", "s3cret", False),  # another scheme carrying the same text
    ("s3cret", "s3cret", False),  # the bare token, no scheme
])
def test_token_matches(header: str | None, token: str | None, expected: bool) -> None:
    assert token_matches(header, token) is expected


# --------------------------------------------------------------------------- the cache


class Looks:
    """A ``take`` that counts its calls and returns a new snapshot each time."""

    def __init__(self, before: Callable[[], None] | None = None) -> None:
        self.calls = 0
        self.before = before
        self._lock = threading.Lock()

    def __call__(self) -> Snapshot:
        with self._lock:
            self.calls += 1
        if self.before is not None:
            self.before()
        return Snapshot((), {}, T, 0.0)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The cache's monotonic clock, set by the test (``clock[0]``)."""
    now = [1000.0]
    monkeypatch.setattr(observe, "time", SimpleNamespace(monotonic=lambda: now[0],
                                                         time=lambda: T))
    return now


def test_the_cache_keeps_a_snapshot_for_max_age(clock: list[float]) -> None:
    take = Looks()
    cache = SnapshotCache(take, max_age_s=10.0)

    first = cache.get()
    clock[0] += 10.0  # exactly max_age: still fresh
    assert cache.get() is first
    assert take.calls == 1

    clock[0] += 0.001  # older than max_age: looked at again
    second = cache.get()
    assert second is not first
    assert take.calls == 2
    assert cache.get() is second

    cache.clear()
    assert cache.get() is not second
    assert take.calls == 3


def test_max_age_0_looks_every_time_and_a_huge_one_never_again() -> None:
    """The real clock: no wait involved in either bound."""
    always = Looks()
    cache = SnapshotCache(always, max_age_s=0)
    snaps = [cache.get() for _ in range(3)]
    assert always.calls == 3
    assert len({id(s) for s in snaps}) == 3

    never = Looks()
    cache = SnapshotCache(never, max_age_s=1e9)
    first = cache.get()
    assert all(cache.get() is first for _ in range(5))
    assert never.calls == 1


def test_callers_arriving_during_a_slow_look_wait_for_it_instead_of_looking_again() -> None:
    started, release, second_look = threading.Event(), threading.Event(), threading.Event()
    take: Looks

    def slow() -> None:
        if take.calls > 1:
            second_look.set()
        started.set()
        assert release.wait(10), "the test never released the look"

    take = Looks(slow)
    cache = SnapshotCache(take, max_age_s=1e9)
    results: list[Snapshot] = []
    ready = threading.Barrier(6)

    def caller() -> None:
        ready.wait(10)
        results.append(cache.get())

    threads = [threading.Thread(target=caller, name=f"scrape-{i}") for i in range(5)]
    first = threading.Thread(target=lambda: results.append(cache.get()), name="scrape-first")
    first.start()
    try:
        assert started.wait(10), "the first look never began"
        for t in threads:
            t.start()
        ready.wait(10)  # every caller is about to call get() while the look is under way
        # had any of them started a look of its own, it would have done so by now
        assert not second_look.wait(0.3)
    finally:
        release.set()
        for t in (first, *threads):
            t.join(10)
    assert not any(t.is_alive() for t in (first, *threads))
    assert take.calls == 1
    assert len(results) == 6
    assert all(r is results[0] for r in results)


def test_while_a_look_is_under_way_callers_get_the_previous_snapshot_at_once() -> None:
    started, release = threading.Event(), threading.Event()
    slow = {"on": False}

    def maybe_slow() -> None:
        if slow["on"]:
            started.set()
            assert release.wait(10), "the test never released the look"

    take = Looks(maybe_slow)
    cache = SnapshotCache(take, max_age_s=0)  # every get looks again
    first = cache.get()
    slow["on"] = True
    looker = threading.Thread(target=cache.get, name="scrape-slow")
    looker.start()
    try:
        assert started.wait(10), "the second look never began"
        assert cache.get() is first  # at once, not behind the slow look
        assert take.calls == 2
    finally:
        release.set()
        looker.join(10)
    assert not looker.is_alive()


def test_a_failed_look_is_remembered_for_max_age_and_then_tried_again() -> None:
    fail = {"on": True}

    def broken() -> None:
        if fail["on"]:
            raise RuntimeError("no connection named postgres_eu")

    take = Looks(broken)
    cache = SnapshotCache(take, max_age_s=1e9)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="postgres_eu"):
            cache.get()
    assert take.calls == 1  # one failing look per period, not one per caller
    fail["on"] = False
    cache.max_age_s = 0
    assert isinstance(cache.get(), Snapshot)
    assert take.calls == 2


def test_a_connection_that_does_not_exist_shows_as_down_not_as_an_error() -> None:
    def no_such_connection(_p: Pipeline) -> Any:
        raise LookupError("The conn_id `postgres_eu` isn't defined")

    found = pipelines()
    snapshot = observe.snapshot(list(found.values()), observe.Sources(
        clients=no_such_connection, database=no_such_connection), timeout_s=1.0)
    assert {v.name for v in snapshot.views} == set(found)
    assert all(v.result is None and v.lag_rows is None and "postgres_eu" in (v.lag_error or "")
               for v in snapshot.views)
    assert not any(ok for (component, _), ok in snapshot.up.items() if component == "postgres")
