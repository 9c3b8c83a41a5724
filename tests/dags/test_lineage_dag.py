"""The ingest DAG's lineage, run for real (``airflow dags test`` against the stack's metadata
database, real Kafka, a fresh Postgres database): the OpenLineage provider's events, caught
by its ``file`` transport, and the table's Asset event with the run's watermark.

The transport is a composite: an HTTP backend nobody listens on first (configured as
docs/lineage.md advises: no retry, a short time-out), then the file. The run must succeed
anyway, the backend costing a log line per event; the file must hold the events.

Then a backfill (by offsets) and a DLQ replay of the same pipeline. Every event of the
three runs, the provider's and this project's facets alike, is checked against the
OpenLineage spec's JSON Schemas (``tests/support/openlineage.py``), as a consumer would
read it; the slices' events must name the job, its input topic, its output table and the
table's column lineage.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.ops.lineage import OFFSETS_FACET
from kafka_ingest_dev.samples import produce_sample
from tests.support.airflow_api import metadata_dsn
from tests.support.dag_runs import run_dag
from tests.support.openlineage import spec_errors
from tests.support.pipelines import dag_env

DAG_ID = "telemetry_metrics_ingest"
REPLAY_DAG_ID = "telemetry_metrics_dlq_replay"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _closed_port() -> int:
    """A local port with no listener (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _asset_extras(stack_env: dict[str, str], uri: str) -> list[dict[str, Any]]:
    with psycopg.connect(metadata_dsn(stack_env)) as conn:
        rows = conn.execute(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
            "WHERE a.uri = %s ORDER BY e.id DESC LIMIT 50", (uri,)).fetchall()
    return [r[0] if isinstance(r[0], dict) else json.loads(r[0] or "{}") for r in rows]


def test_the_ingest_dag_emits_lineage_and_a_watermark(stack_env: dict[str, str],
                                                      clients: Any, make_pipeline: Any,
                                                      pg_dsn: str, tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=2)
    sample = produce_sample(clients, pipeline, count=60, poison=1, partitions=2)
    events_file = tmp_path / "openlineage.jsonl"
    transport = {"type": "composite", "continue_on_failure": True,
                 "continue_on_success": True, "transports": [
                     # as docs/lineage.md advises: one attempt, a short time-out
                     {"type": "http", "url": f"http://127.0.0.1:{_closed_port()}",
                      "timeout": 2, "retry": {"total": 0, "connect": 0, "read": 0}},
                     {"type": "file", "log_file_path": str(events_file), "append": True}]}
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline),
           # this checkout's DAGs and plugins (the stack's settings name the main one's)
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
           "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
           "AIRFLOW__OPENLINEAGE__NAMESPACE": "kafka-ingest-test"}

    proc = run_dag(DAG_ID, env, log_file=tmp_path / "run.log")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    # the backend that is down cost a log line per event, and no retry
    failures = [line for line in output.splitlines() if "HttpTransport" in line
                and "failed to emit event" in line]
    assert failures, output[-3000:]
    assert not [line for line in output.splitlines() if "Retrying (Retry(" in line]

    events = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    slices = [e for e in events if e["eventType"] == "COMPLETE"
              and e["job"]["name"] == f"{DAG_ID}.ingest"]
    assert len(slices) == 2, [(e["eventType"], e["job"]["name"]) for e in events]
    for event in slices:
        [source] = event["inputs"]
        assert (source["namespace"], source["name"]) == (
            f"kafka://{stack_env['KAFKA_BOOTSTRAP_SERVERS'].split(',')[0]}", pipeline.topic)
        table, dlq = event["outputs"]
        assert table["name"] == "kafka_ingest.public.telemetry_metrics"
        assert dlq["name"] == pipeline.dlq_topic
        lineage = table["facets"]["columnLineage"]["fields"]
        assert lineage["device_id"]["inputFields"][0]["field"] == "device_id"
        assert lineage["source_offset"]["inputFields"][0]["field"] == "kafka.offset"
        assert "metric_value" in [f["name"] for f in table["facets"]["schema"]["fields"]]

    # statistics and offset ranges, summed over the run's slices, match what was produced
    def total(kind: str, name: str, facet: str) -> int:
        return sum(d[kind][facet]["rowCount"] for e in slices
                   for d in e["inputs" if kind == "inputFacets" else "outputs"]
                   if d["name"] == name)

    assert total("inputFacets", pipeline.topic, "inputStatistics") == sample["produced"]
    assert total("outputFacets", "kafka_ingest.public.telemetry_metrics",
                 "outputStatistics") == sample["expect"]["row"]
    poison = sum(n for k, n in sample["expect"].items()
                 if k not in {"row", "duplicate", "tombstone"})
    assert total("outputFacets", pipeline.dlq_topic, "outputStatistics") == poison
    ranges = sorted((r["partition"], r["start"], r["end"]) for e in slices
                    for r in e["run"]["facets"][OFFSETS_FACET]["ranges"])
    with psycopg.connect(pg_dsn) as conn:
        stored = conn.execute("SELECT partition, next_offset FROM ingest_offsets "
                              "WHERE topic = %s ORDER BY partition", (pipeline.topic,)).fetchall()
    assert [(p, e) for p, _, e in ranges] == [tuple(r) for r in stored]

    # the table's Asset event carries the watermark and the same ranges
    mine = [x for x in _asset_extras(stack_env, pipeline.asset_uri)
            if any(r.get("topic") == pipeline.topic for r in x.get("offsets", []))]
    assert len(mine) == 1, mine
    assert mine[0]["watermark"] is not None and mine[0]["event_time"] == "kafka_timestamp"
    assert sorted((r["partition"], r["start"], r["end"]) for r in mine[0]["offsets"]) == ranges

    # a backfill by offsets and a DLQ replay: their slices' lineage, and every event valid
    backfill = run_dag(DAG_ID, env, conf={"partitions": {"0": [0, 5]}},
                       log_file=tmp_path / "backfill.log")
    assert backfill.returncode == 0, (backfill.stdout + backfill.stderr)[-3000:]
    replay = run_dag(REPLAY_DAG_ID, env, log_file=tmp_path / "replay.log")
    assert replay.returncode == 0, (replay.stdout + replay.stderr)[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line]
    invalid = {(e["eventType"], e["job"]["name"]): errors for e in events
               if (errors := spec_errors(e))}
    assert not invalid, invalid
    by_job = {(e["job"]["name"], tuple(r["mode"] for r in e["run"]["facets"].get(
        OFFSETS_FACET, {}).get("ranges", []))): e for e in events
        if e["eventType"] == "COMPLETE"}
    backfilled = by_job[(f"{DAG_ID}.ingest", ("backfill",))]
    assert [r["end"] for r in backfilled["run"]["facets"][OFFSETS_FACET]["ranges"]] == [5]
    assert [d["name"] for d in backfilled["inputs"]] == [pipeline.topic]
    replayed = by_job[(f"{REPLAY_DAG_ID}.replay", ("replay",))]
    assert [d["name"] for d in replayed["inputs"]] == [pipeline.dlq_topic]
    assert [d["name"] for d in replayed["outputs"]] == ["kafka_ingest.public.telemetry_metrics"]
    assert replayed["outputs"][0]["facets"]["columnLineage"]["fields"]["device_id"][
        "inputFields"][0]["name"] == pipeline.dlq_topic
