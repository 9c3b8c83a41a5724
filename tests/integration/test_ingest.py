"""The ingest pipeline against the real broker and database (DESIGN §3, §4, §5).

Every run goes through ``plan_run`` / ``ingest_range``, the code path of the DAG and of
``kafka-ingest run``. Expectations come from what was produced (the sample stream is
regenerated from its tag) and from reading the topics back, never from the code under test.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from psycopg.conninfo import make_conninfo

from kafka_ingest.config import OnOffsetGap
from kafka_ingest.db import Database
from kafka_ingest.engine.ingest import ingest_range, plan_run, run_ingest
from kafka_ingest.errors import (
    DatabaseUnavailable,
    DeliveryFailed,
    OffsetGapError,
    ReconciliationError,
    TopicMissing,
    TransientError,
)
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.requests import OffsetWindow
from kafka_ingest_dev.samples import produce_sample, sample_stream
from tests.support.ingest import (
    DeadProducerClients,
    assert_invariants,
    dead_letter_rows,
    execute,
    expected_from_sample,
    group_offsets,
    highs,
    metric,
    produce,
    query,
    read_topic,
    run,
    stored_offsets,
    table_ids,
    total,
)

pytestmark = pytest.mark.integration

COUNT = 20_000


def _runs_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM ingest_runs")[0][0])


def test_one_run_lands_every_valid_event_once_and_dead_letters_every_poison(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=2_500)
    sample = produce_sample(clients, pipeline, count=COUNT, poison=1)
    expected = expected_from_sample(pipeline, sample, count=COUNT, poison=1)

    reports = run(pipeline, clients, db)

    assert len(reports) == 3
    assert total(reports, "read") == sample["produced"]
    assert total(reports, "inserted") == len(expected.ids) == sample["expect"]["row"]
    assert total(reports, "duplicates") == sample["expect"]["duplicate"] > 0
    assert total(reports, "tombstones") == sample["expect"]["tombstone"] == 1
    assert total(reports, "dead_lettered") == len(expected.poison)
    assert_invariants(pipeline, clients, pg_dsn, expected)
    assert all(attempts == 1 for _, attempts in dead_letter_rows(pg_dsn, pipeline).values())
    audited = query(pg_dsn, "SELECT sum(read), sum(inserted), sum(dead_lettered)"
                            " FROM ingest_runs WHERE mode = 'live'")[0]
    assert tuple(map(int, audited)) == (sample["produced"], len(expected.ids),
                                        len(expected.poison))

    # A second run plans nothing and reads nothing.
    runs_before = _runs_count(pg_dsn)
    assert run(pipeline, clients, db) == []
    assert _runs_count(pg_dsn) == runs_before

    # An explicit range over ingested offsets adds no row and leaves the stored offset.
    end = highs(clients, pipeline.topic)
    request = OffsetWindow(partitions={p: (0, hi) for p, hi in end.items()})
    again = run(pipeline, clients, db, request=request)
    assert {r.mode for r in again} == {"backfill"}
    assert total(again, "read") == sample["produced"]
    assert total(again, "inserted") == 0
    assert len(table_ids(pg_dsn, pipeline.table)) == len(expected.ids)
    assert stored_offsets(pg_dsn, pipeline) == end
    assert group_offsets(clients, pipeline) == end
    assert len(dead_letter_rows(pg_dsn, pipeline)) == len(expected.poison)


def test_partitions_ingested_in_parallel_processes_land_exactly_the_same(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # `kafka-ingest run --workers N`: one process per partition slice, as mapped tasks.
    pipeline = make_pipeline("telemetry_metrics", chunk_size=700)
    sample = produce_sample(clients, pipeline, count=3_000, poison=1)
    expected = expected_from_sample(pipeline, sample, count=3_000, poison=1)

    summary = run_ingest(pipeline, clients, db, run_id=f"par__{uuid.uuid4().hex[:6]}",
                         workers=3)

    assert (summary["partitions"], summary["read"]) == (3, sample["produced"])
    assert summary["inserted"] == len(expected.ids)
    assert_invariants(pipeline, clients, pg_dsn, expected)


def test_same_event_in_one_chunk_and_across_partitions_lands_once(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics")
    a, b = metric("dup-a", "d1", 1.0), metric("dup-b", "d2", 2.0)
    produce(clients, pipeline.topic, [(b"k", a), (b"k", a)], partition=0)  # same chunk
    produce(clients, pipeline.topic, [(b"k", a), (b"k", b)], partition=1)  # other partition
    produce(clients, pipeline.topic, [(b"k", b)], partition=2)

    reports = run(pipeline, clients, db)

    assert sorted(table_ids(pg_dsn, pipeline.table)) == ["dup-a", "dup-b"]
    assert total(reports, "read") == 5
    assert total(reports, "inserted") == 2
    assert total(reports, "duplicates") == 3


def test_times_are_stored_exactly_as_postgres_converts_them(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # Event epochs and Kafka timestamps travel as numbers and Postgres makes them
    # timestamptz (CONVERTED columns): to the microsecond, both ends of the range included.
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    epochs = {"t-now": 1_767_225_600.123456, "t-zero": 0.0, "t-far": 253_402_300_799.0}
    producer = clients.producer()
    kafka_ms = 1_767_225_600_789
    for event_id, epoch in epochs.items():
        producer.produce(pipeline.topic, value=metric(event_id, "d", epoch), partition=0,
                         timestamp=kafka_ms)
    assert producer.flush(30) == 0

    run(pipeline, clients, db)

    rows = dict((r[0], r[1:]) for r in query(
        pg_dsn, "SELECT event_id, timestamp, kafka_timestamp FROM telemetry_metrics"))
    assert {k: v[0] for k, v in rows.items()} == {
        k: datetime.fromtimestamp(e, tz=UTC) for k, e in epochs.items()}
    assert {v[1] for v in rows.values()} == {datetime(2026, 1, 1, 0, 0, 0, 789_000, tzinfo=UTC)}


def test_orders_decimal_totals_are_exact(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("orders_created", chunk_size=700)
    count = 2_000
    sample = produce_sample(clients, pipeline, count=count, poison=1)
    expected = expected_from_sample(pipeline, sample, count=count, poison=1)

    run(pipeline, clients, db)

    assert_invariants(pipeline, clients, pg_dsn, expected)
    want = {}
    for s in sample_stream(pipeline, count, 1, tag=sample["tag"], partitions=3):
        if s.expect == "row":
            event = json.loads(s.value or b"")
            want[event["event_id"]] = Decimal(event["total"])
    got = dict(query(pg_dsn, "SELECT event_id, total FROM orders_created"))
    assert got == want
    assert all(isinstance(v, Decimal) for v in got.values())


def _device_state(dsn: str) -> dict[str, str]:
    return dict(query(dsn, "SELECT device_id, event_id FROM device_state"))


def _counts(reports: list[Any]) -> tuple[int, int, int, int]:
    return (total(reports, "read"), total(reports, "inserted"),
            total(reports, "duplicates"), total(reports, "stale"))


def test_device_state_keeps_the_newest_event_per_device(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("device_state", partitions=1)
    events = {
        "e1": metric("e1", "d1", 100.0), "e2": metric("e2", "d1", 200.0),
        "e3": metric("e3", "d1", 150.0), "e4": metric("e4", "d2", 50.0),
        "e5": metric("e5", "d1", 120.0), "e6": metric("e6", "d2", 300.0),
        "e7": metric("e7", "d3", 10.0), "e8": metric("e8", "d3", 20.0),
    }

    def send(*names: str) -> list[Any]:
        produce(clients, pipeline.topic, [(b"k", events[n]) for n in names])
        return run(pipeline, clients, db)

    # In one chunk: e3 (older) arrives after e2 (newer); e1 and e3 are superseded.
    first = send("e1", "e2", "e3", "e4")
    assert _device_state(pg_dsn) == {"d1": "e2", "d2": "e4"}
    assert _counts(first) == (4, 2, 0, 2)
    # Next run: e5 is older than the stored e2 (stale), e2 is replayed (duplicate),
    # e6 supersedes e4, e7 is a new device.
    second = send("e5", "e2", "e6", "e7")
    assert _device_state(pg_dsn) == {"d1": "e2", "d2": "e6", "d3": "e7"}
    assert _counts(second) == (4, 2, 1, 1)
    # Replays of a stored event and of a superseded one change nothing; e8 supersedes e7.
    third = send("e6", "e3", "e8")
    assert _device_state(pg_dsn) == {"d1": "e2", "d2": "e6", "d3": "e8"}
    assert _counts(third) == (3, 1, 1, 1)
    # The same new event twice in one chunk: one lands, the copy is a duplicate, not stale.
    events["e9"] = metric("e9", "d4", 5.0)
    fourth = send("e9", "e9")
    assert _device_state(pg_dsn)["d4"] == "e9"
    assert _counts(fourth) == (2, 1, 1, 0)
    # The stored e2 is the original one (offset 1), not rewritten by its replay.
    assert query(pg_dsn, "SELECT source_offset FROM device_state WHERE device_id = 'd1'") \
        == [(1,)]
    audited = query(pg_dsn, "SELECT sum(read), sum(inserted + duplicates + stale"
                            " + dead_lettered + tombstones) FROM ingest_runs")[0]
    assert audited[0] == audited[1] == 13
    assert stored_offsets(pg_dsn, pipeline) == {0: 13}


def test_rows_postgres_rejects_are_isolated_and_dead_lettered(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1, chunk_size=100)
    execute(pg_dsn, "ALTER TABLE telemetry_metrics"
                  " ADD CONSTRAINT small_values CHECK (metric_value < 1000)")
    bad = {7, 23, 41}
    values = [metric(f"r-{i}", "d1", float(i), 5_000.0 if i in bad else 1.0) for i in range(50)]
    produce(clients, pipeline.topic, [(f"k{i}".encode(), v) for i, v in enumerate(values)])

    reports = run(pipeline, clients, db)

    assert total(reports, "inserted") == 47
    assert total(reports, "dead_lettered") == 3
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(
        f"r-{i}" for i in range(50) if i not in bad)
    letters = dead_letter_rows(pg_dsn, pipeline)
    assert letters == {(0, i): ("rejected_by_database", 1) for i in bad}
    dlq = read_topic(clients, pipeline.dlq_topic)
    assert sorted((int(r.headers["kafka-ingest.offset"]), r.value, r.key) for r in dlq.values()) \
        == [(i, values[i], f"k{i}".encode()) for i in sorted(bad)]
    assert {r.headers["kafka-ingest.error_class"] for r in dlq.values()} \
        == {b"rejected_by_database"}
    assert stored_offsets(pg_dsn, pipeline) == {0: 50}


def test_a_row_postgres_rejects_in_a_latest_tables_first_chunk_is_dead_lettered(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # A latest table's chunk always goes through the staging table, made by the slice's
    # first transaction inside the savepoint the refused row rolls back: the bisection's
    # halves must make it again, not fail the slice on a staging table that is gone
    # (it did, as SchemaMissing, on every retry: the partition stopped for good).
    pipeline = make_pipeline("device_state", partitions=1, chunk_size=100)
    execute(pg_dsn, "ALTER TABLE device_state"
                  " ADD CONSTRAINT small_values CHECK (metric_value < 1000)")
    bad = {7, 23, 41}
    values = [metric(f"r-{i}", f"d{i}", float(i), 5_000.0 if i in bad else 1.0)
              for i in range(50)]
    produce(clients, pipeline.topic, [(f"k{i}".encode(), v) for i, v in enumerate(values)])

    reports = run(pipeline, clients, db)

    assert (total(reports, "inserted"), total(reports, "dead_lettered")) == (47, 3)
    assert sorted(_device_state(pg_dsn)) == sorted(f"d{i}" for i in range(50) if i not in bad)
    assert dead_letter_rows(pg_dsn, pipeline) == {
        (0, i): ("rejected_by_database", 1) for i in bad}
    assert stored_offsets(pg_dsn, pipeline) == {0: 50}


def test_a_backfill_over_stored_rows_and_a_row_postgres_rejects_counts_it_known_dead(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # The backfill's one chunk tries its keys as new: its COPY meets the stored ones first
    # (they come first in key order, more than a COPY batch of them, so Postgres checks
    # their keys before it reaches a refused row), and the chunk takes the staged path in
    # the slice's first transaction, where the refused row rolls the staging table back
    # with the savepoint. The live run dead-lettered the refused rows; the backfill counts
    # them as known, the stored rows as duplicates.
    pipeline = make_pipeline("telemetry_metrics", partitions=1, chunk_size=2_000)
    execute(pg_dsn, "ALTER TABLE telemetry_metrics"
                  " ADD CONSTRAINT small_values CHECK (metric_value < 1000)")
    count, bad = 1_200, {1_150, 1_180, 1_199}
    values = [metric(f"r-{i:04d}", "d1", float(i), 5_000.0 if i in bad else 1.0)
              for i in range(count)]
    produce(clients, pipeline.topic, [(f"k{i}".encode(), v) for i, v in enumerate(values)])
    live = run(pipeline, clients, db)
    assert (total(live, "inserted"), total(live, "dead_lettered")) == (count - 3, 3)

    backfill = run(pipeline, clients, db, request=OffsetWindow(partitions={0: (0, count)}))

    assert [(r.chunks, r.read, r.inserted, r.duplicates, r.dead_lettered, r.known_dead)
            for r in backfill] == [(1, count, 0, count - 3, 0, 3)]
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(
        f"r-{i:04d}" for i in range(count) if i not in bad)
    assert stored_offsets(pg_dsn, pipeline) == {0: count}


def _delete_records(clients: KafkaClients, topic: str, before: int) -> None:
    admin = clients.admin()  # keep it alive: its futures never resolve once it is gone
    futures = admin.delete_records([TopicPartition(topic, 0, before)], operation_timeout=30)
    for future in futures.values():
        deleted = future.result(30)
        assert deleted.low_watermark == before


def test_retention_gap_fails_or_is_recorded_and_skipped(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1, max_records_per_partition=30)
    produce(clients, pipeline.topic, [(b"k", metric(f"g-{i}", "d1", float(i)))
                                      for i in range(100)])
    run(pipeline, clients, db)
    assert stored_offsets(pg_dsn, pipeline) == {0: 30}
    _delete_records(clients, pipeline.topic, 60)  # retention took [0, 60) before we read it

    failing = pipeline.model_copy(update={"on_offset_gap": OnOffsetGap.FAIL,
                                          "max_records_per_partition": 1_000})
    with pytest.raises(OffsetGapError) as gap:
        run(failing, clients, db)
    assert (gap.value.partition, gap.value.start, gap.value.low) == (0, 30, 60)
    assert stored_offsets(pg_dsn, pipeline) == {0: 30}
    assert query(pg_dsn, "SELECT count(*) FROM offset_gaps") == [(0,)]

    skipping = failing.model_copy(update={"on_offset_gap": OnOffsetGap.SKIP})
    reports = run(skipping, clients, db, run_id="after-gap")
    assert [(r.start, r.end) for r in reports] == [(60, 100)]
    assert query(pg_dsn, "SELECT partition, from_offset, to_offset, run_id FROM offset_gaps") \
        == [(0, 30, 60, "after-gap")]
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(
        [f"g-{i}" for i in range(30)] + [f"g-{i}" for i in range(60, 100)])
    assert stored_offsets(pg_dsn, pipeline) == {0: 100}
    assert group_offsets(clients, pipeline) == {0: 100}


def test_max_records_caps_a_run_and_the_next_continues_where_it_stopped(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", max_records_per_partition=700, chunk_size=300)
    count = 3_000
    sample = produce_sample(clients, pipeline, count=count, poison=0)
    expected = expected_from_sample(pipeline, sample, count=count, poison=0)
    end = highs(clients, pipeline.topic)

    first = plan_run(pipeline, clients, db, run_id="capped-1")
    assert first == plan_run(pipeline, clients, db, run_id="capped-1")  # pinned
    assert {(r.partition, r.start, r.end) for r in first} == {
        (p, 0, min(hi, 700)) for p, hi in end.items()}
    reached = {p: 0 for p in end}
    ranges, runs = first, 0
    while ranges:
        runs += 1
        for r in ranges:
            assert r.start == reached[r.partition]  # exactly where the last run stopped
            assert r.size <= 700
            ingest_range(pipeline, r, clients, db, run_id=f"capped-{runs}")
            reached[r.partition] = r.end
        assert stored_offsets(pg_dsn, pipeline) == {p: reached[p] for p in end}
        ranges = plan_run(pipeline, clients, db, run_id=f"capped-{runs + 1}")
    assert runs == -(-max(end.values()) // 700)
    assert set(table_ids(pg_dsn, pipeline.table)) == expected.ids
    # Replanning a finished pinned run gives its slice again; ingesting it reads nothing.
    replanned = plan_run(pipeline, clients, db, run_id="capped-1")
    assert replanned == first
    assert total([ingest_range(pipeline, r, clients, db, run_id="capped-1")
                  for r in replanned], "read") == 0


def _missing_dlq_topic(pipeline: Any, clients: KafkaClients) -> tuple[Any, KafkaClients]:
    """The DLQ topic vanished after planning (the plan checks it exists)."""
    broken = pipeline.model_copy(update={"dlq_topic": f"missing-{uuid.uuid4().hex[:10]}"})
    return broken, KafkaClients({**clients.config, "message.timeout.ms": 3_000})


def _dead_producer(pipeline: Any, clients: KafkaClients) -> tuple[Any, KafkaClients]:
    return pipeline, DeadProducerClients(clients.config)


@pytest.mark.parametrize("breakage", [
    _missing_dlq_topic,  # the DLQ topic does not exist (auto-create is off)
    _dead_producer,      # the producer's broker is a closed port
])
def test_a_dlq_that_cannot_be_written_is_an_infrastructure_error(
        breakage: Callable[..., Any], make_pipeline: Callable[..., Any],
        clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    produce(clients, pipeline.topic, [(b"k", metric(f"i-{i}", "d1", float(i)))
                                      for i in range(20)] + [(b"k", b"not json")])
    ranges = plan_run(pipeline, clients, db, run_id="broken")
    pipeline, broken_clients = breakage(pipeline, clients)

    with pytest.raises(DeliveryFailed) as failed:
        for r in ranges:
            ingest_range(pipeline, r, broken_clients, db, run_id="broken")

    assert isinstance(failed.value, TransientError)
    assert failed.value.total == 1
    assert stored_offsets(pg_dsn, pipeline) == {0: 0}
    assert table_ids(pg_dsn, pipeline.table) == []
    assert dead_letter_rows(pg_dsn, pipeline) == {}
    assert _runs_count(pg_dsn) == 0
    assert group_offsets(clients, pipeline) == {0: None}
    # The same run with a working DLQ finishes the job.
    run(pipeline.model_copy(update={"dlq_topic": make_pipeline().dlq_topic}), clients, db)
    assert len(table_ids(pg_dsn, pipeline.table)) == 20
    assert stored_offsets(pg_dsn, pipeline) == {0: 21}


def test_a_session_that_takes_no_writes_is_an_infrastructure_error_naming_the_fix(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any,
        pg_dsn: str) -> None:
    # What a standby answers (a multi-host DSN that reached it, or a failover under way),
    # made on the primary: every transaction of the session read-only (SQLSTATE 25006).
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    produce(clients, pipeline.topic, [(b"k", metric(f"r-{i}", "d1", float(i)))
                                      for i in range(20)] + [(b"k", b"not json")])
    read_only = Database(make_conninfo(pg_dsn, options="-c default_transaction_read_only=on"),
                         lock_timeout_s=5.0)
    with pytest.raises(DatabaseUnavailable) as planning:  # the plan's first write
        plan_run(pipeline, clients, read_only, run_id="read-only")
    ranges = plan_run(pipeline, clients, db, run_id="read-only")
    with pytest.raises(DatabaseUnavailable) as writing:  # the chunk's transaction
        for r in ranges:
            ingest_range(pipeline, r, clients, read_only, run_id="read-only")

    for failed in (planning.value, writing.value):
        assert isinstance(failed, TransientError)  # Airflow retries it, a bounded number
        assert "ReadOnlySqlTransaction: cannot execute" in str(failed)
        assert "point the DSN at the primary" in str(failed)
    assert stored_offsets(pg_dsn, pipeline) == {0: 0}
    assert table_ids(pg_dsn, pipeline.table) == []
    assert dead_letter_rows(pg_dsn, pipeline) == {}  # an infrastructure error: none
    run(pipeline, clients, db)  # the same run on a session that takes writes
    assert len(table_ids(pg_dsn, pipeline.table)) == 20
    assert stored_offsets(pg_dsn, pipeline) == {0: 21}


def test_a_missing_dlq_topic_fails_the_plan_saying_so_before_anything_is_read(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    produce(clients, pipeline.topic, [(b"k", b"not json")])
    missing = pipeline.model_copy(update={"dlq_topic": f"missing-{uuid.uuid4().hex[:8]}"})

    with pytest.raises(TopicMissing, match=f"dead-letter topic '{missing.dlq_topic}' does not"):
        run(missing, clients, db)

    assert query(pg_dsn, "SELECT count(*) FROM run_plans") == [(0,)]
    assert stored_offsets(pg_dsn, pipeline) == {}


def test_start_policy_latest_skips_history_once_then_follows_the_stored_offset(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=1, start_policy="latest")
    produce(clients, pipeline.topic, [(b"k", metric(f"old-{i}", "d", 10.0 + i))
                                      for i in range(10)])

    first = run(pipeline, clients, db)
    assert total(first, "read") == 0
    assert stored_offsets(pg_dsn, pipeline) == {0: 10}  # the policy applied, and stored

    produce(clients, pipeline.topic, [(b"k", metric(f"new-{i}", "d", 100.0 + i))
                                      for i in range(5)])
    second = run(pipeline, clients, db)
    assert total(second, "read") == 5
    assert sorted(table_ids(pg_dsn, pipeline.table)) == [f"new-{i}" for i in range(5)]
    assert stored_offsets(pg_dsn, pipeline) == {0: 15}


def test_rows_the_table_silently_drops_fail_the_chunk_instead_of_moving_the_offset(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # A trigger that swallows some inserts (a DBA's mistake): ON CONFLICT DO NOTHING would
    # count them as duplicates and move on. The sink checks the table itself instead.
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    execute(pg_dsn, "CREATE FUNCTION swallow() RETURNS trigger LANGUAGE plpgsql AS $$"
                    " BEGIN IF NEW.metric_value > 1000 THEN RETURN NULL; END IF;"
                    " RETURN NEW; END $$;"
                    "CREATE TRIGGER swallow BEFORE INSERT ON telemetry_metrics"
                    " FOR EACH ROW EXECUTE FUNCTION swallow()")
    produce(clients, pipeline.topic, [(b"k", metric(f"e{i}", "d", 1.0 + i,
                                                    value=5000.0 if i == 3 else 1.0))
                                      for i in range(10)])

    with pytest.raises(ReconciliationError, match="1 valid rows are not in the table"):
        run(pipeline, clients, db)

    assert table_ids(pg_dsn, pipeline.table) == []  # the chunk rolled back whole
    assert stored_offsets(pg_dsn, pipeline) == {0: 0}
    assert _runs_count(pg_dsn) == 0


def test_a_message_too_big_for_the_dlq_is_cut_to_fit_not_a_stalled_batch(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # 120 kB key + 899 kB value: fits the source topic (the broker takes 1 MiB), but not a
    # producer's default 1,000,000-byte limit unless key, value and headers are budgeted
    # together for the DLQ copy.
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    key, value = b"k" * 120_000, b"v" * 899_000
    big = Producer({**clients.config, "message.max.bytes": 1_048_000})
    big.produce(pipeline.topic, value, key=key, partition=0)
    big.produce(pipeline.topic, metric("ok", "d", 1.0), key=b"k", partition=0)
    assert big.flush(30) == 0

    (report,) = run(pipeline, clients, db)

    assert (report.read, report.inserted, report.dead_lettered) == (2, 1, 1)
    (record,) = read_topic(clients, pipeline.dlq_topic).values()
    assert record.headers["kafka-ingest.error_class"] == b"too_large"
    assert record.headers["kafka-ingest.value.truncated"] == b"899000"
    assert record.key == key and value.startswith(record.value)
    assert stored_offsets(pg_dsn, pipeline) == {0: 2}
