"""The local stack against itself: a real broker, a real Postgres, real processes.

These tests are the contract the other integration, DAG and chaos tests rely on: ``up`` is
idempotent, Kafka keeps acknowledged messages across a restart, Postgres accepts the
role, and ``down`` leaves no process behind (shown on an independent stack of its own, so
no test depends on the order tests run in).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_ingest_dev import stack
from kafka_ingest_dev.procs import StackError, free_ports
from kafka_ingest_dev.stack import postgres
from kafka_ingest_dev.stack.kafka import BROKER_JVMS
from kafka_ingest_dev.stack.settings import BROKER_JVM_VARIABLE

pytestmark = pytest.mark.integration

# librdkafka's connection errors while the broker restarts go to logging, not stderr.
LOG = logging.getLogger(__name__)
PARTITIONS = 3
# (partition, offset) -> value, as the client types them
Records = dict[tuple[int | None, int | None], bytes | None]
PER_PARTITION = 50


@pytest.fixture(scope="module")
def stack_env() -> dict[str, str]:
    started = time.monotonic()
    env = stack.up()
    print(f"\nstack.up() for the module took {time.monotonic() - started:.2f} s")
    return env


def _config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """Client config; librdkafka logs to ours, not stderr (reconnects while restarting)."""
    return {"bootstrap.servers": bootstrap, "logger": LOG, **extra}


def _create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient(_config(bootstrap))
    new_topic = NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)
    admin.create_topics([new_topic], operation_timeout=30)[name].result(timeout=30)


def _delete_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient(_config(bootstrap))
    admin.delete_topics([name], operation_timeout=30)[name].result(timeout=30)


@pytest.fixture
def topic(stack_env: dict[str, str]) -> Iterator[str]:
    """A fresh 3-partition topic, deleted afterwards whatever happens.

    Each admin call gets its own short-lived client: one kept open across a broker
    restart would only add reconnect noise.
    """
    bootstrap = stack_env["KAFKA_BOOTSTRAP_SERVERS"]
    name = f"test-stack-{uuid.uuid4().hex[:12]}"
    _create_topic(bootstrap, name)
    try:
        yield name
    finally:
        _delete_topic(bootstrap, name)


def _produce(bootstrap: str, topic: str) -> Records:
    """Produce PER_PARTITION messages to each partition; every delivery report checked."""
    producer = Producer(_config(bootstrap, **{"acks": "all", "enable.idempotence": True}))
    errors: list[KafkaError] = []
    delivered: Records = {}

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered[(msg.partition(), msg.offset())] = msg.value()

    for partition in range(PARTITIONS):
        for i in range(PER_PARTITION):
            value = json.dumps({"partition": partition, "i": i}).encode()
            producer.produce(
                topic, value=value, key=f"k{i}".encode(), partition=partition,
                on_delivery=on_delivery,
            )  # fmt: skip
    assert producer.flush(30) == 0
    assert errors == []
    assert len(delivered) == PARTITIONS * PER_PARTITION
    return delivered


def _read_all(bootstrap: str, topic: str, expected: int) -> Records:
    """Read every partition from offset 0 by assign (no group subscription)."""
    consumer = Consumer(
        _config(
            bootstrap,
            **{
                "group.id": f"test-stack-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            },
        )
    )
    seen: Records = {}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while len(seen) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=100, timeout=1.0):
                assert msg.error() is None, msg.error()
                seen[(msg.partition(), msg.offset())] = msg.value()
    finally:
        consumer.close()
    return seen


def test_kafka_round_trip_by_assign(stack_env: dict[str, str], topic: str) -> None:
    bootstrap = stack_env["KAFKA_BOOTSTRAP_SERVERS"]
    produced = _produce(bootstrap, topic)
    assert _read_all(bootstrap, topic, len(produced)) == produced


@pytest.mark.exclusive  # restarts the shared broker
def test_messages_survive_a_broker_restart(stack_env: dict[str, str], topic: str) -> None:
    bootstrap = stack_env["KAFKA_BOOTSTRAP_SERVERS"]
    produced = _produce(bootstrap, topic)
    before = _pids()
    started = time.monotonic()
    stack.restart_kafka()
    print(f"\nrestart_kafka() took {time.monotonic() - started:.2f} s")
    assert _pids()["kafka"] != before["kafka"]
    assert _read_all(bootstrap, topic, len(produced)) == produced


def test_postgres_round_trip(stack_env: dict[str, str]) -> None:
    with psycopg.connect(stack_env["KAFKA_INGEST_PG_DSN"]) as conn:
        conn.execute("CREATE TEMP TABLE probe (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO probe VALUES (%s, %s)", (1, "ünïcode ✓"))
        assert conn.execute("SELECT note FROM probe WHERE id = 1").fetchone() == ("ünïcode ✓",)
        owners = conn.execute(
            "SELECT datname, pg_get_userbyid(datdba) FROM pg_database "
            "WHERE datname IN ('kafka_ingest', 'airflow') ORDER BY datname"
        ).fetchall()
    assert owners == [("airflow", "kafka_ingest"), ("kafka_ingest", "kafka_ingest")]


def test_airflow_metadata_is_migrated(stack_env: dict[str, str]) -> None:
    # Migrated to the head of the installed Airflow, not merely created: the schema
    # version is the newest one Airflow knows of, and its tables answer.
    from airflow.utils.db import _REVISION_HEADS_MAP

    head = list(_REVISION_HEADS_MAP.values())[-1]
    dsn = stack_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", "")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
    assert {"dag", "dag_run", "task_instance", "connection", "serialized_dag"} <= tables


def test_env_is_evaluable_by_a_shell(
    stack_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.main(["env"]) == 0
    exports = capsys.readouterr().out
    names = [
        "KAFKA_BOOTSTRAP_SERVERS",
        "AIRFLOW_CONN_KAFKA_DEFAULT",
        "AIRFLOW_CONN_POSTGRES_DEFAULT",
    ]
    script = exports + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    values = dict(zip(names, out.decode().split("\0"), strict=False))
    assert values["KAFKA_BOOTSTRAP_SERVERS"] == stack_env["KAFKA_BOOTSTRAP_SERVERS"]
    kafka_conn = json.loads(values["AIRFLOW_CONN_KAFKA_DEFAULT"])
    assert kafka_conn["conn_type"] == "kafka"
    assert kafka_conn["extra"]["bootstrap.servers"] == stack_env["KAFKA_BOOTSTRAP_SERVERS"]
    pg_conn = json.loads(values["AIRFLOW_CONN_POSTGRES_DEFAULT"])
    assert (pg_conn["conn_type"], pg_conn["login"], pg_conn["schema"]) == (
        "postgres", "kafka_ingest", "kafka_ingest",
    )  # fmt: skip
    assert all(shlex.split(line)[0] == "export" for line in exports.splitlines())


def test_env_readies_a_shell_with_psql_and_kafkas_own_tools(
        stack_env: dict[str, str], topic: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``eval "$(kafka-ingest stack env)"``: psql from the PG* variables alone, and Kafka's
    own tools on PATH, talking to the stack."""
    assert stack.main(["env"]) == 0
    exports = capsys.readouterr().out
    script = exports + (
        'psql -Atc "select current_user, current_database()"\n'
        'kafka-topics --bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --describe --topic '
        f'{topic} | head -1\n'
        f'kafka-get-offsets --bootstrap-server "$KAFKA_BOOTSTRAP_SERVERS" --topic {topic}\n'
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "KAFKA_"))}
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False,
                          env=clean, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "kafka_ingest|kafka_ingest"
    assert f"Topic: {topic}" in lines[1] and f"PartitionCount: {PARTITIONS}" in lines[1]
    assert sorted(lines[2:]) == [f"{topic}:{p}:0" for p in range(PARTITIONS)]  # empty


