"""The target table, written through a temporary staging table.

One chunk's rows are COPYed (binary) into a temporary staging table, in-chunk duplicates
are dropped, and ``INSERT ... SELECT ... ON CONFLICT`` moves them into the target table:
``DO NOTHING`` on ``event_id`` for append pipelines, ``DO UPDATE ... WHERE`` older for
``latest`` pipelines. The outcome is then checked against the table. A row Postgres
rejects is isolated by bisecting the chunk (in savepoints) and returned for the DLQ.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import psycopg
from psycopg import sql
from psycopg.copy import FileWriter

from kafka_ingest.config import Pipeline, UpsertMode
from kafka_ingest.errors import RejectedByDatabase
from kafka_ingest.records import PROVENANCE_COLUMNS, PROVENANCE_STAGED, Row

#: What a single row can make Postgres or the encoder refuse (a value out of the column's
#: range or encoding, a constraint): the chunk is bisected and the row dead-lettered.
#: (``struct.error``: an int past its column's width, in psycopg's pure-Python dumpers.)
ROW_REFUSALS: tuple[type[Exception], ...] = (psycopg.DataError, psycopg.IntegrityError,
                                             UnicodeEncodeError, OverflowError, struct.error)


@dataclass(frozen=True)
class UpsertResult:
    """What one chunk's upsert did. ``rejected`` rows go to the DLQ, with the reason."""

    inserted: int
    duplicates: int
    stale: int
    rejected: list[tuple[Row, RejectedByDatabase]]
    #: Staged rows the table does not hold (nor a newer version of) after the INSERT:
    #: must be 0. Checked against the table, independently of the counts above.
    missing: int = 0


def _copied_types(pipeline: Pipeline) -> list[str]:
    """The types of the staging columns a row fills, in row order: a column Postgres
    converts (``STAGED``) travels as its raw type."""
    staged = {**pipeline.model.STAGED, **PROVENANCE_STAGED}
    return [staged[name][0] if name in staged else t
            for name, t in (*pipeline.model.SINK_COLUMNS, *PROVENANCE_COLUMNS)]


