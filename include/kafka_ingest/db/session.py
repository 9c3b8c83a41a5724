"""One slice's database session: its connection, its locks, its cursor, its transactions.

The slice engine talks to Postgres only through this port, so its ordering (write, then
COMMIT, then the Kafka commit; resume after a failure) is unit-tested with a fake session
and the real one is tested against the real database.
"""

from __future__ import annotations

from typing import Any

import psycopg

from kafka_ingest.config import Pipeline
from kafka_ingest.db.copy import CopyEncoder
from kafka_ingest.db.locks import lock_partition, unlock_partition
from kafka_ingest.db.repositories import IncarnationsRepository, OffsetsRepository
from kafka_ingest.db.tables import TargetShape, target_shape
from kafka_ingest.db.uow import UnitOfWork
from kafka_ingest.db.writers import TableWriter, writer_for


class SliceSession:
    """A connection held for one slice (session-level locks live as long as it does)."""

    def __init__(self, conn: psycopg.Connection[Any], *, lock_timeout_s: float) -> None:
        self.conn = conn
        self.lock_timeout_s = lock_timeout_s
        #: The target table as the slice found it (:meth:`target`).
        self.shape: TargetShape | None = None
        #: The slice's writer of the target table (:meth:`unit_of_work`), with its state.
        self.writer: TableWriter | None = None

    def lock(self, name: str, partition: int) -> None:
        """The (name, partition) advisory lock of the session, held until :meth:`unlock`
        (see :func:`~kafka_ingest.db.locks.lock_partition`)."""
        lock_partition(self.conn, name, partition, timeout_s=self.lock_timeout_s)

    def unlock(self, name: str, partition: int) -> None:
        unlock_partition(self.conn, name, partition)

    def cursor(self, pipeline: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        """The stored next offset and the topic id it belongs to, read in a transaction of
        its own (so it is current)."""
        stored = OffsetsRepository(self.conn).cursor(pipeline, topic, partition)
        self.conn.commit()
        return stored

    def adopt(self, pipeline: str, topic: str, topic_id: str) -> None:
        """Offsets stored before topic ids were kept belong to the topic read now."""
        OffsetsRepository(self.conn).adopt(pipeline, topic, topic_id)
        self.conn.commit()

    def incarnation(self, topic: str, topic_id: str) -> int:
        """The incarnation number of ``topic_id`` (numbered now if first seen)."""
        number = IncarnationsRepository(self.conn).of(topic, topic_id)
        self.conn.commit()
        return number

    def target(self, pipeline: Pipeline) -> TargetShape:
        """The target table as it is now (read once, when the slice starts): what its rows
        travel as (see :class:`~kafka_ingest.db.tables.TargetShape`)."""
        if self.shape is None:
            try:
                self.shape = target_shape(self.conn, pipeline)
            finally:
                self.conn.rollback()  # a catalog read: end its transaction
        return self.shape

    def copy_encoder(self, pipeline: Pipeline) -> CopyEncoder:
        """What encodes a chunk's rows for ``COPY`` outside its transaction (made before
        the slice's first transaction; see :class:`~kafka_ingest.db.copy.CopyEncoder`)."""
        return CopyEncoder(self.conn, pipeline, self.target(pipeline))

    def unit_of_work(self, pipeline: Pipeline) -> UnitOfWork:
        """A chunk's transaction, writing through the slice's writer (made once, for the
        pipeline's upsert mode: :func:`~kafka_ingest.db.writers.writer_for`)."""
        if self.writer is None:
            self.writer = writer_for(self.conn, pipeline, shape=self.target(pipeline),
                                     lock_timeout_s=self.lock_timeout_s)
        return UnitOfWork(self.conn, pipeline, writer=self.writer)

    def close(self) -> None:
        self.conn.close()
