"""Connections to the pipelines' database, and the one place psycopg's errors are mapped.

Every libpq setting a connection gives reaches psycopg (TLS included). Unless the DSN says
otherwise, connections use TCP keepalives and ``tcp_user_timeout``, so a half-open
connection (a server or network gone without a FIN) fails within about a minute instead
of hanging a task on a COPY or a COMMIT. Those cannot see a peer that is there and
silent: a server that hangs, or a proxy, load balancer or NAT that keeps the connection
and drops its data (its kernel acknowledges every byte, so TCP never gives up). For that,
every request (a statement, a block of COPY, COMMIT, ROLLBACK) waits at most the *reply
time-out* (:data:`DEFAULT_REPLY_TIMEOUT_S`, ``KAFKA_INGEST_PG_REPLY_TIMEOUT_S``) for the
server's answer; then the connection is closed and the request fails as
:class:`NoReply` (transient; a COMMIT's outcome is then unknown, see
:class:`~kafka_ingest.errors.CommitOutcomeUnknown`). A login Postgres refuses (password,
certificate, TLS required) is permanent; a server that does not answer is transient.

A privilege the role lacks (a table, a sequence, the schema, TEMPORARY on the database) is
permanent too, and names the object, the role and the fix: each connection notes on a
failed request's error the role it ran as (libpq's user, no round trip), so the one
mapping (:func:`map_psycopg_error`) can say it whichever code path raised it.

Several servers in one DSN (libpq's multi-host form, a primary and its standbys) connect
with ``target_session_attrs=read-write`` unless the DSN or PGTARGETSESSIONATTRS says
otherwise, so a connection lands on the one that takes writes; a session that still
cannot write (a standby, ``default_transaction_read_only``) fails as
:class:`DatabaseUnavailable` saying how to point the DSN at the primary. Ports libpq cannot
use (not a number, more than one but not one per host) are a :class:`SettingsError` when
the DSN is read, not a server retried as if it were down.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.string import BytesBinaryDumper

from kafka_ingest.db.session import SliceSession
from kafka_ingest.errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    IngestError,
    PrivilegeMissing,
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
    naming ``source``: nothing defaults to localhost or to a database of our choosing.

    Several servers (a primary and its standbys) are libpq's multi-host form: ``host``
    ``a,b`` with one port for all, or the ports in the extra (``"port": "5432,5433"``, a
    list no integer port field can hold) and ``target_session_attrs`` there too, so every
    connect reaches whichever server takes writes now. A field and an extra key naming
    the same setting differently is a :class:`SettingsError`."""
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
    for key, value in fields.items():
        if value is None:
            continue
        if key in params and str(params[key]) != str(value):
            shown = "(hidden)" if key == "password" else f"{value!r} and {params[key]!r}"
            raise SettingsError(f"{source} sets {key} twice, as a field and in its extra: "
                                f"{shown}; keep one")
        params[key] = value
    return make_conninfo("", **params)


def _one_line(text: str) -> str:
    """libpq's multi-line messages ("...failed: Connection refused\n\tIs the server
    running...?") as one line, for a one-line error."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _refused(exc: psycopg.OperationalError) -> DatabaseRefused | None:
    text = str(exc).strip()
    for kind, pattern in _REFUSALS:
        if pattern.search(text):
            return DatabaseRefused(kind, text.splitlines()[-1] if text else kind)
    return None


def _parsed(dsn: str) -> dict[str, Any]:
    """The DSN's settings; a string libpq cannot parse, or ports it cannot use
    (:func:`_check_ports`), is a :class:`SettingsError`.

    libpq's own message quotes the text around the mistake, which may be part of a
    password: only an unknown keyword (the usual typo) is repeated.
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        keyword = re.search(r'invalid connection option "[^"]*"', str(exc))
        raise SettingsError(
            "the Postgres DSN is not a connection string libpq can parse"
            f"{f' ({keyword.group(0)})' if keyword else ''}: give key=value pairs or a "
            "postgresql:// URI") from None
    _check_ports(params)
    return params


def _setting(params: Mapping[str, Any], keyword: str, variable: str) -> tuple[str, str]:
    """(value, where it comes from) of a libpq setting: the DSN's, else the environment
    variable libpq falls back to (``""`` when neither gives one)."""
    given = params.get(keyword)
    if given not in (None, ""):
        return str(given), "the Postgres DSN"
    return os.environ.get(variable, ""), variable


def host_count(params: Mapping[str, Any]) -> int:
    """How many servers libpq tries: the elements of ``hostaddr``, else of ``host`` (the
    DSN's, else PGHOSTADDR/PGHOST), else one (the default socket)."""
    for keyword, variable in (("hostaddr", "PGHOSTADDR"), ("host", "PGHOST")):
        value, _ = _setting(params, keyword, variable)
        if value:
            return value.count(",") + 1
    return 1


