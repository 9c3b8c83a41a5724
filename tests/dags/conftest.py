"""The DAG tests' Airflow: one start of the stack's services for the tests that need them
(:class:`tests.support.airflow_api.SharedAirflow`), stopped when this package's last test on
the worker is done, and while a module that does without them runs (its ``airflow dags
test`` runs, or services of its own, use the same metadata database and DAG ids: a
dag-processor parsing other pipelines must not rewrite their DAGs meanwhile)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest_dev.databases import fresh_database
from tests.support.airflow_api import SharedAirflow
from tests.support.topics import delete_topics

#: The shared services' object while the package's fixture lives (one, or none).
_SHARED: list[SharedAirflow] = []


@pytest.fixture(scope="module", autouse=True)
def _apart_from_the_shared_services(request: pytest.FixtureRequest) -> None:
    """A module whose tests do not use the shared services runs with them stopped (the
    next module that uses them starts them again)."""
    module = [item for item in request.session.items if item.path == request.path]
    if _SHARED and not any("shared_airflow" in getattr(item, "fixturenames", ())
                           for item in module):
        _SHARED[-1].stop()


@pytest.fixture(scope="package")
def shared_airflow(stack_env: dict[str, str], clients: Any,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedAirflow]:
    """The stack's Airflow services with the session's pipelines file, its anchor pipeline
    on real (empty) topics and a database of its own."""
    name = f"anchor_{uuid.uuid4().hex[:8]}"
    doc = {"pipelines": {name: {
        "topic": f"src-{name}", "dlq_topic": f"dlq-{name}", "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2}, "schedule": None,
        "postgres_conn_id": f"pg_{name}"}}}
    anchor: Pipeline = parse_pipelines(doc)[name]
    ensure_topics(clients, {anchor.topic: 1, anchor.dlq_topic: 1})
    with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], cloned=True) as dsn:
        shared = SharedAirflow(tmp_path_factory.mktemp("shared-airflow"), anchor, dsn,
                               stack_env)
        _SHARED.append(shared)
        try:
            shared.ensure()
            yield shared
        finally:
            _SHARED.remove(shared)
            shared.stop()
            delete_topics(clients, [anchor.topic, anchor.dlq_topic])
