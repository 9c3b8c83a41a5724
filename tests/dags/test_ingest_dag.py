"""The ingest DAG run for real: ``airflow dags test`` against the stack's metadata database,
real Kafka and a fresh Postgres database, with a pipelines file of random topics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest_dev.samples import produce_sample, produce_state_sample
from tests.support.airflow_api import last_task_state
from tests.support.dag_runs import run_dag
from tests.support.pipelines import dag_env

DAG_ID = "telemetry_metrics_ingest"

pytestmark = pytest.mark.integration



def _one(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def test_telemetry_ingest_dag_loads_the_table(stack_env: dict[str, str], clients: Any,
                                              make_pipeline: Any, pg_dsn: str,
                                              tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=700)
    sample = produce_sample(clients, pipeline, count=3000, poison=1)
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline)}

    proc = run_dag(DAG_ID, env, log_file=tmp_path / "run1.log")
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
    # the Asset was updated
    assert last_task_state(stack_env, DAG_ID, "table_updated") == "success"

    # A second scheduled-style run finds nothing new and changes nothing.
    proc = run_dag(DAG_ID, env, log_file=tmp_path / "run2.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    assert _one(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets WHERE topic = %s",
                pipeline.topic) == sample["produced"]
    # no new rows, no Asset event
    assert last_task_state(stack_env, DAG_ID, "table_updated") == "skipped"


def test_a_bad_trigger_form_fails_in_plan_before_reading(stack_env: dict[str, str],
                                                         clients: Any, make_pipeline: Any,
                                                         pg_dsn: str, tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics")
    produce_sample(clients, pipeline, count=50, poison=0)
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline)}

    proc = run_dag(DAG_ID, env, conf={"partitions": {"7": [0, 10]}},
                   log_file=tmp_path / "bad.log")

    output = proc.stdout + proc.stderr
    assert "partition 7 does not exist" in output
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == 0
    assert _one(pg_dsn, "SELECT count(*) FROM ingest_runs") == 0


def test_the_declared_state_pipeline_dag_mirrors_its_compacted_topic(
        stack_env: dict[str, str], clients: Any, make_pipeline: Any, pg_dsn: str,
        tmp_path: Path) -> None:
    """The shipped pipeline declared without Python, run by its DAG: the table holds each
    account's last record of the log, and no account whose last record is a tombstone."""
    pipeline = make_pipeline("account_balances", chunk_size=400,
                             source_topic_config={"cleanup.policy": "compact"})
    sample = produce_state_sample(clients, pipeline, accounts=150, updates=1500)
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline)}

    proc = run_dag("account_balances_ingest", env, log_file=tmp_path / "run.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    with psycopg.connect(pg_dsn) as conn:
        stored = dict(conn.execute("SELECT account_id, event_id FROM account_balances"))
        markers = {r[0] for r in conn.execute("SELECT account_id FROM account_balances_tombstones")}
        dead = dict(conn.execute("SELECT error_class, count(*) FROM dead_letters GROUP BY 1"))
        traced = _one(pg_dsn, "SELECT count(*) FROM account_balances WHERE trace_id IS NULL")
    assert stored == sample.final
    assert markers == sample.deleted and sample.deleted
    assert dead == sample.poison
    assert traced == 0  # every record carried its trace-id header into the row
