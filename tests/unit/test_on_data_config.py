"""``schedule: on_data`` in the pipelines file: the ``on_data`` block's defaults, what it
refuses (with a message naming the key), and that it is refused where nothing would use it."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.config import ON_DATA, OnData, Pipeline, parse_pipelines

GOOD: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}


def one(**body: Any) -> Pipeline:
    return parse_pipelines({"pipelines": {"p1": {**GOOD, **body}}})["p1"]


def test_on_data_without_a_block_takes_the_documented_defaults() -> None:
    p = one(schedule="on_data")
    assert p.event_driven and ON_DATA == "on_data"
    assert (p.on_data.min_batch, p.on_data.max_wait_seconds, p.on_data.poll_seconds,
            p.on_data.rearm_seconds, p.on_data.safety_schedule) == (
        10_000, 30.0, 2.0, 300.0, "0 * * * *")


def test_an_on_data_block_overrides_key_by_key() -> None:
    p = one(schedule="on_data", on_data={"min_batch": 5000, "max_wait_seconds": 20,
                                         "safety_schedule": "17 * * * *"})
    assert p.on_data == OnData(min_batch=5000, max_wait_seconds=20.0, poll_seconds=2.0,
                               rearm_seconds=300.0, safety_schedule="17 * * * *")


def test_the_defaults_section_can_carry_the_on_data_block() -> None:
    doc = {"defaults": {"schedule": "on_data", "on_data": {"min_batch": 7}},
           "pipelines": {"p1": dict(GOOD), "p2": {**GOOD, "dlq_topic": "x",
                                                  "on_data": {"min_batch": 9}}}}
    loaded = parse_pipelines(doc)
    assert (loaded["p1"].on_data.min_batch, loaded["p2"].on_data.min_batch) == (7, 9)
    # a pipeline's block replaces the shared one (no key-by-key merge, unlike alerts)
    assert loaded["p2"].on_data.max_wait_seconds == 30.0


@pytest.mark.parametrize("schedule", [
    "*/5 * * * *",  # the default cron
    None,           # manual runs only
])
def test_cron_and_manual_pipelines_are_not_event_driven(schedule: str | None) -> None:
    assert not one(schedule=schedule).event_driven


@pytest.mark.parametrize(("on_data", "message"), [
    # polling less often than the longest wait means the wait cannot be kept
    ({"poll_seconds": 5, "max_wait_seconds": 3},
     "pipelines.p1.on_data: Value error, poll_seconds (5) must not exceed max_wait_seconds (3)"),
    # the default poll (2 s) over a wait set shorter than it
    ({"max_wait_seconds": 1},
     "pipelines.p1.on_data: Value error, poll_seconds (2) must not exceed max_wait_seconds (1)"),
    # Airflow's presets are not cron expressions of five fields
    ({"safety_schedule": "@hourly"},
     "pipelines.p1.on_data: Value error, safety_schedule '@hourly' is not a cron expression "
     "of five fields"),
    # six fields (seconds first, as Quartz writes them)
    ({"safety_schedule": "0 0 * * * *"},
     "pipelines.p1.on_data: Value error, safety_schedule '0 0 * * * *' is not a cron "
     "expression of five fields"),
    ({"min_batch": 0}, "pipelines.p1.on_data.min_batch: Input should be greater than or equal "
                       "to 1"),
    ({"poll_seconds": 0.1}, "pipelines.p1.on_data.poll_seconds: Input should be greater than "
                            "or equal to 0.2"),
    ({"min_btach": 10}, "pipelines.p1.on_data.min_btach: unknown key"),
])
def test_a_bad_on_data_block_is_refused_naming_the_key(on_data: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=r"^<pipelines>: ") as caught:
        one(schedule="on_data", on_data=on_data)
    assert message in str(caught.value)


def test_poll_seconds_equal_to_max_wait_is_accepted() -> None:
    assert one(schedule="on_data", on_data={"poll_seconds": 30,
                                            "max_wait_seconds": 30}).on_data.poll_seconds == 30


@pytest.mark.parametrize(("schedule", "shown"), [
    ("*/5 * * * *", "'*/5 * * * *'"),
    (None, "None"),
])
def test_an_on_data_block_on_a_pipeline_that_never_uses_it_is_refused(
        schedule: str | None, shown: str) -> None:
    with pytest.raises(ValueError) as caught:
        one(schedule=schedule, on_data={"min_batch": 5})
    assert str(caught.value) == (
        "<pipelines>: pipelines.p1.(top level): Value error, on_data is for "
        f"`schedule: on_data`; this pipeline's schedule is {shown}")


def test_an_on_data_block_equal_to_the_defaults_is_not_counted_as_set() -> None:
    assert one(on_data={}).on_data == OnData()
    assert one(on_data={"min_batch": 10_000}).schedule == "*/5 * * * *"


@pytest.mark.parametrize("body", [
    {},                                                          # cron, defaults
    {"schedule": None},                                          # manual
    {"schedule": "on_data", "on_data": {"min_batch": 5, "poll_seconds": 0.5,
                                        "max_wait_seconds": 1}},  # event-driven
])
def test_a_dumped_pipeline_parses_again(body: dict[str, Any]) -> None:
    """Tools write pipelines back as YAML (``model_dump(mode="json")``), ``on_data``
    included for a cron pipeline: its defaults must not count as set."""
    p = one(**body)
    dumped = p.model_dump(mode="json")
    assert dumped["on_data"]["min_batch"] == (5 if p.event_driven else 10_000)
    assert parse_pipelines({"pipelines": {"p1": dumped}})["p1"] == p
