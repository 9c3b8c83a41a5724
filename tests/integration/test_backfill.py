"""Backfills against the real stack: by offsets, by time, through the CLI's code path.

A backfill re-reads a range through the same idempotent sink and never touches the live
stored offset: over ingested data it adds nothing; after rows were deleted it brings back
exactly those; two adjacent half-open time windows read every message exactly once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest.cli import main
from kafka_ingest.config import Pipeline
from kafka_ingest.engine.ingest import ingest_range, plan_run, summarize
from kafka_ingest.errors import TriggerParamsError
from kafka_ingest.requests import (
    OffsetWindow,
    RangeRequest,
    TimeWindow,
    ingest_request,
)
from kafka_ingest_dev.samples import produce_sample
from tests.support.ingest import (
    dead_letter_rows,
    dlq_positions,
    expected_from_sample,
    highs,
    poison_positions,
    read_topic,
)
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 12
STEP_MS = 1000


def produce_timed(clients: Any, topic: str, t0_ms: int, *, tag: str) -> dict[str, int]:
    """PER_PARTITION events per partition, the i-th of each at ``t0_ms + i * STEP_MS``.

    Returns event_id -> message timestamp; every delivery report checked.
    """
    producer = clients.producer()
    errors: list[Any] = []
    stamps: dict[str, int] = {}
    for i in range(PER_PARTITION):
        for p in range(PARTITIONS):
            event_id, ts = f"{tag}-{p}-{i}", t0_ms + i * STEP_MS
            value = json.dumps({"event_id": event_id, "device_id": f"dev-{p}",
                                "timestamp": ts / 1000, "metric_value": float(i),
                                "version": 2}).encode()
            producer.produce(topic, value=value, key=b"k", partition=p, timestamp=ts,
                             on_delivery=lambda err, _msg: errors.append(err) if err else None)
            stamps[event_id] = ts
    assert producer.flush(30) == 0 and not errors
    return stamps


def run(pipeline: Pipeline, clients: Any, db: Any,
        request: RangeRequest | None = None) -> dict[str, Any]:
    run_id = f"test__{uuid.uuid4().hex[:8]}"
    ranges = plan_run(pipeline, clients, db, run_id=run_id, request=request)
    return summarize(ingest_range(pipeline, r, clients, db, run_id=run_id).to_dict()
                     for r in ranges)


def rows(db: Any) -> dict[str, tuple[int, int]]:
    with db.session() as conn:
        found = conn.execute("SELECT event_id, source_partition, source_offset"
                             " FROM telemetry_metrics").fetchall()
    return {e: (int(p), int(o)) for e, p, o in found}


def stored(db: Any, pipeline: Pipeline) -> dict[int, int]:
    with db.session() as conn:
        found = conn.execute("SELECT partition, next_offset FROM ingest_offsets"
                             " WHERE pipeline = %s", (pipeline.name,)).fetchall()
    return {int(p): int(o) for p, o in found}


@pytest.fixture
def produced(make_pipeline: Callable[..., Pipeline],
             clients: Any) -> tuple[Pipeline, dict[str, int]]:
    """A pipeline whose topic was produced, with timestamps an hour ago."""
    pipeline = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=5)
    t0 = int(time.time() * 1000) - 3_600_000
    return pipeline, produce_timed(clients, pipeline.topic, t0, tag=uuid.uuid4().hex[:6])


@pytest.fixture
def ingested(produced: tuple[Pipeline, dict[str, int]], clients: Any,
             db: Any) -> tuple[Pipeline, dict[str, int]]:
    """... and ingested live."""
    pipeline, stamps = produced
    live = run(pipeline, clients, db)
    assert live["inserted"] == PARTITIONS * PER_PARTITION
    assert stored(db, pipeline) == dict.fromkeys(range(PARTITIONS), PER_PARTITION)
    return pipeline, stamps


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat()


def test_backfills_over_ingested_ranges_add_nothing(ingested: tuple[Pipeline, dict[str, int]],
                                                    clients: Any, db: Any) -> None:
    pipeline, stamps = ingested
    before, offsets = rows(db), stored(db, pipeline)
    whole = {p: (0, PER_PARTITION) for p in range(PARTITIONS)}

    by_offsets = run(pipeline, clients, db, OffsetWindow(partitions=whole))
    t_min, t_max = min(stamps.values()), max(stamps.values())
    by_time = run(pipeline, clients, db, TimeWindow(from_ms=t_min, to_ms=t_max + 1))

    for summary in (by_offsets, by_time):
        assert summary["read"] == PARTITIONS * PER_PARTITION
        assert (summary["inserted"], summary["duplicates"]) == (0, PARTITIONS * PER_PARTITION)
    assert rows(db) == before
    assert stored(db, pipeline) == offsets


def test_backfill_brings_back_exactly_the_deleted_rows(
        ingested: tuple[Pipeline, dict[str, int]], clients: Any, db: Any) -> None:
    pipeline, _ = ingested
    before, offsets = rows(db), stored(db, pipeline)
    gone = sorted(before)[::5]
    with db.session() as conn:
        conn.execute("DELETE FROM telemetry_metrics WHERE event_id = ANY(%s)", (gone,))
        conn.commit()
    # Partitions 0 and 1 only: what was deleted from partition 2 stays deleted.
    summary = run(pipeline, clients, db,
                  OffsetWindow(partitions={0: (0, PER_PARTITION), 1: (0, PER_PARTITION)}))

    back = {e for e in gone if before[e][0] in (0, 1)}
    assert summary["inserted"] == len(back)
    assert rows(db) == {e: src for e, src in before.items() if e in back or e not in gone}
    assert stored(db, pipeline) == offsets


def test_a_run_id_reused_for_a_backfill_plans_the_backfill(
        produced: tuple[Pipeline, dict[str, int]], clients: Any, db: Any) -> None:
    # Airflow's backfill with --reprocess-behavior clears a scheduled run and re-runs it,
    # same run id, as a backfill: it must plan the backfill, not reuse the live slice.
    pipeline, stamps = produced
    run_id = "scheduled__2026-11-30T10:00:00+00:00"
    live = plan_run(pipeline, clients, db, run_id=run_id)
    for r in live:
        ingest_range(pipeline, r, clients, db, run_id=run_id)
    before, offsets = rows(db), stored(db, pipeline)
    with db.session() as conn:
        conn.execute("DELETE FROM telemetry_metrics")
        conn.commit()

    window = TimeWindow(from_ms=min(stamps.values()), to_ms=max(stamps.values()) + 1)
    again = plan_run(pipeline, clients, db, run_id=run_id, request=window)
    assert {(r.partition, r.start, r.end, str(r.mode)) for r in again} == {
        (p, 0, PER_PARTITION, "backfill") for p in range(PARTITIONS)}
    for r in again:
        ingest_range(pipeline, r, clients, db, run_id=run_id)
    assert rows(db) == before
    assert stored(db, pipeline) == offsets
    # ...and a retry of that same backfill reuses its own pinned plan.
    assert plan_run(pipeline, clients, db, run_id=run_id, request=window) == again


def test_adjacent_time_windows_cover_a_range_exactly_once(
        make_pipeline: Callable[..., Pipeline], clients: Any, db: Any) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=4)
    t0 = int(time.time() * 1000) - 3_600_000
    stamps = produce_timed(clients, pipeline.topic, t0, tag=uuid.uuid4().hex[:6])
    t1 = t0 + 5 * STEP_MS  # exactly the timestamp of the 6th message of each partition
    t2 = t0 + PER_PARTITION * STEP_MS

    first = run(pipeline, clients, db, TimeWindow(from_ms=t0, to_ms=t1))
    second = run(pipeline, clients, db, TimeWindow(from_ms=t1, to_ms=t2))

    expect_first = {e for e, ts in stamps.items() if ts < t1}
    assert first["inserted"] == len(expect_first) == 5 * PARTITIONS
    assert second["inserted"] == len(stamps) - len(expect_first)
    assert first["read"] + second["read"] == len(stamps)  # no overlap, no gap
    assert set(rows(db)) == set(stamps)
    with db.session() as conn:
        read = conn.execute("SELECT partition, sum(read) FROM ingest_runs"
                            " GROUP BY partition").fetchall()
    assert {int(p): int(n) for p, n in read} == dict.fromkeys(range(PARTITIONS), PER_PARTITION)
    assert stored(db, pipeline) == {}  # a backfill never creates or moves a live offset


def test_cli_backfill_by_time_and_offsets(ingested: tuple[Pipeline, dict[str, int]],
                                          pg_dsn: str, db: Any,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    pipeline, stamps = ingested
    monkeypatch.setenv("KAFKA_INGEST_PG_DSN", pg_dsn)
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES",
                       str(write_pipelines_file(tmp_path / "p.yaml", pipeline)))
    offsets = stored(db, pipeline)

    def backfill(*args: str) -> dict[str, Any]:
        capsys.readouterr()
        assert main(["backfill", pipeline.name, *args]) == 0
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        return out

    by_time = backfill("--from", iso(min(stamps.values())),
                       "--to", iso(max(stamps.values()) + 1))
    by_offsets = backfill("--partition", "1", "--from-offset", "3", "--to-offset", "9")

    assert (by_time["read"], by_time["inserted"]) == (len(stamps), 0)
    assert (by_offsets["read"], by_offsets["inserted"], by_offsets["partitions"]) == (6, 0, 1)
    assert stored(db, pipeline) == offsets


@pytest.mark.parametrize(("partitions", "message"), [
    # a partition the topic does not have
    ({"7": [0, 1]}, "partition 7 does not exist"),
    # past what the topic holds
    ({"0": [0, PER_PARTITION + 5]}, f"past the high watermark {PER_PARTITION}"),
])
def test_backfill_ranges_the_topic_cannot_honour(
        produced: tuple[Pipeline, dict[str, int]], clients: Any, db: Any,
        partitions: dict[str, list[int]], message: str) -> None:
    pipeline, _ = produced
    request = ingest_request({"partitions": partitions}, now=datetime.now(tz=UTC))
    with pytest.raises(TriggerParamsError, match=message):
        plan_run(pipeline, clients, db, run_id=f"bad__{uuid.uuid4().hex[:6]}", request=request)
    with db.session() as conn:  # failed while planning: nothing pinned, nothing read
        assert conn.execute("SELECT count(*) FROM run_plans").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM ingest_runs").fetchone() == (0,)


# --------------------------------------------------------------------------- known poison pills

SAMPLE = 300
TERMS = ("inserted", "duplicates", "stale", "dead_lettered", "known_dead", "tombstones")


def whole_topic(clients: Any, pipeline: Pipeline) -> OffsetWindow:
    return OffsetWindow(partitions={p: (0, hi) for p, hi in
                                    highs(clients, pipeline.topic).items() if hi})


def audit_reconciles(db: Any) -> list[tuple[str, int]]:
    """Every audit row adds up; returns (mode, known_dead) summed per mode."""
    with db.session() as conn:
        bad = conn.execute("SELECT count(*) FROM ingest_runs WHERE read <> inserted"
                           " + duplicates + stale + dead_lettered + known_dead"
                           " + tombstones").fetchone()
        per_mode = conn.execute("SELECT mode, sum(known_dead) FROM ingest_runs"
                                " GROUP BY mode ORDER BY mode").fetchall()
    assert bad == (0,)
    return [(m, int(n)) for m, n in per_mode]


def test_backfills_never_dead_letter_a_known_poison_pill_again(
        make_pipeline: Callable[..., Pipeline], clients: Any, db: Any, pg_dsn: str) -> None:
    # A backfill over a range ingested live meets the same poison pills: they are in
    # dead_letters already, so they are counted as known_dead and neither produced to the
    # DLQ again (a later replay would call them duplicate_in_dlq) nor recorded again.
    pipeline = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=100)
    sample = produce_sample(clients, pipeline, count=SAMPLE, poison=1, partitions=PARTITIONS)
    expected = expected_from_sample(pipeline, sample, count=SAMPLE, poison=1,
                                    partitions=PARTITIONS)
    poison = len(expected.poison)
    live = run(pipeline, clients, db)
    assert (live["dead_lettered"], live["known_dead"]) == (poison, 0)
    dlq = read_topic(clients, pipeline.dlq_topic)
    letters = dead_letter_rows(pg_dsn, pipeline)
    assert len(dlq) == len(letters) == poison
    assert {attempts for _, attempts in letters.values()} == {1}
    offsets = stored(db, pipeline)

    for _ in range(2):
        summary = run(pipeline, clients, db, whole_topic(clients, pipeline))
        assert summary["read"] == sample["produced"]
        assert (summary["inserted"], summary["dead_lettered"], summary["known_dead"]) == (
            0, 0, poison)
        assert summary["read"] == sum(summary[t] for t in TERMS)
        assert read_topic(clients, pipeline.dlq_topic) == dlq  # not one record more
        assert dead_letter_rows(pg_dsn, pipeline) == letters  # attempts still 1
    assert audit_reconciles(db) == [("backfill", 2 * poison), ("live", 0)]
    assert stored(db, pipeline) == offsets


def test_a_backfill_dead_letters_poison_that_was_never_dead_lettered_once(
        make_pipeline: Callable[..., Pipeline], clients: Any, db: Any, pg_dsn: str) -> None:
    # A fresh pipeline whose first run is a backfill: its poison pills were never
    # dead-lettered, so they are, exactly once; the next backfill knows them.
    pipeline = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=100)
    sample = produce_sample(clients, pipeline, count=SAMPLE, poison=1, partitions=PARTITIONS)
    expected = expected_from_sample(pipeline, sample, count=SAMPLE, poison=1,
                                    partitions=PARTITIONS)
    window = whole_topic(clients, pipeline)

    first = run(pipeline, clients, db, window)

    source = read_topic(clients, pipeline.topic)
    poison = poison_positions(source, expected)
    assert (first["dead_lettered"], first["known_dead"]) == (len(poison), 0)
    assert first["read"] == sum(first[t] for t in TERMS)
    dlq = read_topic(clients, pipeline.dlq_topic)
    seen = dlq_positions(dlq, pipeline, source)
    assert set(seen) == set(poison.items()) and set(seen.values()) == {1}
    letters = dead_letter_rows(pg_dsn, pipeline)
    assert letters == {pos: (cls, 1) for pos, cls in poison.items()}

    again = run(pipeline, clients, db, window)
    assert (again["dead_lettered"], again["known_dead"]) == (0, len(poison))
    assert read_topic(clients, pipeline.dlq_topic) == dlq
    assert dead_letter_rows(pg_dsn, pipeline) == letters
    assert audit_reconciles(db) == [("backfill", len(poison))]
    assert stored(db, pipeline) == {}  # a backfill never creates or moves a live offset
