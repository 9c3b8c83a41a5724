"""Lineage and completeness of a run, as plain data: OpenLineage datasets and facets, and the
event-time watermark a table's Asset event carries.

No Airflow and no OpenLineage import: the facets are the JSON the OpenLineage spec
defines (each with ``_producer`` and ``_schemaURL``), built from a pipeline and the slice
reports of a run (:class:`~kafka_ingest.engine.slices.SliceReport` as dicts, what the
mapped tasks return). The Airflow side (``plugins/kafka_ingest_lineage.py``) only wraps
them for the OpenLineage provider.

Naming follows the OpenLineage naming spec: a Kafka topic is namespace
``kafka://<first bootstrap server host:port>``, name ``<topic>``; a Postgres table is
namespace ``postgres://<host:port>``, name ``<database>.<schema>.<table>`` (the same host
and database as the table's Airflow Asset URI, ``asset_host`` and ``asset_database``).

Fields of a Kafka record in the column lineage: the payload's fields by their path in the
payload (``device_id``, ``order.id``); the record's own parts under ``kafka.``:
``kafka.key``, ``kafka.headers.<name>``, ``kafka.topic``, ``kafka.partition``,
``kafka.offset``, ``kafka.timestamp``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from kafka_ingest.contracts.columns import payload_paths
from kafka_ingest.records import INGESTED_AT, PROVENANCE_COLUMNS


def _producer() -> str:
    """The project's identifier: its package URL (purl, ``pkg:generic/<name>@<version>``;
    the project has no URL of its own in ``pyproject.toml``), the installed version."""
    try:
        return f"pkg:generic/{DISTRIBUTION}@{version(DISTRIBUTION)}"
    except PackageNotFoundError:  # run from a source tree that was never installed
        return f"pkg:generic/{DISTRIBUTION}"


DISTRIBUTION = "kafka-ingest"
#: Who produced the facets this module builds (the facet's ``_producer``).
PRODUCER = _producer()
SPEC = "https://openlineage.io/spec"
#: The custom run facet holding the run's offset ranges (its key in ``run.facets``).
OFFSETS_FACET = "kafkaIngest_offsets"
#: Its JSON Schema, shipped in the package (``kafka_ingest/ops/schemas/``).
OFFSETS_SCHEMA = "kafka_ingest/ops/schemas/KafkaIngestOffsetsRunFacet.json"
#: The facet's ``_schemaURL``: the schema file by its path in the package, as a package
#: URL's subpath (after ``#``).
OFFSETS_SCHEMA_URL = f"{PRODUCER}#{OFFSETS_SCHEMA}"

_SCHEMA_URLS = {
    "schema": f"{SPEC}/facets/1-2-0/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet",
    "columnLineage": f"{SPEC}/facets/1-2-0/ColumnLineageDatasetFacet.json"
                     "#/$defs/ColumnLineageDatasetFacet",
    "inputStatistics": f"{SPEC}/facets/1-0-0/InputStatisticsInputDatasetFacet.json"
                       "#/$defs/InputStatisticsInputDatasetFacet",
    "outputStatistics": f"{SPEC}/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json"
                        "#/$defs/OutputStatisticsOutputDatasetFacet",
}
#: Where each provenance column's value comes from in the Kafka record.
_PROVENANCE_FIELDS = {"source_topic": "kafka.topic", "source_partition": "kafka.partition",
                      "source_offset": "kafka.offset", "kafka_key": "kafka.key",
                      "kafka_timestamp": "kafka.timestamp"}


def _facet(kind: str, **fields: Any) -> dict[str, Any]:
    return {"_producer": PRODUCER, "_schemaURL": _SCHEMA_URLS[kind], **fields}


@dataclass(frozen=True)
class DatasetRef:
    """An OpenLineage dataset's identity, and the facets it carries in one event."""

    namespace: str
    name: str
    facets: dict[str, Any] = field(default_factory=dict)
    #: Input or output facets (statistics), by facet name.
    io_facets: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunLineage:
    """What one task run read and wrote, with its run facets."""

    inputs: list[DatasetRef]
    outputs: list[DatasetRef]
    run_facets: dict[str, Any]


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://host:port`` of the first bootstrap server (a listener name such as
    ``SASL_SSL://`` in front of it is dropped)."""
    first = bootstrap_servers.split(",", maxsplit=1)[0].strip()
    host = first.rsplit("://", 1)[-1]
    if not host:
        raise ValueError(f"no bootstrap server in {bootstrap_servers!r}")
    return f"kafka://{host}"