class CopyEncoder:
    """Rows -> the binary ``COPY`` payload of a pipeline's staging table, without I/O.

    The slice engine encodes chunk k+1 in its reading thread while the writer thread runs
    chunk k's transaction, so the writer only sends bytes. The encoder adapts values with
    its connection's adapters (a cursor of its own, never executed) and makes its dumpers
    when created, before any transaction of the slice uses the connection.
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline) -> None:
        self.types = _copied_types(pipeline)
        self._cursor = conn.cursor()
        self._copy(io.BytesIO())  # the dumpers, made now

    def _copy(self, buffer: io.BytesIO) -> psycopg.Copy:
        copy = psycopg.Copy(self._cursor, binary=True, writer=FileWriter(buffer))
        copy.set_types(self.types)
        return copy

    def encode(self, rows: Sequence[Row]) -> bytes | None:
        """The rows' ``COPY`` payload; ``None`` when a row is refused (one of
        :data:`ROW_REFUSALS`): the writer then encodes the rows in its savepoints, where
        the refused row is isolated and dead-lettered like one Postgres refuses."""
        try:
            return self._encode(rows)
        except ROW_REFUSALS:
            return None

    def _encode(self, rows: Sequence[Row]) -> bytes:
        buffer = io.BytesIO()
        with self._copy(buffer) as copy:
            write = copy.write_row
            for row in rows:
                write(row)
        return buffer.getvalue()


class RowsRepository:
    """The pipeline's target table, written through a temporary staging table."""

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline) -> None:
        self.conn = conn
        self.pipeline = pipeline
        cols = (*pipeline.model.SINK_COLUMNS, *PROVENANCE_COLUMNS)
        #: The table's columns, and the staging table's definition of each: a column that
        #: Postgres converts (``STAGED``) is generated from a raw column the row fills.
        self.columns = [name for name, _ in cols]
        staged = {**pipeline.model.STAGED, **PROVENANCE_STAGED}
        self.copied = [f"raw_{name}" if name in staged else name for name, _ in cols]
        self.types = _copied_types(pipeline)
        self._event_id = itemgetter(self.columns.index("event_id"))
        self._stage_columns = [
            sql.SQL("{} {}").format(sql.Identifier(raw), sql.SQL(t)) if raw == name else
            sql.SQL("{raw} {t}, {name} {final} GENERATED ALWAYS AS ({expr}) STORED").format(
                raw=sql.Identifier(raw), t=sql.SQL(t), name=sql.Identifier(name),
                final=sql.SQL(final), expr=sql.SQL(staged[name][1]).format(sql.Identifier(raw)))
            for (name, final), raw, t in zip(cols, self.copied, self.types, strict=True)]
        self.table = sql.Identifier(pipeline.table)
        self.stage = sql.Identifier(f"stage_{pipeline.table}")
        self._stage_ready = False

    def upsert(self, rows: Sequence[Row], *, encoded: bytes | None = None) -> UpsertResult:
        """Upsert ``rows``; rows Postgres rejects are isolated by bisection, not fatal.

        ``encoded``: the rows already encoded by a :class:`CopyEncoder` (sent as they are;
        the bisection, if any, encodes its halves again)."""
        self._ensure_stage()
        return self._upsert_isolating(list(rows), encoded)

    def _upsert_isolating(self, rows: list[Row], encoded: bytes | None = None) -> UpsertResult:
        if not rows:
            return UpsertResult(0, 0, 0, [])
        try:
            with self.conn.transaction():  # a savepoint inside the chunk's transaction
                return self._upsert_once(rows, encoded)
        except ROW_REFUSALS as exc:
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
        self.conn.execute(
            sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                self.stage, sql.SQL(", ").join(self._stage_columns)
            )
        )
        self._stage_ready = True

    def _copy(self, rows: list[Row], encoded: bytes | None) -> None:
        # No JIT for this transaction's statements: compiling them (tens to hundreds of ms
        # once a chunk's estimated cost passes jit_above_cost) costs more than running
        # them. SET LOCAL: the server's setting is untouched outside the chunk.
        self.conn.execute(sql.SQL("SET LOCAL jit = off; TRUNCATE {}").format(self.stage))
        stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            self.stage, sql.SQL(", ").join(map(sql.Identifier, self.copied))
        )
        with self.conn.cursor().copy(stmt) as copy:
            self._send(copy, rows, encoded)

    def _send(self, copy: psycopg.Copy, rows: list[Row], encoded: bytes | None) -> None:
        """The COPY's data: the payload encoded ahead, or the rows encoded now."""
        if encoded is not None:
            copy.write(encoded)
            return
        copy.set_types(self.types)
        write = copy.write_row
        for row in rows:
            write(row)

    def _upsert_once(self, rows: list[Row], encoded: bytes | None = None) -> UpsertResult:
        self._copy(rows, encoded)
        if self.pipeline.upsert.mode is UpsertMode.LATEST:
            return self._upsert_latest(len(rows))
        return self._upsert_append(rows)

    def _upsert_append(self, rows: list[Row]) -> UpsertResult:
        n = len(rows)
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
        # staged event_id is in the table now. When the INSERT wrote one row per distinct
        # staged event_id, it wrote each of them: nothing to look up. Otherwise the ones it
        # skipped are looked up, one primary-key probe per staged row (a scalar subquery is
        # never turned into a join, so the cost stays per chunk whatever the table's size;
        # as an anti-join the planner, knowing nothing of the fresh staging rows, hashed a
        # scan of the whole table for every chunk).
        if inserted == len(set(map(self._event_id, rows))):
            return UpsertResult(inserted, n - inserted, 0, [])
        return UpsertResult(inserted, n - inserted, 0, [], self._missing(
            "SELECT count(DISTINCT s.event_id) FROM {s} s"
            " WHERE (SELECT true FROM {t} x WHERE x.event_id = s.event_id LIMIT 1) IS NULL",
            {}))

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
