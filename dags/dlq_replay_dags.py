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

from airflow.sdk import DAG, Param, dag, get_current_context, task

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.ranges import OffsetRange
from kafka_ingest.replay import (
    KNOWN_ERROR_CLASSES,
    ReplayFilters,
    plan_replay,
    replay_range,
    replay_request,
    summarize_replay,
)
from kafka_ingest_hook import (
    KafkaIngestHook,
    dag_default_args,
    emit_metrics,
    fail_without_retry,
    postgres_database,
    table_updated_task,
)

DRY_RUN_PARAM = Param(False, type="boolean", title="Dry run",
                      description="Validate and report the counts; write nothing (no rows, "
                                  "no dead_letters change, cursor unchanged).")
PARTITIONS_PARAM = Param(
    {}, type="object", title="DLQ offsets",
    description='Offsets of the DLQ topic to replay per partition, half-open [start, end): '
                '{"0": [0, 500]}. Leave empty to continue from the replay cursor.',
)
FROM_PARAM = Param(None, type=["null", "string"], format="date-time", title="From",
                   description="Replay DLQ records with timestamps (the original messages' "
                               "timestamps) from this instant, inclusive (ISO-8601).")
TO_PARAM = Param(None, type=["null", "string"], format="date-time", title="To",
                 description="End instant, exclusive; not in the future.")
ERROR_CLASSES_PARAM = Param(
    [], type="array", items={"type": "string", "enum": list(KNOWN_ERROR_CLASSES)},
    uniqueItems=True, title="Error classes",
    description="Only dead letters of these classes; empty means all.",
)
SOURCE_PARTITION_PARAM = Param(None, type=["null", "integer"], minimum=0,
                               title="Source partition",
                               description="Only dead letters from this source partition.")
EVENT_ID_PARAM = Param(None, type=["null", "string"], minLength=1, maxLength=128,
                       title="Event id", description="Only the dead letter with this event_id.")


def _params() -> dict[str, Any]:
    return dict(get_current_context()["params"])


def build_replay_dag(pipeline: Pipeline) -> DAG:
    hook = KafkaIngestHook  # built inside tasks: nothing at parse time touches a connection

    @dag(
        dag_id=f"{pipeline.name}_dlq_replay",
        schedule=pipeline.replay_schedule,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        doc_md=__doc__,
        tags=["kafka-ingest", "dlq-replay", pipeline.name],
        params={"dry_run": DRY_RUN_PARAM, "partitions": PARTITIONS_PARAM, "from": FROM_PARAM,
                "to": TO_PARAM, "error_classes": ERROR_CLASSES_PARAM,
                "source_partition": SOURCE_PARTITION_PARAM, "event_id": EVENT_ID_PARAM},
        default_args=dag_default_args(pipeline),
    )
    def replay_dag() -> None:
        @task
        def plan() -> list[dict[str, Any]]:
            params = _params()
            with fail_without_retry():  # a bad form fails here, before anything is read
                request = replay_request(params, now=datetime.now(tz=UTC))
                ranges = plan_replay(pipeline, hook(pipeline.kafka_conn_id).clients,
                                     postgres_database(pipeline.postgres_conn_id),
                                     run_id=get_current_context()["run_id"], request=request,
                                     dry_run=bool(params["dry_run"]))
            return [r.to_dict() for r in ranges]

        @task(map_index_template="{{ task.op_kwargs['offset_range']['partition'] }}")
        def replay(offset_range: dict[str, Any]) -> dict[str, Any]:
            params = _params()
            with fail_without_retry():
                report = replay_range(pipeline, OffsetRange.from_dict(offset_range),
                                      hook(pipeline.kafka_conn_id).clients,
                                      postgres_database(pipeline.postgres_conn_id),
                                      run_id=get_current_context()["run_id"],
                                      dry_run=bool(params["dry_run"]),
                                      filters=ReplayFilters.from_params(params))
            return report.to_dict()

        @task(trigger_rule="none_failed")
        def report(results: list[dict[str, Any]] | None) -> dict[str, Any]:
            summary = summarize_replay(results or [], dry_run=bool(_params()["dry_run"]))
            print(f"{pipeline.name} DLQ replay: {summary}")
            if not summary["dry_run"]:
                emit_metrics("replay", pipeline.name, {**summary, **summary["outcomes"]})
            return summary

        summary = report(replay.expand(offset_range=plan()))  # type: ignore[arg-type]
        table_updated_task(pipeline)(summary)

    return replay_dag()


for _pipeline in load_pipelines().values():
    globals()[f"{_pipeline.name}_dlq_replay"] = build_replay_dag(_pipeline)
