"""Example: aggregate only complete windows of a table, scheduled on its Asset.

``<pipeline>_complete_windows`` runs whenever the ingest DAG of a ``telemetry_metrics``
pipeline updates the table's Asset. The Asset event's ``extra`` carries the run's
event-time watermark (docs/lineage.md): every partition's records up to it are in the
table. The task aggregates the last few 5-minute windows of the event time the watermark
is by (the pipeline's ``event_time`` column, else ``kafka_timestamp``) that end at or
before the newest watermark, so a window is never counted while records of it may still
be on their way; a run whose event carries no watermark (a pipeline behind, a backfill)
aggregates nothing. Re-aggregating a complete window gives the same figures, so the
windows may overlap from one run to the next.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Asset, dag, task
from psycopg import sql

from kafka_ingest import Pipeline, load_pipelines
from kafka_ingest.ops.lineage import complete_windows, latest_watermark
from kafka_ingest_hook import postgres_database
from kafka_ingest_tasks import dag_default_args

WINDOW = timedelta(minutes=5)
#: How many complete windows each run (re)computes.
WINDOWS = 3
QUERY = sql.SQL("SELECT count(*), avg(metric_value) FROM {table} "
                "WHERE {time} >= %s AND {time} < %s")


def build_windows_dag(pipeline: Pipeline) -> Any:
    table = Asset(pipeline.asset_uri)

    @dag(dag_id=f"{pipeline.name}_complete_windows", schedule=[table], catchup=False,
         max_active_runs=1, doc_md=__doc__, default_args=dag_default_args(pipeline),
         tags=["kafka-ingest", "example", pipeline.name])
    def windows_dag() -> None:
        @task
        def aggregate(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
            events = (triggering_asset_events or {}).get(table, [])
            mark = latest_watermark(e.extra for e in events)
            if mark is None:
                print("no watermark in the triggering events: nothing is complete yet")
                return []
            query = QUERY.format(table=sql.Identifier(pipeline.table),
                                 time=sql.Identifier(pipeline.event_time_column))
            figures = []
            with postgres_database(pipeline.postgres_conn_id).connect() as conn:
                for start, end in complete_windows(mark, WINDOW, WINDOWS):
                    count, avg = conn.execute(query, (start, end)).fetchone() or (0, None)
                    figures.append({"start": start.isoformat(), "end": end.isoformat(),
                                    "count": count, "avg": None if avg is None else float(avg)})
            return figures

        aggregate()

    return windows_dag()


for _pipeline in load_pipelines().values():
    if _pipeline.contract.event_type == "metric_event" and _pipeline.upsert.mode == "append":
        globals()[f"{_pipeline.name}_complete_windows"] = build_windows_dag(_pipeline)
