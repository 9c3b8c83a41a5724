"""The example DAG scheduled on a table's Asset aggregates only complete windows, run for
real: the ingest DAG loads records with known Kafka timestamps (``airflow dags test``, real
Kafka, a fresh Postgres database) and updates the table's Asset; then the example DAG runs
against that Asset event (``tests/support/asset_run.py``: the run consumes the event as an
Asset-triggered run does) and its figures are read back from XCom.

Two partitions, one record a minute (by Kafka timestamp, or by the payload's ``timestamp``
for a pipeline whose ``event_time`` names it) from a 5-minute boundary T0: partition 0 up to
T0 + 16 min, partition 1 up to T0 + 12 min. The run's watermark is the minimum of the
partitions' latest, T0 + 12 min; the windows that end at or before it are [T0 - 5, T0),
[T0, T0 + 5) and [T0 + 5, T0 + 10). [T0 + 10, T0 + 15) has rows in the table (8), but
partition 1's records of it may still be on their way: it must not be aggregated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest_dev.procs import child_env
from tests.support.airflow_api import metadata_dsn
from tests.support.dag_runs import run_dag
from tests.support.pipelines import dag_env

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: Minutes after T0 of each partition's records.
MINUTES = {0: range(17), 1: range(13)}

pytestmark = pytest.mark.integration


def _produce(clients: Any, topic: str, *, kafka_timestamps: bool) -> int:
    """The records, their event time in the payload's ``timestamp`` and, with
    ``kafka_timestamps``, in their Kafka timestamp too (else the producer's clock: now)."""
    producer = clients.producer()
    n = 0
    for partition, minutes in MINUTES.items():
        for m in minutes:
            at = T0 + timedelta(minutes=m)
            value = {"event_id": f"p{partition}-m{m}", "device_id": f"device-{partition}",
                     "timestamp": at.timestamp(), "metric_value": float(m), "version": 2}
            producer.produce(topic, value=json.dumps(value).encode(), partition=partition,
                             **({"timestamp": int(at.timestamp() * 1000)}
                                if kafka_timestamps else {}))
            n += 1
    assert producer.flush(30) == 0
    return n


def _airflow_db(stack_env: dict[str, str]) -> str:
    return metadata_dsn(stack_env)


def _asset_event(stack_env: dict[str, str], uri: str, topic: str) -> tuple[int, dict[str, Any]]:
    """The id and extra of this test's ingest run's Asset event (the URI is shared by every
    test's telemetry pipeline; the topic is this test's own)."""
    with psycopg.connect(_airflow_db(stack_env)) as conn:
        rows = conn.execute(
            "SELECT e.id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.uri = %s ORDER BY e.id DESC LIMIT 50", (uri,)).fetchall()
    mine = [(i, x if isinstance(x, dict) else json.loads(x or "{}")) for i, x in rows]
    mine = [(i, x) for i, x in mine if any(r.get("topic") == topic for r in x.get("offsets", []))]
    assert len(mine) == 1, mine
    return mine[0]


def _figures(stack_env: dict[str, str], dag_id: str, run_id: str) -> Any:
    with psycopg.connect(_airflow_db(stack_env)) as conn:
        [value] = conn.execute("SELECT value FROM xcom WHERE dag_id = %s AND run_id = %s AND "
                               "task_id = 'aggregate' AND key = 'return_value'",
                               (dag_id, run_id)).fetchone() or [None]
    return value if not isinstance(value, str | bytes) else json.loads(value)


@pytest.mark.parametrize("event_time", [
    None,  # the default: by the records' Kafka timestamps
    # by the payload's field, the Kafka timestamps being the time of the test: the
    # watermark and the windows must be the payload's
    "timestamp",
])
def test_the_example_dag_aggregates_only_the_complete_windows(
        stack_env: dict[str, str], clients: Any, make_pipeline: Any, pg_dsn: str,
        tmp_path: Path, event_time: str | None) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=2, event_time=event_time)
    produced = _produce(clients, pipeline.topic, kafka_timestamps=event_time is None)
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline),
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins")}

    ingest = run_dag(f"{pipeline.name}_ingest", env, log_file=tmp_path / "ingest.log")
    assert ingest.returncode == 0, (ingest.stdout + ingest.stderr)[-3000:]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f"SELECT count(*) FROM {pipeline.table}").fetchone() == (produced,)
    event_id, extra = _asset_event(stack_env, pipeline.asset_uri, pipeline.topic)
    assert datetime.fromisoformat(extra["watermark"]) == T0 + timedelta(minutes=12)
    assert extra["event_time"] == (event_time or "kafka_timestamp")

    dag_id = f"{pipeline.name}_complete_windows"
    proc = subprocess.run([sys.executable, "-m", "tests.support.asset_run", dag_id,
                           str(event_id)], env=child_env(env), cwd=ROOT, capture_output=True,
                          text=True, check=False)
    (tmp_path / "windows.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    run_id = proc.stdout.split("DAG run ", 1)[1].rsplit(": ", 1)[0]

    figures = _figures(stack_env, dag_id, run_id)
    windows = [(datetime.fromisoformat(f["start"]), f["count"]) for f in figures]
    five = timedelta(minutes=5)
    # partition 0's minutes 0-4 and partition 1's: 10 records a window; none before T0
    assert windows == [(T0 - five, 0), (T0, 10), (T0 + five, 10)]
    assert [f["avg"] for f in figures] == [None, 2.0, 7.0]
