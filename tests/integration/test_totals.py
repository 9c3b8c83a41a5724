"""The counters the looks read, kept as the ledger and the dead letters are written (migration
0010), on the real Postgres: made from the existing history when a deployment migrates,
equal to the sums over the rows whatever writes them, unmoved by deletes of the history,
and keyed so that two partitions' slices never wait for each other on them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import psycopg
import pytest

from kafka_ingest.db import (
    DeadLettersRepository,
    LedgerLooks,
    RunRecord,
    RunsRepository,
    migrate,
)
from kafka_ingest.kafka.dlq import DeadLetter
from kafka_ingest.ops.status import status_rows
from kafka_ingest.records import COUNTERS, ChunkCounts
from kafka_ingest_dev.databases import fresh_database

pytestmark = pytest.mark.integration

#: Every counter of the ledger (the record's: the columns of ingest_runs and ingest_totals).
SUMMED = COUNTERS


def _run(conn: Any, partition: int, *, mode: str = "live", read: int = 100,
         dead: int = 0, run_id: str = "r", start: int = 0, minutes_ago: float = 0.0) -> None:
    conn.execute(
        "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
        " seconds, committed_at)"
        " VALUES ('p', %s, %s, 't', %s, %s, %s, %s, %s, 0, 0, %s, 0, %s, 0.5,"
        " now() - %s * interval '1 minute')",
        (run_id, mode, partition, start, start + read, read, read - dead, dead, read * 10,
         minutes_ago))


def _sums(conn: Any) -> dict[tuple[str, int], tuple[int, ...]]:
    """What the ledger's rows sum to, per (mode, partition): the truth for the totals."""
    rows = conn.execute(
        "SELECT mode, partition, count(*), " + ", ".join(f"sum({c})" for c in SUMMED)
        + " FROM ingest_runs WHERE pipeline = 'p' GROUP BY 1, 2").fetchall()
    return {(m, int(p)): tuple(int(v) for v in vs) for m, p, *vs in rows}


def _totals(conn: Any) -> dict[tuple[str, int], tuple[int, ...]]:
    rows = conn.execute(
        "SELECT mode, partition, chunks, " + ", ".join(SUMMED)
        + " FROM ingest_totals WHERE pipeline = 'p'").fetchall()
    return {(m, int(p)): tuple(int(v) for v in vs) for m, p, *vs in rows}


def _newest(conn: Any, mode: str, partition: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT last_id, last_run_id, last_start_offset, last_committed_at FROM ingest_totals"
        " WHERE pipeline = 'p' AND mode = %s AND partition = %s", (mode, partition)).fetchone()
    assert row is not None
    return tuple(row)


def _newest_row(conn: Any, mode: str, partition: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT id, run_id, start_offset, committed_at FROM ingest_runs WHERE pipeline = 'p'"
        " AND mode = %s AND partition = %s ORDER BY committed_at DESC, id DESC LIMIT 1",
        (mode, partition)).fetchone()
    assert row is not None
    return tuple(row)


