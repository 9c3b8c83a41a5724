"""Airflow's own backfill, run by the real scheduler: ``airflow backfill create`` over two
hourly data intervals re-reads exactly the messages whose timestamps fall in them, and
never moves the live stored offset.

The DAG is unpaused (Airflow 3 leaves a paused DAG's backfill runs queued), so the
scheduler first makes its usual scheduled run, which ingests everything live; the test
then deletes the window's rows and backfills them back, as an operator would.

This runs the stack's own Airflow services (``kafka-ingest stack up --airflow``: api-server,
scheduler with the LocalExecutor, dag-processor, triggerer) against its metadata database,
on a pipelines file that holds one pipeline with a unique name, so nothing else in the
metadata database is touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import parse_pipelines
from kafka_ingest_dev.demo import _airflow_bin
from kafka_ingest_dev.samples import make_event
from tests.support.airflow_api import AirflowApi, SharedAirflow, metadata_dsn, poll
from tests.support.deadlines import run_deadline_s
from tests.support.pipelines import dag_env

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)


@pytest.fixture
def airflow_env(stack_env: dict[str, str], pg_dsn: str, tmp_path: Path,
                topics: Callable[..., str]) -> dict[str, Any]:
    name = f"bf_{uuid.uuid4().hex[:10]}"
    doc = {"pipelines": {name: {
        "topic": topics(2, "src"), "dlq_topic": topics(2, "dlq"), "table": "telemetry_metrics",
        "contract": {"event_type": "metric_event", "version": 2}, "schedule": "@hourly",
        "retries": 0, "task_timeout_minutes": 1,  # bounds each wait (tests.support.deadlines)
    }}}
    pipeline = parse_pipelines(doc)[name]
    env = {**os.environ, **stack_env, **dag_env(tmp_path, pg_dsn, pipeline)}
    return {"pipeline": pipeline, "env": env}


@pytest.fixture
def produced(airflow_env: dict[str, Any], clients: Any) -> dict[str, Any]:
    """The messages, produced before Airflow starts: the scheduler makes its scheduled run
    as soon as it sees the (unpaused) DAG, and that run must find them all."""
    h3 = datetime.now(tz=UTC).replace(minute=0, second=0, microsecond=0) - HOUR
    h1 = h3 - 2 * HOUR
    # 30 messages before the window, 40 in each of its two hours, 30 after it.
    stamps = ([h1 - timedelta(minutes=30 - i) for i in range(30)]
              + [h1 + timedelta(minutes=i * 1.5) for i in range(40)]
              + [h1 + HOUR + timedelta(minutes=i * 1.5) for i in range(40)]
              + [h3 + timedelta(seconds=i) for i in range(30)])
    return {"h1": h1, "ids": _produce_at(clients, airflow_env["pipeline"], stamps)}


@pytest.fixture
def airflow_api(shared_airflow: SharedAirflow, airflow_env: dict[str, Any], pg_dsn: str,
                produced: dict[str, Any]) -> Iterator[AirflowApi]:
    """The stack's Airflow services serving this test's pipeline, its DAG unpaused as soon
    as it is parsed (Airflow 3 leaves a paused DAG's backfill runs queued)."""
    with shared_airflow.serving([airflow_env["pipeline"]], pg_dsn) as api:
        api.unpause(f"{airflow_env['pipeline'].name}_ingest")
        yield api


def _produce_at(clients: Any, pipeline: Any, stamps: list[datetime]) -> list[str]:
    import random

    producer = clients.producer()
    rng = random.Random(3)
    ids = []
    for i, ts in enumerate(stamps):
        event = make_event(pipeline, i, "bf", rng)
        producer.produce(pipeline.topic, json.dumps(event).encode(), key=str(i % 7).encode(),
                         timestamp=int(ts.timestamp() * 1000))
        ids.append(event["event_id"])
    assert producer.flush(30) == 0
    return ids


def _airflow_db(stack_env: dict[str, str]) -> str:
    return metadata_dsn(stack_env)


def _runs(stack_env: dict[str, str], dag_id: str) -> list[tuple[str, str]]:
    with psycopg.connect(_airflow_db(stack_env)) as conn:
        return [(str(t), str(s)) for t, s in conn.execute(
            "SELECT run_type, state FROM dag_run WHERE dag_id = %s", (dag_id,))]


def test_airflow_backfill_maps_each_data_interval_to_offsets(
        stack_env: dict[str, str], pg_dsn: str, airflow_env: dict[str, Any],
        produced: dict[str, Any], airflow_api: AirflowApi) -> None:
    pipeline = airflow_env["pipeline"]
    dag_id = f"{pipeline.name}_ingest"
    h1, ids = produced["h1"], produced["ids"]
    inside = set(ids[30:110])

    def scheduled_run_done() -> set[str]:
        """The end states of the scheduled runs (one, or two if an hour began meanwhile)."""
        return {s for t, s in _runs(stack_env, dag_id)
                if t == "scheduled" and s in {"success", "failed"}}

    assert poll("the scheduled (live) run to finish", scheduled_run_done,
                run_deadline_s(pipeline, airflow_api.settings, slices=2)) == {"success"}
    with psycopg.connect(pg_dsn) as conn:
        assert {r[0] for r in conn.execute("SELECT event_id FROM telemetry_metrics")} == set(ids)
        live_offsets = conn.execute("SELECT partition, next_offset FROM ingest_offsets"
                                    " ORDER BY 1").fetchall()
        conn.execute("DELETE FROM telemetry_metrics WHERE event_id = ANY(%s)", (list(inside),))
    assert sum(o for _, o in live_offsets) == len(ids)

    create = subprocess.run(
        [_airflow_bin(), "backfill", "create", "--dag-id", dag_id,
         "--from-date", h1.isoformat(), "--to-date", (h1 + HOUR).isoformat()],
        env=airflow_env["env"], capture_output=True, text=True, check=False)
    assert create.returncode == 0, create.stdout + create.stderr

    def finished() -> list[tuple[str, str]] | None:
        runs = [r for r in _runs(stack_env, dag_id) if r[0] == "backfill"]
        return runs if len(runs) == 2 and all(s in {"success", "failed"} for _, s in runs) \
            else None

    runs = poll("both backfill runs to finish", finished,
                run_deadline_s(pipeline, airflow_api.settings, slices=2, runs=2))
    assert [s for _, s in runs] == ["success", "success"]
    with psycopg.connect(pg_dsn) as conn:
        loaded = {r[0] for r in conn.execute("SELECT event_id FROM telemetry_metrics")}
        read, inserted = conn.execute(
            "SELECT sum(read), sum(inserted) FROM ingest_runs WHERE mode = 'backfill'"
        ).fetchone() or (None, None)
        offsets = conn.execute("SELECT partition, next_offset FROM ingest_offsets"
                               " ORDER BY 1").fetchall()
    assert loaded == set(ids)  # exactly the deleted rows came back
    assert (read, inserted) == (len(inside), len(inside))  # the window, nothing around it
    assert offsets == live_offsets  # a backfill never moves the live stored offset
