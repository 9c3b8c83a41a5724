"""The ingest DAG run for real: ``airflow dags test`` against the stack's metadata database,
real Kafka and a fresh Postgres database, with a pipelines file of random topics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from kafka_ingest.demo import run_dag
from kafka_ingest.samples import produce_sample
from tests.conftest import airflow_postgres_conn, write_pipelines_file

pytestmark = pytest.mark.integration


def _dag_env(tmp_path: Path, pg_dsn: str, *pipelines: Any) -> dict[str, str]:
    return {
        "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", *pipelines)),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(pg_dsn),
    }


def _one(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def _last_state(stack_env: dict[str, str], task_id: str) -> str:
    """The state of ``task_id`` in the newest run of the ingest DAG (metadata database)."""
    dsn = make_conninfo(stack_env["KAFKA_INGEST_PG_DSN"], dbname="airflow")
    return str(_one(dsn, "SELECT ti.state FROM task_instance ti JOIN dag_run r"
                         " ON r.dag_id = ti.dag_id AND r.run_id = ti.run_id"
                         " WHERE ti.dag_id = 'telemetry_metrics_ingest' AND ti.task_id = %s"
                         " ORDER BY r.id DESC LIMIT 1", task_id))


def test_telemetry_ingest_dag_loads_the_table(stack_env: dict[str, str], clients: Any,
                                              make_pipeline: Any, pg_dsn: str,
                                              tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=700)
    sample = produce_sample(clients, pipeline, count=3000, poison=1)
    env = {**stack_env, **_dag_env(tmp_path, pg_dsn, pipeline)}

    proc = run_dag("telemetry_metrics_ingest", env, log_file=tmp_path / "run1.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    rows = _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics")
    assert rows == sample["expect"]["row"]
    dead = _one(pg_dsn, "SELECT count(*) FROM dead_letters WHERE pipeline = %s", pipeline.name)
    poison = sum(n for k, n in sample["expect"].items()
                 if k not in {"row", "duplicate", "tombstone"})
    assert dead == poison
    stored = _one(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets WHERE topic = %s",
                  pipeline.topic)
    assert stored == sample["produced"]
    audit = _one(pg_dsn, "SELECT count(DISTINCT run_id) FROM ingest_runs")
    assert audit == 1
    assert _last_state(stack_env, "table_updated") == "success"  # the Asset was updated

    # A second scheduled-style run finds nothing new and changes nothing.
    proc = run_dag("telemetry_metrics_ingest", env, log_file=tmp_path / "run2.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    assert _one(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets WHERE topic = %s",
                pipeline.topic) == sample["produced"]
    assert _last_state(stack_env, "table_updated") == "skipped"  # no new rows, no Asset event


def test_a_bad_trigger_form_fails_in_plan_before_reading(stack_env: dict[str, str],
                                                         clients: Any, make_pipeline: Any,
                                                         pg_dsn: str, tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics")
    produce_sample(clients, pipeline, count=50, poison=0)
    env = {**stack_env, **_dag_env(tmp_path, pg_dsn, pipeline)}

    proc = run_dag("telemetry_metrics_ingest", env, conf={"partitions": {"7": [0, 10]}},
                   log_file=tmp_path / "bad.log")

    output = proc.stdout + proc.stderr
    assert "partition 7 does not exist" in output
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == 0
    assert _one(pg_dsn, "SELECT count(*) FROM ingest_runs") == 0
