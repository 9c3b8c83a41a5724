"""The unit of work: one transaction on one connection, and the repositories on it."""

from __future__ import annotations

import logging
from typing import Any, Self

import psycopg

from kafka_ingest.config import Pipeline
from kafka_ingest.db.repositories import (
    DeadLettersRepository,
    GapsRepository,
    OffsetsRepository,
    PlansRepository,
    RunsRepository,
)
from kafka_ingest.db.upsert import NewKeys, RowsRepository
from kafka_ingest.errors import CommitOutcomeUnknown

log = logging.getLogger(__name__)


class UnitOfWork:
    """One transaction; rolls back on exit unless :meth:`commit` ran.

    Repositories hang off it (``uow.rows``, ``uow.offsets``, ``uow.dead_letters``,
    ``uow.runs``, ``uow.plans``, ``uow.gaps``), all on the one connection. A lost reply to
    COMMIT raises :class:`CommitOutcomeUnknown`: the caller must re-read the stored offset
    to learn whether the chunk landed.
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 lock_timeout_s: float = 30.0, new_keys: NewKeys | None = None) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.rows = RowsRepository(conn, pipeline, lock_timeout_s=lock_timeout_s,
                                   new_keys=new_keys)
        self.offsets = OffsetsRepository(conn)
        self.dead_letters = DeadLettersRepository(conn)
        self.runs = RunsRepository(conn)
        self.plans = PlansRepository(conn)
        self.gaps = GapsRepository(conn)
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
