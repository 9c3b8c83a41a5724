"""The metrics' snapshot against the real stack: the lag equals ``kafka-ingest lag``'s, the
oldest unread message's age comes from its Kafka timestamp, the ledger's counters equal
what the runs committed; a broker or a database out of reach shows as ``up 0`` within
the snapshot's time-out, never as an error; the exporter serves all of it over HTTP.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ops.lag import LagReader, lag
from kafka_ingest.ops.metrics import exposition, registry_of
from kafka_ingest.ops.observe import Snapshot, SnapshotCache, Sources, snapshot
from kafka_ingest_dev.procs import free_ports
from kafka_ingest_dev.samples import produce_sample
from tests.support.exporter import running_exporter
from tests.support.ingest import run, total
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

PARTITIONS = 3
TIMEOUT_S = 2.0


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``(name, labels) -> value`` of an exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def look(pipeline: Pipeline, clients: KafkaClients, db: Database) -> Snapshot:
    return snapshot([pipeline], Sources(clients=lambda _p: clients, database=lambda _p: db),
                    timeout_s=TIMEOUT_S)


@pytest.fixture
def pipeline(make_pipeline: Callable[..., Pipeline]) -> Pipeline:
    return make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=200)


def test_the_snapshot_tells_the_lag_the_oldest_unread_and_the_ledger(
        pipeline: Pipeline, clients: KafkaClients, db: Database) -> None:
    before = time.time()
    sample = produce_sample(clients, pipeline, count=600, poison=6, partitions=PARTITIONS)
    after = time.time()

    snap = look(pipeline, clients, db)
    view = snap.view(pipeline.name)
    assert view is not None and view.lag_rows is not None
    assert snap.up == {("kafka", pipeline.kafka_conn_id): True,
                       ("postgres", pipeline.postgres_conn_id): True}
    assert list(view.lag_rows) == lag(pipeline, clients, db)  # one implementation of lag
    with LagReader(clients, db) as reader:  # the lag trigger's reads: no group offsets
        without = reader.read([pipeline], group=False)[pipeline.name]
    assert without == [replace(r, group_offset=None) for r in view.lag_rows]
    assert sum(r.lag for r in view.lag_rows) == sample["produced"]
    # the oldest unread message of each partition is its first, produced just now
    assert set(view.oldest_unread) == set(range(PARTITIONS))
    assert all(before - 1 <= ts <= after + 1 for ts in view.oldest_unread.values())
    assert view.totals == {}  # nothing committed yet

    reports = run(pipeline, clients, db)
    found = samples(exposition(registry_of(SnapshotCache(
        lambda: look(pipeline, clients, db), max_age_s=0))).decode())
    name = pipeline.name
    for p in range(PARTITIONS):
        part = {"pipeline": name, "topic": pipeline.topic, "partition": str(p)}
        assert value(found, "kafka_ingest_lag_messages", **part) == 0
        assert value(found, "kafka_ingest_oldest_unread_age_seconds", **part) == 0
    live = {"pipeline": name, "mode": "live"}
    assert value(found, "kafka_ingest_messages_read_total", **live) == sample["produced"]
    assert value(found, "kafka_ingest_rows_inserted_total", **live) == total(reports,
                                                                             "inserted")
    assert value(found, "kafka_ingest_dead_letters_total", **live) == total(
        reports, "dead_lettered") > 0
    parked = sum(v for (n, labels), v in found.items() if n == "kafka_ingest_parked_letters"
                 and ("pipeline", name) in labels)
    assert parked == total(reports, "dead_lettered")
    assert value(found, "kafka_ingest_lag_known", pipeline=name) == 1
    assert value(found, "kafka_ingest_alert_breached", pipeline=name, rule="max_lag") == 0


def test_a_broker_out_of_reach_is_up_0_and_the_database_figures_stay(
        pipeline: Pipeline, clients: KafkaClients, db: Database) -> None:
    sample = produce_sample(clients, pipeline, count=60, poison=1, partitions=PARTITIONS)
    run(pipeline, clients, db)
    closed = free_ports(1)[0]
    gone = KafkaClients({"bootstrap.servers": f"127.0.0.1:{closed}"})
    started = time.monotonic()
    snap = look(pipeline, gone, db)
    took = time.monotonic() - started
    view = snap.view(pipeline.name)
    assert view is not None
    assert snap.up[("kafka", pipeline.kafka_conn_id)] is False
    assert snap.up[("postgres", pipeline.postgres_conn_id)] is True
    assert view.lag_rows is None and view.lag_error and "Kafka" in view.lag_error
    assert view.totals["live"].read == sample["produced"]  # the ledger still answers
    # bounded by the snapshot's time-out (a few requests of TIMEOUT_S each), not hung
    assert took < 10 * TIMEOUT_S, f"the snapshot took {took:.1f} s"
    found = samples(exposition(registry_of(SnapshotCache(lambda: snap))).decode())
    assert value(found, "kafka_ingest_up", component="kafka",
                 connection=pipeline.kafka_conn_id) == 0
    assert value(found, "kafka_ingest_lag_known", pipeline=pipeline.name) == 0
    assert not [k for k in found if k[0] == "kafka_ingest_lag_messages"]


def test_a_database_out_of_reach_is_up_0(pipeline: Pipeline, clients: KafkaClients,
                                         pg_dsn: str) -> None:
    produce_sample(clients, pipeline, count=30, poison=0, partitions=PARTITIONS)
    closed = free_ports(1)[0]
    down = Database(f"host=127.0.0.1 port={closed} dbname=x user=x", connect_timeout=2,
                    reply_timeout_s=TIMEOUT_S)
    snap = look(pipeline, clients, down)
    view = snap.view(pipeline.name)
    assert view is not None
    assert snap.up[("postgres", pipeline.postgres_conn_id)] is False
    assert view.result is None and view.lag_rows is None
    found = samples(exposition(registry_of(SnapshotCache(lambda: snap))).decode())
    assert value(found, "kafka_ingest_up", component="postgres",
                 connection=pipeline.postgres_conn_id) == 0


@pytest.fixture
def exporter(pipeline: Pipeline, pg_dsn: str, stack_env: dict[str, str],
             tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = {**stack_env, "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline))}
    with running_exporter(env, tmp_path / "exporter.log", timeout_s=TIMEOUT_S) as found:
        yield found


def test_the_exporter_serves_the_lag_over_http(
        pipeline: Pipeline, clients: KafkaClients, db: Database,
        exporter: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = exporter
    sample = produce_sample(clients, pipeline, count=90, poison=0, partitions=PARTITIONS)
    time.sleep(0.6)  # past the exporter's cache (0.5 s): the next scrape looks again
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    lags = [v for (n, labels), v in found.items() if n == "kafka_ingest_lag_messages"
            and ("pipeline", pipeline.name) in labels]
    assert len(lags) == PARTITIONS and sum(lags) == sample["produced"]
    proc.terminate()  # SIGTERM ends it cleanly
    assert proc.wait(timeout=30) == 0


def test_the_monitor_checks_a_group_at_once_and_a_missing_topic_spares_the_others(
        pipeline: Pipeline, clients: KafkaClients, db: Database, pg_dsn: str) -> None:
    from kafka_ingest.config import parse_pipelines
    from kafka_ingest.errors import TopicMissing
    from kafka_ingest.ops.status import check_pipelines

    sample = produce_sample(clients, pipeline, count=50, poison=0, partitions=PARTITIONS)
    body = pipeline.model_dump(mode="json", exclude={"name"})
    body.update(topic=f"never-created-{pipeline.topic}")
    missing = parse_pipelines({"pipelines": {"gone": body}})["gone"]
    results = dict((p.name, r) for p, r in check_pipelines([missing, pipeline], clients, db))
    assert isinstance(results["gone"], TopicMissing)
    found = results[pipeline.name]
    assert not isinstance(found, Exception)
    assert found.figures.total_lag == sample["produced"]
    with psycopg.connect(pg_dsn) as conn:
        recorded = conn.execute("SELECT pipeline, total_lag, partition_lags FROM monitor_checks"
                                ).fetchall()
    assert recorded == [(pipeline.name, sample["produced"],
                         {str(r.partition): r.lag for r in lag(pipeline, clients, db)})]
