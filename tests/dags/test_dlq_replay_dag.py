"""The DLQ-replay DAG run for real: ``airflow dags test -c <conf>`` against the stack's
metadata database, real Kafka and a fresh Postgres database, with a pipelines file of
random topics.

The dead letters are made in-process (ingest with contract v1 while the topic carries v2
events); the DAG then runs with the pipelines file saying v2.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline
from kafka_ingest.engine.ingest import ingest_range, plan_run
from tests.support.airflow_api import last_task_state
from tests.support.dag_runs import run_dag
from tests.support.pipelines import dag_env

pytestmark = pytest.mark.integration

V2, NAN, GOOD = 6, 2, 10
DAG_ID = "telemetry_metrics_dlq_replay"



def _rows(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchall()


def _value(i: int, tag: str, *, version: int, nan: bool = False) -> bytes:
    return json.dumps({"event_id": f"{tag}-{version}-{nan}-{i}", "device_id": "d",
                       "timestamp": 1_767_225_600.0 + i,
                       "metric_value": float("nan") if nan else 1.5, "version": version},
                      allow_nan=True).encode()


@pytest.fixture
def parked(make_pipeline: Any, clients: Any, db: Any) -> Pipeline:
    """v1 ingested GOOD rows and parked V2 unknown_version + NAN contract_violation."""
    v1 = make_pipeline("telemetry_metrics", partitions=2,
                       contract={"event_type": "metric_event", "version": 1})
    tag = uuid.uuid4().hex[:6]
    producer = clients.producer()
    values = ([_value(i, tag, version=1) for i in range(GOOD)]
              + [_value(i, tag, version=2) for i in range(V2)]
              + [_value(i, tag, version=1, nan=True) for i in range(NAN)])
    for i, value in enumerate(values):
        producer.produce(v1.topic, value=value, key=b"k", partition=i % 2)
    assert producer.flush(30) == 0
    for r in plan_run(v1, clients, db, run_id="setup"):
        ingest_range(v1, r, clients, db, run_id="setup")
    body = v1.model_dump(mode="json")
    body["contract"]["version"] = 2
    return Pipeline.model_validate(body)


def test_replay_dag_dry_run_then_replay(stack_env: dict[str, str], parked: Pipeline,
                                        pg_dsn: str, tmp_path: Path) -> None:
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, parked)}
    count = "SELECT count(*) FROM telemetry_metrics"
    by_status = ("SELECT status, error_class, attempts, count(*) FROM dead_letters"
                 " GROUP BY 1, 2, 3 ORDER BY 1, 2")
    assert _rows(pg_dsn, by_status) == [("parked", "contract_violation", 1, NAN),
                                        ("parked", "unknown_version", 1, V2)]

    dry = run_dag(DAG_ID, env, conf={"dry_run": True}, log_file=tmp_path / "dry.log")
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
    assert "'recovered': 6, 'still_parked': 2" in dry.stdout + dry.stderr
    assert _rows(pg_dsn, count) == [(GOOD,)]
    assert _rows(pg_dsn, by_status)[1] == ("parked", "unknown_version", 1, V2)
    assert last_task_state(stack_env, DAG_ID, "table_updated") == "skipped"  # nothing written

    real = run_dag(DAG_ID, env, log_file=tmp_path / "real.log")
    assert real.returncode == 0, (real.stdout + real.stderr)[-3000:]
    assert _rows(pg_dsn, count) == [(GOOD + V2,)]
    assert last_task_state(stack_env, DAG_ID, "table_updated") == "success"  # Asset updated
    assert _rows(pg_dsn, by_status) == [("parked", "contract_violation", 2, NAN),
                                        ("recovered", "unknown_version", 2, V2)]
    recovered = _rows(pg_dsn, "SELECT count(*) FROM telemetry_metrics t JOIN dead_letters d"
                              " USING (source_topic, source_partition, source_offset)"
                              " WHERE d.status = 'recovered'")
    assert recovered == [(V2,)]  # the rows carry the original source offsets
    cursor = _rows(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets"
                           f" WHERE topic = '{parked.dlq_topic}'")
    assert cursor == [(V2 + NAN,)]


def test_a_bad_replay_form_fails_in_plan(stack_env: dict[str, str], parked: Pipeline,
                                         pg_dsn: str, tmp_path: Path) -> None:
    """The one bad form that needs the broker to be found; the others are unit-tested
    (tests/unit/test_trigger_params.py) on the same function the plan task calls."""
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, parked)}
    proc = run_dag(DAG_ID, env, conf={"partitions": {"7": [0, 1]}},
                   log_file=tmp_path / "bad.log")
    output = proc.stdout + proc.stderr
    assert "partition 7 does not exist" in output
    assert "AirflowFailException: TriggerParamsError" in output  # failed at once, no retry
    assert "state=failed" in output
    assert _rows(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == [(GOOD,)]
    assert _rows(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE mode = 'replay'") == [(0,)]
    assert _rows(pg_dsn, "SELECT count(*) FROM run_plans WHERE mode = 'replay'") == [(0,)]


def test_airflow_backfill_runs_of_the_ingest_dag_get_adjacent_time_windows(
        stack_env: dict[str, str]) -> None:
    """``airflow backfill create`` runs carry the data interval of their schedule; Airflow
    3's default cron timetable makes it a point (start == end), which no time window can
    be made of. The ingest DAGs use intervals that tile the time line instead."""
    import sys

    import pendulum
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.timetables.base import TimeRestriction
    from airflow.timetables.interval import CronDataIntervalTimetable as CoreTimetable

    from kafka_ingest.requests import TimeWindow, ingest_request

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "dags"))
    import ingest_dags

    dag = ingest_dags.build_ingest_dag(next(iter(ingest_dags.load_pipelines().values())))
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    timetable = CoreTimetable(dag.timetable.expression, timezone="UTC")
    start = pendulum.datetime(2026, 5, 1, 10, 40, tz="UTC")
    first = timetable.next_dagrun_info(last_automated_data_interval=None,
                                       restriction=TimeRestriction(start, None, True))
    assert first is not None
    second = timetable.next_dagrun_info(last_automated_data_interval=first.data_interval,
                                        restriction=TimeRestriction(start, None, True))
    assert second is not None
    windows = [ingest_request({}, run_type="backfill", now=pendulum.now("UTC"),
                              interval=(i.data_interval.start, i.data_interval.end))
               for i in (first, second)]
    assert all(isinstance(w, TimeWindow) for w in windows)
    assert windows[0].to_ms == windows[1].from_ms > windows[0].from_ms  # type: ignore[union-attr]
