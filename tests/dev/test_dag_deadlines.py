"""The DAG tests' deadlines (tests/support/deadlines.py) add up what Airflow is configured to
do; each expected value is the sum written out by hand from the settings it names."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from kafka_ingest.config import parse_pipelines
from tests.support.deadlines import MARGIN_S, parse_deadline_s, retry_delay_s, run_deadline_s

#: The Celery test's services: 20 s heartbeat time-out checked every 2 s, a queued task
#: requeued after 30 s checked every 5, 4 task slots.
SERVICES = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
    "AIRFLOW__CORE__PARALLELISM": "4",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
    "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "50",
}


def _pipeline(**overrides: Any) -> Any:
    body = {"topic": "src", "dlq_topic": "dlq", "table": "telemetry_metrics",
            "contract": {"event_type": "metric_event", "version": 2}, "schedule": None,
            "task_timeout_minutes": 1, **overrides}
    return parse_pipelines({"pipelines": {"p": body}})["p"]


@pytest.mark.parametrize(("overrides", "kwargs", "expected"), [
    # one wave, no retry: the slices' minute and the minute of each of plan, report and
    # table_updated, then the margin
    ({"retries": 0}, {}, 60 + 3 * 60 + MARGIN_S),
    # a pool of one slot runs 3 slices one after another
    ({"retries": 0, "pool": "one", "pool_slots": 1}, {}, 3 * 60 + 3 * 60 + MARGIN_S),
    # the kill: the longer of the killed try (noticed 20 + 2 s after, then 2 retries of up
    # to 20 and 40 s delay + 1 min each) and a slice whose message the killed worker had
    # reserved (requeued after 30 + 5 s, then a whole slice: 1 min and the same retries)
    # (the other three tasks: a whole slice each, retries included)
    ({"retries": 2}, {"from_kill": True},
     max(22 + (20 + 60) + (40 + 60), 30 + 5 + 60 + (20 + 60) + (40 + 60))
     + 3 * (60 + (20 + 60) + (40 + 60)) + MARGIN_S),
    # two runs one after another (a backfill of two intervals), one retry each
    ({"retries": 1}, {"runs": 2}, 2 * (4 * (60 + (20 + 60)) + MARGIN_S)),
])
def test_run_deadline_adds_up_airflows_timers(overrides: dict[str, Any], kwargs: dict[str, Any],
                                              expected: float) -> None:
    assert run_deadline_s(_pipeline(**overrides), SERVICES, slices=3, **kwargs) == expected


def test_retry_delay_covers_airflows_jitter_and_cap() -> None:
    args = {"retry_delay": timedelta(seconds=10), "retry_exponential_backoff": 2.0,
            "max_retry_delay": timedelta(seconds=100)}
    # 10 s doubling, each with up to 100 % jitter: 20, 40, 80, then capped at 100
    assert [retry_delay_s(args, n) for n in (1, 2, 3, 4)] == [20, 40, 80, 100]
    # no back-off: no jitter either
    assert retry_delay_s({"retry_delay": timedelta(seconds=10)}, 3) == 10


def test_parse_deadline() -> None:
    assert parse_deadline_s(SERVICES) == 10 + 50 + MARGIN_S

