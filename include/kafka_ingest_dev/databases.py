"""Throwaway databases for tests and benchmarks, and the Airflow connection of a DSN.

One home for what the test fixtures, the fault tests and the benchmarks all do: create a
database on a server the caller administers (migrated, unless asked otherwise), hand out
its DSN, drop it afterwards, and point an Airflow ``postgres`` connection at it.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: libpq keywords an Airflow ``postgres`` connection holds in its own fields; every other
#: one (sslmode, sslrootcert, connect_timeout, ...) goes into its extra.
_CONN_FIELDS = {"host": "host", "port": "port", "user": "login", "password": "password",
                "dbname": "schema"}


def create_database(admin_dsn: str, *, prefix: str = "t", migrated: bool = True) -> str:
    """A new database named ``<prefix>_<random>`` on ``admin_dsn``'s server, migrated to
    the pipelines' schema (and the pipelines' tables made) unless ``migrated`` is false;
    returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(admin_dsn, dbname=name)
    if migrated:
        from kafka_ingest.config import load_pipelines  # the runtime, only when wanted
        from kafka_ingest.db import migrate
        from kafka_ingest.db.tables import apply_pipelines

        try:
            with psycopg.connect(dsn) as conn:
                migrate(conn)
                apply_pipelines(conn, load_pipelines().values())
        except BaseException:
            drop_database(admin_dsn, dsn)
            raise
    return dsn


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
                   wait_s: float = 0.0) -> Iterator[str]:
    """:func:`create_database`, dropped on exit (see :func:`drop_database`)."""
    dsn = create_database(admin_dsn, prefix=prefix, migrated=migrated)
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
