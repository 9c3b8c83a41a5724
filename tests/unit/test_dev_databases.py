"""The Airflow connection the dev tooling builds from a DSN (the stack's environment, the
DAG tests' and benchmarks' per-database connections): nothing the DSN says is dropped."""

from __future__ import annotations

import json

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
