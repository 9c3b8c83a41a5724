"""DLQ-replay DAGs: one ``<pipeline>_dlq_replay`` per pipeline in ``include/pipelines.yaml``.

plan (checks the form, pins this run's DLQ ranges) → replay (mapped, one task per DLQ
partition) → report (counts by outcome and reason). Each dead letter's original bytes are
re-validated with the pipeline's current contract; the ones that pass are upserted with
their original provenance and marked ``recovered``, the rest stay ``parked`` with the
latest reason. Without ``partitions`` or ``from``/``to`` the run continues from the
replay cursor; with them it never moves the cursor. ``dry_run`` writes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import DAG, dag, get_current_context, task

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.engine.replay import plan_replay, replay_range, summarize_replay
from kafka_ingest.ops.lineage import completeness
from kafka_ingest.ranges import OffsetRange
from kafka_ingest.requests import ReplayForm, ReplayRequest, replay_request
from kafka_ingest_hook import pipeline_clients, postgres_database
from kafka_ingest_lineage import slice_task
from kafka_ingest_tasks import (
    dag_default_args,
    emit_metrics,
    fail_without_retry,
    form_params,
    slice_task_args,
    table_updated_task,
)


def _request() -> ReplayRequest:
    return replay_request(get_current_context()["params"], now=datetime.now(tz=UTC))


def build_replay_dag(pipeline: Pipeline) -> DAG:

    @dag(
        dag_id=f"{pipeline.name}_dlq_replay",
        schedule=pipeline.replay_schedule,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        doc_md=__doc__,
        tags=["kafka-ingest", "dlq-replay", pipeline.name],
        params=form_params(ReplayForm),
        default_args=dag_default_args(pipeline),
    )
    def replay_dag() -> None:
        @task
        def plan() -> list[dict[str, Any]]:
            with fail_without_retry():  # a bad form fails here, before anything is read
                ranges = plan_replay(pipeline, pipeline_clients(pipeline),
                                     postgres_database(pipeline.postgres_conn_id),
                                     run_id=get_current_context()["run_id"], request=_request())
            return [r.to_dict() for r in ranges]

        @slice_task(pipeline, replay=True,
                    map_index_template="{{ task.op_kwargs['offset_range']['partition'] }}",
                    **slice_task_args(pipeline))
        def replay(offset_range: dict[str, Any]) -> dict[str, Any]:
            with fail_without_retry():
                request = _request()
                report = replay_range(pipeline, OffsetRange.from_dict(offset_range),
                                      pipeline_clients(pipeline),
                                      postgres_database(pipeline.postgres_conn_id),
                                      run_id=get_current_context()["run_id"],
                                      dry_run=request.dry_run, filters=request.filters)
            return report.to_dict()

        @task(trigger_rule="none_failed")
        def report(results: list[dict[str, Any]] | None) -> dict[str, Any]:
            summary = summarize_replay(results or [], dry_run=_request().dry_run)
            print(f"{pipeline.name} DLQ replay: {summary}")
            summary["completeness"] = completeness(results or [],
                                                   pipeline.max_records_per_partition,
                                                   event_time=pipeline.event_time)
            if not summary["dry_run"]:
                emit_metrics("replay", pipeline.name, {**summary, **summary["outcomes"]})
            return summary

        summary = report(replay.expand(offset_range=plan()))
        table_updated_task(pipeline)(summary)

    return replay_dag()


for _pipeline in load_pipelines().values():
    globals()[f"{_pipeline.name}_dlq_replay"] = build_replay_dag(_pipeline)
