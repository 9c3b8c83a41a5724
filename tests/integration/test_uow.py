"""The unit of work and the fences around it, on the real database (STYLE §26).

The unit of work rolls back unless told to commit; a rerun resumes from the stored offset;
a DLQ delivery failure aborts before the commit; the compare-and-set fences a zombie; the
advisory lock serialises two runs of one partition.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from kafka_ingest.contracts.columns import millis_to_pg, seconds_to_pg
from kafka_ingest.db import (
    CopyEncoder,
    Database,
    OffsetsRepository,
    UnitOfWork,
)
from kafka_ingest.db.tables import stage_table
from kafka_ingest.db.writers import UpsertResult
from kafka_ingest.engine import ingest, slices
from kafka_ingest.engine.ingest import ingest_range, plan_run
from kafka_ingest.engine.slices import SliceReport
from kafka_ingest.errors import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    DeliveryFailed,
    FencedError,
    TransientError,
)
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.records import Row, row_source
from kafka_ingest.requests import OffsetWindow
from tests.support import pg_to_datetime
from tests.support.ingest import (
    DeadProducerClients,
    dead_letter_rows,
    group_offsets,
    metric,
    produce,
    query,
    stored_offsets,
    table_ids,
)

pytestmark = pytest.mark.integration

TOPIC = "uow-topic"


class Boom(Exception):
    """Stands for any failure inside the transaction."""


def _rows(n: int, *, start: int = 0) -> list[Row]:
    """Rows (contract columns + provenance) for ``telemetry_metrics``."""
    epoch = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    ms = int(1_000 * epoch)
    return [(f"u-{i}", "d1", seconds_to_pg(epoch), float(i), "OK", None, TOPIC, 0, i, b"k",
             millis_to_pg(ms))
            for i in range(start, start + n)]


@pytest.fixture
def pipeline(make_pipeline: Callable[..., Any]) -> Any:
    return make_pipeline("telemetry_metrics", partitions=1, chunk_size=100)


@pytest.fixture
def conn(db: Database, pipeline: Any) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose stored offset for partition 0 starts at 0."""
    c = db.connect()
    OffsetsRepository(c).initialise(pipeline.name, TOPIC, 0, 0)
    c.commit()
    try:
        yield c
    finally:
        c.close()


def _stored(dsn: str, pipeline: Any) -> int | None:
    rows = query(dsn, "SELECT next_offset FROM ingest_offsets WHERE pipeline = %s"
                      " AND topic = %s", (pipeline.name, TOPIC))
    return int(rows[0][0]) if rows else None


def test_uow_rolls_back_by_default(conn: Any, pipeline: Any, pg_dsn: str) -> None:
    with UnitOfWork(conn, pipeline) as uow:
        assert uow.rows.upsert(_rows(3)).inserted == 3
        uow.offsets.advance(pipeline.name, TOPIC, 0, 0, 3)
    assert table_ids(pg_dsn, "telemetry_metrics") == []
    assert _stored(pg_dsn, pipeline) == 0


def test_uow_rolls_back_on_error(conn: Any, pipeline: Any, pg_dsn: str) -> None:
    with pytest.raises(Boom), UnitOfWork(conn, pipeline) as uow:
        uow.rows.upsert(_rows(3))
        uow.offsets.advance(pipeline.name, TOPIC, 0, 0, 3)
        raise Boom
    assert table_ids(pg_dsn, "telemetry_metrics") == []
    assert _stored(pg_dsn, pipeline) == 0


def test_uow_commit_keeps_rows_and_offset_together(conn: Any, pipeline: Any,
                                                   pg_dsn: str) -> None:
    with UnitOfWork(conn, pipeline) as uow:
        uow.rows.upsert(_rows(3))
        uow.offsets.advance(pipeline.name, TOPIC, 0, 0, 3)
        uow.commit()
    assert sorted(table_ids(pg_dsn, "telemetry_metrics")) == ["u-0", "u-1", "u-2"]
    assert _stored(pg_dsn, pipeline) == 3


