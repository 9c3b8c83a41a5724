"""Schema migrations: versioned SQL files applied in order, each in its own transaction."""

from __future__ import annotations

from importlib import resources
from typing import Any

import psycopg

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
