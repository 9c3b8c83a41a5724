"""The monitor DAG: ``kafka_ingest_monitor`` checks every pipeline every 5 minutes.

One task per pipeline, ``check_<pipeline>``: the lag (Kafka's watermarks against the stored
offsets), the DLQ rate, the freshness of live chunks and the parked dead letters, judged
by the pipeline's ``alerts`` rules (``kafka_ingest.ops.monitor``); each check is recorded in
``monitor_checks`` (lag growth is judged over the recorded checks). On a breach the
pipeline's notifiers are called (webhooks, Airflow notifiers), then the task fails
without retry, naming the pipeline, the rule and the figures, so Airflow's own failure
alerting fires as well; the next check judges again. Kafka or Postgres out of reach is
retried with backoff, like any task of the pipeline. What each alert means and what to
do: the README's runbook.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import dag, get_current_context, task

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.ops.status import check_pipeline
from kafka_ingest_hook import (
    KafkaIngestHook,
    alert_on_breaches,
    dag_default_args,
    emit_metrics,
    fail_without_retry,
    postgres_database,
)

MONITOR_SCHEDULE = "*/5 * * * *"
#: A check stuck longer than the schedule's interval is failed (and retried).
CHECK_TIMEOUT = timedelta(minutes=4)


def check_task(pipeline: Pipeline) -> Any:
    """The check of one pipeline, with that pipeline's owner and retries."""

    @task(task_id=f"check_{pipeline.name}",
          **{**dag_default_args(pipeline), "execution_timeout": CHECK_TIMEOUT})
    def check() -> dict[str, Any]:
        with fail_without_retry():  # a missing topic, refused credentials: no retry helps
            result = check_pipeline(pipeline, KafkaIngestHook(pipeline.kafka_conn_id).clients,
                                    postgres_database(pipeline.postgres_conn_id))
        figures = result.figures.to_dict()
        print(f"{pipeline.name}: {figures}")
        emit_metrics("monitor", pipeline.name, figures)
        alert_on_breaches(pipeline, result.breaches, get_current_context())
        return figures

    return check


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
    for pipeline in load_pipelines().values():
        check_task(pipeline)()


kafka_ingest_monitor()
