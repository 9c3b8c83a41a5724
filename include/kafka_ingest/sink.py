"""Postgres: the unit of work, its repositories, and the schema migrations.

One chunk is one transaction on one psycopg 3 connection: rows are COPYed (binary) into a
temporary staging table, in-chunk duplicates dropped, ``INSERT ... SELECT ... ON CONFLICT``
into the target table, dead letters recorded, the stored offset advanced by compare-and-set
and an audit row written; then COMMIT. :class:`UnitOfWork` rolls back on exit unless
:meth:`UnitOfWork.commit` ran.

Service code takes the unit of work as a parameter, so unit tests pass a fake.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Self

import psycopg
from psycopg import sql

from kafka_ingest.config import Pipeline, UpsertMode
from kafka_ingest.errors import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    FencedError,
    RejectedByDatabase,
    map_psycopg_error,
)
from kafka_ingest.validate import ms_to_datetime

log = logging.getLogger(__name__)

PROVENANCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("source_topic", "text"),
    ("source_partition", "int4"),
    ("source_offset", "int8"),
    ("kafka_key", "bytea"),
    ("kafka_timestamp", "timestamptz"),
)
#: Index of ``source_offset`` counted from the end of a row tuple.
_OFFSET_FROM_END = -3
_MIGRATION_LOCK = 7_431_002_211  # pg_advisory_xact_lock key: one migrator at a time


# --------------------------------------------------------------------------- connection


class Database:
    """Opens psycopg 3 connections to the pipelines' database; errors become transient."""

    def __init__(self, dsn: str, *, connect_timeout: int = 10, lock_timeout_s: float = 30.0):
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self.lock_timeout_s = lock_timeout_s

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self.dsn,
                autocommit=autocommit,
                connect_timeout=self.connect_timeout,
                application_name="kafka-ingest",
                # A half-open connection (a server or network gone without a FIN) fails
                # within about a minute instead of hanging a task on a COPY or a COMMIT.
                keepalives=1,
                keepalives_idle=30,
                keepalives_interval=10,
                keepalives_count=3,
                tcp_user_timeout=60_000,
            )
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable("connect", str(exc).strip()) from exc

    @contextmanager
    def session(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection closed on exit; psycopg errors mapped onto the error tree."""
        conn = self.connect(autocommit=autocommit)
        try:
            with translate_errors("session"):
                yield conn
        finally:
            conn.close()


@contextmanager
def translate_errors(operation: str) -> Iterator[None]:
    """Map psycopg's connection-level errors onto :mod:`kafka_ingest.errors`."""
    try:
        yield
    except psycopg.Error as exc:
        mapped = map_psycopg_error(operation, exc)
        if mapped is None:
            raise
        raise mapped from exc


# --------------------------------------------------------------------------- migrations


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the pending migrations in order, each in its own transaction. Idempotent."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        files = sorted(
            (f for f in resources.files("kafka_ingest.migrations").iterdir()
             if f.name.endswith(".sql")),
            key=lambda f: f.name,
        )
        for file in files:
            version = file.name.removesuffix(".sql")
            if version in done:
                continue
            with conn.transaction():
                conn.execute(file.read_text(encoding="utf-8"))
                conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied


# --------------------------------------------------------------------------- locks


def lock_partition(conn: psycopg.Connection[Any], pipeline: str, partition: int,
                   *, timeout_s: float, for_transaction: bool = False) -> None:
    """Take the advisory lock of (pipeline, partition), waiting up to ``timeout_s``.

    Session-level by default, so it spans a live slice's chunk transactions and dies with
    the connection (a killed worker never leaves it behind). ``for_transaction`` takes it
    in the caller's open transaction (a backfill chunk's), released by its COMMIT or
    ROLLBACK: backfills then interleave with live slices chunk by chunk. The two kinds
    exclude each other. Failing to get it in time is transient.
    """
    timeout = f"{int(timeout_s * 1000)}"
    try:
        if for_transaction:  # no savepoint: a savepoint's commit would not keep the lock
            previous = conn.execute("SELECT current_setting('lock_timeout')").fetchone()
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (pipeline, partition))
            conn.execute("SELECT set_config('lock_timeout', %s, true)",
                         (previous[0] if previous else "0",))
            return
        with conn.transaction():  # set_config(..., true) ends with this transaction
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
            conn.execute("SELECT pg_advisory_lock(hashtext(%s), %s)", (pipeline, partition))
    except psycopg.errors.LockNotAvailable as exc:
        raise DatabaseUnavailable(
            "advisory lock",
            f"{pipeline}[{partition}] is being written by another run for over {timeout_s}s",
        ) from exc


