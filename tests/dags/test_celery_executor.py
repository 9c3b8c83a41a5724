"""The ingest DAG on Airflow's distributed executor, for real: the stack's CeleryExecutor
(``kafka-ingest stack up --airflow --executor celery --workers 2``: Redis as the broker,
the metadata database as the result backend, two ``airflow celery worker`` processes that
each report their own hostname), driven through the REST API.

- the mapped slices of one run spread over both workers, and rows and offsets are exact;
- a worker SIGKILLed (with its task processes: a machine lost) in the middle of a slice:
  Airflow sees the task's heartbeat stop, retries it on the surviving worker, and the run
  ends with nothing lost, nothing duplicated and the offsets at the high watermarks;
- a pool of one slot (named in the pipelines file, created by the stack) runs the slices
  one after another.

One set of services serves the three tests (starting them costs most of the time); each
test has its own pipeline, topics and database (an Airflow connection per pipeline).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest_dev import stack
from kafka_ingest_dev.databases import airflow_postgres_conn, create_database, drop_database
from kafka_ingest_dev.samples import produce_sample
from tests.support.airflow_api import AirflowApi, poll, running_airflow
from tests.support.deadlines import run_deadline_s, setting
from tests.support.ingest import (
    assert_invariants,
    expected_from_sample,
    highs,
    stored_offsets,
)
from tests.support.pipelines import write_pipelines_file
from tests.support.topics import delete_topics

pytestmark = pytest.mark.integration

WORKERS = 2
PARTITIONS = 3
#: Airflow notices a task whose heartbeat stopped after this many seconds (default 300),
#: checking every two; live tasks heartbeat every 5 s ([workers] min_heartbeat_interval).
#: A task whose Celery message went down with a killed worker before it started (each
#: worker reserves the next message while it runs one) stays queued until the scheduler's
#: queued time-out requeues it (default 600 s, checked every 120). The waits' deadlines
#: follow from these (tests.support.deadlines).
SCHEDULER = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "30",
    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "5",
}
# (pipeline key, events, poison rounds, overrides)
CASES = {
    "spread": (3_000, 1, {"chunk_size": 200}),
    # Many small chunks (one transaction each): the slice lasts long enough to be caught
    # with chunks committed and chunks to go.
    "kill": (9_000, 1, {"chunk_size": 10, "retries": 2}),
    "pool": (600, 0, {"chunk_size": 100, "pool_slots": 1}),
}


@pytest.fixture(scope="module")
def celery(stack_env: dict[str, str], clients: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Any]]:
    """Three pipelines (own topics, database and Postgres connection each) and the stack's
    Airflow services on the CeleryExecutor with two workers."""
    admin_dsn = stack_env["KAFKA_INGEST_PG_DSN"]
    tag = uuid.uuid4().hex[:6]
    bodies, dsns, env = {}, {}, {}
    for key, (_, _, overrides) in CASES.items():
        name = f"cel_{tag}_{key}"
        dsns[name] = create_database(admin_dsn)
        conn_id = f"pg_{name}"
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = airflow_postgres_conn(dsns[name])
        bodies[name] = {
            "topic": f"src-{name}", "dlq_topic": f"dlq-{name}", "table": "telemetry_metrics",
            "contract": {"event_type": "metric_event", "version": 2}, "schedule": None,
            "retries": 0, "postgres_conn_id": conn_id, "partitions": PARTITIONS,
            # Airflow itself ends a hung try after a minute (not the default hour), which
            # bounds how long a run may take and so each wait's deadline.
            "task_timeout_minutes": 1,
            **({"pool": f"{name}_writers"} if key == "pool" else {}), **overrides,
        }
    pipelines = parse_pipelines({"pipelines": bodies})
    topics = [t for p in pipelines.values() for t in (p.topic, p.dlq_topic)]
    ensure_topics(clients, dict.fromkeys(topics, PARTITIONS))
    path = write_pipelines_file(tmp_path_factory.mktemp("celery") / "p.yaml",
                                *pipelines.values())
    env["KAFKA_INGEST_PIPELINES"] = str(path)
    dag_ids = [f"{name}_ingest" for name in pipelines]
    try:
        with running_airflow(env, dag_ids, extra=SCHEDULER, executor="celery",
                             workers=WORKERS) as api:
            for dag_id in dag_ids:
                api.unpause(dag_id)
            yield {"api": api, "pipelines": pipelines, "dsns": dsns, "env": env}
    finally:
        delete_topics(clients, topics)
        for dsn in dsns.values():
            drop_database(admin_dsn, dsn)


def _case(celery: dict[str, Any], key: str) -> tuple[Pipeline, str, str]:
    name = next(n for n in celery["pipelines"] if n.endswith(f"_{key}"))
    return celery["pipelines"][name], celery["dsns"][name], f"{name}_ingest"


def _produce(clients: Any, pipeline: Pipeline, key: str) -> Any:
    count, poison, _ = CASES[key]
    sample = produce_sample(clients, pipeline, count=count, poison=poison,
                            partitions=PARTITIONS)
    return expected_from_sample(pipeline, sample, count=count, poison=poison,
                                partitions=PARTITIONS)


def _finished(api: AirflowApi, pipeline: Pipeline, dag_id: str, run_id: str, *,
              from_kill: bool = False) -> float:
    """Wait for the run to succeed, at most as long as Airflow may take; the deadline."""
    deadline = run_deadline_s(pipeline, api.settings, slices=PARTITIONS, from_kill=from_kill)
    state = api.wait_for_run(dag_id, run_id, deadline)
    assert state == "success", api.task_states(dag_id, run_id)
    return deadline


def test_mapped_slices_spread_over_the_workers(celery: dict[str, Any], clients: Any) -> None:
    api: AirflowApi = celery["api"]
    pipeline, dsn, dag_id = _case(celery, "spread")
    expected = _produce(clients, pipeline, "spread")

    run_id = api.trigger(dag_id, {})
    _finished(api, pipeline, dag_id, run_id)

    slices = api.task_instances(dag_id, run_id, "ingest")
    assert len(slices) == PARTITIONS
    hosts = {t["hostname"] for t in slices}
    print(f"slices by worker: {sorted((t['rendered_map_index'], t['hostname']) for t in slices)}")
    assert all(h.startswith("worker-") for h in hosts), hosts  # each worker's own name
    assert len(hosts) >= 2, hosts
    # and they ran at once (so the pool test's one-at-a-time is the pool's doing)
    spans = sorted((_when(t["start_date"]), _when(t["end_date"])) for t in slices)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)), spans
    assert_invariants(pipeline, clients, dsn, expected)
    assert api.xcom(dag_id, run_id, "report")["inserted"] == len(expected.ids)


def _doomed_slice(api: AirflowApi, dag_id: str, run_id: str, dsn: str, pipeline: Pipeline,
                  end: dict[int, int]) -> dict[str, Any] | None:
    """A running slice on a worker, with chunks committed and chunks to go."""
    offsets = stored_offsets(dsn, pipeline)
    for ti in api.task_instances(dag_id, run_id, "ingest"):
        if ti["state"] != "running" or not ti["hostname"] or not ti["pid"]:
            continue
        partition = int(ti["rendered_map_index"])
        if 0 < offsets.get(partition, 0) < end[partition] * 0.6:
            return {**ti, "partition": partition}
    return None


def _kill_worker(celery: dict[str, Any], node: str) -> list[int]:
    """SIGKILL the Celery worker ``node`` and its task processes, as a lost machine."""
    return stack.settings().airflow.kill_worker(node.split("@", maxsplit=1)[0])


#: The kill test's own pytest time-out: its run's deadline from the kill is 1,055 s
#: (tests.support.deadlines), above the session's 600 s; the test checks it still fits.
KILL_TIMEOUT_S = 1_055 + 300


@pytest.mark.timeout(KILL_TIMEOUT_S)
def test_a_worker_killed_mid_slice_is_retried_on_a_worker(celery: dict[str, Any],
                                                          clients: Any) -> None:
    api: AirflowApi = celery["api"]
    pipeline, dsn, dag_id = _case(celery, "kill")
    from_kill = run_deadline_s(pipeline, api.settings, slices=PARTITIONS, from_kill=True)
    assert from_kill + 300 <= KILL_TIMEOUT_S, f"raise KILL_TIMEOUT_S above {from_kill:.0f} s"
    expected = _produce(clients, pipeline, "kill")
    end = highs(clients, pipeline.topic)

    run_id = api.trigger(dag_id, {})
    doomed = poll("a slice half done", lambda: _doomed_slice(
        api, dag_id, run_id, dsn, pipeline, end),
        run_deadline_s(pipeline, api.settings, slices=PARTITIONS), interval_s=0.2)
    killed = _kill_worker(celery, doomed["hostname"])
    killed_at, killed_on = time.monotonic(), datetime.now(tz=UTC)
    assert doomed["pid"] in killed  # the task process itself went down with its worker
    last_beat = _last_heartbeat(api, dag_id, run_id, doomed["map_index"])
    time.sleep(1)  # nothing of the dead slice may commit from here on
    partition = doomed["partition"]
    at_kill = stored_offsets(dsn, pipeline)[partition]
    assert 0 < at_kill < end[partition], "the worker was not killed in the middle of a slice"

    deadline = _finished(api, pipeline, dag_id, run_id, from_kill=True)
    took = time.monotonic() - killed_at

    tries = api.tries(dag_id, run_id, "ingest", doomed["map_index"])
    seen = [(t["try_number"], t["state"], t["hostname"], t["start_date"], t["end_date"])
            for t in tries]
    print(f"partition {partition}: killed on {doomed['hostname']} at offset {at_kill} of "
          f"{end[partition]}; the run ended {took:.0f} s later (deadline {deadline:.0f} s); "
          f"tries: {seen}")
    assert len(tries) >= 2
    assert tries[0]["hostname"] == doomed["hostname"]
    assert tries[0]["state"] != "success"
    # failed for its silence, not on anyone's word: no sooner than the heartbeat time-out
    # after the last heartbeat the dead try recorded (read just after the kill; on a busy
    # machine it may be more than one interval before it)
    silent_s = (_when(tries[0]["end_date"]) - last_beat).total_seconds()
    assert silent_s >= setting(api.settings, "scheduler", "task_instance_heartbeat_timeout"), \
        (silent_s, last_beat, killed_on)
    assert tries[-1]["state"] == "success"
    assert tries[-1]["hostname"].startswith("worker-")
    # Nothing lost, nothing duplicated, offsets at the end (the DLQ topic may hold a pill
    # twice: produced by the killed try, again by the retry; the table never does).
    assert_invariants(pipeline, clients, dsn, expected, dlq_exactly_once=False)
    with psycopg.connect(dsn) as conn:
        resumed = conn.execute("SELECT min(start_offset) FROM ingest_runs WHERE partition = %s"
                               " AND start_offset >= %s", (partition, at_kill)).fetchone()
    assert resumed == (at_kill,)  # the retry resumed from the stored offset

    # `stack up` brings the lost worker back (and only it).
    stack.up(airflow=True, airflow_env=celery["env"] | SCHEDULER, executor="celery",
             workers=WORKERS)
    services = stack.settings().airflow
    assert services.ping_workers([doomed["hostname"]]) == {doomed["hostname"]}


def _last_heartbeat(api: AirflowApi, dag_id: str, run_id: str, map_index: int) -> datetime:
    """The last heartbeat the running try of a mapped ``ingest`` task recorded, from
    Airflow's metadata database (the REST API does not show it)."""
    url = api.settings["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", "")
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT last_heartbeat_at FROM task_instance WHERE dag_id = %s AND run_id = %s "
            "AND task_id = 'ingest' AND map_index = %s", (dag_id, run_id, map_index)).fetchone()
    assert row is not None and row[0] is not None, "the killed try recorded no heartbeat"
    return row[0]


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def test_a_pool_of_one_slot_runs_the_slices_one_at_a_time(celery: dict[str, Any],
                                                          clients: Any) -> None:
    api: AirflowApi = celery["api"]
    pipeline, dsn, dag_id = _case(celery, "pool")
    assert pipeline.pool and pipeline.max_parallel_partitions > 1
    assert api.get(f"/pools/{pipeline.pool}")["slots"] == 1  # made by `stack up`
    expected = _produce(clients, pipeline, "pool")

    run_id = api.trigger(dag_id, {})
    _finished(api, pipeline, dag_id, run_id)

    slices = sorted(api.task_instances(dag_id, run_id, "ingest"),
                    key=lambda t: _when(t["start_date"]))
    assert len(slices) == PARTITIONS
    assert {t["pool"] for t in slices} == {pipeline.pool}
    for before, after in itertools.pairwise(slices):
        assert _when(after["start_date"]) >= _when(before["end_date"]), (before, after)
    assert_invariants(pipeline, clients, dsn, expected)