def test_a_chunks_upsert_probes_the_key_and_never_scans_the_whole_table(
        conn: Any, pipeline: Any) -> None:
    # The outcome check once hashed a full scan of the target table for every chunk, so a
    # run's time grew with the table (quadratic over a long backfill). Whatever the table
    # holds, a chunk costs index probes of its own keys; and no JIT compiles its statements.
    # The table grows without an ANALYZE, as it does during a long run.
    with conn.cursor() as cur:
        cur.execute("INSERT INTO telemetry_metrics (event_id, device_id, \"timestamp\","
                    " metric_value, status, source_topic, source_partition, source_offset)"
                    " SELECT 'old-' || i, 'd', now(), i, 'OK', 'old', 0, i"
                    " FROM generate_series(1, 50000) i")
    conn.commit()
    with UnitOfWork(conn, pipeline) as uow:
        uow.rows.upsert(_rows(100))
        uow.commit()
    with UnitOfWork(conn, pipeline) as uow:
        # 100 stored already and 10 duplicated inside the chunk: those are looked up.
        up = uow.rows.upsert(_rows(2_000) + _rows(10))
        assert (up.inserted, up.duplicates, up.missing) == (1_900, 110, 0)
        seq, idx = conn.execute(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables"
            " WHERE relname = 'telemetry_metrics'").fetchone()
        assert seq == 0, f"{seq} sequential scan(s) of the target table in one chunk"
        assert idx > 0
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("off",)
    assert conn.execute("SELECT current_setting('jit')").fetchone() == ("on",)  # LOCAL only


def test_a_row_the_insert_skipped_and_the_table_lacks_is_missing(
        conn: Any, pipeline: Any) -> None:
    # The outcome is checked against the table, not inferred from the counts: a trigger
    # that silently drops a row (or anything else that keeps a staged event out of the
    # table) makes the chunk's upsert report it missing, so reconciliation fails.
    conn.execute("CREATE FUNCTION drop_u7() RETURNS trigger LANGUAGE plpgsql AS $$"
                 " BEGIN IF NEW.event_id = 'u-7' THEN RETURN NULL; END IF; RETURN NEW; END $$")
    conn.execute("CREATE TRIGGER drop_u7 BEFORE INSERT ON telemetry_metrics"
                 " FOR EACH ROW EXECUTE FUNCTION drop_u7()")
    conn.commit()
    with UnitOfWork(conn, pipeline) as uow:
        up = uow.rows.upsert(_rows(20))
    assert (up.inserted, up.duplicates, up.missing) == (19, 1, 1)


def test_rows_encoded_ahead_load_exactly_as_rows_written_in_the_transaction(
        conn: Any, pipeline: Any, pg_dsn: str) -> None:
    # The slice engine encodes a chunk for COPY outside its transaction: what lands must
    # be what the rows say, byte for byte, NULLs, bytes and timestamps included.
    rows = _rows(50)
    rows[3] = (*rows[3][:5], "celsius", TOPIC, 0, 3, None, None)
    encoded = CopyEncoder(conn, pipeline).encode(rows)
    columns = ("event_id, device_id, \"timestamp\", metric_value, status, unit, source_topic,"
               " source_partition, source_offset, kafka_key, kafka_timestamp")
    landed = []
    for payload in (encoded, None):
        with UnitOfWork(conn, pipeline) as uow:
            assert uow.rows.upsert(rows, encoded=payload).inserted == 50
            landed.append(conn.execute(f"SELECT {columns} FROM telemetry_metrics"
                                       " ORDER BY source_offset").fetchall())
    assert landed[0] == landed[1]
    assert landed[0][3][5:] == ("celsius", TOPIC, 0, 3, None, None)


def test_a_payload_encoded_ahead_counts_one_row_per_event_and_goes_straight_in(
        conn: Any, pipeline: Any, pg_dsn: str) -> None:
    # Copies of an event in one chunk (a producer's retry) are left out of the payload, and
    # the payload says how many rows it holds: the writer checks the COPY's row count
    # against it (no count of the chunk's distinct events made again in the transaction),
    # so the chunk goes straight into the table, with no staging table made.
    rows = _rows(20)
    copies = [(*r[:8], 100 + r[8], *r[9:]) for r in rows[:5]]  # later offsets, same ids
    payload = CopyEncoder(conn, pipeline).encode(rows + copies)
    assert payload is not None and payload.rows == 20
    with UnitOfWork(conn, pipeline) as uow:
        up = uow.rows.upsert(rows + copies, encoded=payload)
        assert conn.execute("SELECT to_regclass(%s)",
                            (f"pg_temp.{stage_table(pipeline)}",)).fetchone() == (None,)
        uow.commit()
    assert (up.inserted, up.duplicates, up.missing) == (20, 5, 0)
    kept = conn.execute("SELECT min(source_offset), max(source_offset) FROM telemetry_metrics"
                        ).fetchone()
    assert kept == (0, 19)  # of each event its lowest place in the log


