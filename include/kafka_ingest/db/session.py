"""One slice's database session: its connection, its locks, its cursor, its transactions.

The slice engine talks to Postgres only through this port, so its ordering (write, then
COMMIT, then the Kafka commit; resume after a failure) is unit-tested with a fake session
and the real one is tested against the real database.
"""

from __future__ import annotations

from typing import Any

import psycopg

from kafka_ingest.config import Pipeline
from kafka_ingest.db.locks import lock_partition, unlock_partition
from kafka_ingest.db.repositories import OffsetsRepository
from kafka_ingest.db.uow import UnitOfWork
from kafka_ingest.db.upsert import CopyEncoder, NewKeys


class SliceSession:
    """A connection held for one slice (session-level locks live as long as it does)."""

    def __init__(self, conn: psycopg.Connection[Any], *, lock_timeout_s: float) -> None:
        self.conn = conn
        self.lock_timeout_s = lock_timeout_s
        #: Whether the slice's chunks met stored keys (see :class:`NewKeys`).
        self.new_keys = NewKeys()

    def lock(self, name: str, partition: int) -> None:
        """The (name, partition) advisory lock of the session, held until :meth:`unlock`
        (see :func:`~kafka_ingest.db.locks.lock_partition`)."""
        lock_partition(self.conn, name, partition, timeout_s=self.lock_timeout_s)

    def unlock(self, name: str, partition: int) -> None:
        unlock_partition(self.conn, name, partition)

    def cursor(self, pipeline: str, topic: str, partition: int) -> int | None:
        """The stored next offset, read in a transaction of its own (so it is current)."""
        stored = OffsetsRepository(self.conn).get(pipeline, topic, partition)
        self.conn.commit()
        return stored

    def copy_encoder(self, pipeline: Pipeline) -> CopyEncoder:
        """What encodes a chunk's rows for ``COPY`` outside its transaction (made before
        the slice's first transaction; see :class:`~kafka_ingest.db.upsert.CopyEncoder`)."""
        return CopyEncoder(self.conn, pipeline)

    def unit_of_work(self, pipeline: Pipeline) -> UnitOfWork:
        return UnitOfWork(self.conn, pipeline, lock_timeout_s=self.lock_timeout_s,
                          new_keys=self.new_keys)

    def close(self) -> None:
        self.conn.close()
