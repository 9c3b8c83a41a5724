"""Postgres: connections, locks, migrations, the unit of work, repositories, the writers,
and the queries of the looks (:mod:`kafka_ingest.db.observations`): all the SQL.

One chunk is one transaction on one psycopg 3 connection (:class:`UnitOfWork`): rows,
dead letters, the stored offset moved by compare-and-set, the audit row, then COMMIT.
"""

from kafka_ingest.db.connection import (
    Database,
    libpq_dsn,
    map_psycopg_error,
    translate_errors,
)
from kafka_ingest.db.copy import CopyEncoder
from kafka_ingest.db.locks import lock_partition, unlock_partition
from kafka_ingest.db.observations import (
    LedgerLooks,
    LetterLooks,
    MonitorChecksRepository,
    RecordedCheck,
)
from kafka_ingest.db.repositories import (
    DeadLettersRepository,
    GapsRepository,
    IncarnationsRepository,
    OffsetsRepository,
    PinnedRange,
    PlansRepository,
    RetentionRepository,
    RunRecord,
    RunsRepository,
)
from kafka_ingest.db.schema import grant_runtime, migrate
from kafka_ingest.db.session import SliceSession
from kafka_ingest.db.uow import UnitOfWork
from kafka_ingest.db.writers import DeleteResult, TableWriter, UpsertResult, writer_for

__all__ = [
    "CopyEncoder",
    "Database",
    "DeadLettersRepository",
    "DeleteResult",
    "GapsRepository",
    "IncarnationsRepository",
    "LedgerLooks",
    "LetterLooks",
    "MonitorChecksRepository",
    "OffsetsRepository",
    "PinnedRange",
    "PlansRepository",
    "RecordedCheck",
    "RetentionRepository",
    "RunRecord",
    "RunsRepository",
    "SliceSession",
    "TableWriter",
    "UnitOfWork",
    "UpsertResult",
    "grant_runtime",
    "libpq_dsn",
    "lock_partition",
    "map_psycopg_error",
    "migrate",
    "translate_errors",
    "unlock_partition",
    "writer_for",
]
