"""What the DAG files share: task arguments, the retry policy, the trigger forms' params,
Airflow's metrics of a run, and the task that updates the table's Asset.

No side effects at import time (the plugin manager imports every file here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from airflow.sdk import Param
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from kafka_ingest.engine.ingest import rows_changed
from kafka_ingest.errors import PermanentError
from kafka_ingest.records import COUNTERS
from kafka_ingest.requests import form_fields

log = logging.getLogger(__name__)


@contextmanager
def fail_without_retry() -> Iterator[None]:
    """Fail the task at once (no retry) for a :class:`~kafka_ingest.errors.PermanentError`:
    a retention gap, counts that do not reconcile, a trigger form that cannot be honoured,
    credentials the cluster refuses. Every other error propagates unchanged, so Airflow
    retries it with backoff."""
    try:
        yield
    except PermanentError as exc:
        raise AirflowFailException(f"{type(exc).__name__}: {exc}") from exc


def form_params(form: Any) -> dict[str, Param]:
    """A DAG's ``params`` generated from a trigger-form model of :mod:`kafka_ingest.requests`
    (titles, descriptions, limits; optional fields nullable), so the form, the CLI and the
    checks share one definition."""
    return {name: Param(default, **schema) for name, (default, schema) in
            form_fields(form).items()}


#: The figures of a run's summary sent to Airflow's metrics: every counter of
#: :class:`~kafka_ingest.records.ChunkCounts`, then the run's own and the replay's.
METRICS = (*COUNTERS, "lag_after", "dlq_rate", "recovered", "still_parked", "total_lag",
           "group_lag", "parked")


def emit_metrics(kind: str, pipeline: str, summary: dict[str, Any]) -> None:
    """Send a run's sums to Airflow's metrics (StatsD or OpenTelemetry, as configured).

    Each figure goes out twice, as Airflow's own metrics do: ``kafka_ingest.<kind>.<name>``
    tagged with the pipeline (OpenTelemetry, DogStatsD), and
    ``kafka_ingest.<kind>.<pipeline>.<name>`` for plain StatsD, which drops tags (without
    the name, two pipelines would overwrite each other's gauge).
    """
    from airflow.sdk.observability.stats import Stats

    for name in METRICS:
        value = summary.get(name)
        if isinstance(value, int | float):
            Stats.gauge(f"kafka_ingest.{kind}.{name}", value, tags={"pipeline": pipeline})
            Stats.gauge(f"kafka_ingest.{kind}.{pipeline}.{name}", value)


def dag_default_args(pipeline: Any) -> dict[str, Any]:
    """Task defaults of every DAG of a pipeline: its owner, and retries that back off
    exponentially from 10 s to 10 min (infrastructure errors heal; see errors.py)."""
    return {
        "owner": pipeline.owner,
        "retries": pipeline.retries,
        "retry_delay": timedelta(seconds=10),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(minutes=pipeline.task_timeout_minutes),
    }


def slice_task_args(pipeline: Any) -> dict[str, Any]:
    """Arguments of the mapped slice tasks (ingest, replay): the pipeline's Airflow pool
    (``default_pool`` when it names none) and how many of one run's slices may run at once,
    so a topic with many partitions does not open as many Postgres writers together."""
    return {"pool": pipeline.pool or "default_pool",
            "max_active_tis_per_dagrun": pipeline.max_parallel_partitions}


def table_updated_task(pipeline: Any) -> Any:
    """A task that updates the target table's Airflow Asset, only when rows changed
    (inserted, updated or deleted: :func:`~kafka_ingest.engine.ingest.rows_changed`).

    Asset-scheduled downstream DAGs then run on new data, not on every empty
    micro-batch; with nothing changed the task is skipped and no Asset event is sent. The
    event's ``extra`` is the summary's ``completeness``
    (:func:`~kafka_ingest.ops.lineage.completeness`: the event-time watermark, the offset
    ranges).
    """
    from airflow.sdk import Asset, task

    asset = Asset(pipeline.asset_uri)

    @task(task_id="table_updated", outlets=[asset])
    def table_updated(summary: dict[str, Any], outlet_events: Any = None) -> int:
        if summary.get("dry_run"):
            raise AirflowSkipException("a dry run wrote nothing: the table's Asset is not updated")
        changed = rows_changed(summary)
        if not changed:
            raise AirflowSkipException("no row was inserted, updated or deleted: the table's "
                                       "Asset is not updated")
        if summary.get("completeness") and outlet_events is not None:
            # the run's event-time watermark and offset ranges (docs/lineage.md)
            outlet_events[asset].extra.update(summary["completeness"])
        return changed

    return table_updated