def unlock_partition(conn: psycopg.Connection[Any], pipeline: str, partition: int) -> None:
    """Release the session lock; a broken connection has released it already."""
    if conn.closed:
        return
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s), %s)", (pipeline, partition))
    except psycopg.Error:
        log.warning("could not release the lock of %s[%d]; it ends with the connection",
                    pipeline, partition)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class UpsertResult:
    """What one chunk's upsert did. ``rejected`` rows go to the DLQ, with the reason."""

    inserted: int
    duplicates: int
    stale: int
    rejected: list[tuple[tuple[Any, ...], RejectedByDatabase]]
    #: Staged rows the table does not hold (nor a newer version of) after the INSERT:
    #: must be 0. Checked against the table, independently of the counts above.
    missing: int = 0


@dataclass(frozen=True)
class RunRecord:
    pipeline: str
    run_id: str
    mode: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    read: int
    inserted: int
    duplicates: int
    stale: int
    dead_lettered: int
    tombstones: int
    bytes: int
    seconds: float


# --------------------------------------------------------------------------- repositories


class RowsRepository:
    """The pipeline's target table, written through a temporary staging table."""

    _BISECTABLE = (psycopg.DataError, psycopg.IntegrityError, UnicodeEncodeError)

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline) -> None:
        self.conn = conn
        self.pipeline = pipeline
        cols = (*pipeline.model.SINK_COLUMNS, *PROVENANCE_COLUMNS)
        self.columns = [name for name, _ in cols]
        self.types = [pg_type for _, pg_type in cols]
        self.table = sql.Identifier(pipeline.table)
        self.stage = sql.Identifier(f"stage_{pipeline.table}")
        self._stage_ready = False

    def upsert(self, rows: Sequence[tuple[Any, ...]]) -> UpsertResult:
        """Upsert ``rows``; rows Postgres rejects are isolated by bisection, not fatal."""
        self._ensure_stage()
        return self._upsert_isolating(list(rows))

    def _upsert_isolating(self, rows: list[tuple[Any, ...]]) -> UpsertResult:
        if not rows:
            return UpsertResult(0, 0, 0, [])
        try:
            with self.conn.transaction():  # a savepoint inside the chunk's transaction
                return self._upsert_once(rows)
        except self._BISECTABLE as exc:
            if len(rows) == 1:
                reason = RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
                return UpsertResult(0, 0, 0, [(rows[0], reason)])
        mid = len(rows) // 2
        left = self._upsert_isolating(rows[:mid])
        right = self._upsert_isolating(rows[mid:])
        return UpsertResult(
            left.inserted + right.inserted,
            left.duplicates + right.duplicates,
            left.stale + right.stale,
            left.rejected + right.rejected,
            left.missing + right.missing,
        )

    def _ensure_stage(self) -> None:
        if self._stage_ready:
            return
        cols = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t))
            for n, t in zip(self.columns, self.types, strict=True)
        )
        self.conn.execute(
            sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                self.stage, cols
            )
        )
        self._stage_ready = True

    def _copy(self, rows: list[tuple[Any, ...]]) -> None:
        self.conn.execute(sql.SQL("TRUNCATE {}").format(self.stage))
        stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self.stage, sql.SQL(", ").join(map(sql.Identifier, self.columns))
        )
        with self.conn.cursor().copy(stmt) as copy:
            copy.set_types(self.types)
            for row in rows:
                copy.write_row(row)

    def _upsert_once(self, rows: list[tuple[Any, ...]]) -> UpsertResult:
        self._copy(rows)
        if self.pipeline.upsert.mode is UpsertMode.LATEST:
            return self._upsert_latest(len(rows))
        return self._upsert_append(len(rows))

    def _upsert_append(self, n: int) -> UpsertResult:
        cols = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        cur = self.conn.execute(
            sql.SQL(
                "INSERT INTO {t} ({c}) SELECT DISTINCT ON (event_id) {c} FROM {s}"
                " ORDER BY event_id, source_topic, source_partition, source_offset"
                " ON CONFLICT (event_id) DO NOTHING"
            ).format(t=self.table, c=cols, s=self.stage)
        )
        inserted = cur.rowcount
        # Every staged row not inserted is a duplicate (in the chunk, or already stored).
        # Counting "already stored" with a SELECT before the INSERT misses rows a concurrent
        # transaction (another partition's task) inserts meanwhile: ON CONFLICT skips them,
        # so the chunk failed reconciliation. What is checked instead is the outcome: every
        # staged event_id is in the table now.
        return UpsertResult(inserted, n - inserted, 0, [], self._missing(
            "SELECT count(*) FROM (SELECT DISTINCT event_id FROM {s}) s"
            " WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.event_id = s.event_id)", {}))

    def _missing(self, query: str, extra: dict[str, sql.Composable]) -> int:
        row = self.conn.execute(
            sql.SQL(query).format(t=self.table, s=self.stage, **extra)
        ).fetchone()
        return int(row[0]) if row else 0

    def _upsert_latest(self, n: int) -> UpsertResult:
        key = sql.Identifier(self.pipeline.upsert.key or "")
        order = sql.Identifier(self.pipeline.upsert.order_by)
        cols = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c))
            for c in self.columns if c != self.pipeline.upsert.key
        )
        fmt = {"t": self.table, "s": self.stage, "k": key, "o": order, "c": cols, "u": updates}
        # Classify each staged row before writing. "copy" 1 is the copy of an event the
        # INSERT below would pick (same event => same key and time; the highest offset wins).
        row = self.conn.execute(sql.SQL(
            "WITH s AS (SELECT event_id, {k}, {o}, source_offset, row_number() OVER"
            " (PARTITION BY event_id ORDER BY source_offset DESC, source_partition DESC) AS copy"
            " FROM {s}), f AS (SELECT s.copy, EXISTS (SELECT 1 FROM {t} x"
            " WHERE x.event_id = s.event_id) AS stored, EXISTS (SELECT 1 FROM {t} y"
            " WHERE y.{k} = s.{k} AND (s.{o}, s.source_offset) <= (y.{o}, y.source_offset))"
            " AS older FROM s)"
            " SELECT count(*) FILTER (WHERE copy > 1),"
            " count(*) FILTER (WHERE copy = 1 AND stored),"
            " count(*) FILTER (WHERE copy = 1 AND NOT stored AND older) FROM f"
        ).format(**fmt)).fetchone()
        dup_in_chunk, dup_stored, stale_stored = (int(v) for v in row) if row else (0, 0, 0)
        cur = self.conn.execute(sql.SQL(
            "INSERT INTO {t} ({c}) SELECT DISTINCT ON ({k}) {c} FROM {s}"
            # A replay of the stored event is a duplicate (counted above), not a newer
            # version: its later source_offset must not rewrite the row nor count twice.
            " WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.event_id = {s}.event_id)"
            " ORDER BY {k}, {o} DESC, source_offset DESC, source_partition DESC"
            " ON CONFLICT ({k}) DO UPDATE SET {u}, ingested_at = now()"
            " WHERE ({t}.{o}, {t}.source_offset) < (EXCLUDED.{o}, EXCLUDED.source_offset)"
        ).format(**fmt))
        inserted = cur.rowcount
        # The rest lost, inside the chunk, to a newer event of the same entity: stale too.
        superseded = n - inserted - dup_in_chunk - dup_stored - stale_stored
        # The outcome, checked against the table: each staged event is stored, or its entity
        # holds a version at least as new.
        missing = self._missing(
            "SELECT count(*) FROM {s} s WHERE NOT EXISTS (SELECT 1 FROM {t} x"
            " WHERE x.{k} = s.{k} AND (x.event_id = s.event_id"
            " OR (x.{o}, x.source_offset) >= (s.{o}, s.source_offset)))",
            {"k": key, "o": order})
        return UpsertResult(inserted, dup_in_chunk + dup_stored, stale_stored + superseded, [],
                            missing)


