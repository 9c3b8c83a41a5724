"""OpenLineage naming and facets, and the run's event-time watermark (ops/lineage.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops.lineage import (
    OFFSETS_FACET,
    OFFSETS_SCHEMA,
    OFFSETS_SCHEMA_URL,
    PRODUCER,
    column_lineage_facet,
    complete_windows,
    completeness,
    kafka_namespace,
    latest_watermark,
    run_lineage,
    schema_facet,
    watermark,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def _report(partition: int, start: int, end: int, *, mode: str = "live",
            max_ts: int | None = T0, **counts: Any) -> dict[str, Any]:
    return {"topic": "telemetry-metrics", "partition": partition, "start": start, "end": end,
            "mode": mode, "max_event_time_ms": max_ts, **counts}


@pytest.mark.parametrize(("servers", "namespace"), [
    ("broker:9092", "kafka://broker:9092"),
    # the first server names the cluster; a listener name in front of it is dropped
    ("SASL_SSL://b1.example:9093, b2.example:9093", "kafka://b1.example:9093"),
])
def test_kafka_namespace(servers: str, namespace: str) -> None:
    assert kafka_namespace(servers) == namespace


def test_ingest_reads_the_topic_and_writes_the_table_and_the_dlq(
        shipped: dict[str, Pipeline]) -> None:
    lineage = run_lineage(shipped["telemetry_metrics"],
                          [_report(1, 5, 9, read=4, bytes=400, inserted=3, dead_lettered=1)],
                          bootstrap_servers="k1:9092,k2:9092")
    [source] = lineage.inputs
    table, dlq = lineage.outputs
    assert (source.namespace, source.name) == ("kafka://k1:9092", "telemetry-metrics")
    assert (table.namespace, table.name) == ("postgres://localhost:5432",
                                             "kafka_ingest.public.telemetry_metrics")
    assert (dlq.namespace, dlq.name) == ("kafka://k1:9092", "telemetry-metrics-dlq")
    assert {k: v for k, v in source.io_facets["inputStatistics"].items()
            if not k.startswith("_")} == {"rowCount": 4, "size": 400}
    assert table.io_facets["outputStatistics"]["rowCount"] == 3
    assert dlq.io_facets["outputStatistics"]["rowCount"] == 1
    assert lineage.run_facets[OFFSETS_FACET]["ranges"] == [
        {"topic": "telemetry-metrics", "partition": 1, "start": 5, "end": 9, "mode": "live"}]


def test_replay_reads_the_dlq_and_writes_the_table_only(shipped: dict[str, Pipeline]) -> None:
    lineage = run_lineage(shipped["telemetry_metrics"],
                          [_report(0, 0, 3, mode="replay", read=3, inserted=2)],
                          bootstrap_servers="k1:9092", replay=True)
    assert [d.name for d in lineage.inputs] == ["telemetry-metrics-dlq"]
    assert [d.name for d in lineage.outputs] == ["kafka_ingest.public.telemetry_metrics"]


def test_a_dry_run_wrote_nothing(shipped: dict[str, Pipeline]) -> None:
    lineage = run_lineage(shipped["telemetry_metrics"],
                          [_report(0, 0, 3, mode="replay", read=3) | {"dry_run": True}],
                          bootstrap_servers="k1:9092", replay=True)
    assert [d.name for d in lineage.inputs] == ["telemetry-metrics-dlq"]
    assert lineage.outputs == []


def test_schema_facet_lists_the_table_columns_in_order(shipped: dict[str, Pipeline]) -> None:
    fields = schema_facet(shipped["orders_created"])["fields"]
    assert fields[0] == {"name": "event_id", "type": "character varying(128)"}
    assert {"name": "total", "type": "numeric(14,2)"} in fields
    assert [f["name"] for f in fields[-6:]] == [
        "source_topic", "source_partition", "source_offset", "kafka_key", "kafka_timestamp",
        "ingested_at"]


def test_column_lineage_from_payload_key_header_and_provenance() -> None:
    doc = {"pipelines": {"p": {
        "topic": "t", "dlq_topic": "t-dlq", "table": "p_rows",
        "contract": {"event_type": "metric_event", "version": 2},
        "record_key": {"column": "entity"}, "headers": {"trace-id": {"column": "trace"}}}}}
    fields = column_lineage_facet(parse_pipelines(doc)["p"], "kafka://k:9092", "t")["fields"]

    def source(column: str) -> tuple[str, str]:
        [field] = fields[column]["inputFields"]
        return field["field"], field["transformations"][0]["subtype"]

    assert source("device_id") == ("device_id", "IDENTITY")
    # an epoch in the payload becomes a timestamptz: converted on the way
    assert source("timestamp") == ("timestamp", "TRANSFORMATION")
    assert source("entity") == ("kafka.key", "IDENTITY")
    assert source("trace") == ("kafka.headers.trace-id", "IDENTITY")
    assert source("source_offset") == ("kafka.offset", "IDENTITY")
    assert source("kafka_timestamp") == ("kafka.timestamp", "IDENTITY")
    assert "ingested_at" not in fields  # filled by the table's default, from no field


def test_watermark_is_the_minimum_of_the_partitions_latest() -> None:
    reports = [_report(0, 0, 10, max_ts=T0 + 5_000), _report(1, 0, 4, max_ts=T0 + 2_000)]
    assert watermark(reports, max_records=100) == datetime(2026, 1, 1, 0, 0, 2, tzinfo=UTC)


@pytest.mark.parametrize("behind", [
    # a partition whose range the plan cut at max_records_per_partition: more is waiting
    _report(1, 0, 100, max_ts=T0 + 9_000),
    # a backfill reads the past: it says nothing about what is complete now
    _report(1, 0, 4, mode="backfill", max_ts=T0 + 9_000),
    # a dry run loaded nothing
    _report(1, 0, 4, max_ts=T0 + 9_000) | {"dry_run": True},
    # no timestamp read (a slice whose every record had none)
    _report(1, 0, 4, max_ts=None),
])
def test_a_partition_behind_holds_the_watermark_back(behind: dict[str, Any]) -> None:
    assert watermark([_report(0, 0, 10), behind], max_records=100) is None


def test_completeness_is_the_asset_extra() -> None:
    extra = completeness([_report(0, 3, 10, resumed_from=5)], max_records=100)
    assert extra == {"watermark": "2026-01-01T00:00:00+00:00",
                     "event_time": "kafka_timestamp", "offsets": [
        {"topic": "telemetry-metrics", "partition": 0, "start": 3, "end": 10, "mode": "live",
         "resumed_from": 5}]}


def test_complete_windows_end_at_or_before_the_watermark() -> None:
    mark = datetime(2026, 1, 1, 10, 7, 30, tzinfo=UTC)
    at = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    # [10:05, 10:10) holds 10:07:30 and later: not complete yet
    assert complete_windows(mark, timedelta(minutes=5), 2) == [
        (at - timedelta(minutes=5), at), (at, at + timedelta(minutes=5))]
    # a watermark on a boundary completes the window that ends there
    assert complete_windows(at, timedelta(minutes=5), 1)[-1][1] == at


def test_latest_watermark_of_several_events() -> None:
    assert latest_watermark([{"watermark": "2026-01-01T00:00:02+00:00"},
                             {"watermark": None}, {"watermark": "2026-01-01T00:00:05+00:00"},
                             {}]) == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert latest_watermark([{"watermark": None}]) is None


def _event(lineage: Any) -> dict[str, Any]:
    """A COMPLETE run event of ``lineage`` as the OpenLineage provider sends it."""
    return {
        "eventType": "COMPLETE", "eventTime": "2026-01-01T00:00:00Z",
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": "01920000-0000-7000-8000-000000000000",
                "facets": lineage.run_facets},
        "job": {"namespace": "kafka-ingest", "name": "telemetry_metrics_ingest.ingest"},
        "inputs": [{"namespace": d.namespace, "name": d.name, "facets": d.facets,
                    "inputFacets": d.io_facets} for d in lineage.inputs],
        "outputs": [{"namespace": d.namespace, "name": d.name, "facets": d.facets,
                     "outputFacets": d.io_facets} for d in lineage.outputs]}


def test_the_facets_meet_the_spec_and_a_broken_one_does_not(
        shipped: dict[str, Pipeline]) -> None:
    from tests.support.openlineage import spec_errors

    lineage = run_lineage(shipped["telemetry_metrics"],
                          [_report(1, 5, 9, read=4, bytes=400, inserted=3, dead_lettered=1,
                                   resumed_from=7)],
                          bootstrap_servers="k1:9092")
    event = _event(lineage)
    assert spec_errors(event) == []
    # each kind of facet this project builds, broken the way a bug would break it
    table = event["outputs"][0]
    broken = [
        (table["outputFacets"]["outputStatistics"], "rowCount", "3"),
        (table["facets"]["columnLineage"]["fields"]["device_id"]["inputFields"][0],
         "field", None),
        (table["facets"]["schema"], "fields", {"name": "device_id"}),
        (event["run"]["facets"][OFFSETS_FACET]["ranges"][0], "end", "9"),
        (event["run"]["facets"][OFFSETS_FACET], "_producer", None),
    ]
    for facet, key, bad in broken:
        good = facet.pop(key)
        if bad is not None:
            facet[key] = bad
        assert spec_errors(event), (key, bad)
        facet[key] = good
    assert spec_errors(event) == []


def test_the_producer_and_the_custom_facets_schema_are_this_projects() -> None:
    from importlib.resources import files

    assert PRODUCER.startswith("pkg:generic/kafka-ingest@")
    base, _, path = OFFSETS_SCHEMA_URL.partition("#")
    assert base == PRODUCER and path == OFFSETS_SCHEMA
    shipped = files("kafka_ingest").joinpath(*OFFSETS_SCHEMA.split("/")[1:])
    assert OFFSETS_FACET in json.loads(shipped.read_text(encoding="utf-8"))["properties"]
