"""Expected failures of the command line, as a user sees them against the real stack.

Each case runs the command with one thing wrong (a setting, a refused login, a privilege, a
topic, a service out of reach) and checks what the user gets: exit status 2, exactly one
``kafka-ingest: ...`` line on stderr naming the problem (and the fix, where there is one),
no traceback, and, for a service out of reach, no wait beyond the configured time-out.

The matrix calls ``kafka_ingest.cli.main`` in this process (:func:`tests.support.cli.cli`:
the environment set for the call, stdout and stderr with the command's log lines captured,
an uncaught exception a traceback and exit status 1 as in a process), so a case costs the
command's own work, not an interpreter's start and imports.
One case of each error class also runs as ``python -m kafka_ingest.cli`` in a subprocess
(:func:`as_a_user`), as a user runs it: the entry point, the exit status, the one line on
the real stderr, and librdkafka's logging as the command configures it.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Pipeline, load_pipelines, parse_pipelines
from kafka_ingest.db import grant_runtime
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest_dev import stack
from kafka_ingest_dev.databases import fresh_database
from kafka_ingest_dev.samples import produce_sample
from tests.support import cli as support_cli
from tests.support.pipelines import write_pipelines_file
from tests.support.topics import delete_topics

pytestmark = pytest.mark.integration

#: The Kafka config's socket.timeout.ms in these tests: a broker out of reach must fail a
#: command after about this, not after a longer wait of the command's own.
SOCKET_TIMEOUT_MS = 1000
#: The DSN's connect_timeout (seconds) where a server is out of reach.
CONNECT_TIMEOUT_S = 2
#: A failing command's own work in this process beside its one bounded wait (under a second
#: measured on a busy 2-core machine), with room to spare.
WORK_S = 5.0

RUN = ["run", "telemetry_metrics", "--workers", "1"]
BACKFILL = ["backfill", "telemetry_metrics", "--partition", "0", "--from-offset", "0",
            "--to-offset", "1"]
REPLAY = ["replay-dlq", "telemetry_metrics"]
LAG = ["lag", "telemetry_metrics"]
STATUS = ["status", "telemetry_metrics"]
RESET = ["reset-offsets", "telemetry_metrics", "--partition", "0", "--to", "0", "--yes"]
MIGRATE = ["migrate"]
TOPICS = ["topics", "create"]
PRODUCE = ["produce-sample", "telemetry_metrics", "--count", "1"]


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stderr: str
    seconds: float


def cli(env: dict[str, str | None], args: list[str]) -> Outcome:
    """The command in this process (:func:`tests.support.cli.cli`), with ``env`` for the
    call: its exit status, its stderr, how long it ran."""
    started = time.monotonic()
    done = support_cli.cli(env, *args)
    return Outcome(done.returncode, done.stderr, time.monotonic() - started)


def as_a_user(env: dict[str, str | None], args: list[str]) -> Outcome:
    """The command as a user runs it (``python -m kafka_ingest.cli`` in a subprocess)."""
    started = time.monotonic()
    done = support_cli.as_a_user(env, *args)
    return Outcome(done.returncode, done.stderr, time.monotonic() - started)


def ended_within(result: Outcome, timeout_s: float, what: str) -> None:
    """The command (in this process: no interpreter start counted) ended within one wait of
    the configured time-out ``what`` and its own work: it waited out no default time-out
    and retried nothing."""
    bound = timeout_s + WORK_S
    assert result.seconds < bound, (f"took {result.seconds:.1f} s: more than one {what} "
                                    f"({timeout_s:.0f} s) and {WORK_S:.0f} s of work")


def the_line(result: Outcome, *expected: str) -> str:
    """The one ``kafka-ingest: ...`` line of a failure; it must say each of ``expected``."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("kafka-ingest: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kafka_config(bootstrap: str, **extra: Any) -> str:
    return json.dumps({"bootstrap.servers": bootstrap, "socket.timeout.ms": SOCKET_TIMEOUT_MS,
                       **extra})