def test_migrating_makes_the_totals_of_the_existing_ledger_and_letters(
        stack_env: dict[str, str]) -> None:
    with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], migrated=False) as dsn, \
            psycopg.connect(dsn) as conn:
        files = sorted((f for f in resources.files("kafka_ingest.db").joinpath(
            "migrations").iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
        conn.execute("CREATE TABLE schema_migrations (version text PRIMARY KEY,"
                     " applied_at timestamptz NOT NULL DEFAULT now())")
        for file in files:  # a deployment from before the totals
            if file.name < "0010":
                conn.execute(file.read_text(encoding="utf-8"))
                conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)",
                             (file.name.removesuffix(".sql"),))
        for i in range(12):
            _run(conn, i % 2, mode=("live", "backfill")[i % 3 == 0], read=10 + i, dead=i % 4,
                 run_id=f"r{i}", start=i * 100, minutes_ago=60 - i)
        _run(conn, 0, run_id="late-but-older", start=5000, minutes_ago=600)
        for offset, status, reason in [(1, "parked", "not_json"), (2, "parked", "not_json"),
                                       (3, "recovered", "not_json"),
                                       (4, "parked", "contract_violation")]:
            conn.execute(
                "INSERT INTO dead_letters (pipeline, source_topic, source_partition,"
                " source_offset, contract, error_class, error_detail, status, dlq_topic)"
                " VALUES ('p', 't', 0, %s, 'c.v1', %s, 'x', %s, 't-dlq')",
                (offset, reason, status))
        conn.commit()
        expected = _sums(conn)

        assert "0010_totals_and_retention" in migrate(conn)

        assert _totals(conn) == expected
        for mode, partition in expected:
            assert _newest(conn, mode, partition) == _newest_row(conn, mode, partition)
        assert _newest(conn, "live", 0)[1] != "late-but-older"  # newest by time, not by id
        letters = conn.execute("SELECT status, error_class, letters FROM dead_letter_totals"
                               " ORDER BY 1, 2").fetchall()
        assert letters == [("parked", "contract_violation", 1), ("parked", "not_json", 2),
                           ("recovered", "not_json", 1)]


def test_the_ledger_totals_follow_every_write_and_survive_deletes(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        runs = RunsRepository(conn)
        for i in range(6):  # the way the slices write, one chunk a statement
            runs.add(RunRecord(pipeline="p", run_id=f"run{i}", mode="live", topic="t",
                               partition=i % 2, start_offset=i * 50, end_offset=i * 50 + 50,
                               counts=ChunkCounts(read=50, inserted=45, duplicates=3,
                                                  dead_lettered=2, bytes=500),
                               seconds=0.25))
            conn.commit()
        # several chunks in one statement, one of them older than what is there already
        conn.execute(
            "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
            " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
            " seconds, committed_at) VALUES"
            " ('p', 'bulk', 'replay', 't-dlq', 0, 0, 10, 10, 9, 0, 0, 1, 0, 9, 0.1, now()),"
            " ('p', 'bulk', 'replay', 't-dlq', 0, 10, 20, 10, 10, 0, 0, 0, 0, 9, 0.1, now()),"
            " ('p', 'old', 'live', 't', 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 0.1,"
            "  now() - interval '1 day')")
        conn.commit()
        expected = _sums(conn)
        assert _totals(conn) == expected
        assert _newest(conn, "live", 0)[1] == "run4"  # the older chunk is not the newest
        assert _newest(conn, "replay", 0)[2] == 10  # of one statement's rows, the later id

        conn.execute("DELETE FROM ingest_runs WHERE pipeline = 'p'")  # the retention, all of it
        conn.commit()
        assert _totals(conn) == expected


def _letter(partition: int, offset: int, error_class: str = "not_json") -> DeadLetter:
    return DeadLetter(
        source_topic="t", source_partition=partition, source_offset=offset, key=b"k",
        value=b"v", timestamp_ms=1_700_000_000_000, error_class=error_class,
        error_detail="x", contract="c.v1", dlq_topic="t-dlq",
        first_failed_at=datetime.now(UTC))


def _letter_totals(conn: Any) -> dict[tuple[str, str], int]:
    rows = conn.execute("SELECT status, error_class, sum(letters) FROM dead_letter_totals"
                        " WHERE pipeline = 'p' GROUP BY 1, 2 HAVING sum(letters) <> 0").fetchall()
    return {(s, c): int(n) for s, c, n in rows}


def _letter_rows(conn: Any) -> dict[tuple[str, str], int]:
    rows = conn.execute("SELECT status, error_class, count(*) FROM dead_letters"
                        " WHERE pipeline = 'p' GROUP BY 1, 2").fetchall()
    return {(s, c): int(n) for s, c, n in rows}


def test_every_counter_of_the_record_reaches_the_audit_the_totals_and_the_looks(
        pg_dsn: str) -> None:
    """A chunk whose every counter differs: the audit row (``RunsRepository``), the
    totals (the trigger), the ledger's looks and ``kafka-ingest status``'s recent chunks
    carry each one, under its own name."""
    counts = ChunkCounts(**{c: 2 ** i for i, c in enumerate(COUNTERS)})
    with psycopg.connect(pg_dsn) as conn:
        columns = {t: {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s",
            (t,)).fetchall()} for t in ("ingest_runs", "ingest_totals")}
        RunsRepository(conn).add(RunRecord(
            pipeline="p", run_id="r", mode="live", topic="t", partition=0, start_offset=0,
            end_offset=counts.read, counts=counts, seconds=0.5))
        audit = conn.execute("SELECT " + ", ".join(COUNTERS) + " FROM ingest_runs").fetchone()
        totals = LedgerLooks(conn).totals("p")
        recent = status_rows(conn, "p")[0]

    assert set(COUNTERS) <= columns["ingest_runs"] and set(COUNTERS) <= columns["ingest_totals"]
    assert audit == tuple(counts.as_dict().values())
    assert totals == {"live": counts}
    assert [{c: r[c] for c in COUNTERS} for r in recent] == [counts.as_dict()]


