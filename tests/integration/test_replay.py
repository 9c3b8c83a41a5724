"""DLQ replay against the real stack: a contract that rejected a class of events is fixed,
and the replay loads exactly those events with their original provenance.

The story: ``telemetry_metrics`` runs with ``metric_event`` v1 while producers already
send v2 (with ``unit``); the v2 events are dead-lettered as ``unknown_version``. NaN
readings are dead-lettered as ``contract_violation`` and stay bad under any version. The
pipeline then moves to v2 and the DLQ is replayed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest.cli import main
from kafka_ingest.config import Pipeline
from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize
from kafka_ingest.engine.replay import (
    plan_replay,
    replay_range,
    summarize_replay,
)
from kafka_ingest.kafka.metadata import watermarks
from kafka_ingest.requests import (
    LiveRun,
    OffsetWindow,
    RangeRequest,
    ReplayFilters,
    ReplayRequest,
    TimeWindow,
)
from tests.support.ingest import versioned_metric, with_version
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

PARTITIONS = 2
GOOD, V2, NAN = 20, 8, 3

Source = tuple[str, int, int]  # (topic, partition, offset)


def produce(clients: Any, topic: str, records: list[tuple[bytes, bytes, int]]) -> list[Source]:
    """Produce (key, value, partition) records; every delivery report checked."""
    producer = clients.producer()
    reports: dict[int, tuple[Any, Any]] = {}
    for i, (key, value, partition) in enumerate(records):
        producer.produce(topic, value=value, key=key, partition=partition,
                         on_delivery=lambda err, msg, i=i: reports.__setitem__(i, (err, msg)))
    assert producer.flush(30) == 0
    assert len(reports) == len(records) and all(err is None for err, _ in reports.values())
    return [(m.topic(), m.partition(), m.offset()) for _, m in (reports[i] for i in
                                                               range(len(records)))]


def ingest_all(pipeline: Pipeline, clients: Any, db: Any) -> dict[str, Any]:
    run_id = f"test__{uuid.uuid4().hex[:8]}"
    ranges = plan_run(pipeline, clients, db, run_id=run_id)
    return summarize(ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict()
                     for r in ranges)


def replay(pipeline: Pipeline, clients: Any, db: Any, *, dry_run: bool = False,
           request: RangeRequest | None = None,
           filters: ReplayFilters | None = None) -> dict[str, Any]:
    run_id = f"replay__{uuid.uuid4().hex[:8]}"
    asked = ReplayRequest(request or LiveRun(), dry_run, filters or ReplayFilters())
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=asked)
    return summarize_replay(replay_range(pipeline, r, clients, db, run_id=run_id,
                                         dry_run=dry_run, filters=filters).to_dict()
                            for r in ranges)


def table_rows(db: Any) -> dict[str, Source]:
    with db.session() as conn:
        rows = conn.execute("SELECT event_id, source_topic, source_partition, source_offset"
                            " FROM telemetry_metrics").fetchall()
    return {e: (t, int(p), int(o)) for e, t, p, o in rows}


def letters(db: Any) -> dict[Source, tuple[str, str, int]]:
    """(source) -> (status, error_class, attempts)"""
    with db.session() as conn:
        rows = conn.execute("SELECT source_topic, source_partition, source_offset, status,"
                            " error_class, attempts FROM dead_letters").fetchall()
    return {(t, int(p), int(o)): (s, c, int(a)) for t, p, o, s, c, a in rows}


def replay_cursor(db: Any, pipeline: Pipeline) -> dict[int, int]:
    with db.session() as conn:
        rows = conn.execute("SELECT partition, next_offset FROM ingest_offsets"
                            " WHERE pipeline = %s AND topic = %s",
                            (pipeline.name, pipeline.dlq_topic)).fetchall()
    return {int(p): int(o) for p, o in rows}


@pytest.fixture
def story(make_pipeline: Callable[..., Pipeline], clients: Any, db: Any) -> dict[str, Any]:
    """Ingested with v1: GOOD rows in the table, V2 + NAN letters parked."""
    v1 = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=7,
                       contract={"event_type": "metric_event", "version": 1})
    tag = uuid.uuid4().hex[:6]
    good = [(b"k", versioned_metric(f"{tag}-good-{i}", version=1), i % PARTITIONS)
            for i in range(GOOD)]
    v2 = [(b"k", versioned_metric(f"{tag}-v2-{i}", version=2), i % PARTITIONS)
          for i in range(V2)]
    nan = [(b"k", versioned_metric(f"{tag}-nan-{i}", version=1, value=float("nan")),
            i % PARTITIONS)
           for i in range(NAN)]
    produced_ms = int(time.time() * 1000)
    sources = produce(clients, v1.topic, good + v2 + nan)
    v2_sources = dict(zip([f"{tag}-v2-{i}" for i in range(V2)], sources[GOOD:GOOD + V2],
                          strict=True))
    first = ingest_all(v1, clients, db)
    assert (first["inserted"], first["dead_lettered"]) == (GOOD, V2 + NAN)
    parked = letters(db)
    assert sorted(c for _, c, _ in parked.values()) == sorted(
        ["unknown_version"] * V2 + ["contract_violation"] * NAN)
    return {"v1": v1, "v2": with_version(v1, 2), "v2_sources": v2_sources,
            "produced_ms": produced_ms,
            "nan_sources": set(sources[GOOD + V2:]), "rows": table_rows(db), "parked": parked}


def test_dry_run_reports_the_counts_and_writes_nothing(story: dict[str, Any], clients: Any,
                                                       db: Any) -> None:
    summary = replay(story["v2"], clients, db, dry_run=True)

    assert summary["dry_run"] is True
    assert summary["outcomes"] == {"recovered": V2, "still_parked": NAN,
                                   "already_recovered": 0, "filtered_out": 0}
    assert summary["reasons"] == {"recovered": {"unknown_version": V2},
                                  "still_parked": {"contract_violation": NAN}}
    assert summary["inserted"] == V2
    # A time window over the DLQ (its records carry the original timestamps): same counts.
    window = replay(story["v2"], clients, db, dry_run=True,
                    request=TimeWindow(from_ms=story["produced_ms"] - 60_000,
                                       to_ms=int(time.time() * 1000)))
    assert window["outcomes"] == summary["outcomes"]
    assert table_rows(db) == story["rows"]
    assert letters(db) == story["parked"]
    assert replay_cursor(db, story["v2"]) == {}


def test_replay_recovers_exactly_the_fixed_class(story: dict[str, Any], clients: Any,
                                                 db: Any) -> None:
    v2 = story["v2"]
    summary = replay(v2, clients, db)

    assert summary["outcomes"] == {"recovered": V2, "still_parked": NAN,
                                   "already_recovered": 0, "filtered_out": 0}
    rows = table_rows(db)
    new = {e: src for e, src in rows.items() if e not in story["rows"]}
    assert new == story["v2_sources"]  # provenance = the original source offsets
    state = letters(db)
    for src in story["v2_sources"].values():
        assert state[src] == ("recovered", "unknown_version", 2)
    for src in story["nan_sources"]:
        assert state[src] == ("parked", "contract_violation", 2)
    with db.session() as conn:
        units = conn.execute("SELECT count(*) FROM telemetry_metrics WHERE unit = 'celsius'"
                             ).fetchone()
    assert units == (V2,)
    consumer = clients.consumer("test")
    try:
        marks = watermarks(consumer, v2.dlq_topic, list(range(PARTITIONS)))
    finally:
        consumer.close()
    assert replay_cursor(db, v2) == {p: high for p, (_, high) in marks.items()}

    # Again from the cursor: nothing left to read, nothing changes.
    again = replay(v2, clients, db)
    assert again["partitions"] == 0 and again["read"] == 0
    assert table_rows(db) == rows and letters(db) == state

    # Again over the whole DLQ by offsets: recovered ones are skipped, no row is added.
    whole = {p: (low, high) for p, (low, high) in marks.items() if high > low}
    explicit = replay(v2, clients, db, request=OffsetWindow(partitions=whole))
    assert explicit["outcomes"] == {"recovered": 0, "still_parked": NAN,
                                    "already_recovered": V2, "filtered_out": 0}
    assert table_rows(db) == rows
    assert all(letters(db)[src] == ("parked", "contract_violation", 3)
               for src in story["nan_sources"])
    assert replay_cursor(db, v2) == {p: high for p, (_, high) in marks.items()}


def test_filters_replay_only_what_matches_and_keep_the_cursor(story: dict[str, Any],
                                                              clients: Any, db: Any) -> None:
    v2 = story["v2"]
    event_id, source = next(iter(story["v2_sources"].items()))

    one = replay(v2, clients, db, filters=ReplayFilters(event_id=event_id))
    assert one["outcomes"] == {"recovered": 1, "still_parked": 0, "already_recovered": 0,
                               "filtered_out": V2 + NAN - 1}
    assert set(table_rows(db)) - set(story["rows"]) == {event_id}
    assert letters(db)[source][0] == "recovered"
    # A filtered replay never moves the cursor (initialised at the low watermark).
    assert set(replay_cursor(db, v2).values()) == {0}

    by_class = replay(v2, clients, db, filters=ReplayFilters(
        error_classes=frozenset({"contract_violation"}), source_partition=0))
    nan_in_0 = sum(1 for _, p, _ in story["nan_sources"] if p == 0)
    assert by_class["outcomes"]["still_parked"] == nan_in_0
    assert by_class["outcomes"]["recovered"] == 0
    assert by_class["outcomes"]["filtered_out"] == V2 + NAN - nan_in_0

    rest = replay(v2, clients, db)
    assert rest["outcomes"] == {"recovered": V2 - 1, "still_parked": NAN,
                                "already_recovered": 1, "filtered_out": 0}
    assert len(table_rows(db)) == GOOD + V2


def test_cli_replay_is_the_same_code_path(story: dict[str, Any], pg_dsn: str,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    pipeline = story["v2"]
    monkeypatch.setenv("KAFKA_INGEST_PG_DSN", pg_dsn)
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES",
                       str(write_pipelines_file(tmp_path / "p.yaml", pipeline)))
    capsys.readouterr()
    assert main(["replay-dlq", pipeline.name, "--error-class", "unknown_version"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outcomes"] == {"recovered": V2, "still_parked": 0,
                                   "already_recovered": 0, "filtered_out": NAN}
    assert summary["filters"]["error_classes"] == ["unknown_version"]