class OffsetsRepository:
    """``ingest_offsets``: the next offset to read, moved only by compare-and-set."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def get(self, pipeline: str, topic: str, partition: int) -> int | None:
        row = self.conn.execute(
            "SELECT next_offset FROM ingest_offsets"
            " WHERE pipeline = %s AND topic = %s AND partition = %s",
            (pipeline, topic, partition),
        ).fetchone()
        return int(row[0]) if row else None

    def all(self, pipeline: str, topic: str) -> dict[int, int]:
        rows = self.conn.execute(
            "SELECT partition, next_offset FROM ingest_offsets WHERE pipeline = %s AND topic = %s",
            (pipeline, topic),
        ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def initialise(self, pipeline: str, topic: str, partition: int, offset: int) -> int:
        """Store ``offset`` unless a value exists; return the stored value."""
        self.conn.execute(
            "INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (pipeline, topic, partition, offset),
        )
        stored = self.get(pipeline, topic, partition)
        assert stored is not None
        return stored

    def reset(self, pipeline: str, topic: str, partition: int, offset: int) -> int | None:
        """Set the stored offset by hand (operators only); return the previous value."""
        before = self.get(pipeline, topic, partition)
        self.conn.execute(
            "INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (pipeline, topic, partition)"
            " DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
            (pipeline, topic, partition, offset),
        )
        return before

    def advance(self, pipeline: str, topic: str, partition: int, expected: int, new: int) -> None:
        """Compare-and-set: exactly one row moves from ``expected`` to ``new``, or fence."""
        cur = self.conn.execute(
            "UPDATE ingest_offsets SET next_offset = %s, updated_at = now()"
            " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
            (new, pipeline, topic, partition, expected),
        )
        if cur.rowcount != 1:
            raise FencedError(pipeline, topic, partition, expected,
                              self.get(pipeline, topic, partition))


class DeadLettersRepository:
    """``dead_letters``: one row per (pipeline, source topic, partition, offset)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def record(self, pipeline: str, letters: Sequence[Any],
               delivered: Sequence[tuple[int, int] | None]) -> None:
        """Insert (or bump the attempt count of) each dead letter, parked."""
        if not letters:
            return
        params = [
            (pipeline, d.source_topic, d.source_partition, d.source_offset, d.key,
             ms_to_datetime(d.timestamp_ms), d.contract, d.error_class, d.error_detail,
             d.attempts, d.first_failed_at, d.dlq_topic,
             loc[0] if loc else None, loc[1] if loc else None)
            for d, loc in zip(letters, delivered, strict=True)
        ]
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO dead_letters (pipeline, source_topic, source_partition,"
                " source_offset, kafka_key, kafka_timestamp, contract, error_class,"
                " error_detail, attempts, first_failed_at, dlq_topic, dlq_partition, dlq_offset)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (pipeline, source_topic, source_partition, source_offset) DO UPDATE"
                " SET error_class = EXCLUDED.error_class, error_detail = EXCLUDED.error_detail,"
                "     contract = EXCLUDED.contract,"
                "     attempts = GREATEST(dead_letters.attempts + 1, EXCLUDED.attempts),"
                "     last_failed_at = now(), status = 'parked', recovered_at = NULL,"
                "     dlq_topic = EXCLUDED.dlq_topic,"
                "     dlq_partition = COALESCE(EXCLUDED.dlq_partition, dead_letters.dlq_partition),"
                "     dlq_offset = COALESCE(EXCLUDED.dlq_offset, dead_letters.dlq_offset)",
                params,
            )

    def mark_recovered(self, pipeline: str, keys: Sequence[tuple[str, int, int]]) -> None:
        if not keys:
            return
        with self.conn.cursor() as cur:
            cur.executemany(
                "UPDATE dead_letters SET status = 'recovered', recovered_at = now(),"
                " attempts = attempts + 1"
                " WHERE pipeline = %s AND source_topic = %s AND source_partition = %s"
                " AND source_offset = %s",
                [(pipeline, *k) for k in keys],
            )

    def status_of(self, pipeline: str,
                  keys: Sequence[tuple[str, int, int]]) -> dict[tuple[str, int, int], str]:
        rows = self.conn.execute(
            "SELECT source_topic, source_partition, source_offset, status FROM dead_letters"
            " WHERE pipeline = %s AND (source_topic, source_partition, source_offset)"
            " IN (SELECT * FROM unnest(%s::text[], %s::int[], %s::bigint[]))",
            (pipeline, [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
        ).fetchall()
        return {(t, int(p), int(o)): s for t, p, o, s in rows}


class RunsRepository:
    """``ingest_runs`` (audit, one row per committed chunk) and ``run_plans``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def add(self, r: RunRecord) -> None:
        self.conn.execute(
            "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
            " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
            " seconds) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (r.pipeline, r.run_id, r.mode, r.topic, r.partition, r.start_offset, r.end_offset,
             r.read, r.inserted, r.duplicates, r.stale, r.dead_lettered, r.tombstones, r.bytes,
             r.seconds),
        )

    def pinned_plan(self, pipeline: str, run_id: str,
                    request_key: str) -> list[tuple[str, int, int, int, str]]:
        """The ranges pinned to this run for this request (empty if none)."""
        return [
            (t, int(p), int(s), int(e), m)
            for t, p, s, e, m in self.conn.execute(
                "SELECT topic, partition, start_offset, end_offset, mode FROM run_plans"
                " WHERE pipeline = %s AND run_id = %s AND request_key = %s"
                " ORDER BY topic, partition",
                (pipeline, run_id, request_key),
            )
        ]

    def pin_plan(self, pipeline: str, run_id: str, request_key: str, mode: str,
                 ranges: Sequence[tuple[str, int, int, int]]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO run_plans (pipeline, run_id, request_key, mode, topic, partition,"
                " start_offset, end_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(pipeline, run_id, request_key, mode, *r) for r in ranges],
            )

    def record_gap(self, pipeline: str, topic: str, partition: int, start: int, end: int,
                   run_id: str | None) -> None:
        self.conn.execute(
            "INSERT INTO offset_gaps (pipeline, topic, partition, from_offset, to_offset, run_id)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (pipeline, topic, partition, start, end, run_id),
        )


# --------------------------------------------------------------------------- unit of work


class UnitOfWork:
    """One transaction; rolls back on exit unless :meth:`commit` ran.

    A lost reply to COMMIT raises :class:`CommitOutcomeUnknown`: the caller must re-read
    the stored offset to learn whether the chunk landed.
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.rows = RowsRepository(conn, pipeline)
        self.offsets = OffsetsRepository(conn)
        self.dead_letters = DeadLettersRepository(conn)
        self.runs = RunsRepository(conn)
        self._committed = False

    def __enter__(self) -> Self:
        self._committed = False
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._committed and not self.conn.closed:
            try:
                self.conn.rollback()
            except psycopg.Error:
                log.warning("rollback failed; the connection is gone, so is the transaction")

    def commit(self, *, partition: int = -1, start: int = -1, end: int = -1) -> None:
        try:
            self.conn.commit()
        except psycopg.OperationalError as exc:
            raise CommitOutcomeUnknown(self.pipeline.name, partition, start, end) from exc
        self._committed = True

    def rollback(self) -> None:
        self.conn.rollback()


__all__ = [
    "PROVENANCE_COLUMNS",
    "Database",
    "DeadLettersRepository",
    "OffsetsRepository",
    "RowsRepository",
    "RunRecord",
    "RunsRepository",
    "UnitOfWork",
    "UpsertResult",
    "lock_partition",
    "migrate",
    "translate_errors",
    "unlock_partition",
]
