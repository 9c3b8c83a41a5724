"""The lag trigger without a triggerer, a broker or a database: its serialized form, its
shared-stream key, the per-pipeline filter over hand-made readings, and the shared poll
loop over a fake :class:`kafka_ingest.ops.status.LagReader` with the sleeps recorded.

Also the ingest DAG of an ``on_data`` pipeline: built in-process (no metadata database),
its schedule is the safety cron or the Asset the lag trigger watches.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from types import ModuleType
from typing import Any, cast

import pytest

import kafka_ingest_triggers as triggers
from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.errors import IngestError, TopicMissing
from kafka_ingest.ops.lag import LagRow
from kafka_ingest_triggers import CLASSPATH, LagReading, LagTrigger
from tests.support import ROOT

BODY: dict[str, Any] = {
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "schedule": "on_data",
}
#: Fire at 100, or after 10 s; poll each 0.5 s.
ON_DATA: dict[str, Any] = {"min_batch": 100, "max_wait_seconds": 10, "poll_seconds": 0.5}


def load(**entries: dict[str, Any]) -> dict[str, Pipeline]:
    body = {name: {**BODY, "topic": f"{name}-in", "dlq_topic": f"{name}-dlq", **entry}
            for name, entry in entries.items()}
    return parse_pipelines({"pipelines": body})


PIPELINES = load(p1={"on_data": ON_DATA},
                 p2={"on_data": {**ON_DATA, "poll_seconds": 3, "min_batch": 1}},
                 p3={"kafka_conn_id": "kafka_other"},
                 p4={"postgres_conn_id": "postgres_other"})


def row(pipeline: str, partition: int, lag: int, stored: int | None = 1000) -> LagRow:
    base = stored if stored is not None else 0
    return LagRow(pipeline=pipeline, topic=f"{pipeline}-in", partition=partition,
                  stored_offset=stored, group_offset=stored, low=0, high=base + lag)


# --------------------------------------------------------------------------- the trigger


def test_serialize_round_trips_through_the_classpath_and_json() -> None:
    trigger = LagTrigger.of(PIPELINES["p1"])
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH == "kafka_ingest_triggers.LagTrigger"
    module, name = classpath.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    assert cls is LagTrigger
    # the triggerer rebuilds it from the kwargs it stored as JSON
    again = cls(**json.loads(json.dumps(kwargs)))
    assert again.serialize() == (classpath, kwargs)
    assert kwargs == {"pipeline": "p1", "kafka_conn_id": "kafka_default",
                      "postgres_conn_id": "postgres_default",
                      "on_data": {"min_batch": 100, "max_wait_seconds": 10.0,
                                  "poll_seconds": 0.5, "rearm_seconds": 300.0,
                                  "safety_schedule": "0 * * * *"},
                      "max_records": 200_000}  # the pipeline's max_records_per_partition


def test_the_settings_are_copied_not_shared() -> None:
    settings = dict(ON_DATA)
    trigger = LagTrigger("p1", "kafka_default", "postgres_default", settings)
    settings["min_batch"] = 1
    assert trigger.serialize()[1]["on_data"]["min_batch"] == 100


def test_one_shared_stream_per_kafka_and_postgres_connection() -> None:
    p1, p2, p3, p4 = (LagTrigger.of(PIPELINES[n]).shared_stream_key()
                      for n in ("p1", "p2", "p3", "p4"))
    hash(p1)
    assert p1 == p2  # same connections, different settings: one poll loop
    assert len({p1, p3, p4}) == 3  # another Kafka, another Postgres: a loop each


# --------------------------------------------------------------------------- the filter


async def stream_of(readings: Iterable[LagReading]) -> AsyncIterator[LagReading]:
    for reading in readings:
        yield reading


def events(trigger: LagTrigger, readings: Iterable[LagReading]) -> list[Any]:
    async def collect() -> list[Any]:
        return [e.payload async for e in trigger.filter_shared_stream(stream_of(readings))]

    return asyncio.run(collect())


def test_the_filter_fires_for_its_own_pipeline_only() -> None:
    readings = [
        # p2 (min_batch 1) lags all along: its own trigger's business, not p1's
        LagReading(0.0, {"p1": [row("p1", 0, 0)], "p2": [row("p2", 0, 500)]}),
        LagReading(1.0, {"p1": [row("p1", 0, 60), row("p1", 1, 39)],
                         "p2": [row("p2", 0, 900)]}),
        LagReading(2.0, {"p1": [row("p1", 0, 60), row("p1", 1, 40)],
                         "p2": [row("p2", 0, 900)]}),
        # fired: quiet while the stored offsets stand still
        LagReading(3.0, {"p1": [row("p1", 0, 600), row("p1", 1, 400)]}),
        # the run moved both: 120 more wait, one follow-up
        LagReading(9.0, {"p1": [row("p1", 0, 70, 1060), row("p1", 1, 50, 1040)]}),
        LagReading(10.0, {"p1": [row("p1", 0, 80, 1060), row("p1", 1, 50, 1040)]}),
    ]
    assert events(LagTrigger.of(PIPELINES["p1"]), readings) == [
        {"pipeline": "p1", "reason": "min_batch", "total_lag": 100,
         "partitions": {"0": 60, "1": 40}, "waited_seconds": 1.0},
        {"pipeline": "p1", "reason": "min_batch", "total_lag": 120,
         "partitions": {"0": 70, "1": 50}, "waited_seconds": 0.0},
    ]


def test_unknown_lag_and_failed_readings_are_skipped_and_do_not_restart_the_wait() -> None:
    readings = [
        LagReading(0.0, {"p1": [row("p1", 0, 5)]}),                # the wait starts
        LagReading(2.0, error="broker down"),                      # the whole read failed
        LagReading(4.0, {"p1": TopicMissing("p1-in")}),            # p1's topic is gone
        LagReading(6.0, {"p1": IngestError("something else")}),
        LagReading(8.0, {"p2": [row("p2", 0, 0)]}),                # p1 no longer on_data
        LagReading(10.0, {"p1": [row("p1", 0, 6)]}),               # 10 s after the first
    ]
    assert events(LagTrigger.of(PIPELINES["p1"]), readings) == [
        {"pipeline": "p1", "reason": "max_wait", "total_lag": 6, "partitions": {"0": 6},
         "waited_seconds": 10.0},
    ]


# --------------------------------------------------------------------------- the poll loop


class Enough(BaseException):
    """Ends a loop the test is done with (what the triggerer's cancellation would do): not
    an ``Exception``, so the loop's own handler does not take it for a failed read."""


class FakeReader:
    """A :class:`LagReader` that answers from a script: rows, or an exception to raise;
    past its end, :class:`Enough`."""

    def __init__(self, script: list[dict[str, Any] | Exception]) -> None:
        self.script = list(script)
        self.asked: list[list[str]] = []
        self.closed = 0

    def read(self, pipelines: list[Pipeline], *, group: bool = True) -> dict[str, Any]:
        assert group is False  # the trigger judges by the stored offsets only
        self.asked.append([p.name for p in pipelines])
        if not self.script:
            raise Enough
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def close(self) -> None:
        self.closed += 1


class RecordedSleeps:
    """The module's ``asyncio`` with ``sleep`` recording its delays instead of sleeping
    (and ending a loop that sleeps ``limit`` times: a test that hangs tells nothing)."""

    def __init__(self, limit: int = 100) -> None:
        self.delays: list[float] = []
        self.limit = limit

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        if len(self.delays) >= self.limit:
            raise Enough


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    recorded = RecordedSleeps()
    monkeypatch.setattr(triggers, "asyncio", recorded)
    return recorded


def fake_stack(monkeypatch: pytest.MonkeyPatch, script: list[dict[str, Any] | Exception],
               *, watched: Any = None) -> tuple[FakeReader, list[str]]:
    """``watched`` gives p1 and p2 (or what ``watched`` says); ``_reader`` one fake reader,
    recording which pipeline it was built for."""
    reader, built = FakeReader(script), []

    def make_reader(pipeline: Pipeline) -> FakeReader:
        built.append(pipeline.name)
        return reader

    def watched_default(kafka_conn_id: str, postgres_conn_id: str) -> list[Pipeline]:
        assert (kafka_conn_id, postgres_conn_id) == ("kafka_default", "postgres_default")
        return [PIPELINES["p1"], PIPELINES["p2"]]

    monkeypatch.setattr(triggers, "watched", watched or watched_default)
    monkeypatch.setattr(triggers, "_reader", make_reader)
    return reader, built


def take(n: int, *, after: Any = None) -> list[LagReading]:
    """The first ``n`` readings of p1's shared stream, then the stream closed (``after``
    called once it is)."""
    async def main() -> list[LagReading]:
        stream = cast(AsyncGenerator[LagReading, None], LagTrigger.open_shared_stream(
            LagTrigger.of(PIPELINES["p1"]).serialize()[1]))
        try:
            return [await anext(stream) for _ in range(n)]
        finally:
            await stream.aclose()

    return asyncio.run(main())


ROWS_A = {"p1": [row("p1", 0, 3)], "p2": [row("p2", 0, 0)]}
ROWS_B = {"p1": [row("p1", 0, 4)], "p2": TopicMissing("p2-in")}


def test_the_loop_survives_a_failed_read_and_backs_off(monkeypatch: pytest.MonkeyPatch,
                                                       sleeps: RecordedSleeps) -> None:
    reader, built = fake_stack(monkeypatch, [ROWS_A, OSError("broker down"), ROWS_B, ROWS_A])
    readings = take(4)
    assert [(r.rows, r.error) for r in readings] == [
        (ROWS_A, None), ({}, "broker down"), (ROWS_B, None), (ROWS_A, None)]
    assert readings[0].at <= readings[1].at <= readings[2].at <= readings[3].at
    # the smallest poll of the watched pipelines (p1's 0.5 s), doubled after the failure
    assert sleeps.delays == [0.5, 1.0, 0.5]
    assert reader.asked == [["p1", "p2"]] * 4
    # a failed read drops its reader: the next one re-reads the Airflow connections
    assert built == ["p1", "p1"]
    assert reader.closed == 2  # after the failure, and by aclose()


def test_the_backoff_doubles_per_failure_up_to_its_cap(monkeypatch: pytest.MonkeyPatch,
                                                      sleeps: RecordedSleeps) -> None:
    slow = load(s1={"on_data": {"poll_seconds": 20, "max_wait_seconds": 60}})["s1"]
    fake_stack(monkeypatch, [RuntimeError("1"), RuntimeError("2"), RuntimeError("3"),
                             ROWS_A, ROWS_A], watched=lambda *_: [slow])
    readings = take(5)
    assert [r.error for r in readings] == ["1", "2", "3", None, None]
    assert sleeps.delays == [40.0, 60.0, 60.0, 20.0]  # 20 * 2, 20 * 4, 20 * 8 capped at 60


def test_a_bad_pipelines_file_is_an_error_reading_at_the_default_poll(
        monkeypatch: pytest.MonkeyPatch, sleeps: RecordedSleeps) -> None:
    answers: list[Any] = [ValueError("pipelines.yaml: not valid YAML"),
                          [PIPELINES["p1"]]]

    def watched(*_: str) -> list[Pipeline]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    reader, _ = fake_stack(monkeypatch, [ROWS_A], watched=watched)
    readings = take(2)
    assert [(r.rows, r.error) for r in readings] == [
        ({}, "pipelines.yaml: not valid YAML"), (ROWS_A, None)]
    assert sleeps.delays == [4.0]  # the default poll (2 s: no pipeline known), doubled
    assert reader.asked == [["p1"]] and reader.closed == 1


def test_nothing_watched_reads_nothing_and_opens_no_reader(monkeypatch: pytest.MonkeyPatch,
                                                          sleeps: RecordedSleeps) -> None:
    reader, built = fake_stack(monkeypatch, [], watched=lambda *_: [])
    sleeps.limit = 3

    async def main() -> None:
        stream = LagTrigger.open_shared_stream(LagTrigger.of(PIPELINES["p1"]).serialize()[1])
        with pytest.raises(Enough):  # three polls, not one reading
            await anext(stream)

    asyncio.run(main())
    assert built == [] and reader.asked == [] and reader.closed == 0
    assert sleeps.delays == [2.0, 2.0, 2.0]  # the default poll: no pipeline says another


def test_run_is_the_same_loop_and_filter(monkeypatch: pytest.MonkeyPatch,
                                         sleeps: RecordedSleeps) -> None:
    fake_stack(monkeypatch, [{"p1": [row("p1", 0, 0)]}, {"p1": [row("p1", 0, 150)]}])

    async def main() -> Any:
        run = cast(AsyncGenerator[Any, None], LagTrigger.of(PIPELINES["p1"]).run())
        try:
            return (await anext(run)).payload
        finally:
            await run.aclose()

    payload = asyncio.run(main())
    assert payload == {"pipeline": "p1", "reason": "min_batch", "total_lag": 150,
                       "partitions": {"0": 150}, "waited_seconds": 0.0}
    assert sleeps.delays == [0.5]


# --------------------------------------------------------------------------- the DAG


@pytest.fixture(scope="module")
def ingest_dags() -> ModuleType:
    """``dags/ingest_dags.py`` imported as a module of its own (building its DAGs needs no
    service, as the DAG integrity tests show)."""
    spec = importlib.util.spec_from_file_location("ingest_dags_under_test",
                                                  ROOT / "dags" / "ingest_dags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_on_data_dag_is_scheduled_on_the_watched_asset_or_its_safety_cron(
        ingest_dags: ModuleType) -> None:
    from airflow.sdk import Asset, AssetOrTimeSchedule, CronTriggerTimetable

    pipeline = load(w1={"on_data": {**ON_DATA, "safety_schedule": "17 * * * *"}})["w1"]
    schedule = ingest_dags.build_ingest_dag(pipeline).timetable
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert isinstance(schedule.timetable, CronTriggerTimetable)
    assert (schedule.timetable.expression, schedule.timetable.timezone) == ("17 * * * *",
                                                                            "UTC")
    asset = schedule.asset_condition
    assert isinstance(asset, Asset)
    assert (asset.name, asset.uri) == ("w1_new_data", "kafka-ingest://w1/lag")
    [watcher] = asset.watchers
    assert watcher.name == "w1_lag"
    assert isinstance(watcher.trigger, LagTrigger)
    assert watcher.trigger.serialize() == LagTrigger.of(pipeline).serialize()


def test_a_cron_dag_has_no_watcher(ingest_dags: ModuleType) -> None:
    from airflow.sdk import AssetOrTimeSchedule, CronDataIntervalTimetable

    pipeline = load(c1={"schedule": "*/5 * * * *"})["c1"]
    schedule = ingest_dags.build_ingest_dag(pipeline).timetable
    assert isinstance(schedule, CronDataIntervalTimetable)
    assert not isinstance(schedule, AssetOrTimeSchedule)