def pipeline_on(topic: str, dlq_topic: str) -> Pipeline:
    body = load_pipelines()["telemetry_metrics"].model_dump(mode="json", exclude={"name"})
    body.update(topic=topic, dlq_topic=dlq_topic, partitions=1)
    return parse_pipelines({"pipelines": {"telemetry_metrics": body}})["telemetry_metrics"]


@pytest.fixture(scope="module")
def good(stack_env: dict[str, str], clients: KafkaClients,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str | None]]:
    """Settings that work: a migrated database of the module's own, a pipeline whose
    topics exist, Kafka with a short socket time-out. Each case breaks one thing."""
    tag = uuid.uuid4().hex[:8]
    pipeline = pipeline_on(f"src-{tag}", f"dlq-{tag}")
    ensure_topics(clients, {pipeline.topic: 1, pipeline.dlq_topic: 1})
    path = write_pipelines_file(tmp_path_factory.mktemp("cli") / "p.yaml", pipeline)
    try:
        with fresh_database(stack_env["KAFKA_INGEST_PG_DSN"], cloned=True) as dsn:
            yield {"KAFKA_INGEST_PIPELINES": str(path), "KAFKA_INGEST_PG_DSN": dsn,
                   "KAFKA_INGEST_PG_ADMIN_DSN": dsn, "KAFKA_BOOTSTRAP_SERVERS": None,
                   "KAFKA_INGEST_PG_GRANT_TO": None,
                   "KAFKA_INGEST_KAFKA_CONFIG": kafka_config(stack_env["KAFKA_BOOTSTRAP_SERVERS"])}
    finally:
        delete_topics(clients, [pipeline.topic, pipeline.dlq_topic])


def test_the_good_settings_work(good: dict[str, str | None]) -> None:
    # The cases below differ from these in one thing each, so that thing is what fails.
    for args in (MIGRATE, RUN, LAG, STATUS):
        result = cli(good, args)
        assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("args", [RUN, STATUS, REPLAY])
def test_a_missing_dsn_is_named(good: dict[str, str | None], args: list[str]) -> None:
    the_line(cli({**good, "KAFKA_INGEST_PG_DSN": None}, args),
             "set KAFKA_INGEST_PG_DSN (the pipelines' Postgres database")


def test_a_missing_owner_dsn_is_named(good: dict[str, str | None]) -> None:
    env = {**good, "KAFKA_INGEST_PG_DSN": None, "KAFKA_INGEST_PG_ADMIN_DSN": None}
    the_line(cli(env, MIGRATE), "set KAFKA_INGEST_PG_ADMIN_DSN or --dsn")


@pytest.mark.parametrize("args", [RUN, LAG, TOPICS, PRODUCE])
def test_a_kafka_config_that_is_not_json_is_named(good: dict[str, str | None],
                                                  args: list[str]) -> None:
    the_line(cli({**good, "KAFKA_INGEST_KAFKA_CONFIG": '{"bootstrap.servers": '}, args),
             "KAFKA_INGEST_KAFKA_CONFIG is not a JSON object")


@pytest.mark.parametrize(("setting", "named"), [
    ({"no.such.key": 1}, 'No such configuration property: "no.such.key"'),  # a typo
    ({"retry.backoff.ms": "soon"}, "Invalid value for configuration property"),
])
@pytest.mark.parametrize("args", [RUN, LAG, TOPICS])
def test_a_kafka_setting_librdkafka_refuses_is_named(good: dict[str, str | None],
                                                     args: list[str], setting: dict[str, Any],
                                                     named: str) -> None:
    config = {**json.loads(str(good["KAFKA_INGEST_KAFKA_CONFIG"])), **setting}
    the_line(cli({**good, "KAFKA_INGEST_KAFKA_CONFIG": json.dumps(config)}, args),
             named, "fix the Kafka connection's settings")