def test_compare_and_set_fences_a_zombie(conn: Any, pipeline: Any, pg_dsn: str) -> None:
    with UnitOfWork(conn, pipeline) as uow:  # the live run moves the offset to 5
        uow.rows.upsert(_rows(5))
        uow.offsets.advance(pipeline.name, TOPIC, 0, 0, 5)
        uow.commit()
    # A zombie that still believes the offset is 0 writes [0, 10).
    with pytest.raises(FencedError) as fenced, UnitOfWork(conn, pipeline) as uow:
        uow.rows.upsert(_rows(10))
        uow.offsets.advance(pipeline.name, TOPIC, 0, 0, 10)
        uow.commit()
    assert (fenced.value.expected, fenced.value.found) == (0, 5)
    assert len(table_ids(pg_dsn, "telemetry_metrics")) == 5
    assert _stored(pg_dsn, pipeline) == 5


# --------------------------------------------------------------------------- slice level


def _produce_events(clients: KafkaClients, pipeline: Any, n: int,
                    poison_at: set[int] | None = None) -> None:
    poison_at = poison_at or set()
    produce(clients, pipeline.topic, [
        (b"k", b"{not json" if i in poison_at else metric(f"s-{i}", "d1", float(i)))
        for i in range(n)])


def _fail_at(stage: str, nth: int) -> Callable[[str], None]:
    seen = {"n": 0}

    def hook(at: str) -> None:
        if at == stage:
            seen["n"] += 1
            if seen["n"] == nth:
                raise Boom(f"{stage} #{nth}")
    return hook