def test_the_dead_letter_totals_follow_inserts_recoveries_and_changes(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        letters = DeadLettersRepository(conn)
        letters.record("p", [_letter(0, o) for o in range(6)] + [_letter(1, 9, "too_large")],
                       [None] * 7)
        conn.commit()
        assert _letter_totals(conn) == _letter_rows(conn) == {("parked", "not_json"): 6,
                                                              ("parked", "too_large"): 1}
        letters.mark_recovered("p", [("t", 1, 0, 0), ("t", 1, 0, 1), ("t", 1, 0, 2)])
        # failing again: one recovered letter parked again, one parked letter changes class
        letters.record("p", [_letter(0, 2, "contract_violation"),
                             _letter(0, 3, "contract_violation")], [None, None])
        conn.commit()
        expected = {("parked", "not_json"): 2, ("parked", "contract_violation"): 2,
                    ("parked", "too_large"): 1, ("recovered", "not_json"): 2}
        assert _letter_totals(conn) == _letter_rows(conn) == expected

        # a parked letter deleted by hand is no longer parked; a recovered one deleted (the
        # retention) still counts as recovered: a counter never goes back
        conn.execute("DELETE FROM dead_letters WHERE source_offset IN (0, 4)")
        conn.commit()
        assert _letter_totals(conn) == {**expected, ("parked", "not_json"): 1}
        assert _letter_rows(conn)[("recovered", "not_json")] == 1

        conn.execute("TRUNCATE dead_letters")  # the owner wiping them: none is parked
        conn.commit()
        assert _letter_totals(conn) == {("recovered", "not_json"): 2}


def test_two_partitions_slices_do_not_wait_for_each_other_on_the_totals(
        pg_dsn: str) -> None:
    """Slice A's chunk holds its totals rows until its COMMIT; slice B, on another
    partition of the same pipeline, commits meanwhile (a shared row would block it until
    its lock time-out)."""
    with psycopg.connect(pg_dsn) as a, psycopg.connect(pg_dsn) as b:
        for conn in (a, b):  # both partitions' rows exist: the steady state
            _run(conn, 0 if conn is a else 1)
            DeadLettersRepository(conn).record("p", [_letter(0 if conn is a else 1, 1)], [None])
            conn.commit()
        _run(a, 0, start=100)
        DeadLettersRepository(a).record("p", [_letter(0, 2)], [None])  # A: not committed
        b.execute("SET lock_timeout = '2s'")
        done = threading.Event()

        def slice_b() -> None:
            _run(b, 1, start=100)
            DeadLettersRepository(b).record("p", [_letter(1, 2)], [None])
            b.commit()
            done.set()

        worker = threading.Thread(target=slice_b, name="slice-b")
        worker.start()
        worker.join(timeout=10)  # bounded: B's own lock time-out is 2 s
        a.commit()
        assert done.is_set(), "slice B waited on slice A's totals"
        assert _totals(a) == _sums(a)
        assert _letter_totals(a) == _letter_rows(a)