_PORT = re.compile(r"\s*[0-9]+\s*")


def _check_ports(params: Mapping[str, Any]) -> None:
    """The ports libpq would use, checked as it checks them at connect time: each a number
    from 1 to 65535 (or empty: the default), one for every host or one for all. Either
    mistake never heals, so it is a :class:`SettingsError` now rather than a connection
    failure retried as if Postgres were down. The value is not repeated: a URI with an
    unescaped ``/`` in its password puts part of the password where the port goes."""
    ports, source = _setting(params, "port", "PGPORT")
    if not ports:
        return
    elements = ports.split(",")
    if not all(not p.strip() or (_PORT.fullmatch(p) and 1 <= int(p) <= 65535)
               for p in elements):
        raise SettingsError(
            f"the port in {source} is not a number from 1 to 65535 (several servers: one "
            "per host, comma-separated, e.g. port=5432,5433): fix the port")
    hosts = host_count(params)
    if len(elements) > 1 and len(elements) != hosts:
        raise SettingsError(
            f"{source} names {len(elements)} ports for {hosts} host(s): libpq needs one port "
            "for every host, or a single port for all of them")


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


#: Seconds a connection waits for the server's reply to one request before it closes the
#: connection and fails the request (:class:`NoReply`); ``KAFKA_INGEST_PG_REPLY_TIMEOUT_S``
#: overrides it (0: wait forever). Longer than a lock wait (``lock_timeout_s``, 30 s).
DEFAULT_REPLY_TIMEOUT_S = 60.0
REPLY_TIMEOUT_ENV = "KAFKA_INGEST_PG_REPLY_TIMEOUT_S"

RV = TypeVar("RV")

#: The attribute a connection sets on the psycopg error of a failed request: the role the
#: request ran as (see :func:`map_psycopg_error`).
_ROLE_ATTR = "kafka_ingest_role"


class NoReply(psycopg.OperationalError):
    """The server did not answer a request within the reply time-out; the connection was
    closed (its protocol state is unknown), so it is never used again."""


class _Connection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server is bounded.

    psycopg runs each request (execute, COPY, COMMIT, ROLLBACK) through :meth:`wait`; a
    wait longer than ``reply_timeout_s`` closes the connection and raises
    :class:`NoReply`. Connecting is bounded by libpq's ``connect_timeout`` instead.
    """

    reply_timeout_s: float | None = None

    def wait(self, gen: PQGen[RV], interval: float = 0.1,
             timeout: float | None = None) -> RV:
        try:
            return self._wait(gen, interval, timeout)
        except psycopg.DatabaseError as exc:
            # The server's errors surface here (psycopg checks a request's results inside
            # the generator this drives): note the role while the connection is at hand.
            # libpq's user is the session's role, known without asking the server.
            setattr(exc, _ROLE_ATTR, self.info.user)
            raise

    def _wait(self, gen: PQGen[RV], interval: float, timeout: float | None) -> RV:
        if timeout is not None or not self.reply_timeout_s:  # psycopg's own bounded waits
            return super().wait(gen, interval, timeout)
        try:
            return super().wait(gen, interval, self.reply_timeout_s)
        except psycopg.errors._WaitTimeout as exc:
            self.close()
            raise NoReply(f"no reply from the server within {self.reply_timeout_s:g} s "
                          f"({REPLY_TIMEOUT_ENV}); the connection was closed") from exc


def reply_timeout_from_env() -> float | None:
    """``KAFKA_INGEST_PG_REPLY_TIMEOUT_S`` (seconds; 0: none), else the default."""
    raw = (os.environ.get(REPLY_TIMEOUT_ENV) or "").strip()
    if not raw:
        return DEFAULT_REPLY_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{REPLY_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value < 0:
        raise SettingsError(f"{REPLY_TIMEOUT_ENV}={raw!r} is negative (0 turns it off)")
    return value or None


def connection_defaults(given: Mapping[str, Any], *, connect_timeout: int) -> dict[str, Any]:
    """What a connection adds to the DSN's settings ``given``, only where it leaves them
    unset (whatever it says wins): :data:`CONNECTION_DEFAULTS`, the connect time-out, and,
    for several servers (a primary and its standbys) without ``target_session_attrs`` in
    the DSN or PGTARGETSESSIONATTRS, ``read-write``: the server that takes writes, not the
    first that answers, which may be a standby. One server keeps libpq's ``any``."""
    defaults: dict[str, Any] = {**CONNECTION_DEFAULTS, "connect_timeout": connect_timeout}
    if host_count(given) > 1 and not os.environ.get("PGTARGETSESSIONATTRS"):
        defaults["target_session_attrs"] = "read-write"
    return {k: v for k, v in defaults.items() if k not in given}