@pytest.mark.parametrize("args", [RUN, MIGRATE])
def test_a_dsn_libpq_cannot_parse_is_named_without_repeating_it(
        good: dict[str, str | None], args: list[str]) -> None:
    bad = "host=127.0.0.1 password=hunter two"  # libpq: missing "=" after "two"
    line = the_line(cli({**good, "KAFKA_INGEST_PG_DSN": bad, "KAFKA_INGEST_PG_ADMIN_DSN": bad},
                        args), "is not a connection string libpq can parse")
    assert "KAFKA_INGEST_PG" in line  # which setting
    assert "hunter" not in line and "two" not in line  # a password is never repeated


def test_a_pipelines_file_that_is_not_yaml_is_one_line(good: dict[str, str | None],
                                                       tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("pipelines: [\n")
    the_line(cli({**good, "KAFKA_INGEST_PIPELINES": str(tmp_path / "p.yaml")}, RUN),
             "not valid YAML", "line 2, column 1")


# --------------------------------------------------------------------------- Postgres


@pytest.mark.parametrize("args", [RUN, STATUS, MIGRATE, REPLAY])
def test_a_wrong_postgres_password_is_refused(good: dict[str, str | None],
                                              args: list[str]) -> None:
    assert good["KAFKA_INGEST_PG_DSN"] is not None
    wrong = make_conninfo(good["KAFKA_INGEST_PG_DSN"], password="not-the-password")
    line = the_line(cli({**good, "KAFKA_INGEST_PG_DSN": wrong,
                         "KAFKA_INGEST_PG_ADMIN_DSN": wrong}, args),
                    "Postgres refused the connection (authentication)",
                    "password authentication failed", "a retry cannot cure this")
    assert "not-the-password" not in line


@pytest.mark.parametrize("args", [RUN, BACKFILL, REPLAY, LAG, STATUS, RESET, MIGRATE])
def test_a_database_that_is_down_is_named(good: dict[str, str | None],
                                          args: list[str]) -> None:
    assert good["KAFKA_INGEST_PG_DSN"] is not None
    down = make_conninfo(good["KAFKA_INGEST_PG_DSN"], port=closed_port(),
                         connect_timeout=CONNECT_TIMEOUT_S)
    result = cli({**good, "KAFKA_INGEST_PG_DSN": down, "KAFKA_INGEST_PG_ADMIN_DSN": down},
                 args)
    the_line(result, "Postgres connect failed", "Connection refused")
    ended_within(result, CONNECT_TIMEOUT_S, "connect_timeout")


@pytest.mark.parametrize("args", [RUN, STATUS, MIGRATE])
@pytest.mark.parametrize(("port", "said"), [
    ("54x2", "is not a number from 1 to 65535"),  # a typo
    ("{port},{port}", "names 2 ports for 1 host(s)"),  # a standby's list, one host named
])
def test_a_port_libpq_cannot_use_is_a_setting_not_a_database_down(
        good: dict[str, str | None], args: list[str], port: str, said: str) -> None:
    assert good["KAFKA_INGEST_PG_DSN"] is not None
    params = conninfo_to_dict(good["KAFKA_INGEST_PG_DSN"])
    bad = make_conninfo(good["KAFKA_INGEST_PG_DSN"], port=port.format(port=params["port"]))
    result = cli({**good, "KAFKA_INGEST_PG_DSN": bad, "KAFKA_INGEST_PG_ADMIN_DSN": bad}, args)
    line = the_line(result, "KAFKA_INGEST_PG", said)
    assert "Postgres connect failed" not in line  # not a server to wait for


def test_a_port_error_never_repeats_a_password(good: dict[str, str | None]) -> None:
    # An unescaped "/" in the password: libpq takes "u" as the host, "xq7z" as the port.
    bad = "postgresql://kafka_ingest:xq7z/secret@127.0.0.1/kafka_ingest"
    line = the_line(cli({**good, "KAFKA_INGEST_PG_DSN": bad}, RUN), "is not a number")
    assert "xq7z" not in line and "secret" not in line


@pytest.mark.parametrize("args", [
    RUN,  # the plan pins the run's ranges: the first write
    ["backfill", "telemetry_metrics", "--partition", "0", "--from-offset", "0",
     "--to-offset", "10"],
    RESET,
])
def test_a_session_that_takes_no_writes_says_how_to_reach_the_primary(
        good: dict[str, str | None], make_pipeline: Any, clients: KafkaClients,
        tmp_path: Path, args: list[str]) -> None:
    # What a standby answers, made on the primary: every transaction of the session
    # read-only. Transient (a standby being promoted takes writes moments later); the
    # line says what to change when it is not that.
    pipeline = make_pipeline("telemetry_metrics", partitions=1)
    produce_sample(clients, pipeline, count=10, poison=0, partitions=1)
    assert good["KAFKA_INGEST_PG_DSN"] is not None
    read_only = make_conninfo(good["KAFKA_INGEST_PG_DSN"],
                              options="-c default_transaction_read_only=on")
    env = {**good, "KAFKA_INGEST_PG_DSN": read_only,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline))}
    the_line(cli(env, args), "ReadOnlySqlTransaction: cannot execute",
             "in a read-only transaction", "point the DSN at the primary",
             "target_session_attrs=read-write")


