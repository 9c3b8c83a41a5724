"""The monitor DAG run as users run it: ``airflow dags test kafka_ingest_monitor`` against
the stack's metadata database, real Kafka and a fresh Postgres database, with a pipelines
file of random topics whose alerts say ``max_lag: 5`` and name two notifiers: a webhook
served by this test on loopback, and an Airflow notifier class (``notifier_for_tests``).

Also, without services: the notifiers of a breach are called one by one, a failing one is
logged and never hides the breach, and the task fails naming pipeline, rule and figures.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import parse_pipelines
from kafka_ingest.db import Database
from kafka_ingest.ops.monitor import Breach, monitor_groups
from kafka_ingest_dev.samples import produce_sample
from tests.dags.notifier_for_tests import FILE_VARIABLE
from tests.support.airflow_api import last_task_state
from tests.support.dag_runs import run_dag
from tests.support.ingest import run
from tests.support.pipelines import dag_env

DAG_ID = "kafka_ingest_monitor"
HERE = Path(__file__).resolve().parent
NOTIFIER_CLASS = "notifier_for_tests.FileNotifier"


def _checks(dsn: str, pipeline: str) -> list[tuple[int, list[str]]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT total_lag, breaches FROM monitor_checks WHERE pipeline = %s"
                            " ORDER BY id", (pipeline,)).fetchall()
    return [(int(lag), list(breaches)) for lag, breaches in rows]


@pytest.mark.integration
def test_lag_above_max_notifies_and_fails_then_a_caught_up_pipeline_passes(
        stack_env: dict[str, str], clients: Any, make_pipeline: Any, pg_dsn: str,
        tmp_path: Path, webhook: Any) -> None:
    url = f"http://127.0.0.1:{webhook.server_address[1]}/hooks/monitor-test"
    pipeline = make_pipeline("telemetry_metrics", alerts={"max_lag": 5, "notifiers": [
        url, {"class": NOTIFIER_CLASS, "kwargs": {"prefix": "[{{ dag.dag_id }}] "}}]})
    produced = produce_sample(clients, pipeline, count=40, poison=0)["produced"]
    assert produced > 5
    notes = tmp_path / "notifier.txt"
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline), FILE_VARIABLE: str(notes),
           # the notifier class is importable by the DAG run's processes
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH"))
                                         if p),
           "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    (task_id,) = monitor_groups([pipeline])  # the test's pipelines file has this one

    # Messages produced, none ingested: made-up lag above max_lag.
    proc = run_dag(DAG_ID, env, log_file=tmp_path / "monitor1.log")
    output = proc.stdout + proc.stderr
    message = (f"{pipeline.name}: max_lag: lag {produced} messages over 3 partitions is above "
               "max_lag 5")
    figures = {"total_lag": produced, "partitions": 3, "max_lag": 5}
    assert proc.returncode != 0, output[-3000:]
    assert f"{message} (figures: {json.dumps(figures)})" in output, output[-3000:]
    assert last_task_state(stack_env, DAG_ID, task_id) == "failed"
    assert webhook.received == [("/hooks/monitor-test", "application/json", {
        "pipeline": pipeline.name, "rule": "max_lag", "message": message, "figures": figures})]
    assert notes.read_text(encoding="utf-8") == f"[{DAG_ID}] {message}\n"
    assert _checks(pg_dsn, pipeline.name) == [(produced, ["max_lag"])]

    # Everything ingested: the next check finds nothing wrong, and tells no one; beside
    # it, the retention prunes a chunk older than the pipeline keeps (30 days), not its
    # counts.
    run(pipeline, clients, Database(pg_dsn))
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition,"
                     " start_offset, end_offset, read, inserted, duplicates, stale,"
                     " dead_lettered, tombstones, bytes, seconds, committed_at) VALUES"
                     " (%s, 'old', 'backfill', %s, 0, 0, 7, 7, 7, 0, 0, 0, 0, 70, 0.1,"
                     " now() - interval '40 days')", (pipeline.name, pipeline.topic))
    proc = run_dag(DAG_ID, env, log_file=tmp_path / "monitor2.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert last_task_state(stack_env, DAG_ID, task_id) == "success"
    assert last_task_state(stack_env, DAG_ID, f"prune{task_id.removeprefix('check')}") \
        == "success"
    assert len(webhook.received) == 1
    assert notes.read_text(encoding="utf-8") == f"[{DAG_ID}] {message}\n"
    assert _checks(pg_dsn, pipeline.name) == [(produced, ["max_lag"]), (0, [])]
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM ingest_runs WHERE run_id = 'old'"
                            ).fetchone() == (0,)
        assert conn.execute("SELECT read FROM ingest_totals WHERE pipeline = %s AND"
                            " mode = 'backfill'", (pipeline.name,)).fetchone() == (7,)


# --------------------------------------------------------------------------- no services


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BREACHES = (
    Breach("p1", "max_lag", {"total_lag": 50, "partitions": 3, "max_lag": 5},
           "p1: max_lag: lag 50 messages over 3 partitions is above max_lag 5"),
    Breach("p1", "max_parked", {"parked": 1001, "max_parked": 1000},
           "p1: max_parked: 1001 dead letters are parked, above max_parked 1000"),
)


def _pipeline(notifiers: list[Any]) -> Any:
    body = {"topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
            "table": "t_rows", "dlq_topic": "t-in-dlq", "alerts": {"notifiers": notifiers}}
    return parse_pipelines({"pipelines": {"p1": body}})["p1"]


def test_a_failing_notifier_is_logged_and_never_hides_the_breach(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, webhook: Any,
        caplog: pytest.LogCaptureFixture) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from kafka_ingest_alerts import alert_on_breaches

    notes = tmp_path / "notes.txt"
    monkeypatch.setenv(FILE_VARIABLE, str(notes))
    monkeypatch.syspath_prepend(str(HERE))
    good_hook = f"http://127.0.0.1:{webhook.server_address[1]}/ok"
    closed = _closed_port()
    pipeline = _pipeline([
        f"http://127.0.0.1:{closed}/hooks/s3cret",           # refused
        {"class": "notifier_for_tests.NoSuchNotifier"},      # not importable
        {"class": NOTIFIER_CLASS, "kwargs": {"prefix": "[{{ pipeline }}] "}},
        good_hook,
    ])

    with caplog.at_level(logging.INFO), pytest.raises(AirflowFailException) as exc:
        alert_on_breaches(pipeline, BREACHES, {"run_id": "manual__test"})

    assert str(exc.value) == (
        "2 alert rule(s) breached: p1: max_lag: lag 50 messages over 3 partitions is "
        'above max_lag 5 (figures: {"total_lag": 50, "partitions": 3, "max_lag": 5}) | p1: '
        "max_parked: 1001 dead letters are parked, above max_parked 1000 (figures: "
        '{"parked": 1001, "max_parked": 1000}); notifiers that failed: '
        f"http://127.0.0.1:{closed}/…, "
        "notifier_for_tests.NoSuchNotifier")
    # the notifiers after the failing ones were still called, once per breach (webhook)
    # and once with every breach (the notifier class)
    assert notes.read_text(encoding="utf-8") == (f"[p1] {BREACHES[0].message}\n"
                                                 f"{BREACHES[1].message}\n")
    assert [(path, body["rule"]) for path, _, body in webhook.received] == [
        ("/ok", "max_lag"), ("/ok", "max_parked")]
    # the failures are in the log, without the webhook's secret path
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and not any("s3cret" in e for e in [*errors, str(exc.value)])
    assert "notifier_for_tests.NoSuchNotifier failed: AttributeError" in errors[1]


def test_no_breach_no_notifier_no_failure(webhook: Any) -> None:
    from kafka_ingest_alerts import alert_on_breaches

    pipeline = _pipeline([f"http://127.0.0.1:{webhook.server_address[1]}/ok"])
    alert_on_breaches(pipeline, (), {})
    assert webhook.received == []


def test_the_monitor_dag_has_one_check_and_one_prune_per_group_with_its_owner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.dag_processing.dagbag import DagBag

    from kafka_ingest.config import load_pipelines

    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))  # parsing needs no service
    monkeypatch.setenv("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    bag = DagBag(dag_folder=str(HERE.parents[1] / "dags" / "monitor_dags.py"))
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]
    shipped = load_pipelines()
    groups = monitor_groups(shipped.values())
    # a check and, beside it, the retention's prune, per group
    prunes = {f"prune{k.removeprefix('check')}": k for k in groups}
    assert {t.task_id for t in dag.tasks} == set(groups) | set(prunes)
    assert sorted(p.name for ps in groups.values() for p in ps) == sorted(shipped)
    assert dag.catchup is False and dag.max_active_runs == 1
    assert "kafka-ingest" in dag.tags and "monitor" in dag.tags
    for task_id in [*groups, *prunes]:
        task = dag.get_task(task_id)
        for pipeline in groups[prunes.get(task_id, task_id)]:
            assert (task.owner, task.retries) == (pipeline.owner, pipeline.retries)


def test_pipelines_are_grouped_by_owner_retries_and_connections() -> None:
    def one(name: str, **body: Any) -> Any:
        return parse_pipelines({"pipelines": {name: {
            "topic": f"t-{name}", "dlq_topic": f"t-{name}-dlq", "table": "t_rows",
            "contract": {"event_type": "metric_event", "version": 2}, **body}}})[name]

    pipelines = [one("a"), one("b"), one("c", owner="payments team"),
                 one("d", owner="payments_team"), one("e", retries=0),
                 one("f", kafka_conn_id="kafka_eu"), one("g", postgres_conn_id="pg_eu")]
    groups = {k: [p.name for p in v] for k, v in monitor_groups(pipelines).items()}
    assert sorted(groups.values()) == [["a", "b"], ["c"], ["d"], ["e"], ["f"], ["g"]]
    assert groups["check_data-platform__kafka_default__postgres_default__r3"] == ["a", "b"]
    # an owner a task id cannot spell keeps a group of its own (no merge with "payments_team")
    assert len({k for k, v in groups.items() if v in (["c"], ["d"])}) == 2
