"""OpenLineage of the slice tasks (ingest, backfill, replay), through Airflow's OpenLineage
provider.

``slice_task(...)`` is ``@task`` with one addition: its operator has
``get_openlineage_facets_on_complete``, so the provider's listener (when a transport is
configured: ``[openlineage] transport``) puts the task's inputs, outputs and facets in its
COMPLETE event, built by :func:`kafka_ingest.ops.lineage.run_lineage` from the slice's
report. Without the provider, or with OpenLineage off, nothing here runs. Lineage never
slows or fails a task: building it is wrapped (a failure costs a log line), and the
provider emits after the task's work, catching its transport's errors itself.

No side effects at import time (the plugin manager imports every file here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator

log = logging.getLogger(__name__)


class SliceLineageOperator(_PythonDecoratedOperator):
    """``@task`` whose OpenLineage comes from the slice report it returns."""

    custom_operator_name = "@task"

    def __init__(self, *, lineage: Callable[[Mapping[str, Any]], Any] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lineage = lineage
        self.slice_report: Mapping[str, Any] | None = None

    def execute(self, context: Any) -> Any:
        result = super().execute(context)
        self.slice_report = result if isinstance(result, Mapping) else None
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        return openlineage_of(self.lineage, self.slice_report)


def openlineage_of(lineage: Callable[[Mapping[str, Any]], Any] | None,
                   report: Mapping[str, Any] | None) -> Any:
    """The provider's ``OperatorLineage`` of a slice report, or None (no lineage: logged)
    if it cannot be built."""
    if lineage is None or report is None:
        return None
    try:
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import InputDataset, OutputDataset

        built = lineage(report)
        return OperatorLineage(
            inputs=[InputDataset(d.namespace, d.name, facets=d.facets, inputFacets=d.io_facets)
                    for d in built.inputs],
            outputs=[OutputDataset(d.namespace, d.name, facets=d.facets,
                                   outputFacets=d.io_facets) for d in built.outputs],
            run_facets=built.run_facets)
    except Exception as exc:  # lineage is a report: never a reason to fail a slice
        log.warning("no OpenLineage for this slice: %s: %s", type(exc).__name__, exc)
        return None


def slice_task(pipeline: Any, *, replay: bool = False, **kwargs: Any) -> Any:
    """``@task(**kwargs)`` for a pipeline's slice task, with its OpenLineage (the source or
    dead-letter topic in, the table and the dead-letter topic out)."""
    from airflow.sdk.bases.decorator import task_decorator_factory

    def lineage(report: Mapping[str, Any]) -> Any:
        from kafka_ingest.ops.lineage import run_lineage
        from kafka_ingest_hook import KafkaIngestHook

        servers = str(KafkaIngestHook(pipeline.kafka_conn_id).clients.config["bootstrap.servers"])
        return run_lineage(pipeline, [report], bootstrap_servers=servers, replay=replay)

    return task_decorator_factory(decorated_operator_class=SliceLineageOperator,
                                  lineage=lineage, **kwargs)