# --------------------------------------------------------------------------- exporter


def test_an_exporter_port_in_use_is_named_with_the_fix(good: dict[str, str | None]) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = cli(good, ["exporter", "--port", str(port)])
    the_line(result, f"the exporter cannot listen on 127.0.0.1:{port}",
             "Address already in use", "--port")


# --------------------------------------------------------------------------- Kafka


@pytest.mark.parametrize("args", [
    # planned: the planner's metadata requests
    pytest.param(RUN, id="run"),
    pytest.param(BACKFILL, id="backfill"),
    pytest.param(REPLAY, id="replay-dlq"),
    # the operator's views and tools
    pytest.param(LAG, id="lag"),
    pytest.param(RESET, id="reset-offsets"),
    pytest.param(TOPICS, id="topics-create"),
    pytest.param(PRODUCE, id="produce-sample"),
])
def test_a_broker_that_is_down_fails_within_the_socket_timeout(
        good: dict[str, str | None], args: list[str]) -> None:
    config = kafka_config(f"127.0.0.1:{closed_port()}")
    result = cli({**good, "KAFKA_INGEST_KAFKA_CONFIG": config}, args)
    the_line(result, "Kafka", "failed", "Broker transport failure")
    ended_within(result, KafkaClients(json.loads(config)).request_timeout_s,
                 "socket.timeout.ms")


@pytest.mark.parametrize("args", [RUN, BACKFILL, REPLAY, LAG, RESET])
def test_a_missing_topic_is_named_with_the_fix(good: dict[str, str | None], tmp_path: Path,
                                               args: list[str]) -> None:
    tag = uuid.uuid4().hex[:8]
    pipeline = pipeline_on(f"never-created-{tag}", f"never-created-dlq-{tag}")
    env = {**good, "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml",
                                                                       pipeline))}
    the_line(cli(env, args), "does not exist on the cluster", "never-created-",
             "kafka-ingest topics create")


# --------------------------------------------------------------------------- secure stack


@pytest.fixture(scope="module")
def secure_env(stack_env: dict[str, str]) -> dict[str, str]:
    stack.up(secure=True)  # a no-op when the test command started the stack secure
    return stack.env(secure=True)


@pytest.fixture(scope="module")
def as_app(good: dict[str, str | None], secure_env: dict[str, str]) -> dict[str, str | None]:
    """The good settings, but Postgres as the runtime role, to which nothing was granted
    in this database (its owner migrated it with no --grant-to)."""
    assert good["KAFKA_INGEST_PG_DSN"] is not None
    dbname = conninfo_to_dict(good["KAFKA_INGEST_PG_DSN"])["dbname"]
    app = make_conninfo(secure_env["KAFKA_INGEST_PG_DSN"], dbname=dbname)
    return {**good, "KAFKA_INGEST_PG_DSN": app, "KAFKA_INGEST_PG_ADMIN_DSN": None}


