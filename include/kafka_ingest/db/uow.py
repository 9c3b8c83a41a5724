"""The unit of work: one transaction on one connection, and the repositories on it."""

from __future__ import annotations

import logging
from typing import Any, Self

import psycopg
from psycopg.pq import TransactionStatus

from kafka_ingest.config import Pipeline
from kafka_ingest.db.repositories import (
    DeadLettersRepository,
    IncarnationsRepository,
    OffsetsRepository,
    RunsRepository,
)
from kafka_ingest.db.tables import TargetShape
from kafka_ingest.db.writers import NewKeys, TableWriter, writer_for
from kafka_ingest.errors import CommitOutcomeUnknown

log = logging.getLogger(__name__)


class UnitOfWork:
    """One transaction, opened on entry; rolls back on exit unless :meth:`commit` ran.

    The target table's writer (``uow.rows``: the slice's, or one made for this unit of
    work) and the repositories hang off it (``uow.offsets``, ``uow.dead_letters``,
    ``uow.runs``, ``uow.incarnations``), all on the one connection. A lost reply to COMMIT
    raises :class:`CommitOutcomeUnknown`: the caller must re-read the stored offset to
    learn whether the chunk landed.
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 writer: TableWriter | None = None, shape: TargetShape | None = None,
                 lock_timeout_s: float = 30.0, new_keys: NewKeys | None = None) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.rows = writer or writer_for(conn, pipeline, shape=shape,
                                         lock_timeout_s=lock_timeout_s, new_keys=new_keys)
        self.offsets = OffsetsRepository(conn)
        self.dead_letters = DeadLettersRepository(conn)
        self.runs = RunsRepository(conn)
        self.incarnations = IncarnationsRepository(conn)
        self._committed = False

    def __enter__(self) -> Self:
        """BEGIN. psycopg opens a transaction before the first statement of an idle
        connection, so the statement here opens the chunk's: every statement after it,
        savepoints included, belongs to it (a ``conn.transaction()`` block on an idle
        connection would be a transaction of its own that COMMITs). JIT is off for its
        statements: compiling them (tens to hundreds of ms once a chunk's estimated cost
        passes ``jit_above_cost``) costs more than running them; the server's setting is
        untouched outside the transaction."""
        status = self.conn.info.transaction_status
        if status != TransactionStatus.IDLE:
            # a savepoint of a transaction left open would commit nothing
            raise RuntimeError("a unit of work opens its own transaction; the connection "
                               f"is not idle ({status.name})")
        self._committed = False
        self.conn.execute("SET LOCAL jit = off")
        self.rows.begin()
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
