"""The Airflow Postgres connection reaches psycopg whole: every libpq setting of its extra
is used (a wrong root certificate fails), and nothing is defaulted (no host: refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from kafka_ingest.errors import DatabaseRefused, PermanentError, SettingsError
from kafka_ingest_dev import stack, tls

pytestmark = pytest.mark.integration


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields: Any) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "postgres", **fields}))


@pytest.fixture(scope="module")
def secure_pg(stack_env: dict[str, str]) -> dict[str, Any]:
    stack.up(secure=True)
    return conninfo_to_dict(stack.env(secure=True)["KAFKA_INGEST_PG_DSN"])


def _fields(pg: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"host": pg["host"], "port": int(pg["port"]), "login": pg["user"],
            "password": pg["password"], "schema": pg["dbname"], "extra": extra}


def test_the_extra_reaches_psycopg(secure_pg: dict[str, Any],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka_ingest_hook import postgres_database

    _connection(monkeypatch, "pg_tls", **_fields(
        secure_pg, sslmode="verify-full", sslrootcert=secure_pg["sslrootcert"],
        options="-c statement_timeout=12345", application_name="from-the-extra"))
    with postgres_database("pg_tls").connect() as conn:
        row = conn.execute("SELECT ssl, current_setting('statement_timeout'),"
                           " current_setting('application_name') FROM pg_stat_ssl"
                           " WHERE pid = pg_backend_pid()").fetchone()
    assert row == (True, "12345ms", "from-the-extra")


def test_a_wrong_root_certificate_in_the_extra_fails(secure_pg: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from kafka_ingest_hook import postgres_database

    other = tls.ensure(tmp_path / "other-ca")
    _connection(monkeypatch, "pg_wrong_ca", **_fields(
        secure_pg, sslmode="verify-full", sslrootcert=str(other.ca_cert)))
    with pytest.raises(DatabaseRefused) as info:
        postgres_database("pg_wrong_ca").connect()
    assert info.value.kind == "certificate"


def test_without_sslmode_the_tls_only_role_is_refused_not_downgraded(
        secure_pg: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka_ingest_hook import postgres_database

    _connection(monkeypatch, "pg_plain", **_fields(secure_pg, sslmode="disable"))
    with pytest.raises(DatabaseRefused) as info:
        postgres_database("pg_plain").connect()
    assert info.value.kind == "TLS required"


@pytest.mark.parametrize(("fields", "missing"), [
    ({"schema": "kafka_ingest", "login": "u"}, "no host"),  # never "localhost" by default
    ({"host": "127.0.0.1", "login": "u"}, "no database"),  # never "postgres" by default
])
def test_a_connection_without_host_or_database_is_refused_naming_it(
        stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any],
        missing: str) -> None:
    from kafka_ingest_hook import postgres_database

    _connection(monkeypatch, "pg_incomplete", **fields)
    with pytest.raises(SettingsError) as info:
        postgres_database("pg_incomplete")
    assert "'pg_incomplete'" in str(info.value) and missing in str(info.value)
    assert isinstance(info.value, PermanentError)  # the task fails without retries
