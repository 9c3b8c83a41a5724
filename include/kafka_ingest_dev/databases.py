"""Throwaway databases for tests and benchmarks, and the Airflow connection of a DSN.

One home for what the test fixtures, the fault tests and the benchmarks all do: create a
database on a server the caller administers (migrated, unless asked otherwise), hand out
its DSN, drop it afterwards, and point an Airflow ``postgres`` connection at it.

``cloned=True`` (the tests' databases) copies a migrated template instead of migrating
each new database: the template is made once per process, server and schema (the
migrations and the pipelines' tables) with ``migrate`` and ``apply_pipelines`` as any
database is, closed to connections, and dropped when the process ends; each database is
then a ``CREATE DATABASE ... TEMPLATE`` of it (a fraction of a migration's time). The
benchmarks keep migrating: their Postgres figures count the making of each database.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: libpq keywords an Airflow ``postgres`` connection holds in its own fields; every other
#: one (sslmode, sslrootcert, connect_timeout, ...) goes into its extra.
_CONN_FIELDS = {"host": "host", "port": "port", "user": "login", "password": "password",
                "dbname": "schema"}


def create_database(admin_dsn: str, *, prefix: str = "t", migrated: bool = True,
                    cloned: bool = False) -> str:
    """A new database named ``<prefix>_<random>`` on ``admin_dsn``'s server, migrated to
    the pipelines' schema (and the pipelines' tables made) unless ``migrated`` is false;
    returns its DSN. ``cloned``: a copy of this process's migrated template for the
    server and schema (made on first use) instead of a migration of its own."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    template = _template(admin_dsn) if migrated and cloned else None
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        create = sql.SQL("{} TEMPLATE {}").format(create, sql.Identifier(template))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(create)
    dsn = make_conninfo(admin_dsn, dbname=name)
    if migrated and template is None:
        try:
            _migrate(dsn)
        except BaseException:
            drop_database(admin_dsn, dsn)
            raise
    return dsn


def _migrate(dsn: str) -> None:
    """The pipelines' schema and tables, as ``kafka-ingest migrate`` makes them."""
    from kafka_ingest.config import load_pipelines  # the runtime, only when wanted
    from kafka_ingest.db import migrate
    from kafka_ingest.db.tables import apply_pipelines

    with psycopg.connect(dsn) as conn:
        migrate(conn)
        apply_pipelines(conn, load_pipelines().values())


#: This process's templates: (role and server, schema fingerprint) -> (admin DSN, name).
_TEMPLATES: dict[tuple[str, str], tuple[str, str]] = {}
_TEMPLATES_LOCK = threading.Lock()


def _schema_fingerprint() -> str:
    """What a migrated database holds: the migrations and the pipelines' tables (the
    pipelines file in force, ``KAFKA_INGEST_PIPELINES`` or the shipped one)."""
    from kafka_ingest.config import load_pipelines

    digest = hashlib.sha256()
    migrations = resources.files("kafka_ingest.db").joinpath("migrations")
    for file in sorted(migrations.iterdir(), key=lambda f: f.name):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    pipelines = {name: p.model_dump(mode="json") for name, p in load_pipelines().items()}
    digest.update(json.dumps(pipelines, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _server(admin_dsn: str) -> str:
    """Whose template: the server and the role that makes (and owns) the copies."""
    params = conninfo_to_dict(admin_dsn)
    return f"{params.get('user')}@{params.get('host')}:{params.get('port')}"


def _template(admin_dsn: str) -> str:
    """This process's migrated template on ``admin_dsn``'s server for the schema in force,
    made (migrated, then closed to connections) on first use."""
    key = (_server(admin_dsn), _schema_fingerprint())
    with _TEMPLATES_LOCK:
        if key not in _TEMPLATES:
            dsn = create_database(admin_dsn, prefix="template", migrated=False)
            name = str(conninfo_to_dict(dsn)["dbname"])
            try:
                _migrate(dsn)
                with psycopg.connect(admin_dsn, autocommit=True) as conn:
                    # closed: no session (autovacuum's neither) keeps a copy from starting
                    conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE true "
                                         "ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
            except BaseException:
                drop_database(admin_dsn, dsn)
                raise
            if not _TEMPLATES:
                atexit.register(_drop_templates)
            _TEMPLATES[key] = (admin_dsn, name)
        return _TEMPLATES[key][1]


def _drop_templates() -> None:
    """The process ends: its templates go (best effort: a server already gone keeps them)."""
    with _TEMPLATES_LOCK:
        for admin_dsn, name in _TEMPLATES.values():
            with contextlib.suppress(psycopg.Error), \
                    psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} WITH IS_TEMPLATE false")
                             .format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        _TEMPLATES.clear()


def drop_database(admin_dsn: str, dsn: str, *, wait_s: float = 0.0) -> None:
    """Drop the database ``dsn`` names (its sessions are ended), waiting up to ``wait_s``
    for a Postgres that is restarting (the chaos tests restart it); after that, warn and
    leave it."""
    name = str(conninfo_to_dict(dsn)["dbname"])
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                             .format(sql.Identifier(name)))
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() >= deadline:
                print(f"warning: database {name} was not dropped: {exc}", file=sys.stderr)
                return
            time.sleep(1.0)  # a retry interval while Postgres restarts, not a wait for a result


@contextmanager
def fresh_database(admin_dsn: str, *, prefix: str = "t", migrated: bool = True,
                   cloned: bool = False, wait_s: float = 0.0) -> Iterator[str]:
    """:func:`create_database`, dropped on exit (see :func:`drop_database`)."""
    dsn = create_database(admin_dsn, prefix=prefix, migrated=migrated, cloned=cloned)
    try:
        yield dsn
    finally:
        drop_database(admin_dsn, dsn, wait_s=wait_s)


def airflow_postgres_conn(dsn: str) -> str:
    """An Airflow ``postgres`` connection (the JSON form of ``AIRFLOW_CONN_<ID>``) pointing
    at ``dsn``, every libpq keyword of it kept (TLS settings in the extra)."""
    params = conninfo_to_dict(dsn)
    conn: dict[str, object] = {"conn_type": "postgres"}
    extra = {}
    for key, value in params.items():
        if key == "port" and "," in str(value):  # several servers: no integer holds it
            extra[key] = value
        elif key in _CONN_FIELDS:
            conn[_CONN_FIELDS[key]] = int(str(value)) if key == "port" else value
        else:
            extra[key] = value
    if extra:
        conn["extra"] = extra
    return json.dumps(conn)
