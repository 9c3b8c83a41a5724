"""The monitor DAG: ``kafka_ingest_monitor`` checks every pipeline every 5 minutes.

One task per group of pipelines with the same owner, retries, Kafka and Postgres
connections (``kafka_ingest.ops.monitor.monitor_groups``; the shipped pipelines make one):
one look at the cluster and the database for all of them, then per pipeline the lag
(Kafka's watermarks against the stored offsets), the DLQ rate, the freshness of live
chunks and the parked dead letters, judged by the pipeline's ``alerts`` rules
(``kafka_ingest.ops.monitor``); each check is recorded in ``monitor_checks`` (lag growth is
judged over the recorded checks). On a breach the pipeline's notifiers are called
(webhooks, Airflow notifiers), then the task fails without retry, naming each pipeline,
rule and figures (and any pipeline whose topic is missing), so Airflow's own failure
alerting fires as well; the next check judges again. Kafka or Postgres out of reach is
retried with backoff, like any task of the pipeline. What each alert means and what to
do: the runbook, docs/runbook.md.

Beside each check, a ``prune_...`` task applies the group's pipelines' ``retention``
(``kafka_ingest.ops.retention``): bookkeeping older than the pipeline says goes, in
bounded batches, never what the guarantees and the rules read.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import dag, get_current_context, task

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.errors import IngestError
from kafka_ingest.ops.monitor import monitor_groups
from kafka_ingest.ops.retention import prune
from kafka_ingest.ops.status import check_pipelines
from kafka_ingest_alerts import alert_on_checks
from kafka_ingest_hook import KafkaIngestHook, postgres_database
from kafka_ingest_tasks import dag_default_args, emit_metrics, fail_without_retry

MONITOR_SCHEDULE = "*/5 * * * *"
#: A check stuck longer than the schedule's interval is failed (and retried).
CHECK_TIMEOUT = timedelta(minutes=4)
#: How long one prune deletes before it leaves the rest to the next run.
PRUNE_BUDGET = timedelta(minutes=2)


def prune_task_id(check_task_id: str) -> str:
    """The prune task beside a group's check task."""
    return "prune_" + check_task_id.removeprefix("check_")


def check_task(task_id: str, pipelines: list[Pipeline]) -> Any:
    """The check of one group of pipelines (one owner, retries and pair of connections),
    with their owner and retries."""
    first = pipelines[0]

    @task(task_id=task_id,
          **{**dag_default_args(first), "execution_timeout": CHECK_TIMEOUT})
    def check() -> dict[str, Any]:
        with fail_without_retry():  # refused credentials: no retry helps
            results = check_pipelines(pipelines, KafkaIngestHook(first.kafka_conn_id).clients,
                                      postgres_database(first.postgres_conn_id))
        figures: dict[str, Any] = {}
        found, unknown = [], []
        for pipeline, result in results:
            if isinstance(result, IngestError):  # a missing topic: the others still count
                unknown.append(f"{pipeline.name}: {result}")
                continue
            figures[pipeline.name] = result.figures.to_dict()
            print(f"{pipeline.name}: {figures[pipeline.name]}")
            emit_metrics("monitor", pipeline.name, figures[pipeline.name])
            found.append((pipeline, result.breaches))
        alert_on_checks(found, get_current_context(), unknown=unknown)
        return figures

    return check


def prune_task(task_id: str, pipelines: list[Pipeline]) -> Any:
    """The retention of one group of pipelines' bookkeeping, with their owner and retries."""
    first = pipelines[0]

    @task(task_id=task_id,
          **{**dag_default_args(first), "execution_timeout": CHECK_TIMEOUT})
    def prune_group() -> list[dict[str, Any]]:
        with fail_without_retry():  # a missing grant: no retry helps
            pruned = prune(pipelines, postgres_database(first.postgres_conn_id),
                           budget_s=PRUNE_BUDGET.total_seconds())
        return [vars(p) for p in pruned]

    return prune_group


@dag(
    dag_id="kafka_ingest_monitor",
    schedule=MONITOR_SCHEDULE,
    start_date=datetime(2026, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["kafka-ingest", "monitor"],
)
def kafka_ingest_monitor() -> None:
    for task_id, pipelines in monitor_groups(load_pipelines().values()).items():
        check_task(task_id, pipelines)()
        prune_task(prune_task_id(task_id), pipelines)()


kafka_ingest_monitor()