def postgres_dataset(pipeline: Any) -> tuple[str, str]:
    """The target table's (namespace, name): ``postgres://host:port``,
    ``database.public.table``."""
    return (f"postgres://{pipeline.asset_host}",
            f"{pipeline.asset_database}.public.{pipeline.table}")


def table_columns(pipeline: Any) -> list[tuple[str, str]]:
    """The target table's columns (name, Postgres type) in table order: the contract's,
    the key and header columns, the provenance, ``ingested_at``."""
    return [*((c.name, c.ddl) for c in pipeline.sink_columns),
            *((c.name, c.type) for c in PROVENANCE_COLUMNS), (INGESTED_AT, "timestamptz")]


def schema_facet(pipeline: Any) -> dict[str, Any]:
    """The table's ``schema`` facet, from the contract (what the table is made from)."""
    return _facet("schema", fields=[{"name": n, "type": t} for n, t in table_columns(pipeline)])


def column_sources(pipeline: Any) -> dict[str, str]:
    """Each column filled from the record -> the record's field it comes from (module
    docstring for the names); ``ingested_at`` comes from none."""
    sources = {column: path for path, column in payload_paths(pipeline.model).items()}
    if pipeline.key_column is not None:
        key = pipeline.key_column
        sources[key.column] = f"kafka.key.{key.field}" if key.field else "kafka.key"
    for name, header in pipeline.headers.items():
        sources[header.column] = f"kafka.headers.{name}"
    return {**sources, **_PROVENANCE_FIELDS}


def column_lineage_facet(pipeline: Any, namespace: str, topic: str) -> dict[str, Any]:
    """The table's ``columnLineage`` facet: each column from its field of ``topic``'s
    records, directly: the value itself (``IDENTITY``), or converted on the way (an epoch
    into a ``timestamptz``: ``TRANSFORMATION``)."""
    converted = set(getattr(pipeline.model, "CONVERTED", {}))
    return _facet("columnLineage", fields={
        column: {"inputFields": [{
            "namespace": namespace, "name": topic, "field": source,
            "transformations": [{
                "type": "DIRECT",
                "subtype": "TRANSFORMATION" if column in converted else "IDENTITY",
                "description": "the record's own" if source.startswith("kafka.")
                else "the payload's field, validated by the contract",
                "masking": False}],
        }]}
        for column, source in column_sources(pipeline).items()
    })