def test_status_reports_every_part_up(stack_env: dict[str, str]) -> None:
    parts = {part.name: part for part in stack.status()}
    assert {"kafka", "postgres", "airflow-db"} <= set(parts)
    assert all(part.up for part in parts.values()), parts


def _without_services(env: dict[str, str]) -> dict[str, str]:
    """``env`` less what ``stack env`` adds while the Airflow services run (their API, the
    metrics token, the running executor's settings) or the Connect worker does (its URL):
    the DAG tests on the other xdist worker start and stop them at any moment, and the
    first Debezium test starts the worker."""
    added = ("AIRFLOW_API_", "KAFKA_INGEST_METRICS_TOKEN", "AIRFLOW__CORE__EXECUTOR",
             "AIRFLOW__CORE__PARALLELISM", "AIRFLOW__CELERY__", "KAFKA_INGEST_CONNECT_URL")
    return {k: v for k, v in env.items() if not k.startswith(added)}


def test_up_twice_is_a_noop(stack_env: dict[str, str]) -> None:
    before = _pids()
    lines: list[str] = []
    assert _without_services(stack.up(report=lines.append)) == _without_services(stack_env)
    assert _pids() == before
    # each part found running (the metadata database current): nothing started, migrated
    # or waited for
    parts = {line.split(":", 1)[0]: line for line in lines}
    assert "already running on" in parts["kafka"], lines
    assert "already running on" in parts["postgres"], lines
    assert parts["airflow-db"].startswith("airflow-db: up to date"), lines
    assert not [line for line in lines if " started " in line or "migrat" in line], lines