@pytest.mark.parametrize(("args", "denied"), [
    (RUN, "permission denied for table run_plans"),  # planning pins the run's ranges
    (BACKFILL, "permission denied for table run_plans"),
    (REPLAY, "permission denied for table run_plans"),
    (STATUS, "permission denied for table"),
    (LAG, "permission denied for table ingest_offsets"),
    (RESET, "permission denied for table ingest_offsets"),
])
def test_a_missing_privilege_names_the_object_the_role_and_the_fix(
        as_app: dict[str, str | None], args: list[str], denied: str) -> None:
    the_line(cli(as_app, args), f"Postgres denied role '{stack.PG_APP_ROLE}' a privilege",
             denied, f"kafka-ingest migrate --grant-to {stack.PG_APP_ROLE}")


def test_migrating_as_the_runtime_role_says_to_use_the_owner(
        as_app: dict[str, str | None]) -> None:
    # Without KAFKA_INGEST_PG_ADMIN_DSN, migrate runs as KAFKA_INGEST_PG_DSN's role, which
    # may not create tables: granting it would not be the fix, the owner's DSN is.
    line = the_line(cli(as_app, MIGRATE), f"role '{stack.PG_APP_ROLE}'",
                    "permission denied for schema public", "KAFKA_INGEST_PG_ADMIN_DSN")
    assert "--grant-to" not in line


def test_granting_a_role_that_does_not_exist_is_named(good: dict[str, str | None]) -> None:
    the_line(cli({**good, "KAFKA_INGEST_PG_GRANT_TO": "no_such_role"}, MIGRATE),
             "role 'no_such_role' does not exist")


def test_a_wrong_sasl_password_is_refused(as_app: dict[str, str | None],
                                          secure_env: dict[str, str]) -> None:
    config = {**json.loads(secure_env["KAFKA_INGEST_KAFKA_CONFIG"]),
              "sasl.password": "not-the-password"}
    result = cli({**as_app, "KAFKA_INGEST_KAFKA_CONFIG": json.dumps(config)}, LAG)
    line = the_line(result, "Kafka", "refused", "Authentication failed")
    assert "not-the-password" not in line


# ------------------------------------------------- each kind of object, on the real path


DENIED = f"Postgres denied role '{stack.PG_APP_ROLE}' a privilege: "


@pytest.mark.parametrize(("revoke", "denied"), [
    # read by the planner, on a connection of its own
    ("REVOKE SELECT ON run_plans FROM {app}", DENIED + "permission denied for table run_plans"),
    # a schema the role may not use: Postgres hides its tables ("does not exist")
    ("REVOKE USAGE ON SCHEMA public FROM PUBLIC, {app}",
     f'relation "run_plans" does not exist; create the schema with `kafka-ingest migrate`, '
     f"or, if it was migrated, role '{stack.PG_APP_ROLE}' may not use the schema"),
    # written by the slices, each in a worker process of its own (--workers 2): the error
    # crosses the process boundary intact, the role it ran as included
    ("REVOKE INSERT ON telemetry_metrics FROM {app}",
     DENIED + "permission denied for table telemetry_metrics"),
    ("REVOKE USAGE ON ALL SEQUENCES IN SCHEMA public FROM {app}",
     DENIED + "permission denied for sequence ingest_runs_id_seq"),
    ("REVOKE TEMPORARY ON DATABASE {db} FROM PUBLIC, {app}",  # the staging tables
     DENIED + "permission denied to create temporary tables in database"),
])
def test_each_missing_privilege_is_named_on_the_run_path(
        secure_env: dict[str, str], clients: KafkaClients, make_pipeline: Any, pg_dsn: str,
        tmp_path: Path, revoke: str, denied: str) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=2)
    produce_sample(clients, pipeline, count=40, poison=0, partitions=2)
    dbname = str(conninfo_to_dict(pg_dsn)["dbname"])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        grant_runtime(conn, stack.PG_APP_ROLE, [pipeline.table])
        conn.execute(revoke.format(app=stack.PG_APP_ROLE, db=dbname))  # type: ignore[arg-type]
    env: dict[str, str | None] = {
        "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
        "KAFKA_INGEST_PG_DSN": make_conninfo(secure_env["KAFKA_INGEST_PG_DSN"], dbname=dbname),
        "KAFKA_BOOTSTRAP_SERVERS": None,
        "KAFKA_INGEST_KAFKA_CONFIG": json.dumps({"bootstrap.servers":
                                                 clients.config["bootstrap.servers"]})}
    the_line(cli(env, ["run", pipeline.name, "--workers", "2"]), denied,
             f"kafka-ingest migrate --grant-to {stack.PG_APP_ROLE}")


