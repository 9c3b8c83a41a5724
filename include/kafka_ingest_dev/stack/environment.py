"""``stack env``: the environment that points clients, tests and Airflow at the stack."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from kafka_ingest_dev.databases import airflow_postgres_conn
from kafka_ingest_dev.procs import StackError
from kafka_ingest_dev.stack import airflow_db, kafka, postgres, registry
from kafka_ingest_dev.stack import connect as kafka_connect
from kafka_ingest_dev.stack.postgres import PG_APP_ROLE
from kafka_ingest_dev.stack.settings import Settings, settings

KAFKA_GROUP_ID = "kafka-ingest"


def _with_tools(s: Settings) -> str:
    """PATH with Kafka's tools (and this interpreter's scripts: kafka-ingest, airflow) first."""
    first = [str(s.bin_dir), str(Path(sys.executable).parent)]
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p not in first]
    return os.pathsep.join(first + rest)


def _refuse_missing(s: Settings, *, secure: bool, faults: bool, replica: bool) -> None:
    """A StackError saying which ``up`` option is missing for the environment asked for."""
    if secure and not s.secure:
        raise StackError("the stack is not secure: run `kafka-ingest stack up --secure` first")
    if faults and not s.faults:
        raise StackError("the stack has no fault proxies: run `kafka-ingest stack up --faults` "
                         "first")
    if faults and secure:
        raise StackError("the fault proxies front the plaintext listeners: --faults and "
                         "--secure do not go together")
    if replica and s.replica is None:
        raise StackError("the stack has no standby: run `kafka-ingest stack up --replica` "
                         "first")


def env(*, secure: bool = False, faults: bool = False, replica: bool = False,
        ) -> dict[str, str]:
    """The environment that points clients, tests and Airflow at the local stack; with
    ``secure``, at its SASL_SSL listener and at Postgres over verified TLS as the runtime
    role (``KAFKA_INGEST_PG_ADMIN_DSN``: the schema owner, for migrations, and
    ``KAFKA_INGEST_PG_GRANT_TO``: the runtime role, so a plain ``kafka-ingest migrate``
    grants it what it needs; empty on the other stacks, whose pipelines run as the owner,
    so a shell that had the secure environment stops granting); with ``faults``, at Kafka
    and Postgres through Toxiproxy, plus ``TOXIPROXY_URL`` (Airflow's metadata database
    stays direct); with ``replica``, at both Postgres nodes through multi-host connection
    strings that follow a failover (``target_session_attrs=read-write``), Airflow's
    metadata database included (with ``faults`` too, Kafka goes through the proxies and
    Postgres straight to both nodes: the proxy fronts one)."""
    from psycopg.conninfo import make_conninfo

    s = settings()
    _refuse_missing(s, secure=secure, faults=faults, replica=replica)
    secrets = airflow_db.airflow_secrets(s)
    project = s.repo or Path.cwd()
    client = kafka.client_config(s, secure=secure, faults=faults)
    pg = postgres.params(s, secure=secure, faults=faults, replica=replica)
    return {
        "KAFKA_INGEST_STATE_DIR": str(s.state),
        "PATH": _with_tools(s),
        "KAFKA_BOOTSTRAP_SERVERS": client["bootstrap.servers"],
        "KAFKA_INGEST_KAFKA_CONFIG": json.dumps(client),
        "KAFKA_INGEST_PG_DSN": make_conninfo(**pg),
        "KAFKA_INGEST_PG_ADMIN_DSN": make_conninfo(**postgres.params(
            s, secure=secure, owner=True, faults=faults, replica=replica)),
        "KAFKA_INGEST_PG_GRANT_TO": PG_APP_ROLE if secure else "",
        "PGHOST": pg["host"],
        "PGPORT": str(pg["port"]),
        "PGUSER": pg["user"],
        "PGPASSWORD": pg["password"],
        "PGDATABASE": pg["dbname"],
        "PGSSLMODE": pg.get("sslmode", "prefer"),
        **({"PGTARGETSESSIONATTRS": "read-write"} if replica else {}),
        **({"PGSSLROOTCERT": pg["sslrootcert"]} if secure else {}),
        "AIRFLOW_HOME": str(s.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(project / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__FERNET_KEY": secrets["fernet_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets["jwt_secret"],
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": airflow_db.db_url(s, replica=replica),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {"conn_type": "kafka", "extra": {**client, "group.id": KAFKA_GROUP_ID}}),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(make_conninfo(**pg)),
        **({"TOXIPROXY_URL": s.toxiproxy.url} if faults else {}),
        **(s.airflow.client_env() if s.airflow.running() else {}),
        **registry.client_env(s),
        **kafka_connect.client_env(s),
    }
