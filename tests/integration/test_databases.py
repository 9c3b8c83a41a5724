"""The tests' databases (``kafka_ingest_dev.databases``) on the stack's real Postgres: a copy
of the migrated template is what a migration makes, each copy is a database of its own, and
the template takes no session of its own, so copies never wait for it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest_dev import databases

pytestmark = pytest.mark.integration

#: The catalog of a database's own objects: tables and their columns, indexes, constraints,
#: sequences, views, functions and triggers, with their definitions; and the rows of the
#: migrations' ledger.
CATALOG = {
    "columns": "SELECT table_name, column_name, data_type, is_nullable, column_default"
               " FROM information_schema.columns WHERE table_schema = 'public'",
    "indexes": "SELECT tablename, indexname, indexdef FROM pg_indexes"
               " WHERE schemaname = 'public'",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
                   " FROM pg_constraint WHERE connamespace = 'public'::regnamespace",
    "relations": "SELECT relname, relkind FROM pg_class"
                 " WHERE relnamespace = 'public'::regnamespace",
    "functions": "SELECT proname, pg_get_functiondef(oid) FROM pg_proc"
                 " WHERE pronamespace = 'public'::regnamespace",
    "triggers": "SELECT tgrelid::regclass::text, tgname FROM pg_trigger WHERE NOT tgisinternal",
    "ledger": "SELECT version FROM schema_migrations",
}


def _catalog(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        return {name: sorted(conn.execute(query).fetchall(), key=repr)  # type: ignore[arg-type]
                for name, query in CATALOG.items()}


def test_a_copy_of_the_template_is_what_a_migration_makes(stack_env: dict[str, str]) -> None:
    admin = stack_env["KAFKA_INGEST_PG_DSN"]
    with databases.fresh_database(admin) as migrated, \
            databases.fresh_database(admin, cloned=True) as cloned:
        expected = _catalog(migrated)
        assert expected["ledger"] and expected["columns"]  # a migrated database, not empty
        assert _catalog(cloned) == expected


def test_copies_are_databases_of_their_own_and_the_template_takes_no_session(
        stack_env: dict[str, str]) -> None:
    admin = stack_env["KAFKA_INGEST_PG_DSN"]
    with databases.fresh_database(admin, cloned=True) as first, \
            databases.fresh_database(admin, cloned=True) as second:
        assert conninfo_to_dict(first)["dbname"] != conninfo_to_dict(second)["dbname"]
        with psycopg.connect(first) as conn:
            conn.execute("INSERT INTO schema_migrations (version) VALUES ('written-in-one')")
        with psycopg.connect(second) as conn:
            assert conn.execute("SELECT count(*) FROM schema_migrations"
                                " WHERE version = 'written-in-one'").fetchone() == (0,)
        (template,) = [name for (server, _), (_, name) in databases._TEMPLATES.items()
                       if server == databases._server(admin)]
        with pytest.raises(psycopg.OperationalError, match="not currently accepting"):
            psycopg.connect(make_conninfo(admin, dbname=template), connect_timeout=10).close()
        # a third copy, made after the others were written: the template is unchanged
        with databases.fresh_database(admin, cloned=True) as third, psycopg.connect(third) as c:
            assert c.execute("SELECT count(*) FROM schema_migrations"
                             " WHERE version = 'written-in-one'").fetchone() == (0,)

