"""The slice tasks' OpenLineage, as the provider gets it (plugins/kafka_ingest_lineage.py):
the core's datasets and facets made the provider's ``OperatorLineage``, and a failure to
build them a log line, never an error of the task."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from kafka_ingest.config import DEFAULT_PIPELINES_FILE, load_pipelines
from kafka_ingest.ops.lineage import OFFSETS_FACET, run_lineage

REPORT = {"topic": "telemetry-metrics", "partition": 0, "start": 0, "end": 5, "mode": "live",
          "read": 5, "bytes": 500, "inserted": 4, "dead_lettered": 1}


def test_the_provider_gets_the_core_lineage() -> None:
    from kafka_ingest_lineage import openlineage_of

    pipeline = load_pipelines(DEFAULT_PIPELINES_FILE)["telemetry_metrics"]

    def lineage(report: Mapping[str, Any]) -> Any:
        return run_lineage(pipeline, [report], bootstrap_servers="k:9092")

    got = openlineage_of(lineage, REPORT)
    assert [(d.namespace, d.name) for d in got.inputs] == [("kafka://k:9092",
                                                            "telemetry-metrics")]
    assert got.inputs[0].inputFacets["inputStatistics"]["rowCount"] == 5
    table, dlq = got.outputs
    assert set(table.facets) == {"schema", "columnLineage"}
    assert (table.outputFacets["outputStatistics"]["rowCount"],
            dlq.outputFacets["outputStatistics"]["rowCount"]) == (4, 1)
    assert got.run_facets[OFFSETS_FACET]["ranges"][0]["end"] == 5


def test_lineage_that_cannot_be_built_costs_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    from kafka_ingest_lineage import openlineage_of

    def broken(report: Mapping[str, Any]) -> Any:
        raise KeyError("bootstrap.servers")

    with caplog.at_level(logging.WARNING, logger="kafka_ingest_lineage"):
        assert openlineage_of(broken, REPORT) is None
    assert [r.getMessage() for r in caplog.records] == [
        "no OpenLineage for this slice: KeyError: 'bootstrap.servers'"]
