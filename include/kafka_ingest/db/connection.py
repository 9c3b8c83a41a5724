"""Connections to the pipelines' database, and the one place psycopg's errors are mapped.

Every libpq setting a connection gives reaches psycopg (TLS included). Unless the DSN says
otherwise, connections use TCP keepalives and ``tcp_user_timeout``, so a half-open
connection (a server or network gone without a FIN) fails within about a minute instead
of hanging a task on a COPY or a COMMIT. A login Postgres refuses (password, certificate,
TLS required) is permanent; a server that does not answer is transient.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.db.session import SliceSession
from kafka_ingest.errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    IngestError,
    RejectedByDatabase,
    SchemaMissing,
    SettingsError,
)

log = logging.getLogger(__name__)

#: Every connection keyword libpq knows (sslmode, sslrootcert, sslcert, sslkey, options,
#: target_session_attrs, ...): each one a connection gives reaches psycopg.
LIBPQ_KEYWORDS = frozenset(opt.keyword.decode() for opt in psycopg.pq.Conninfo.get_defaults())

#: What libpq says when the server (or the TLS handshake) refuses a login: no retry helps.
_REFUSALS = (
    ("authentication", re.compile(r"authentication failed|role \S+ does not exist")),
    ("certificate", re.compile(r"certificate|SSL error", re.IGNORECASE)),
    ("TLS required", re.compile(r"no pg_hba\.conf entry|pg_hba\.conf rejects|SSL was "
                                r"required|does not support SSL")),
    ("unknown database", re.compile(r"database \S+ does not exist")),
)


def libpq_dsn(*, source: str, host: str | None, port: int | None, user: str | None,
              password: str | None, dbname: str | None,
              extra: Mapping[str, Any] | None = None) -> str:
    """A libpq connection string from a connection's fields and every libpq keyword in its
    extra (TLS settings included). No host or no database is a :class:`SettingsError`
    naming ``source``: nothing defaults to localhost or to a database of our choosing."""
    missing = [name for name, value in (("host", host), ("database (schema)", dbname))
               if not value]
    if missing:
        raise SettingsError(f"{source} has no {' and no '.join(missing)}; set it (nothing "
                            "is assumed)")
    extra = dict(extra or {})
    ignored = sorted(set(extra) - LIBPQ_KEYWORDS)
    if ignored:
        log.info("%s: extra keys %s are not libpq settings; not passed to psycopg", source,
                 ignored)
    params = {k: v for k, v in extra.items() if k in LIBPQ_KEYWORDS and v is not None}
    fields: dict[str, Any] = {"host": host, "port": port, "user": user, "password": password,
                              "dbname": dbname}
    return make_conninfo("", **{k: v for k, v in fields.items() if v is not None}, **params)


def _refused(exc: psycopg.OperationalError) -> DatabaseRefused | None:
    text = str(exc).strip()
    for kind, pattern in _REFUSALS:
        if pattern.search(text):
            return DatabaseRefused(kind, text.splitlines()[-1] if text else kind)
    return None


#: libpq settings used unless the DSN sets them: a half-open connection fails within about
#: a minute instead of hanging a task on a COPY or a COMMIT.
CONNECTION_DEFAULTS: dict[str, Any] = {
    "application_name": "kafka-ingest",
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}


class Database:
    """Opens psycopg 3 connections to the pipelines' database; errors become transient."""

    def __init__(self, dsn: str, *, connect_timeout: int = 10, lock_timeout_s: float = 30.0):
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self.lock_timeout_s = lock_timeout_s

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        # Defaults for what the DSN leaves unset; whatever the DSN says wins.
        given = conninfo_to_dict(self.dsn)
        defaults = {k: v for k, v in {**CONNECTION_DEFAULTS,
                                      "connect_timeout": self.connect_timeout}.items()
                    if k not in given}
        try:
            return psycopg.connect(self.dsn, autocommit=autocommit, **defaults)
        except psycopg.OperationalError as exc:
            raise (_refused(exc) or DatabaseUnavailable("connect", str(exc).strip())) from exc

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
