"""Production security on the real stack: Kafka over SASL_SSL (SCRAM-SHA-512), Postgres over
verified TLS as a least-privilege runtime role, refusals that fail fast and permanently,
and no secret anywhere it does not belong.

The secure listener and Postgres TLS come from ``kafka-ingest stack up --secure`` (the test
command starts the stack that way); ``stack.env(secure=True)`` gives the settings a user
would export with ``kafka-ingest stack env --secure``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Pipeline, load_pipelines
from kafka_ingest.db import Database, grant_runtime, migrate
from kafka_ingest.engine.ingest import plan_run
from kafka_ingest.errors import DatabaseRefused, KafkaRefused, PermanentError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ops.retention import prune
from kafka_ingest_dev import stack, tls
from kafka_ingest_dev.databases import fresh_database
from kafka_ingest_dev.demo import run_dag
from kafka_ingest_dev.samples import produce_sample
from tests.support.airflow_api import metadata_dsn
from tests.support.ingest import assert_invariants, expected_from_sample, read_topic
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

COUNT, POISON = 600, 1
#: A refusal must be told within this (not after a task time-out of retries).
REFUSAL_DEADLINE_S = 60


@pytest.fixture(scope="module")
def secure_env(stack_env: dict[str, str]) -> dict[str, str]:
    stack.up(secure=True)  # a no-op when the test command started the stack secure
    return stack.env(secure=True)


@pytest.fixture
def app_dsn(secure_env: dict[str, str], pg_dsn: str) -> str:
    """The runtime role's DSN (TLS, verify-full) to this test's database, after the owner
    granted it the runtime privileges."""
    with psycopg.connect(pg_dsn) as conn:
        grant_runtime(conn, stack.PG_APP_ROLE, [p.table for p in load_pipelines().values()])
    return make_conninfo(secure_env["KAFKA_INGEST_PG_DSN"],
                         dbname=conninfo_to_dict(pg_dsn)["dbname"])


@pytest.fixture
def secrets_of(secure_env: dict[str, str]) -> list[str]:
    creds = tls.credentials(tls.TlsFiles(Path(secure_env["KAFKA_INGEST_STATE_DIR"]) / "tls"))
    return [creds["kafka_password"], creds["pg_app_password"]]


def _sample(clients: KafkaClients, make_pipeline: Callable[..., Pipeline]) -> tuple[Any, Any]:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=250)
    sample = produce_sample(clients, pipeline, count=COUNT, poison=POISON)
    return pipeline, expected_from_sample(pipeline, sample, count=COUNT, poison=POISON)


def _assert_no_secret(secrets: list[str], where: str, text: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret leaked into {where}"


def _tables_text(dsn: str) -> str:
    """Every row of every table of the pipelines' database, as JSON text."""
    out = []
    with psycopg.connect(dsn) as conn:
        names = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for name in names:
            rows = conn.execute(sql.SQL("SELECT row_to_json(t)::text FROM {} t").format(
                sql.Identifier(name))).fetchall()
            out += [r[0] for r in rows]
    return "\n".join(out)


def _dlq_text(clients: KafkaClients, pipeline: Pipeline) -> str:
    records = read_topic(clients, pipeline.dlq_topic).values()
    return "\n".join(repr((r.key, r.value, r.headers)) for r in records)


# --------------------------------------------------------------------------- full runs