# ------------------------------------------------ each class of error, as a user runs it


def _setting(good: dict[str, str | None], _: pytest.FixtureRequest) -> Any:
    return {**good, "KAFKA_INGEST_PG_DSN": None}, RUN, [
        "set KAFKA_INGEST_PG_DSN (the pipelines' Postgres database"]


def _refused(good: dict[str, str | None], _: pytest.FixtureRequest) -> Any:
    wrong = make_conninfo(str(good["KAFKA_INGEST_PG_DSN"]), password="not-the-password")
    return {**good, "KAFKA_INGEST_PG_DSN": wrong}, STATUS, [
        "Postgres refused the connection (authentication)", "a retry cannot cure this"]


def _database_down(good: dict[str, str | None], _: pytest.FixtureRequest) -> Any:
    down = make_conninfo(str(good["KAFKA_INGEST_PG_DSN"]), port=closed_port())
    return {**good, "KAFKA_INGEST_PG_DSN": down}, RUN, [
        "Postgres connect failed", "Connection refused"]


def _broker_down(good: dict[str, str | None], _: pytest.FixtureRequest) -> Any:
    config = kafka_config(f"127.0.0.1:{closed_port()}")
    return {**good, "KAFKA_INGEST_KAFKA_CONFIG": config}, LAG, [
        "Kafka", "failed", "Broker transport failure"]


def _missing_topic(good: dict[str, str | None], request: pytest.FixtureRequest) -> Any:
    tag = uuid.uuid4().hex[:8]
    path = request.getfixturevalue("tmp_path") / "p.yaml"
    pipeline = pipeline_on(f"never-created-{tag}", f"never-created-dlq-{tag}")
    return {**good, "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(path, pipeline))}, \
        RUN, ["does not exist on the cluster", "kafka-ingest topics create"]


def _privilege(good: dict[str, str | None], request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("as_app"), LAG, [
        f"Postgres denied role '{stack.PG_APP_ROLE}' a privilege",
        f"kafka-ingest migrate --grant-to {stack.PG_APP_ROLE}"]


def _exporter_port(good: dict[str, str | None], request: pytest.FixtureRequest) -> Any:
    held = socket.socket()
    request.addfinalizer(held.close)
    held.bind(("127.0.0.1", 0))
    held.listen()
    return good, ["exporter", "--port", str(held.getsockname()[1])], [
        "the exporter cannot listen on", "Address already in use"]


@pytest.mark.parametrize("case", [_setting, _refused, _database_down, _broker_down,
                                  _missing_topic, _privilege, _exporter_port],
                         ids=lambda case: case.__name__.strip("_").replace("_", "-"))
def test_each_class_of_error_as_a_user_runs_the_command(
        good: dict[str, str | None], request: pytest.FixtureRequest, case: Any) -> None:
    env, args, expected = case(good, request)
    result = as_a_user(env, args)
    the_line(result, *expected)
    # librdkafka logs each failed connection attempt (about twenty a second): once is
    # enough, through Python logging, never as librdkafka's own "%3|1796...|FAIL|" lines
    logged = [line.split(" ", 2)[-1] for line in result.stderr.splitlines()]
    assert len(logged) == len(set(logged)), result.stderr[-3000:]
    assert not re.search(r"^%\d\|", result.stderr, re.MULTILINE), result.stderr[-3000:]