def offsets_facet(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The custom run facet of the run's offset ranges, one per partition slice: replaying
    ``[start, end)`` of each (a backfill by offsets) reads exactly what the run read."""
    return {"_producer": PRODUCER, "_schemaURL": OFFSETS_SCHEMA_URL,
            "ranges": offset_ranges(reports)}


def offset_ranges(reports: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The slices' ranges, by topic and partition: half-open ``[start, end)``, with the
    mode (``live``, ``backfill``, ``replay``) and the first offset actually read
    (``resumed_from``, when a retry resumed past the start)."""
    ranges = [{"topic": r["topic"], "partition": int(r["partition"]),
               "start": int(r["start"]), "end": int(r["end"]), "mode": r["mode"],
               **({"resumed_from": int(r["resumed_from"])}
                  if r.get("resumed_from") is not None else {})}
              for r in reports]
    return sorted(ranges, key=lambda r: (r["topic"], r["partition"], r["start"]))


def _sum(reports: list[Mapping[str, Any]], name: str) -> int:
    return sum(int(r.get(name) or 0) for r in reports)


def run_lineage(pipeline: Any, reports: Iterable[Mapping[str, Any]], *,
                bootstrap_servers: str, replay: bool = False) -> RunLineage:
    """The lineage of slice reports of one pipeline: an ingest (or backfill) reads the
    source topic and writes the table and the dead-letter topic; a replay reads the
    dead-letter topic and writes the table (its letters stay where they are). A dry run
    read its input and wrote nothing: no outputs."""
    reports = list(reports)
    done = [r for r in reports if not r.get("dry_run")]
    namespace = kafka_namespace(bootstrap_servers)
    topic = pipeline.dlq_topic if replay else pipeline.topic
    source = DatasetRef(namespace, topic, io_facets={"inputStatistics": _facet(
        "inputStatistics", rowCount=_sum(done, "read"), size=_sum(done, "bytes"))})
    table_ns, table_name = postgres_dataset(pipeline)
    table = DatasetRef(
        table_ns, table_name,
        facets={"schema": schema_facet(pipeline),
                "columnLineage": column_lineage_facet(pipeline, namespace, topic)},
        io_facets={"outputStatistics": _facet(
            "outputStatistics", rowCount=_sum(done, "inserted"))})
    outputs = [table] if done else []
    if done and not replay:
        outputs.append(DatasetRef(namespace, pipeline.dlq_topic, io_facets={
            "outputStatistics": _facet("outputStatistics",
                                       rowCount=_sum(done, "dead_lettered"))}))
    return RunLineage([source], outputs, {OFFSETS_FACET: offsets_facet(reports)})


# ------------------------------------------------------------------ completeness


def caught_up(report: Mapping[str, Any], max_records: int) -> bool:
    """Whether a live slice loaded its partition up to where the topic was when the run
    was planned: it read its whole planned range (a retry that resumed inside it still
    reached its end), and the plan did not cut the range at ``max_records`` (a partition
    with more waiting than one run reads is behind)."""
    size = int(report["end"]) - int(report["start"])
    return (report.get("mode") == "live" and not report.get("dry_run")
            and size < max_records and report.get("max_event_time_ms") is not None)


def watermark(reports: Iterable[Mapping[str, Any]], max_records: int) -> datetime | None:
    """The run's event-time watermark: the minimum over the run's partitions of the latest
    event time loaded (``max_event_time_ms`` of each slice: by the pipeline's
    ``event_time`` field, or the Kafka timestamp), when every partition the run read is
    caught up (:func:`caught_up`); otherwise None, and the watermark does not advance. A
    partition the run did not read had nothing new when it was planned.

    Meaning: for every partition of the source topic, the records up to the watermark in
    log order are in the table (or dead-lettered). A consumer aggregating windows that end
    at or before it sees complete windows (records whose event time is out of log order, a
    producer's late ``CreateTime`` or a late event, can still arrive after it).
    """
    slices = list(reports)
    if not slices or not all(caught_up(r, max_records) for r in slices):
        return None
    latest: dict[tuple[str, int], int] = {}
    for r in slices:
        key = (r["topic"], int(r["partition"]))
        latest[key] = max(latest.get(key, 0), int(r["max_event_time_ms"]))
    return datetime.fromtimestamp(min(latest.values()) / 1000, tz=UTC)


#: What the watermark is by when the pipeline names no ``event_time`` (its column).
KAFKA_TIMESTAMP = "kafka_timestamp"


def completeness(reports: Iterable[Mapping[str, Any]], max_records: int, *,
                 event_time: str | None = None) -> dict[str, Any]:
    """What a table's Asset event carries in its ``extra``: ``watermark`` (ISO-8601, or
    None: this run does not advance it), ``event_time`` (what it is by: the pipeline's
    ``event_time`` field, or ``kafka_timestamp``) and ``offsets`` (the run's ranges)."""
    slices = [r for r in reports if not r.get("dry_run")]
    mark = watermark(slices, max_records)
    return {"watermark": mark.isoformat() if mark else None,
            "event_time": event_time or KAFKA_TIMESTAMP, "offsets": offset_ranges(slices)}


def latest_watermark(extras: Iterable[Mapping[str, Any]]) -> datetime | None:
    """The newest watermark of some Asset events' ``extra`` (an Asset-scheduled run may
    come from several events; one without a watermark advanced nothing)."""
    marks = [datetime.fromisoformat(x["watermark"]) for x in extras if x.get("watermark")]
    return max(marks, default=None)


def complete_windows(mark: datetime, width: timedelta, count: int) -> list[tuple[datetime,
                                                                                 datetime]]:
    """The last ``count`` windows ``[start, end)`` of ``width`` (aligned on the Unix epoch)
    that end at or before the watermark ``mark``: complete, by the watermark's meaning."""
    if width <= timedelta(0) or count < 1:
        raise ValueError("complete_windows needs a positive width and count")
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + (mark - epoch) // width * width
    return [(end - (i + 1) * width, end - i * width) for i in reversed(range(count))]


__all__ = [
    "KAFKA_TIMESTAMP",
    "OFFSETS_FACET",
    "OFFSETS_SCHEMA",
    "OFFSETS_SCHEMA_URL",
    "PRODUCER",
    "DatasetRef",
    "RunLineage",
    "caught_up",
    "column_lineage_facet",
    "column_sources",
    "complete_windows",
    "completeness",
    "kafka_namespace",
    "latest_watermark",
    "offset_ranges",
    "offsets_facet",
    "postgres_dataset",
    "run_lineage",
    "schema_facet",
    "table_columns",
    "watermark",
]