def test_cli_ingests_over_sasl_ssl_and_tls_postgres_leaking_no_secret(
        secure_env: dict[str, str], clients: KafkaClients, make_pipeline: Any, pg_dsn: str,
        app_dsn: str, secrets_of: list[str], tmp_path: Path) -> None:
    pipeline, expected = _sample(clients, make_pipeline)
    env = {**os.environ,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "KAFKA_INGEST_KAFKA_CONFIG": secure_env["KAFKA_INGEST_KAFKA_CONFIG"],
           "KAFKA_INGEST_PG_DSN": app_dsn}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    done = subprocess.run([sys.executable, "-m", "kafka_ingest.cli", "-v", "run",
                           pipeline.name], env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # It went through the secure endpoints: the SASL_SSL port, TLS as the runtime role.
    config = json.loads(secure_env["KAFKA_INGEST_KAFKA_CONFIG"])
    assert config["security.protocol"] == "SASL_SSL"
    assert conninfo_to_dict(app_dsn)["user"] == stack.PG_APP_ROLE
    assert_invariants(pipeline, clients, pg_dsn, expected)
    _assert_no_secret(secrets_of, "the CLI's output and debug log", done.stdout + done.stderr)
    _assert_no_secret(secrets_of, "the tables", _tables_text(pg_dsn))
    _assert_no_secret(secrets_of, "the DLQ records", _dlq_text(clients, pipeline))


def test_ingest_dag_over_sasl_ssl_and_tls_postgres_leaking_no_secret(
        stack_env: dict[str, str], secure_env: dict[str, str], clients: KafkaClients,
        make_pipeline: Any, pg_dsn: str, app_dsn: str, secrets_of: list[str],
        tmp_path: Path) -> None:
    pipeline, expected = _sample(clients, make_pipeline)
    app = conninfo_to_dict(app_dsn)
    pg_conn = {"conn_type": "postgres", "host": app["host"], "port": int(app["port"]),
               "login": app["user"], "password": app["password"], "schema": app["dbname"],
               "extra": {"sslmode": app["sslmode"], "sslrootcert": app["sslrootcert"]}}
    env = {**stack_env,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "AIRFLOW_CONN_KAFKA_DEFAULT": secure_env["AIRFLOW_CONN_KAFKA_DEFAULT"],
           "AIRFLOW_CONN_POSTGRES_DEFAULT": json.dumps(pg_conn)}
    dag_id = f"{pipeline.name}_ingest"
    proc = run_dag(dag_id, env, log_file=tmp_path / "dag.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert_invariants(pipeline, clients, pg_dsn, expected)

    _assert_no_secret(secrets_of, "the DAG run's output", proc.stdout + proc.stderr)
    logs = Path(stack_env["AIRFLOW_HOME"]) / "logs"
    task_logs = "\n".join(p.read_text(errors="replace") for p in logs.rglob("*")
                          if p.is_file() and dag_id in str(p))
    _assert_no_secret(secrets_of, "the task logs", task_logs)
    with psycopg.connect(metadata_dsn(stack_env)) as conn:
        xcom = conn.execute("SELECT coalesce(string_agg(value::text, ' '), '') FROM xcom"
                            " WHERE dag_id = %s", (dag_id,)).fetchone()
    assert xcom is not None and xcom[0], "the run left no XCom to check"
    _assert_no_secret(secrets_of, "XCom", xcom[0])
    _assert_no_secret(secrets_of, "the tables", _tables_text(pg_dsn))
    _assert_no_secret(secrets_of, "the DLQ records", _dlq_text(clients, pipeline))


def test_the_readme_flow_on_the_secure_stack_leaves_the_runtime_role_able_to_run(
        secure_env: dict[str, str], stack_env: dict[str, str], clients: KafkaClients,
        make_pipeline: Any, tmp_path: Path) -> None:
    # What a newcomer types after `stack up --secure`, in a shell: `stack env --secure`,
    # `migrate`, `run`, nothing else (no --grant-to). Only the database is this test's own.
    pipeline, expected = _sample(clients, make_pipeline)
    pipelines = write_pipelines_file(tmp_path / "p.yaml", pipeline)
    script = (
        'eval "$(kafka-ingest stack env --secure)" && '
        # a fresh database instead of the stack's own (libpq: a later keyword wins)
        'export KAFKA_INGEST_PG_DSN="$KAFKA_INGEST_PG_DSN dbname=$DB" '
        'KAFKA_INGEST_PG_ADMIN_DSN="$KAFKA_INGEST_PG_ADMIN_DSN dbname=$DB" && '
        'kafka-ingest migrate && kafka-ingest run "$PIPELINE"')
    with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], migrated=False) as dsn:
        env = {**os.environ, "DB": str(conninfo_to_dict(dsn)["dbname"]),
               "PIPELINE": pipeline.name, "KAFKA_INGEST_PIPELINES": str(pipelines),
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                              check=False, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        # migrate said what it granted, and to whom (the role `stack env --secure` names)
        out = done.stdout
        assert (f"granted '{stack.PG_APP_ROLE}' (from KAFKA_INGEST_PG_GRANT_TO) the runtime "
                "privileges:") in out
        for line in ("CONNECT, TEMPORARY on database", "USAGE on schema public",
                     "SELECT, INSERT on table run_plans",
                     "SELECT, INSERT, UPDATE on table ingest_offsets",
                     "SELECT, INSERT, UPDATE on table telemetry_metrics"):
            assert line in out, out
        summary = json.loads(out[out.index("{"):])  # then `run` printed its summary
        assert summary["inserted"] == len(expected.ids)
        with psycopg.connect(dsn) as conn:
            may_plan = conn.execute("SELECT has_table_privilege(%s, 'run_plans', 'INSERT')",
                                    (stack.PG_APP_ROLE,)).fetchone()
        assert may_plan == (True,)
        assert_invariants(pipeline, clients, dsn, expected)


def test_stack_env_names_the_runtime_role_only_on_the_secure_stack(
        secure_env: dict[str, str]) -> None:
    assert secure_env["KAFKA_INGEST_PG_GRANT_TO"] == stack.PG_APP_ROLE
    assert conninfo_to_dict(secure_env["KAFKA_INGEST_PG_DSN"])["user"] == stack.PG_APP_ROLE
    # the plaintext stack runs as the owner: nothing to grant, and a shell that had the
    # secure environment stops granting once it evals the plain one
    assert stack.env()["KAFKA_INGEST_PG_GRANT_TO"] == ""


# --------------------------------------------------------------------------- refusals


@pytest.fixture
def pipeline(make_pipeline: Callable[..., Pipeline]) -> Pipeline:
    return make_pipeline("telemetry_metrics", partitions=1)


def _refused_within_deadline(action: Callable[[], object]) -> PermanentError:
    started = time.monotonic()
    with pytest.raises(PermanentError) as info:
        action()
    took = time.monotonic() - started
    assert took < REFUSAL_DEADLINE_S, f"refused only after {took:.0f} s"
    return info.value


def test_a_wrong_sasl_password_is_refused_fast_and_permanently(
        secure_env: dict[str, str], pipeline: Pipeline, db: Database) -> None:
    config = {**json.loads(secure_env["KAFKA_INGEST_KAFKA_CONFIG"]),
              "sasl.password": "not-the-password"}
    err = _refused_within_deadline(
        lambda: plan_run(pipeline, KafkaClients(config), db, run_id="wrong-password"))
    assert isinstance(err, KafkaRefused)
    assert "authentication" in str(err).lower()
    assert "not-the-password" not in str(err)


def test_an_unknown_ca_is_refused_fast_and_permanently(
        secure_env: dict[str, str], pipeline: Pipeline, db: Database, tmp_path: Path) -> None:
    other = tls.ensure(tmp_path / "other-ca")  # a CA the broker's certificate is not from
    config = {**json.loads(secure_env["KAFKA_INGEST_KAFKA_CONFIG"]),
              "ssl.ca.location": str(other.ca_cert)}
    err = _refused_within_deadline(
        lambda: plan_run(pipeline, KafkaClients(config), db, run_id="unknown-ca"))
    assert isinstance(err, KafkaRefused)
    assert "certificate" in str(err).lower()


def test_plain_text_to_the_tls_only_role_is_refused(app_dsn: str) -> None:
    plain = make_conninfo(app_dsn, sslmode="disable")
    err = _refused_within_deadline(lambda: Database(plain).connect().close())
    assert isinstance(err, DatabaseRefused) and err.kind == "TLS required"


def test_a_wrong_root_certificate_is_refused(app_dsn: str, tmp_path: Path) -> None:
    other = tls.ensure(tmp_path / "other-ca")
    wrong = make_conninfo(app_dsn, sslrootcert=str(other.ca_cert))
    err = _refused_within_deadline(lambda: Database(wrong).connect().close())
    assert isinstance(err, DatabaseRefused) and err.kind == "certificate"


# --------------------------------------------------------------------------- least privilege


@pytest.fixture
def as_app(app_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(app_dsn, autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("statement", [
    # the runtime role cannot change the schema ...
    "CREATE TABLE intruder (id int)",
    "ALTER TABLE telemetry_metrics ADD COLUMN intruder int",
    "DROP TABLE telemetry_metrics",
    "DROP TABLE ingest_offsets",
    # ... nor empty a table wholesale, nor delete rows it never needs to delete
    "TRUNCATE telemetry_metrics",
    "TRUNCATE dead_letters",
    "DELETE FROM ingest_offsets",
    "CREATE INDEX intruder ON telemetry_metrics (device_id)",
    # ... nor delete the bookkeeping (the retention deletes through functions that say
    # what may go), nor set the counters the triggers keep
    "DELETE FROM ingest_runs",
    "DELETE FROM dead_letters WHERE status = 'parked'",
    "DELETE FROM run_plans",
    "DELETE FROM monitor_checks",
    "UPDATE ingest_totals SET read = 0",
    "UPDATE dead_letter_totals SET letters = 0",
])
def test_the_runtime_role_cannot_create_alter_drop_or_truncate(
        as_app: psycopg.Connection[Any], statement: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_app.execute(statement)  # type: ignore[arg-type]


def test_the_runtime_role_prunes_through_the_retention_functions_only(
        pg_dsn: str, app_dsn: str) -> None:
    """The monitor's prune, run as the runtime role: old chunks and recovered letters go,
    the parked letter stays, and the totals written through the triggers are intact."""
    pipeline = load_pipelines()["telemetry_metrics"]
    with psycopg.connect(app_dsn) as conn:  # the runtime role writes as a chunk does
        conn.execute("INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition,"
                     " start_offset, end_offset, read, inserted, duplicates, stale,"
                     " dead_lettered, tombstones, bytes, seconds, committed_at) VALUES"
                     " (%s, 'old', 'live', 't', 0, 0, 5, 5, 5, 0, 0, 0, 0, 50, 0.1,"
                     " now() - interval '40 days')", (pipeline.name,))
        conn.execute("INSERT INTO dead_letters (pipeline, source_topic, source_partition,"
                     " source_offset, contract, error_class, error_detail, status,"
                     " recovered_at, dlq_topic) VALUES"
                     " (%s, 't', 0, 1, 'c', 'not_json', 'x', 'recovered',"
                     "  now() - interval '40 days', 'd'),"
                     " (%s, 't', 0, 2, 'c', 'not_json', 'x', 'parked', NULL, 'd')",
                     (pipeline.name, pipeline.name))
    pruned = prune([pipeline], Database(app_dsn))
    assert {(x.table, x.rows) for x in pruned if x.rows} == {("ingest_runs", 1),
                                                            ("recovered_letters", 1)}
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT status FROM dead_letters").fetchall() == [("parked",)]
        assert conn.execute("SELECT read FROM ingest_totals").fetchall() == [(5,)]


def test_a_role_granted_before_the_totals_is_granted_them_by_the_migration(
        secure_env: dict[str, str], stack_env: dict[str, str]) -> None:
    """A deployment upgrading: its runtime role had the old grants; after ``migrate``
    (without --grant-to) its chunks and its monitor go on."""
    role = stack.PG_APP_ROLE
    with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], migrated=False) as dsn, \
            psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE schema_migrations (version text PRIMARY KEY,"
                     " applied_at timestamptz NOT NULL DEFAULT now())")
        for file in sorted(resources.files("kafka_ingest.db").joinpath("migrations").iterdir(),
                           key=lambda f: f.name):
            if file.name.endswith(".sql") and file.name < "0010":
                conn.execute(file.read_text(encoding="utf-8"))
                conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)",
                             (file.name.removesuffix(".sql"),))
        conn.execute(sql.SQL("GRANT SELECT, INSERT ON ingest_runs, monitor_checks TO {}")
                     .format(sql.Identifier(role)))
        conn.commit()
        migrate(conn)
        granted = conn.execute(
            "SELECT has_table_privilege(%s, 'ingest_totals', 'SELECT'),"
            " has_table_privilege(%s, 'dead_letter_totals', 'SELECT'),"
            " has_table_privilege(%s, 'ingest_totals', 'UPDATE'),"
            " has_function_privilege(%s, 'prune_ingest_runs(text, timestamptz, integer)',"
            "   'EXECUTE')", (role, role, role, role)).fetchone()
        assert granted == (True, True, False, True)


def test_the_runtime_role_can_do_what_the_pipelines_need(
        as_app: psycopg.Connection[Any]) -> None:
    # a temporary staging table (TEMPORARY on the database) and the bookkeeping DML
    as_app.execute("CREATE TEMP TABLE stage_check (id int)")
    as_app.execute("INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
                   " VALUES ('p', 't', 0, 0)")
    as_app.execute("UPDATE ingest_offsets SET next_offset = 1 WHERE pipeline = 'p'")
    row = as_app.execute("SELECT next_offset FROM ingest_offsets WHERE pipeline = 'p'")
    assert row.fetchone() == (1,)