class Database:
    """Opens psycopg 3 connections to the pipelines' database; errors become transient.

    ``reply_timeout_s``: how long each request waits for the server's reply (None: from
    ``KAFKA_INGEST_PG_REPLY_TIMEOUT_S``, else :data:`DEFAULT_REPLY_TIMEOUT_S`; 0: no
    limit). Keep it above ``lock_timeout_s`` and above the longest statement a chunk runs:
    a lock wait or a statement it cuts short fails as :class:`NoReply` (transient, like
    the lock time-out) instead of being answered.
    """

    def __init__(self, dsn: str, *, connect_timeout: int = 10, lock_timeout_s: float = 30.0,
                 reply_timeout_s: float | None = None):
        _parsed(dsn)  # a DSN libpq cannot parse is refused now, not at the first connect
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self.lock_timeout_s = lock_timeout_s
        self.reply_timeout_s = (reply_timeout_from_env() if reply_timeout_s is None
                                else reply_timeout_s or None)

    def bounded(self, timeout_s: float) -> Database:
        """The same database with connecting and every request bounded by ``timeout_s``
        (the metrics' looks and the lag trigger's reads: a slow server fails them fast)."""
        return Database(self.dsn, connect_timeout=max(1, math.ceil(timeout_s)),
                        lock_timeout_s=self.lock_timeout_s, reply_timeout_s=timeout_s)

    def connect(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        # Defaults for what the DSN leaves unset; whatever the DSN says wins.
        defaults = connection_defaults(_parsed(self.dsn), connect_timeout=self.connect_timeout)
        try:
            conn = _Connection.connect(self.dsn, autocommit=autocommit, **defaults)
        except psycopg.OperationalError as exc:
            raise (_refused(exc) or DatabaseUnavailable("connect", _one_line(str(exc)))) from exc
        conn.reply_timeout_s = self.reply_timeout_s
        # A binary COPY picks each column's dumper by its type, and psycopg.dbapi20 makes
        # bytea's a pure-Python one (for its Binary wrapper): bytes go through the C
        # dumper instead (the same bytes on the wire; 0.26 µs a row less for kafka_key).
        conn.adapters.register_dumper(bytes, BytesBinaryDumper)
        return conn

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


#: How Postgres names the object of a privilege it denies: "permission denied for table
#: run_plans" (also schema, sequence, database, function, ...), and the one that reads
#: differently, TEMPORARY: "permission denied to create temporary tables in database x".
_DENIED = (
    re.compile(r"permission denied for (?P<kind>[a-z ]+?) (?P<name>\S+)$"),
    re.compile(r"permission denied to create temporary tables in (?P<kind>database) "
               r"\"?(?P<name>[^\"]+)\"?$"),
)


def _privilege_missing(exc: psycopg.Error, role: str | None) -> PrivilegeMissing:
    detail = exc.diag.message_primary or str(exc).strip().splitlines()[0]
    for pattern in _DENIED:
        found = pattern.search(detail)
        if found:
            return PrivilegeMissing(role, detail, on=f"{found['kind']} {found['name']}")
    return PrivilegeMissing(role, detail)


def _read_only(exc: psycopg.Error) -> str:
    """SQLSTATE 25006: the server takes no writes in this session. Transient: a standby
    being promoted takes them moments later, so the retry (bounded by Airflow's retries)
    finds it writable; a standby that stays one, or a session made read-only on purpose,
    fails every retry with this advice."""
    detail = exc.diag.message_primary or str(exc).strip().splitlines()[0]
    return (f"ReadOnlySqlTransaction: {detail}; the server is a standby, or the session is "
            "read-only (default_transaction_read_only set for the role, the database or "
            "the DSN's options): point the DSN at the primary, e.g. every server in host "
            "(host=a,b port=5432,5433) with target_session_attrs=read-write, the default "
            "for several hosts")


def map_psycopg_error(operation: str, exc: BaseException, *,
                      role: str | None = None) -> IngestError | None:
    """Map a psycopg error onto the tree; ``None`` means "not ours, let it propagate".

    A value Postgres refuses (``psycopg.DataError``, integrity errors) is a data error (the
    sink isolates the row by bisection); connection and server-state errors are transient;
    a missing table means the migrations never ran (or the role may not use the schema,
    which Postgres words the same way); a privilege the role lacks is permanent and names
    the object, the role and the fix. ``role``: the role the failed request ran as; by
    default the one its connection noted on the error (every connection
    :class:`Database` opens does).
    """
    role = role or getattr(exc, _ROLE_ATTR, None)
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return DatabaseUnavailable(operation, _read_only(exc))
    if isinstance(exc, psycopg.errors.UndefinedTable):  # or a schema the role may not use
        return SchemaMissing(str(exc).strip().splitlines()[0], role=role)
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return _privilege_missing(exc, role)
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
