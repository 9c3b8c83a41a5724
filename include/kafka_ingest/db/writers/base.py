"""What every table writer shares: the results, the staging table, the ``COPY``, and the
isolation of a row Postgres refuses (bisection in savepoints)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from kafka_ingest.config import Pipeline
from kafka_ingest.db.copy import ROW_REFUSALS, copy_statement, write_order
from kafka_ingest.db.tables import TargetShape, contract_shape, row_columns, stage_table
from kafka_ingest.errors import DataError, RejectedByDatabase
from kafka_ingest.records import CopyPayload, Row, Source, Tombstone


@dataclass(frozen=True)
class UpsertResult:
    """What one chunk's upsert did. ``rejected`` rows go to the DLQ, with the reason (a
    value Postgres refused, or a version log order cannot place)."""

    inserted: int
    duplicates: int
    stale: int
    rejected: list[tuple[Row, DataError]]
    #: Staged rows the table does not hold (nor a newer version of) after the INSERT:
    #: must be 0. Checked against the table, independently of the counts above.
    missing: int = 0

    def __add__(self, other: UpsertResult) -> UpsertResult:
        return UpsertResult(self.inserted + other.inserted,
                            self.duplicates + other.duplicates, self.stale + other.stale,
                            self.rejected + other.rejected, self.missing + other.missing)


@dataclass(frozen=True)
class DeleteResult:
    """What one chunk's tombstones did: rows deleted, tombstones log order cannot place
    (for the DLQ), and tombstones whose key the table holds neither a marker for (at least
    as new) nor a newer row after them: must be 0."""

    deleted: int
    missing: int = 0
    rejected: list[tuple[Tombstone, DataError]] = field(default_factory=list)


#: The staging table: temporary, emptied at each COMMIT.
_CREATE_STAGE = "CREATE TEMP TABLE IF NOT EXISTS {s} ({columns}) ON COMMIT DELETE ROWS"
_EMPTY_STAGE = "TRUNCATE {s}"


class TableWriter:
    """The pipeline's target table as one slice writes it, chunk by chunk, each inside its
    transaction (a :class:`~kafka_ingest.db.uow.UnitOfWork`). Made once per slice (its
    per-slice state lives here); :meth:`begin` starts each chunk's transaction. Subclasses
    write one upsert mode: :meth:`_upsert_once` on the chunk's rows (or one half of them,
    when a row is refused)."""

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 shape: TargetShape | None = None, lock_timeout_s: float = 30.0) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.lock_timeout_s = lock_timeout_s
        shape = shape or contract_shape(pipeline)
        #: The columns a row fills, in row order: the target table's and the staging
        #: table's alike.
        self.columns = [c.name for c in row_columns(pipeline)]
        self.types = list(shape.copy_types)
        self._order = write_order(pipeline)
        self.table = sql.Identifier(pipeline.table)
        self.stage = sql.Identifier(stage_table(pipeline))
        self._column_list = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        self._copy_into_table = copy_statement(self.table, self.columns)
        self._copy_into_stage = copy_statement(self.stage, self.columns)
        self._create_stage = sql.SQL(_CREATE_STAGE).format(
            s=self.stage, columns=sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(ddl))
                for name, ddl in zip(self.columns, shape.stage_types, strict=True)))
        self._empty_stage = sql.SQL(_EMPTY_STAGE).format(s=self.stage)
        #: Whether this transaction made (or found) the staging table.
        self._stage_ready = False

    def begin(self) -> None:
        """A chunk's transaction begins (a staging table made in the previous one, if it
        rolled back, is gone)."""
        self._stage_ready = False

    def serialize(self, partitions: Iterable[int], *, every: bool = False) -> None:
        """Take what the chunk's transaction holds until it ends, before any write
        (nothing, but for deleting tables): the keys of ``partitions``, or of every
        partition (a replay, whose letters' keys the chunks beside it may write from other
        partitions, see :func:`~kafka_ingest.db.locks.hold_keys`)."""

    def upsert(self, rows: Sequence[Row], *, source: Source | None = None,
               encoded: CopyPayload | None = None) -> UpsertResult:
        """Upsert ``rows``, all read from ``source`` (one incarnation of one topic; needed
        by tables that order versions by it); rows Postgres rejects are isolated by
        bisection, not fatal.

        ``encoded``: the rows already encoded by a :class:`~kafka_ingest.db.copy.CopyEncoder`
        (sent as they are; the bisection, if any, encodes its halves again). Runs inside
        the chunk's transaction: its savepoints would otherwise be transactions of their
        own."""
        if self.conn.info.transaction_status == TransactionStatus.IDLE:
            raise RuntimeError("the upsert runs inside a transaction (a unit of work)")
        return self._isolating(list(rows), source, encoded)

    def delete(self, tombstones: Sequence[Tombstone], *,
               source: Source | None = None) -> DeleteResult:
        """Apply a chunk's tombstones (only deleting tables have any to apply)."""
        return DeleteResult(0)

    def _isolating(self, rows: list[Row], source: Source | None,
                   encoded: CopyPayload | None = None) -> UpsertResult:
        if not rows:
            return UpsertResult(0, 0, 0, [])
        stage_ready = self._stage_ready
        try:
            with self.conn.transaction():  # a savepoint inside the chunk's transaction
                return self._upsert_once(rows, source, encoded)
        except ROW_REFUSALS as exc:
            # A staging table this savepoint made is gone with it: the halves make it again.
            self._stage_ready = stage_ready
            if len(rows) == 1:
                reason = RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
                return UpsertResult(0, 0, 0, [(rows[0], reason)])
        mid = len(rows) // 2
        return self._isolating(rows[:mid], source) + self._isolating(rows[mid:], source)

    def _upsert_once(self, rows: list[Row], source: Source | None,
                     encoded: CopyPayload | None) -> UpsertResult:
        raise NotImplementedError

    def _stage(self, rows: list[Row], encoded: CopyPayload | None) -> None:
        """The chunk's payload in the staging table (made when this transaction first
        needs it), and nothing else there."""
        if not self._stage_ready:
            self.conn.execute(self._create_stage)
            self._stage_ready = True
        self.conn.execute(self._empty_stage)
        self._copy(self._copy_into_stage, rows, encoded)

    def _copy(self, statement: sql.Composed, rows: list[Row], encoded: CopyPayload | None) -> int:
        """``COPY`` the chunk's payload: the rows it copied."""
        with self.conn.cursor() as cur:
            with cur.copy(statement) as copy:
                self._send(copy, rows, encoded)
            return cur.rowcount

    def _send(self, copy: psycopg.Copy, rows: list[Row], encoded: CopyPayload | None) -> None:
        """The COPY's data: the payload encoded ahead, or the rows encoded now (in the
        same order, :func:`~kafka_ingest.db.copy.write_order`)."""
        if encoded is not None:
            copy.write(encoded.data)
            return
        copy.set_types(self.types)
        write = copy.write_row
        for row in self._order(rows):
            write(row)

    def _scalar(self, statement: sql.Composed, params: Any = None) -> int:
        row = self.conn.execute(statement, params).fetchone()
        return int(row[0]) if row else 0


__all__ = ["DeleteResult", "TableWriter", "UpsertResult"]
