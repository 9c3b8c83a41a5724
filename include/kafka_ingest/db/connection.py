"""Connections to the pipelines' database, and the one place psycopg's errors are mapped.

Every connection uses TCP keepalives and ``tcp_user_timeout``, so a half-open connection
(a server or network gone without a FIN) fails within about a minute instead of hanging a
task on a COPY or a COMMIT.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from kafka_ingest.db.session import SliceSession
from kafka_ingest.errors import (
    DatabaseUnavailable,
    IngestError,
    RejectedByDatabase,
    SchemaMissing,
)


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
                keepalives=1,
                keepalives_idle=30,
                keepalives_interval=10,
                keepalives_count=3,
                tcp_user_timeout=60_000,
            )
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable("connect", str(exc).strip()) from exc

    def open_slice(self) -> SliceSession:
        """A connection for one slice, closed by the caller (:meth:`SliceSession.close`)."""
        return SliceSession(self.connect(), lock_timeout_s=self.lock_timeout_s)

    @contextmanager
    def session(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection closed on exit; psycopg errors mapped onto the error tree."""
        conn = self.connect(autocommit=autocommit)
        try:
            with translate_errors("session"):
                yield conn
        finally:
            conn.close()


def map_psycopg_error(operation: str, exc: BaseException) -> IngestError | None:
    """Map a psycopg error onto the tree; ``None`` means "not ours, let it propagate".

    A value Postgres refuses (``psycopg.DataError``, integrity errors) is a data error (the
    sink isolates the row by bisection); connection and server-state errors are transient;
    a missing table means the migrations never ran.
    """
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return SchemaMissing(str(exc).strip().splitlines()[0])
    # Lock and statement timeouts, and the server ending an idle or too long transaction's
    # session (SQLSTATE 25P03, 25P04: psycopg files those under InternalError).
    server_gave_up = (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled,
                      psycopg.errors.IdleInTransactionSessionTimeout,
                      psycopg.errors.TransactionTimeout)
    if isinstance(exc, server_gave_up):
        return DatabaseUnavailable(operation, f"{type(exc).__name__}: {str(exc).strip()}")
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(operation, f"{type(exc).__name__}: {str(exc).strip()}")
    return None


@contextmanager
def translate_errors(operation: str) -> Iterator[None]:
    """Map psycopg's errors onto :mod:`kafka_ingest.errors` (see :func:`map_psycopg_error`)."""
    try:
        yield
    except psycopg.Error as exc:
        mapped = map_psycopg_error(operation, exc)
        if mapped is None:
            raise
        raise mapped from exc