def test_another_airflow_instance_has_a_migrated_metadata_database_and_home_of_its_own(
        stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # What each xdist worker's DAG tests run on (tests/support/workers.py): a copy of the
    # stack's migrated database, made once, and a home (logs, pid files) of its own.
    name = f"t{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(stack.INSTANCE_VARIABLE, name)
    settings = stack.settings()
    try:
        env = stack.up()
        again: list[str] = []
        stack.up(report=again.append)
        assert env["AIRFLOW_HOME"] == str(settings.state / f"airflow-{name}")
        url = env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert url.endswith(f"/airflow_{name}"), url
        versions = []
        for dsn in (url.replace("+psycopg2", ""),
                    stack_env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", "")):
            with psycopg.connect(dsn) as conn:
                versions.append(conn.execute("SELECT version_num FROM alembic_version"
                                             ).fetchall())
                tables = {r[0] for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
            assert {"dag", "dag_run", "task_instance", "serialized_dag"} <= tables, dsn
        assert versions[0] == versions[1] and versions[0], versions
        assert any(line.startswith("airflow-db: up to date") for line in again), again
        part = next(p for p in stack.status() if p.name == "airflow-db")
        assert part.up and part.address.endswith(f"/airflow_{name}"), part
    finally:
        with postgres.admin(stack.primary_node(settings)) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "airflow_{name}" WITH (FORCE)')
        shutil.rmtree(settings.airflow_home, ignore_errors=True)


def test_an_independent_stack_comes_up_cold_and_down_leaves_no_process(
        monkeypatch: pytest.MonkeyPatch, stack_env: dict[str, str]) -> None:
    """A second, independent stack from nothing (the jar cache stays warm), on its own
    ports and state dir, so stopping it never touches the stack other tests share.

    The state dir is a mkdtemp directly under /tmp, not pytest's tmp_path: as root the
    ``postgres`` user must traverse every parent, and tmp_path's parents are private.
    """
    state = Path(tempfile.mkdtemp(prefix="kafka-ingest-cold-"))
    for name, value in stack.isolated_env(state).items():
        monkeypatch.setenv(name, value)
    pids: dict[str, int | None] = {}
    try:
        started = time.monotonic()
        env = stack.up(report=print)
        cold = time.monotonic() - started
        started = time.monotonic()
        stack.up()
        warm = time.monotonic() - started
        print(f"\nfresh state dir: cold up {cold:.2f} s, warm up {warm:.3f} s")
        assert env["KAFKA_INGEST_STATE_DIR"] == str(state)
        assert all(part.up for part in stack.status())
        pids = _pids()
        assert all(pid is not None for pid in pids.values()), pids
        # a stack of its own runs lean Kafka nodes; the shared one, the benchmarks' broker
        # (this session's, on its default port), the server JVM
        assert BROKER_JVMS["lean"][-1] in psutil.Process(pids["kafka"]).cmdline()
        shared = [p for p in psutil.process_iter(["cmdline"])
                  if "kafka.Kafka" in (p.info["cmdline"] or [])
                  and f"{stack_env['KAFKA_INGEST_STATE_DIR']}/" in " ".join(p.info["cmdline"])]
        assert shared and all(BROKER_JVMS["server"][-1] in p.info["cmdline"] for p in shared)
    finally:
        stack.down()
        still_running = {name: pid for name, pid in pids.items() if pid and _alive(pid)}
        assert still_running == {}
        assert not any(part.up for part in stack.status())
        shutil.rmtree(state)


def test_a_broker_jvm_the_stack_does_not_know_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BROKER_JVM_VARIABLE, "tiny")
    with pytest.raises(StackError, match="KAFKA_INGEST_KAFKA_JVM='tiny': one of server, lean"):
        stack.settings()


def _pids() -> dict[str, int | None]:
    """The parts' pids, less the Connect worker's (the first Debezium test starts it)."""
    return {part.name: part.pid for part in stack.status()
            if part.name not in {"airflow-db", "connect"}}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


#: A user's shell with libpq variables that would each turn a connection of the stack's
#: own elsewhere, or fail it: the standby-only session a failover's wait could never get
#: from a primary, a read-only session, another address, an authentication method the
#: private socket does not use, ports no server has.
HOSTILE_LIBPQ = {
    "PGTARGETSESSIONATTRS": "standby", "PGOPTIONS": "-c default_transaction_read_only=on",
    "PGHOSTADDR": "192.0.2.1", "PGREQUIREAUTH": "scram-sha-256", "PGCHANNELBINDING": "require",
    "PGPORT": "1,2", "PGHOST": "nowhere.invalid", "PGUSER": "nobody", "PGDATABASE": "none",
    "PGSSLMODE": "verify-full", "PGCLIENTENCODING": "bogus", "PGCONNECT_TIMEOUT": "1",
}


def test_the_stacks_own_connections_ignore_the_users_libpq_variables(
        stack_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in HOSTILE_LIBPQ.items():
        monkeypatch.setenv(name, value)
    parts = {part.name: part for part in stack.status()}  # its health probes
    assert parts["postgres"].up and parts["airflow-db"].up, parts
    settings = stack.settings()
    with postgres.admin(stack.primary_node(settings)) as conn:  # its superuser's connection
        row = conn.execute("SELECT pg_is_in_recovery(), current_user,"
                           " current_setting('default_transaction_read_only')").fetchone()
    assert row == (False, "postgres", "off")


def test_down_finds_toxiproxy_started_on_ports_its_shell_does_not_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``up --faults`` with ``KAFKA_INGEST_TOXIPROXY_PORT`` set, ``down`` from a shell
    without it: Toxiproxy is stopped like every other part (each is known by a path of
    its state dir, not by a port). Only Toxiproxy runs in this state dir, so ``down``
    has nothing else to stop."""
    from kafka_ingest_dev.procs import terminate

    state = Path(tempfile.mkdtemp(prefix="kafka-ingest-toxi-"))
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", str(state))
    monkeypatch.setenv("KAFKA_INGEST_TOXIPROXY_PORT", str(free_ports(1)[0]))
    server = stack.settings().toxiproxy
    pid = None
    try:
        pid, started = server.start()
        assert started and server.answers()
        (state / "faults").write_text("Toxiproxy in front of Kafka and Postgres\n")
        monkeypatch.delenv("KAFKA_INGEST_TOXIPROXY_PORT")  # the default port from here
        assert stack.settings().toxiproxy.port != server.port
        lines: list[str] = []
        stack.down(report=lines.append)
        assert f"toxiproxy: stopped (pid {pid})" in lines, lines
        assert not _alive(pid)
    finally:
        if pid is not None and _alive(pid):  # a down that missed it: by its pid
            terminate(pid, 10.0)
        shutil.rmtree(state, ignore_errors=True)
