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

from kafka_ingest.errors import SettingsError

#: What the runtime role needs of each bookkeeping table (no DELETE, no TRUNCATE: the
#: retention deletes through :data:`RUNTIME_FUNCTIONS`).
RUNTIME_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "ingest_offsets": ("SELECT", "INSERT", "UPDATE"),
    "topic_incarnations": ("SELECT", "INSERT"),
    "dead_letters": ("SELECT", "INSERT", "UPDATE"),
    "ingest_runs": ("SELECT", "INSERT"),
    "run_plans": ("SELECT", "INSERT"),
    "offset_gaps": ("SELECT", "INSERT"),
    "monitor_checks": ("SELECT", "INSERT"),
    # a mirror's truncates (migration 0011), one row per partition, moved forward
    "truncate_points": ("SELECT", "INSERT", "UPDATE"),
    # kept by the owner's triggers (migration 0010) as the ledger and the letters change
    "ingest_totals": ("SELECT",),
    "dead_letter_totals": ("SELECT",),
}
#: The retention's functions (migration 0010), by name and argument types: the monitor
#: deletes through them, each saying what may go, instead of holding DELETE.
RUNTIME_FUNCTIONS: dict[str, tuple[str, ...]] = {
    "prune_ingest_runs": ("text", "timestamptz", "integer"),
    "prune_run_plans": ("text", "timestamptz", "integer"),
    "prune_monitor_checks": ("text", "timestamptz", "integer", "integer"),
    "prune_recovered_letters": ("text", "timestamptz", "integer"),
}
#: On the pipelines' target tables: the upsert reads, inserts and (``latest``) updates.
TARGET_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")

MIGRATION_LOCK = 7_431_002_211  # pg_advisory_xact_lock key: one migrator at a time


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the pending migrations in order, each in its own transaction. Idempotent."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
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


def grant_runtime(conn: psycopg.Connection[Any], role: str, tables: Iterable[str], *,
                  deleting: Iterable[str] = ()) -> list[str]:
    """Grant ``role`` what the pipelines need, and nothing more; idempotent. Returns what
    was granted, one ``"<privileges> on <object>"`` line each.

    CONNECT and TEMPORARY on this database (staging tables are temporary), USAGE on the
    schema and the audit sequences, the DML of :data:`RUNTIME_PRIVILEGES` and
    :data:`TARGET_PRIVILEGES`, EXECUTE on the retention's :data:`RUNTIME_FUNCTIONS`; on the
    ``deleting`` tables (of pipelines that delete on tombstones, and their marker tables)
    DELETE as well. Run it as the owner after the migrations and the tables (``schema
    apply``). A role that does not exist is a :class:`SettingsError` naming it (not
    Postgres's "role does not exist" from the middle of the grants).
    """
    who = sql.Identifier(role)
    granted: list[str] = []

    def grant(privileges: Iterable[str], kind: str, name: str | None = None) -> None:
        what = sql.SQL(kind) if name is None else sql.SQL(f"{kind} {{}}").format(
            sql.Identifier(name))
        conn.execute(sql.SQL("GRANT {} ON {} TO {}").format(
            sql.SQL(", ").join(sql.SQL(p) for p in privileges), what, who))
        granted.append(f"{', '.join(privileges)} on {kind.lower()}"
                       f"{f' {name}' if name is not None else ''}")

    with conn.transaction():
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            raise SettingsError(f"role {role!r} does not exist on this server, so it cannot be "
                                "granted the runtime privileges: create it (CREATE ROLE ... "
                                "LOGIN) or name another one")
        grant(("CONNECT", "TEMPORARY"), "DATABASE", conn.info.dbname)
        grant(("USAGE",), "SCHEMA", "public")
        grant(("USAGE",), "ALL SEQUENCES IN SCHEMA public")
        for table, privileges in RUNTIME_PRIVILEGES.items():
            grant(privileges, "TABLE", table)
        for function, types in RUNTIME_FUNCTIONS.items():
            conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {}({}) TO {}").format(
                sql.Identifier(function), sql.SQL(", ".join(types)), who))
            granted.append(f"EXECUTE on function {function}")
        deletes = set(deleting)
        for table in sorted(set(tables) | deletes):
            grant((*TARGET_PRIVILEGES, "DELETE") if table in deletes else TARGET_PRIVILEGES,
                  "TABLE", table)
    return granted
