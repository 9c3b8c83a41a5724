"""Airflow's metadata database in the local stack, and the secrets its processes share.

No daemon: ``AIRFLOW_HOME=<state>/airflow`` and ``airflow db migrate`` against the
``airflow`` database of the stack's Postgres, re-run only when the installed Airflow
version changes (or the schema is gone). Airflow's services themselves are
:mod:`kafka_ingest_dev.airflow_services`.

Another Airflow of the same stack (``KAFKA_INGEST_AIRFLOW_INSTANCE=<name>``: each
pytest-xdist worker's) has ``AIRFLOW_HOME=<state>/airflow-<name>`` and the database
``airflow_<name>``, made once as a copy of the migrated ``airflow`` database
(``CREATE DATABASE ... TEMPLATE``: a second of work, where a migration takes a minute),
migrated on its own only while another session holds the ``airflow`` database open.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.metadata
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from kafka_ingest_dev.procs import PartStatus, StackError, child_env, tail
from kafka_ingest_dev.stack import postgres
from kafka_ingest_dev.stack.postgres import PG_PASSWORD, PG_ROLE, primary_node
from kafka_ingest_dev.stack.settings import Settings

MIGRATE_TIMEOUT_S = 900.0


def airflow_version() -> str | None:
    """The installed Airflow, read from package metadata (the core never imports it)."""
    for dist in ("apache-airflow-core", "apache-airflow"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return None


def airflow_secrets(s: Settings) -> dict[str, str]:
    """JWT secret and Fernet key, generated once: every Airflow process must share them."""
    path = s.state / "airflow-secrets.json"
    if not path.is_file():
        s.state.mkdir(parents=True, exist_ok=True)
        fresh = {
            "jwt_secret": secrets.token_urlsafe(32),
            "fernet_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        }
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(fresh, indent=2) + "\n")
        tmp.chmod(0o600)
        # link() fails if another process won the race; then its secrets are the ones.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    stored: dict[str, str] = json.loads(path.read_text())
    return stored


def db_url(s: Settings, *, replica: bool) -> str:
    """Airflow's metadata database (SQLAlchemy, psycopg2): the primary, or (``replica``)
    both nodes, psycopg2 passing them to libpq as one multi-host string."""
    base = f"postgresql+psycopg2://{PG_ROLE}:{PG_PASSWORD}@"
    if not replica:
        return f"{base}127.0.0.1:{primary_node(s).port}/{s.airflow_database}"
    hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in s.pg_nodes)
    return f"{base}/{s.airflow_database}?{hosts}&target_session_attrs=read-write"


def _migrate_marker(s: Settings) -> Path:
    return s.airflow_home / ".db-migrated"


def _current(s: Settings, version: str) -> bool:
    """Migrated by this Airflow version, and the database still has its schema."""
    marker = _migrate_marker(s)
    if not marker.is_file() or marker.read_text().strip() != version:
        return False
    import psycopg

    try:
        with postgres.connect(postgres.dsn(primary_node(s), s.airflow_database)) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except psycopg.Error:
        return False
    return row is not None


def ensure(s: Settings, environment: Mapping[str, str]) -> str:
    """``airflow db migrate`` (with the stack's ``environment``) unless this Airflow
    version migrated the database already; the line ``up`` prints. Another instance's
    database is a copy of the stack's own (migrated first if need be)."""
    version = airflow_version()
    if version is None:
        return "airflow-db: skipped (apache-airflow is not installed)"
    if _current(s, version):
        return f"airflow-db: up to date (airflow {version})"
    if s.airflow_instance:
        return _copy(s, version, environment)
    return _migrate(s, version, environment)


def _copy(s: Settings, version: str, environment: Mapping[str, str]) -> str:
    """The instance's database made anew as a copy of the stack's migrated one; migrated
    on its own instead while a session (the stack's own services, a shell) holds that
    one open: Postgres copies no database in use."""
    import psycopg
    from psycopg import sql

    own = replace(s, airflow_instance="")
    base = ensure(own, {**environment, "AIRFLOW_HOME": str(own.airflow_home),
                        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url(own, replica=False)})
    started = time.monotonic()
    name = sql.Identifier(s.airflow_database)
    with postgres.admin(primary_node(s)) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        try:
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} OWNER {}").format(
                name, sql.Identifier(own.airflow_database), sql.Identifier(PG_ROLE)))
        except psycopg.errors.ObjectInUse:
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                name, sql.Identifier(PG_ROLE)))
            return (f"{base}; {s.airflow_database} (airflow in use, so not copied): "
                    f"{_migrate(s, version, environment)}")
    s.airflow_home.mkdir(parents=True, exist_ok=True)
    _migrate_marker(s).write_text(f"{version}\n")
    took = time.monotonic() - started
    return f"{base}; airflow-db {s.airflow_database}: copied in {took:.1f} s"


def _migrate(s: Settings, version: str, environment: Mapping[str, str]) -> str:
    s.airflow_home.mkdir(parents=True, exist_ok=True)
    logfile = s.airflow_home / "db-migrate.log"
    started = time.monotonic()
    with logfile.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=child_env(environment), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, timeout=MIGRATE_TIMEOUT_S, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        raise StackError(f"airflow db migrate failed: {tail(logfile, 3)}")
    _migrate_marker(s).write_text(f"{version}\n")
    took = time.monotonic() - started
    return f"airflow-db: migrated (airflow {version}) in {took:.1f} s"


def status(s: Settings) -> PartStatus:
    version = airflow_version()
    primary = primary_node(s)
    address = f"127.0.0.1:{primary.port}/{s.airflow_database}"
    if version is None:
        return PartStatus("airflow-db", address, False, detail="apache-airflow not installed")
    if not primary.answers():  # no database to ask: down, not "not migrated"
        return PartStatus("airflow-db", address, False, detail="Postgres is down")
    current = _current(s, version)
    detail = f"airflow {version}" if current else "not migrated (run stack up)"
    return PartStatus("airflow-db", address, current, detail=detail)
