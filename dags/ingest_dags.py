"""Ingest DAGs: one ``<pipeline>_ingest`` per pipeline in ``include/pipelines.yaml``.

plan (pins this run's offset ranges) → ingest (mapped, one task per partition range)
→ report (sums, metrics) → table_updated (the table's Asset, if rows landed). A run with
nothing to read ends at plan: the rest is skipped without starting a task. A manual
run with ``partitions`` or ``from``/``to`` is a backfill: it never moves the live stored
offset. Airflow's own backfill (``airflow backfill create``) maps each data interval to
offsets by time.

``schedule: on_data`` pipelines are scheduled on an Asset their lag trigger watches
(``plugins/kafka_ingest_triggers.py``): a run starts when enough new data is there, never
while the topic is quiet, plus a slow safety cron.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import (
    DAG,
    Asset,
    AssetOrTimeSchedule,
    AssetWatcher,
    CronDataIntervalTimetable,
    CronTriggerTimetable,
    dag,
    get_current_context,
    task,
)

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize
from kafka_ingest.ops.lineage import completeness
from kafka_ingest.ranges import OffsetRange
from kafka_ingest.requests import IngestForm, RangeRequest, ingest_request
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
from kafka_ingest_triggers import LagTrigger


def _request(context: Any) -> RangeRequest:
    dag_run = context["dag_run"]
    interval = (context.get("data_interval_start"), context.get("data_interval_end"))
    return ingest_request(
        context["params"], now=datetime.now(tz=UTC),
        # The task SDK's run type is an enum whose str() is "DagRunType.BACKFILL": compare
        # its value ("backfill", "scheduled", "manual").
        run_type=str(getattr(dag_run.run_type, "value", dag_run.run_type)),
        interval=interval if all(interval) else None,
    )


def _schedule(pipeline: Pipeline) -> Any:
    """The DAG's schedule: ``on_data``, the pipeline's lag Asset (watched by the lag
    trigger in the triggerer) or its slow safety cron; else :func:`_cron`."""
    if not pipeline.event_driven:
        return _cron(pipeline.schedule)
    watcher = AssetWatcher(name=f"{pipeline.name}_lag", trigger=LagTrigger.of(pipeline))
    return AssetOrTimeSchedule(
        timetable=CronTriggerTimetable(pipeline.on_data.safety_schedule, timezone="UTC"),
        assets=Asset(name=f"{pipeline.name}_new_data", uri=f"kafka-ingest://{pipeline.name}/lag",
                     watchers=[watcher]))


def _max_active_runs(pipeline: Pipeline) -> int:
    """One run at a time on a cron schedule. ``on_data``: two, because the lag trigger
    fires once the run's slices reached their end, while the run's last tasks still run;
    with one, Airflow's scheduler holds the next run back until the DAG processor's next
    parse whenever that parse counted the ending run as active (30 s: the freshness tail).
    Two live runs never read the same offsets twice: a slice that moves the cursor holds
    its partition's lock and resumes where the stored cursor is (DESIGN §3)."""
    return 2 if pipeline.event_driven else 1


def _cron(expression: str | None) -> Any:
    """A cron schedule with data intervals ``[previous tick, tick)``.

    Airflow 3 turns a cron string into ``CronTriggerTimetable``, whose runs have a point
    interval (start == end): every ``airflow backfill`` run would then ask for an empty
    time window and fail. Intervals that tile the time line map to adjacent half-open
    offset windows instead.
    """
    if expression is None or expression in ("@once", "@continuous"):
        return expression
    return CronDataIntervalTimetable(expression, timezone="UTC")


def build_ingest_dag(pipeline: Pipeline) -> DAG:

    @dag(
        dag_id=f"{pipeline.name}_ingest",
        schedule=_schedule(pipeline),
        # on_data: no start date, so unpausing runs no past safety tick (a quiet pipeline
        # starts no run); the safety cron's first run is its next tick
        start_date=None if pipeline.event_driven else datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=_max_active_runs(pipeline),
        doc_md=__doc__,
        tags=["kafka-ingest", "ingest", pipeline.name],
        params=form_params(IngestForm),
        default_args=dag_default_args(pipeline),
    )
    def ingest_dag() -> None:
        # Nothing planned (an empty list): plan skips everything downstream itself, so a
        # quiet run ends at plan, with no task process and no scheduler loop per task after.
        @task.short_circuit
        def plan() -> list[dict[str, Any]]:
            context = get_current_context()
            with fail_without_retry():  # a bad form fails here, before anything is read
                ranges = plan_run(pipeline, pipeline_clients(pipeline),
                                  postgres_database(pipeline.postgres_conn_id),
                                  run_id=context["run_id"], request=_request(context))
            return [r.to_dict() for r in ranges]

        @slice_task(pipeline,
                    map_index_template="{{ task.op_kwargs['offset_range']['partition'] }}",
                    **slice_task_args(pipeline))
        def ingest(offset_range: dict[str, Any]) -> dict[str, Any]:
            with fail_without_retry():
                report = ingest_range(pipeline, OffsetRange.from_dict(offset_range),
                                      pipeline_clients(pipeline),
                                      postgres_database(pipeline.postgres_conn_id),
                                      run_id=get_current_context()["run_id"])
            return report.to_dict()

        @task(trigger_rule="none_failed")
        def report(results: list[dict[str, Any]] | None) -> dict[str, Any]:
            summary = summarize(results or [])
            print(f"{pipeline.name}: {summary}")
            summary["completeness"] = completeness(results or [],
                                                   pipeline.max_records_per_partition,
                                                   event_time=pipeline.event_time)
            emit_metrics("ingest", pipeline.name, summary)
            return summary

        summary = report(ingest.expand(offset_range=plan()))
        table_updated_task(pipeline)(summary)

    return ingest_dag()


for _pipeline in load_pipelines().values():
    globals()[f"{_pipeline.name}_ingest"] = build_ingest_dag(_pipeline)