def test_a_rerun_resumes_from_the_stored_offset(
        pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _produce_events(clients, pipeline, 250)
    (rng,) = plan_run(pipeline, clients, db, run_id="resume")
    monkeypatch.setattr(slices, "CHUNK_HOOK", _fail_at("upserted", 2))
    with pytest.raises(Boom):
        ingest_range(pipeline, rng, clients, db, run_id="resume")
    assert stored_offsets(pg_dsn, pipeline) == {0: 100}
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(f"s-{i}" for i in range(100))
    assert group_offsets(clients, pipeline) == {0: 100}

    monkeypatch.setattr(slices, "CHUNK_HOOK", None)
    (again,) = plan_run(pipeline, clients, db, run_id="resume")
    assert again == rng  # the pinned slice, not a new plan
    report = ingest_range(pipeline, again, clients, db, run_id="resume")
    assert (report.resumed_from, report.read, report.inserted) == (100, 150, 150)
    assert len(table_ids(pg_dsn, pipeline.table)) == 250
    assert stored_offsets(pg_dsn, pipeline) == {0: 250}
    assert group_offsets(clients, pipeline) == {0: 250}


def test_a_dlq_delivery_failure_aborts_before_the_commit(
        pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str) -> None:
    _produce_events(clients, pipeline, 150, poison_at={115})  # in the second chunk
    (rng,) = plan_run(pipeline, clients, db, run_id="dlq-down")
    with pytest.raises(DeliveryFailed):
        ingest_range(pipeline, rng, DeadProducerClients(clients.config), db, run_id="dlq-down")
    # The first chunk (no dead letter) committed; the second left no trace.
    assert stored_offsets(pg_dsn, pipeline) == {0: 100}
    assert len(table_ids(pg_dsn, pipeline.table)) == 100
    assert dead_letter_rows(pg_dsn, pipeline) == {}
    assert query(pg_dsn, "SELECT start_offset, end_offset FROM ingest_runs") == [(0, 100)]
    assert group_offsets(clients, pipeline) == {0: 100}


def test_a_zombie_run_is_fenced_by_the_stored_offset(
        pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _produce_events(clients, pipeline, 150)
    (rng,) = plan_run(pipeline, clients, db, run_id="zombie")

    def another_run_commits_first(stage: str) -> None:
        if stage == "upserted":  # mid-transaction: someone else moves the offset on
            with psycopg.connect(pg_dsn) as other:
                OffsetsRepository(other).advance(pipeline.name, pipeline.topic, 0, 0, 100)

    monkeypatch.setattr(slices, "CHUNK_HOOK", another_run_commits_first)
    with pytest.raises(FencedError) as fenced:
        ingest_range(pipeline, rng, clients, db, run_id="zombie")
    assert (fenced.value.expected, fenced.value.found) == (0, 100)
    assert table_ids(pg_dsn, pipeline.table) == []  # the zombie's chunk was rolled back
    assert stored_offsets(pg_dsn, pipeline) == {0: 100}
    assert query(pg_dsn, "SELECT count(*) FROM ingest_runs") == [(0,)]


def _waiting_for_advisory_lock(dsn: str) -> bool:
    return query(dsn, "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid ="
                      " l.database WHERE l.locktype = 'advisory' AND NOT l.granted"
                      " AND d.datname = current_database()")[0][0] > 0


def _poll(condition: Callable[[], bool], what: str, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _pause_first_chunk(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event,
                                                                  threading.Event]:
    """The first chunk to reach "upserted" (its transaction open, its partition locked)
    sets ``holding`` and waits there until ``release`` is set."""
    holding, release = threading.Event(), threading.Event()

    def hold(stage: str) -> None:
        if stage == "upserted" and not holding.is_set():
            holding.set()
            assert release.wait(60)

    monkeypatch.setattr(slices, "CHUNK_HOOK", hold)
    return holding, release


def _ingest_in_thread(results: dict[str, SliceReport | BaseException], name: str,
                      *args: Any) -> threading.Thread:
    """``ingest_range(*args, run_id=name)`` in a thread; its report or error in results."""
    def target() -> None:
        try:
            results[name] = ingest_range(*args, run_id=name)
        except BaseException as exc:
            results[name] = exc

    thread = threading.Thread(target=target)
    thread.start()
    return thread


def test_the_advisory_lock_serialises_two_runs_of_one_partition(
        pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _produce_events(clients, pipeline, 150)
    (rng,) = plan_run(pipeline, clients, db, run_id="locked")
    results: dict[str, SliceReport | BaseException] = {}
    # Only the run holding the lock can reach "upserted": the first one, held there.
    holding, release = _pause_first_chunk(monkeypatch)
    holder = _ingest_in_thread(results, "first", pipeline, rng, clients, db)
    assert holding.wait(30)
    try:
        # A second run gives up after its lock timeout: a transient error, nothing written.
        with pytest.raises(DatabaseUnavailable):
            ingest_range(pipeline, rng, clients, Database(pg_dsn, lock_timeout_s=0.5),
                         run_id="locked")
        # A patient one waits for the lock, then re-reads the stored offset.
        waiter = _ingest_in_thread(results, "second", pipeline, rng, clients, db)
        _poll(lambda: _waiting_for_advisory_lock(pg_dsn), "the second run to wait")
    finally:
        release.set()
    holder.join(60)
    waiter.join(60)
    done, later = results["first"], results["second"]
    assert isinstance(done, SliceReport) and isinstance(later, SliceReport), results
    assert (done.read, done.inserted) == (150, 150)
    assert (later.resumed_from, later.read) == (150, 0)
    assert len(table_ids(pg_dsn, pipeline.table)) == 150
    assert query(pg_dsn, "SELECT count(*) FROM ingest_runs") == [(2,)]


def test_a_backfill_runs_beside_the_live_slice_of_its_partition_without_waiting(
        pipeline: Any, clients: KafkaClients, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Airflow's own backfill runs beside the schedule: the live slice holds the partition's
    # lock for its whole slice, and a backfill must neither wait for that (it would fail
    # after its lock time-out on any long slice) nor hold the live slice up. Here the live
    # slice is held between its two chunks, lock taken, while the whole backfill runs.
    _produce_events(clients, pipeline, 150)
    impatient = Database(pg_dsn, lock_timeout_s=0.5)
    (live,) = plan_run(pipeline, clients, impatient, run_id="live")
    (backfill,) = plan_run(pipeline, clients, impatient, run_id="backfill",
                           request=OffsetWindow(partitions={0: (0, 150)}))
    results: dict[str, SliceReport | BaseException] = {}
    holding, release = threading.Event(), threading.Event()

    def hold_after_the_first_commit(stage: str) -> None:
        if stage == "db_committed" and not holding.is_set():
            holding.set()
            assert release.wait(60)

    monkeypatch.setattr(slices, "CHUNK_HOOK", hold_after_the_first_commit)
    holder = _ingest_in_thread(results, "live", pipeline, live, clients, impatient)
    try:
        assert holding.wait(30)
        done = ingest_range(pipeline, backfill, clients, impatient, run_id="backfill")
    finally:
        release.set()
        holder.join(60)
    later = results["live"]
    assert isinstance(later, SliceReport), results
    assert (done.read, done.inserted, done.duplicates) == (150, 50, 100)
    assert (later.read, later.inserted, later.duplicates) == (150, 100, 50)
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(f"s-{i}" for i in range(150))
    # moved by the live slice only
    assert stored_offsets(pg_dsn, pipeline) == {0: 150}
    assert query(pg_dsn, "SELECT mode, count(*) FROM ingest_runs GROUP BY 1 ORDER BY 1") == [
        ("backfill", 2), ("live", 2)]


@pytest.mark.parametrize("committed", [
    True,   # the COMMIT landed, its reply was lost: the rerun must not redo the chunk
    False,  # the COMMIT never landed: the rerun must do the chunk
])
def test_a_lost_commit_reply_is_resolved_by_rereading_the_stored_offset(
        committed: bool, pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _produce_events(clients, pipeline, 250)
    (rng,) = plan_run(pipeline, clients, db, run_id="lost")
    real_commit, real_uow_commit = psycopg.Connection.commit, UnitOfWork.commit
    calls = {"uow": 0, "inside": False}

    def uow_commit(self: UnitOfWork, **kwargs: Any) -> None:
        calls["uow"] += 1
        calls["inside"] = True
        try:
            real_uow_commit(self, **kwargs)
        finally:
            calls["inside"] = False

    def conn_commit(self: psycopg.Connection[Any]) -> None:
        if not (calls["inside"] and calls["uow"] == 2):  # the second chunk's COMMIT
            real_commit(self)
            return
        if committed:
            real_commit(self)
        else:
            self.rollback()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(UnitOfWork, "commit", uow_commit)
    monkeypatch.setattr(psycopg.Connection, "commit", conn_commit)
    with pytest.raises(CommitOutcomeUnknown) as lost:
        ingest_range(pipeline, rng, clients, db, run_id="lost")
    assert isinstance(lost.value, TransientError)  # Airflow retries it
    assert stored_offsets(pg_dsn, pipeline) == {0: 200 if committed else 100}

    monkeypatch.undo()
    report = ingest_range(pipeline, rng, clients, db, run_id="lost")
    assert report.resumed_from == (200 if committed else 100)
    assert report.inserted == (50 if committed else 150)
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(f"s-{i}" for i in range(250))
    assert stored_offsets(pg_dsn, pipeline) == {0: 250}
    assert group_offsets(clients, pipeline) == {0: 250}


def test_a_row_the_encoder_refuses_is_isolated_and_dead_lettered_like_one_postgres_refuses(
        pipeline: Any, clients: KafkaClients, db: Database, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows are encoded for COPY before their transaction. A value the encoder cannot
    # encode (a lone surrogate in a text: a contract that let one through) must not fail
    # the chunk on every retry: the row is isolated in the transaction's savepoints and
    # dead-lettered, the rest of the chunk loads. One in each of the two chunks.
    _produce_events(clients, pipeline, 150)
    real = ingest.validate_chunk
    bad = {17: "d\ud800", 120: "\udc80"}  # offset -> a value for the device_id column

    def letting_one_through(messages: Any, pipe: Any, decoder: Any = None) -> Any:
        result = real(messages, pipe, decoder)
        result.rows = [(r[0], bad[row_source(r).offset], *r[2:]) if row_source(r).offset in bad
                       else r for r in result.rows]
        return result

    monkeypatch.setattr(ingest, "validate_chunk", letting_one_through)
    (rng,) = plan_run(pipeline, clients, db, run_id="encoder")
    report = ingest_range(pipeline, rng, clients, db, run_id="encoder")

    assert (report.read, report.inserted, report.dead_lettered) == (150, 148, 2)
    assert sorted(table_ids(pg_dsn, pipeline.table)) == sorted(
        f"s-{i}" for i in range(150) if i not in bad)
    assert {pos: cls for pos, (cls, _) in dead_letter_rows(pg_dsn, pipeline).items()} == {
        (0, 17): "rejected_by_database", (0, 120): "rejected_by_database"}
    assert stored_offsets(pg_dsn, pipeline) == {0: 150}


def _table(conn: Any) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT event_id, source_topic, source_partition, source_offset,"
                        " metric_value FROM telemetry_metrics ORDER BY event_id").fetchall()


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[int | None]:
    """What each new-keys attempt returned (rows inserted, or None: it wrote nothing)."""
    from kafka_ingest.db.writers import AppendWriter

    seen: list[int | None] = []
    real = AppendWriter._copy_new

    def spy(self: AppendWriter, *args: Any) -> int | None:
        seen.append(real(self, *args))
        return seen[-1]

    monkeypatch.setattr(AppendWriter, "_copy_new", spy)
    return seen


def test_an_append_chunk_of_new_keys_is_inserted_without_on_conflict_and_counts_alike(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    # The COPY of new keys keeps, of each event twice in the chunk, the copy ON CONFLICT
    # keeps (the first place in the log, wherever it is in the chunk), so both paths
    # leave the same table and the same counts.
    rows = _rows(30)
    rows += [(*rows[4][:3], 99.0, *rows[4][4:8], 40, *rows[4][9:]),
             (*rows[9][:3], 77.0, *rows[9][4:8], 41, *rows[9][9:])]
    landed: list[list[tuple[Any, ...]]] = []
    counts: list[tuple[int, int, int]] = []
    for chunk in (rows, rows, [*rows[:5], rows[-1], *rows[5:-1]]):
        conn.execute("TRUNCATE telemetry_metrics")
        conn.commit()
        with UnitOfWork(conn, pipeline) as uow:
            if chunk is rows and landed:
                uow.rows.new_keys.met_stored_key()  # straight to ON CONFLICT
            up = uow.rows.upsert(chunk)
            counts.append((up.inserted, up.duplicates, up.missing))
            landed.append(_table(conn))
    assert attempts == [30, 30]
    assert counts == [(30, 2, 0)] * 3
    assert landed[0] == landed[1] == landed[2]
    by_id = {r[0]: r for r in landed[0]}
    assert by_id["u-4"][3:] == (4, 4.0) and by_id["u-9"][3:] == (9, 9.0)


def test_a_chunk_meeting_a_stored_key_falls_back_to_on_conflict_and_the_slice_pauses(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    from kafka_ingest.db.writers.append import NewKeys

    new_keys = NewKeys()
    with UnitOfWork(conn, pipeline, new_keys=new_keys) as uow:
        assert uow.rows.upsert(_rows(10)).inserted == 10
        uow.commit()
    with UnitOfWork(conn, pipeline, new_keys=new_keys) as uow:  # 5 stored, 10 new
        up = uow.rows.upsert(_rows(15, start=5))
        assert (up.inserted, up.duplicates, up.missing) == (10, 5, 0)
        uow.commit()
    assert attempts == [10, None] and (new_keys.pause, new_keys.skip) == (1, 1)
    for start in (20, 30):  # the next chunk skips the attempt, the one after tries again
        with UnitOfWork(conn, pipeline, new_keys=new_keys) as uow:
            assert uow.rows.upsert(_rows(10, start=start)).inserted == 10
            uow.commit()
    assert attempts == [10, None, 10] and (new_keys.pause, new_keys.skip) == (0, 0)
    assert [r[0] for r in _table(conn)] == sorted(f"u-{i}" for i in range(40))


def test_a_source_position_chunk_tries_its_keys_as_new_in_the_incarnation_its_column_takes(
        db: Database, make_pipeline: Callable[..., Any], attempts: list[int | None]) -> None:
    """A table keyed by the source position: the COPY of new keys leaves the incarnation
    to the column's default (1), so a chunk of the topic as first seen is copied straight
    in, one of a topic created again (incarnation 2) takes the staged path, which writes
    its incarnation; a table whose column defaults to another value is never copied into
    (its rows would take that value)."""
    from kafka_ingest.db.tables import create_statements
    from kafka_ingest.records import Source

    pipeline = make_pipeline("telemetry_metrics", partitions=1, chunk_size=100,
                             identity="source_position", table="by_position")
    with closing(db.connect()) as conn:
        for change in create_statements(pipeline):
            conn.execute(change.statement)  # type: ignore[arg-type]
        conn.commit()

        def write(rows: list[Row], incarnation: int) -> UpsertResult:
            with UnitOfWork(conn, pipeline) as uow:
                up = uow.rows.upsert(rows, source=Source(TOPIC, None, incarnation))
                uow.commit()
            return up

        assert write(_rows(10), 1).inserted == 10
        assert attempts == [10]  # copied straight in
        again = write(_rows(10), 1)  # a replay: the COPY is refused, ON CONFLICT keeps them
        assert (again.inserted, again.duplicates) == (0, 10) and attempts == [10, None]
        assert write(_rows(10), 2).inserted == 10  # the topic created again
        assert attempts == [10, None]
        conn.execute("ALTER TABLE by_position ALTER COLUMN source_incarnation SET DEFAULT 5")
        conn.commit()
        assert write(_rows(5, start=10), 1).inserted == 5
        assert attempts == [10, None]
        assert conn.execute("SELECT source_incarnation, count(*) FROM by_position GROUP BY 1"
                            " ORDER BY 1").fetchall() == [(1, 15), (2, 10)]


def test_a_letter_twice_in_a_chunk_lands_once_as_a_new_key_and_through_on_conflict(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    # Two rows at one place in the log (a dead letter produced twice, replayed): the
    # chunk's write order keeps one of them, so the COPY of new keys writes one row per
    # event, as ON CONFLICT does.
    rows = _rows(5)
    for attempt in (True, False):
        conn.execute("TRUNCATE telemetry_metrics")
        conn.commit()
        with UnitOfWork(conn, pipeline) as uow:
            if not attempt:
                uow.rows.new_keys.met_stored_key()
            up = uow.rows.upsert([*rows, rows[2]])
            assert (up.inserted, up.duplicates, up.missing) == (5, 1, 0)
            assert [r[0] for r in _table(conn)] == [f"u-{i}" for i in range(5)]
    assert attempts == [5]


def test_a_row_postgres_refuses_in_a_new_keys_chunk_is_isolated_and_the_rest_lands(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    rows = _rows(40)
    rows[17] = ("x" * 200, *rows[17][1:])  # event_id longer than varchar(128)
    with UnitOfWork(conn, pipeline) as uow:
        up = uow.rows.upsert(rows)
        assert (up.inserted, up.missing) == (39, 0)
        assert [row_source(row).offset for row, _ in up.rejected] == [17]
        assert len(_table(conn)) == 39
    assert sum(filter(None, attempts)) == 39  # every half the bisection wrote: new keys


def test_three_copies_of_an_event_across_partitions_keep_the_lowest_place_both_ways(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    # A replay's chunk: rows of several partitions, not in log order, an event three times.
    rows = _rows(12)
    rows = [(*r[:7], i % 3, 100 - i, *r[9:]) for i, r in enumerate(rows)]
    copies = [(*rows[5][:3], v, *rows[5][4:7], p, o, *rows[5][9:])
              for v, p, o in ((1.5, 2, 7), (2.5, 0, 3), (3.5, 0, 9))]
    chunk = [rows[0], copies[0], *rows[1:6], copies[1], *rows[6:], copies[2]]
    landed: list[dict[str, Any]] = []
    for attempt in (True, False):
        conn.execute("TRUNCATE telemetry_metrics")
        conn.commit()
        with UnitOfWork(conn, pipeline) as uow:
            if not attempt:
                uow.rows.new_keys.met_stored_key()
            up = uow.rows.upsert(chunk)
            assert (up.inserted, up.duplicates, up.missing) == (12, 3, 0)
            landed.append({r[0]: r[2:] for r in _table(conn)})
    assert attempts == [12] and landed[0] == landed[1]
    assert landed[0]["u-5"] == (0, 3, 2.5)


def test_new_keys_pauses_double_up_to_the_limit_and_end_on_a_chunk_of_new_keys() -> None:
    from kafka_ingest.db.writers.append import NEW_KEYS_MAX_PAUSE, NewKeys

    keys, tried = NewKeys(), []
    for _ in range(300):
        tried.append(keys.attempt())
        if tried[-1]:
            keys.met_stored_key()
    gaps = [len(g) for g in "".join("x" if t else "." for t in tried).split("x")[1:-1]]
    assert gaps[:7] == [1, 2, 4, 8, 16, 32, 64] and set(gaps[7:]) == {NEW_KEYS_MAX_PAUSE}
    keys.all_new()
    assert keys.attempt() and keys.attempt()


def test_a_connection_copies_bytes_with_psycopgs_c_dumper(db: Database) -> None:
    # A binary COPY dumps each column by its type; psycopg.dbapi20 registers a pure-Python
    # dumper for bytea, which cost a slice 0.26 µs a row for kafka_key alone. The project's
    # connections dump bytes with psycopg's own (C) dumper: the same bytes on the wire.
    from psycopg.postgres import types
    from psycopg.pq import Format

    with closing(db.connect()) as c:
        dumper = c.adapters.get_dumper_by_oid(types["bytea"].oid, Format.BINARY)
        assert dumper.__module__.split(".")[0] in {"psycopg_binary", "psycopg_c"}, dumper
        assert c.execute("SELECT %b::bytea", (b"\x00\xffk",)).fetchone() == (b"\x00\xffk",)


def test_an_epoch_travels_as_the_timestamptz_postgres_to_timestamp_makes(conn: Any) -> None:
    # Epochs are converted in the hot loop, no longer by the server. Seconds: the
    # microsecond to_timestamp makes, half-way cases and the range's ends included.
    rnd = random.Random(7)
    seconds = [0.0, 0.5, 1.5, 2.5, 0.0000005, 0.0000015, 1_767_225_600.25,
               1_767_225_600.9478652, 253_402_300_799.0, 253_402_300_799.999999,
               *(rnd.uniform(0, 4e9) for _ in range(2000)),
               *(rnd.randrange(0, 4 * 10**15) / 10**6 for _ in range(2000))]
    assert [seconds_to_pg(s) for s in seconds] == _server_us(conn, "to_timestamp(x)",
                                                            "float8", seconds)
    # Milliseconds: exact, which the server's float path (to_timestamp(ms / 1000.0)) also
    # is to 2096 (4e12 ms) at least, and no longer is from the 2270s to the year 9999.
    millis = [0, 1, 999, 1_767_225_600_123, *(rnd.randrange(0, 4 * 10**12) for _ in range(4000))]
    assert [millis_to_pg(ms) for ms in millis] == _server_us(
        conn, "to_timestamp(x::float8 / 1000)", "int8", millis)
    last = millis_to_pg(253_402_300_799_999)
    assert pg_to_datetime(last) == datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    assert _server_us(conn, "to_timestamp(x::float8 / 1000)", "int8",
                      [253_402_300_799_999]) == [last + 8]


def _server_us(conn: Any, expression: str, kind: str, values: list[Any]) -> list[int]:
    """``expression`` of each value ``x`` as microseconds since 2000-01-01, by the server."""
    found = conn.execute(
        f"SELECT array_agg((extract(epoch FROM {expression} - %s) * 1000000)::int8 ORDER BY i)"
        f" FROM unnest(%s::{kind}[]) WITH ORDINALITY u(x, i)",
        (datetime(2000, 1, 1, tzinfo=UTC), values)).fetchone()[0]
    return list(found)


def test_a_table_postgres_refuses_copy_into_takes_the_staged_path_for_the_slice(
        conn: Any, pipeline: Any, attempts: list[int | None]) -> None:
    from kafka_ingest.db.writers.append import NewKeys

    # COPY FROM is refused on a table under row-level security: the chunk loads through
    # the staging table and INSERT instead, and the slice stops trying.
    conn.execute("ALTER TABLE telemetry_metrics ENABLE ROW LEVEL SECURITY")
    conn.execute("ALTER TABLE telemetry_metrics FORCE ROW LEVEL SECURITY")
    conn.execute("CREATE POLICY everything ON telemetry_metrics USING (true) WITH CHECK (true)")
    conn.commit()
    new_keys = NewKeys()
    for start in (0, 10):
        with UnitOfWork(conn, pipeline, new_keys=new_keys) as uow:
            up = uow.rows.upsert(_rows(10, start=start))
            assert (up.inserted, up.duplicates, up.missing) == (10, 0, 0)
            uow.commit()
    assert attempts == [None]
    assert [r[0] for r in _table(conn)] == sorted(f"u-{i}" for i in range(20))


def test_two_transactions_writing_the_same_new_keys_wait_for_each_other_never_deadlock(
        db: Database, conn: Any, pipeline: Any) -> None:
    # Copies of the same 200 events in two partitions, in opposite orders in their chunks,
    # written at once. A trigger holds each transaction for a second before u-100, so both
    # are half-way then. In chunk order each would hold keys the other needs next: a
    # deadlock, and one chunk fails. Each chunk writes its keys in key order instead, so
    # the later one waits for the earlier one's first key, then finds them all stored.
    conn.execute("CREATE FUNCTION hold_u100() RETURNS trigger LANGUAGE plpgsql AS $$"
                 " BEGIN IF NEW.event_id = 'u-100' THEN PERFORM pg_sleep(1); END IF;"
                 " RETURN NEW; END $$")
    conn.execute("CREATE TRIGGER hold_u100 BEFORE INSERT ON telemetry_metrics"
                 " FOR EACH ROW EXECUTE FUNCTION hold_u100()")
    conn.commit()
    rows = _rows(200)
    chunks = {0: rows, 1: [(*r[:7], 1, *r[8:]) for r in reversed(rows)]}
    outcome: dict[int, Any] = {}

    def write(partition: int) -> None:
        try:
            with closing(db.connect()) as c, UnitOfWork(c, pipeline) as uow:
                outcome[partition] = uow.rows.upsert(chunks[partition])
                uow.commit()
        except Exception as exc:
            outcome[partition] = exc

    writers = [threading.Thread(target=write, args=(p,)) for p in chunks]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    assert all(isinstance(up, UpsertResult) for up in outcome.values()), outcome
    assert sorted((up.inserted, up.duplicates, up.missing) for up in outcome.values()) == [
        (0, 200, 0), (200, 0, 0)]
    assert len({r[2] for r in _table(conn)}) == 1  # every row one partition's copy
    assert len(_table(conn)) == 200
