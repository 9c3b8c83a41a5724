"""``schedule: on_data`` on the real scheduler and triggerer (``stack up --airflow``): the
lag trigger starts a run within ``max_wait_seconds`` (plus the scheduler's own loops) of
new data, none while the topic is quiet, exactly one follow-up for a burst that lands
during a run, and a paused DAG, whose Asset Airflow stops watching, picks up the lag that
grew meanwhile once unpaused. Rows, dead letters and
stored offsets are exact after each, as for any run.

Each wait follows a deadline derived from the pipeline's settings and Airflow's
(:mod:`tests.support.deadlines`); the measured delays are printed, never asserted as timings.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest_dev.airflow_services import watchers_running
from kafka_ingest_dev.samples import produce_sample
from tests.support.airflow_api import AirflowApi, SharedAirflow, metadata_dsn, poll
from tests.support.deadlines import MARGIN_S, parse_deadline_s, run_deadline_s

pytestmark = pytest.mark.integration

PARTITIONS = 2
MIN_BATCH = 400
MAX_WAIT_S = 6.0
POLL_S = 1.0
#: Above the longest run (as the setting asks): a slice is failed at task_timeout_minutes
#: (2) and has no retry, plus the plan's and the scheduler's share. A shorter one re-fires
#: the trigger while a run still works on a busy machine (an extra run: what it is for).
REARM_S = 2 * 60 + 30.0


@pytest.fixture
def pipeline(topics: Callable[..., str]) -> Pipeline:
    name = f"ondata_{uuid.uuid4().hex[:8]}"
    doc = {"pipelines": {name: {
        "topic": topics(PARTITIONS, "src"), "dlq_topic": topics(PARTITIONS, "dlq"),
        "table": "telemetry_metrics", "contract": {"event_type": "metric_event", "version": 2},
        "schedule": "on_data", "retries": 0, "task_timeout_minutes": 2,
        "on_data": {"min_batch": MIN_BATCH, "max_wait_seconds": MAX_WAIT_S,
                    "poll_seconds": POLL_S, "rearm_seconds": REARM_S,
                    "safety_schedule": "0 0 1 1 *"},  # never during the test
    }}}
    return parse_pipelines(doc)[name]


@pytest.fixture
def api(shared_airflow: SharedAirflow, pipeline: Pipeline, pg_dsn: str
        ) -> Iterator[AirflowApi]:
    with shared_airflow.serving([pipeline], pg_dsn) as a:
        yield a


def _runs(api: AirflowApi, dag_id: str) -> list[dict[str, Any]]:
    """The runs the lag trigger caused (not the safety cron's: its one missed tick may run
    when the DAG is first unpaused, as Airflow runs a cron DAG's latest tick)."""
    runs = api.get(f"/dags/{dag_id}/dagRuns?order_by=run_after&limit=100")["dag_runs"]
    return [r for r in runs if r["run_type"] == "asset_triggered"]


def _one(dsn: str, query: str, *args: Any) -> Any:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def _fire_deadline_s(api: AirflowApi) -> float:
    """From new data to a queued run: the watch's wait, a poll, the scheduler's loops."""
    return MAX_WAIT_S + 2 * POLL_S + MARGIN_S


def _new_run(api: AirflowApi, dag_id: str, seen: set[str], timeout_s: float
             ) -> dict[str, Any]:
    def fresh() -> dict[str, Any] | None:
        return next((r for r in _runs(api, dag_id) if r["dag_run_id"] not in seen), None)
    run = poll(f"a run of {dag_id} caused by new data", fresh, timeout_s, interval_s=0.5)
    seen.add(run["dag_run_id"])
    return dict(run)


def _finish(api: AirflowApi, pipeline: Pipeline, dag_id: str, run: dict[str, Any]) -> None:
    state = api.wait_for_run(dag_id, run["dag_run_id"],
                             run_deadline_s(pipeline, api.settings, slices=PARTITIONS))
    assert state == "success", api.task_states(dag_id, run["dag_run_id"])


def _stays_quiet(api: AirflowApi, dag_id: str, seen: set[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        extra = [r["dag_run_id"] for r in _runs(api, dag_id) if r["dag_run_id"] not in seen]
        assert not extra, f"runs started while nothing was new: {extra}"
        time.sleep(1)


def _asset_events_since(airflow_dsn: str, asset: str, since: float) -> int:
    """The Asset's events (a lag trigger firing) after ``since`` (epoch seconds)."""
    return int(_one(airflow_dsn, "SELECT count(*) FROM asset_event e JOIN asset a"
                    " ON a.id = e.asset_id WHERE a.name = %s AND e.timestamp > to_timestamp(%s)",
                    asset, since))


def _queued_runs(airflow_dsn: str, dag_id: str) -> int:
    """The Asset events queued for the DAG (Airflow's asset_dag_run_queue), from which the
    scheduler makes its asset-triggered runs."""
    return int(_one(airflow_dsn, "SELECT count(*) FROM asset_dag_run_queue"
                    " WHERE target_dag_id = %s", dag_id))


def _queued_after(run: dict[str, Any], produced_at: float) -> float:
    return datetime.fromisoformat(run["queued_at"]).timestamp() - produced_at


def test_on_data_runs_on_new_data_once_per_burst_never_while_quiet_and_after_a_pause(
        api: AirflowApi, shared_airflow: SharedAirflow, pipeline: Pipeline, clients: Any,
        pg_dsn: str, stack_env: dict[str, str]) -> None:
    dag_id = f"{pipeline.name}_ingest"
    seen: set[str] = set()
    api.unpause(dag_id)
    # the scheduler registers the Asset's watcher, a triggerer picks its trigger up
    airflow_dsn = metadata_dsn(stack_env)
    poll("the lag trigger to run in the triggerer",
         lambda: watchers_running(airflow_dsn, f"{pipeline.name}_new_data"),
         parse_deadline_s(api.settings) + MARGIN_S)

    # quiet: the topic is empty, the trigger starts nothing
    _stays_quiet(api, dag_id, seen, 3 * MAX_WAIT_S)

    # a few events (below min_batch): a run after max_wait
    produced_at = time.time()
    first = produce_sample(clients, pipeline, count=60, poison=2, partitions=PARTITIONS)
    assert first["produced"] < MIN_BATCH
    run = _new_run(api, dag_id, seen, _fire_deadline_s(api))
    print(f"max_wait: queued {_queued_after(run, produced_at):.1f} s after the produce")

    # a burst once that run has pinned its ranges: exactly one follow-up run
    api.wait_for_task(dag_id, run["dag_run_id"], "plan",
                      run_deadline_s(pipeline, api.settings, slices=PARTITIONS))
    burst = produce_sample(clients, pipeline, count=1000, poison=5, partitions=PARTITIONS)
    assert burst["produced"] >= MIN_BATCH
    _finish(api, pipeline, dag_id, run)
    follow = _new_run(api, dag_id, seen, _fire_deadline_s(api))
    _finish(api, pipeline, dag_id, follow)
    _stays_quiet(api, dag_id, seen, 3 * MAX_WAIT_S)
    rows = first["expect"]["row"] + burst["expect"]["row"]
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows
    dead = _one(pg_dsn, "SELECT count(*) FROM dead_letters WHERE pipeline = %s", pipeline.name)
    assert dead == sum(n for s in (first, burst) for k, n in s["expect"].items()
                       if k not in ("row", "duplicate", "tombstone"))
    assert _one(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets WHERE pipeline = %s",
                pipeline.name) == first["produced"] + burst["produced"]

    # paused: once the DAG file is parsed again, the Asset's watcher is retired (Airflow
    # watches Assets of unpaused DAGs only); the lag grows and nothing runs. Unpaused, the
    # next parse starts a watcher, whose trigger starts a run for the waiting lag.
    api.client.patch(f"/dags/{dag_id}", json={"is_paused": True}).raise_for_status()
    asset = f"{pipeline.name}_new_data"
    shared_airflow.reparse()
    poll("the paused DAG's Asset watcher to be retired", lambda: not watchers_running(
        airflow_dsn, asset), parse_deadline_s(api.settings) + MARGIN_S, interval_s=0.5)
    produced_at = time.time()
    later = produce_sample(clients, pipeline, count=80, poison=0, partitions=PARTITIONS)
    _stays_quiet(api, dag_id, seen, 3 * MAX_WAIT_S)
    assert _asset_events_since(airflow_dsn, asset, produced_at) == 0
    assert _queued_runs(airflow_dsn, dag_id) == 0  # an asset-triggered run starts from these
    unpaused_at = time.time()
    api.unpause(dag_id)
    shared_airflow.reparse()
    run = _new_run(api, dag_id, seen, parse_deadline_s(api.settings) + _fire_deadline_s(api))
    print(f"after the pause: queued {_queued_after(run, unpaused_at):.1f} s after unpausing")
    _finish(api, pipeline, dag_id, run)
    assert _one(pg_dsn, "SELECT count(*) FROM telemetry_metrics") == rows + later["expect"]["row"]
    total = first["produced"] + burst["produced"] + later["produced"]
    assert _one(pg_dsn, "SELECT sum(next_offset) FROM ingest_offsets WHERE pipeline = %s",
                pipeline.name) == total
