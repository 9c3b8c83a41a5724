"""The ``retention`` block of the pipelines file, without services: its defaults, merged key
by key under ``defaults``, ``null`` for ever, and the settings that cannot work refused at
load time with the key named."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.config import Pipeline, parse_pipelines

BODY: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}


def pipelines(retention: Any = None, defaults: Any = None, **body: Any) -> dict[str, Pipeline]:
    own = {**BODY, **body} if retention is None else {**BODY, **body, "retention": retention}
    doc: dict[str, Any] = {"pipelines": {"p1": own, "p2": dict(BODY)}}
    if defaults is not None:
        doc["defaults"] = {"retention": defaults}
    return parse_pipelines(doc)


def _days(p: Pipeline) -> tuple[int | None, ...]:
    r = p.retention
    return (r.ingest_runs_days, r.run_plans_days, r.monitor_checks_days,
            r.recovered_letters_days)


def test_retention_keeps_thirty_days_of_each_by_default() -> None:
    assert _days(pipelines()["p1"]) == (30, 30, 30, 30)


def test_a_pipeline_overrides_the_defaults_retention_key_by_key() -> None:
    loaded = pipelines(retention={"ingest_runs_days": 7},
                       defaults={"ingest_runs_days": 90, "recovered_letters_days": None})
    # p1 changed one and kept the shared "for ever"; p2 has the shared ones
    assert _days(loaded["p1"]) == (7, 30, 30, None)
    assert _days(loaded["p2"]) == (90, 30, 30, None)


@pytest.mark.parametrize(("body", "message"), [
    # a typo in a key
    ({"retention": {"ingest_run_days": 5}}, "pipelines.p1.retention.ingest_run_days: unknown key"),
    # nothing younger than a day ever goes: a shorter setting would not do what it says
    ({"retention": {"run_plans_days": 0}},
     "pipelines.p1.retention.run_plans_days: Input should be greater than or equal to 1"),
    # the DLQ rate is read from the chunks of its window: they must still be there
    ({"retention": {"ingest_runs_days": 1}, "alerts": {"window_minutes": 2 * 24 * 60}},
     "retention.ingest_runs_days (1) must cover alerts.window_minutes (2880)"),
])
def test_a_retention_that_cannot_work_is_refused_naming_its_key(
        body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"pipelines\.p1") as exc:
        pipelines(**body)
    assert message in str(exc.value)
