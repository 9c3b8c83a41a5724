"""The dev tooling's databases (``kafka_ingest_dev.databases``): the Airflow connection it
builds from a DSN (the stack's environment, the DAG tests' and benchmarks' per-database
connections), nothing the DSN says dropped; and, on the stack's real Postgres, the tests'
databases: a copy of the migrated template is what a migration makes, each copy is a
database of its own, and the template takes no session of its own, so copies never wait
for it."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest_dev import databases
from kafka_ingest_dev.databases import airflow_postgres_conn


def test_every_libpq_setting_of_the_dsn_reaches_the_connection() -> None:
    dsn = ("host=127.0.0.1 port=15433 dbname=t_1 user=app password=s3cret "
           "sslmode=verify-full sslrootcert=/tmp/ca.crt connect_timeout=3")
    assert json.loads(airflow_postgres_conn(dsn)) == {
        "conn_type": "postgres", "host": "127.0.0.1", "port": 15433, "schema": "t_1",
        "login": "app", "password": "s3cret",
        "extra": {"sslmode": "verify-full", "sslrootcert": "/tmp/ca.crt",
                  "connect_timeout": "3"}}


def test_a_plain_dsn_has_no_extra() -> None:
    conn = json.loads(airflow_postgres_conn("host=db port=5432 dbname=d user=u password=p"))
    assert "extra" not in conn and conn["port"] == 5432


def test_a_multi_host_dsn_keeps_its_port_list_in_the_extra() -> None:
    conn = json.loads(airflow_postgres_conn(
        "host=127.0.0.1,127.0.0.1 port=15432,15434 dbname=d user=u password=p "
        "target_session_attrs=read-write"))
    assert conn["host"] == "127.0.0.1,127.0.0.1" and "port" not in conn
    assert conn["extra"] == {"port": "15432,15434", "target_session_attrs": "read-write"}


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


@pytest.mark.integration
def test_a_copy_of_the_template_is_what_a_migration_makes(stack_env: dict[str, str]) -> None:
    admin = stack_env["KAFKA_INGEST_PG_DSN"]
    with databases.fresh_database(admin) as migrated, \
            databases.fresh_database(admin, cloned=True) as cloned:
        expected = _catalog(migrated)
        assert expected["ledger"] and expected["columns"]  # a migrated database, not empty
        assert _catalog(cloned) == expected


@pytest.mark.integration
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

