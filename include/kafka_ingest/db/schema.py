"""Schema migrations, applied by the owner role, and the runtime role's grants.

Least privilege: the role that owns the schema runs the migrations (``kafka-ingest
migrate``); the pipelines run as a role that may only read and write rows of its own
tables and make temporary staging tables. It cannot create, alter, drop or truncate.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

#: What the runtime role needs of each bookkeeping table (no DELETE, no TRUNCATE).
RUNTIME_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "ingest_offsets": ("SELECT", "INSERT", "UPDATE"),
    "dead_letters": ("SELECT", "INSERT", "UPDATE"),
    "ingest_runs": ("SELECT", "INSERT"),
    "run_plans": ("SELECT", "INSERT"),
    "offset_gaps": ("SELECT", "INSERT"),
    "monitor_checks": ("SELECT", "INSERT"),
}
#: On the pipelines' target tables: the upsert reads, inserts and (``latest``) updates.
TARGET_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")

_MIGRATION_LOCK = 7_431_002_211  # pg_advisory_xact_lock key: one migrator at a time


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the pending migrations in order, each in its own transaction. Idempotent."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        files = sorted(
            (f for f in resources.files("kafka_ingest.db").joinpath("migrations").iterdir()
             if f.name.endswith(".sql")),
            key=lambda f: f.name,
        )
        for file in files:
            version = file.name.removesuffix(".sql")
            if version in done:
                continue
            with conn.transaction():
                conn.execute(file.read_text(encoding="utf-8"))
                conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied


def grant_runtime(conn: psycopg.Connection[Any], role: str, tables: Iterable[str]) -> None:
    """Grant ``role`` what the pipelines need, and nothing more; idempotent.

    CONNECT and TEMPORARY on this database (staging tables are temporary), USAGE on the
    schema and the audit sequences, the DML of :data:`RUNTIME_PRIVILEGES` and
    :data:`TARGET_PRIVILEGES`. Run it as the owner after the migrations.
    """
    who = sql.Identifier(role)

    def grant(privileges: Iterable[str], what: sql.Composable) -> None:
        conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(
            sql.SQL(", ").join(sql.SQL(p) for p in privileges), what, who))

    with conn.transaction():
        grant(("CONNECT", "TEMPORARY"), sql.SQL("DATABASE {}").format(
            sql.Identifier(conn.info.dbname)))
        grant(("USAGE",), sql.SQL("SCHEMA public"))
        grant(("USAGE",), sql.SQL("ALL SEQUENCES IN SCHEMA public"))
        for table, privileges in RUNTIME_PRIVILEGES.items():
            grant(privileges, sql.SQL("TABLE {}").format(sql.Identifier(table)))
        for table in sorted(set(tables)):
            grant(TARGET_PRIVILEGES, sql.SQL("TABLE {}").format(sql.Identifier(table)))
