"""The environment the local stack's processes start with, and its own libpq connections:
neither reads the user's libpq variables (``stack env --replica`` exports
``PGPORT=15432,15434``, which made the failover's rebuilt standby refuse to start)."""

from __future__ import annotations

import ast

import psycopg
import pytest

from kafka_ingest_dev.procs import LIBPQ_VARIABLES, child_env, own_libpq
from tests.support import ROOT

DEV_PACKAGE = ROOT / "include" / "kafka_ingest_dev"

#: What ``eval "$(kafka-ingest stack env --replica --secure)"`` leaves in a shell, and the
#: variables the issue names besides (PGSERVICE, PGOPTIONS), and PGDATA, which postgres,
#: pg_ctl and initdb read themselves.
SHELL = {
    "PGHOST": "127.0.0.1,127.0.0.1", "PGPORT": "15432,15434", "PGUSER": "kafka_ingest_app",
    "PGPASSWORD": "secret", "PGDATABASE": "kafka_ingest", "PGSSLMODE": "verify-full",
    "PGSSLROOTCERT": "/tmp/ca.pem", "PGTARGETSESSIONATTRS": "read-write",
    "PGSERVICE": "mine", "PGOPTIONS": "-c default_transaction_read_only=on",
    "PGDATA": "/somewhere/else",
}


def test_child_env_leaves_out_the_users_libpq_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", "/state")
    env = child_env()
    assert not set(SHELL) & set(env), sorted(set(SHELL) & set(env))
    assert env["KAFKA_INGEST_STATE_DIR"] == "/state"  # everything else is kept
    assert env["PATH"]


def test_a_variable_the_stack_sets_on_purpose_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPORT", "15432,15434")
    env = child_env({"PGPORT": "15432", "GOBIN": "/bin"}, None, {"GOBIN": "/cache/bin"})
    assert (env["PGPORT"], env["GOBIN"]) == ("15432", "/cache/bin")  # later layers win


def test_the_list_has_every_variable_the_installed_libpq_reads() -> None:
    # A newer libpq that reads one more variable fails this, so the list is extended.
    read = {o.envvar.decode() for o in psycopg.pq.Conninfo.get_defaults() if o.envvar}
    assert "PGTARGETSESSIONATTRS" in read and len(read) > 30
    assert read <= LIBPQ_VARIABLES, sorted(read - LIBPQ_VARIABLES)


def test_every_process_the_dev_package_starts_gets_an_environment_of_its_own() -> None:
    # subprocess.run/Popen without env= hand the child this process's environment, the
    # user's libpq variables included; the stack's processes pass child_env(...) (or an
    # environment built from it by the caller).
    calls = []
    for path in sorted(DEV_PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("run", "Popen")
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "subprocess"):
                env = next((k.value for k in node.keywords if k.arg == "env"), None)
                calls.append((f"{path.relative_to(DEV_PACKAGE)}:{node.lineno}",
                              None if env is None else ast.unparse(env)))
    assert len(calls) >= 12, calls  # the walk finds them (fewer: a walk that misses some)
    bare = [(where, env) for where, env in calls if env is None or "os.environ" in env]
    assert bare == []
    # Every service (Kafka's nodes, the registry, Toxiproxy, Prometheus, Redis, Airflow's
    # services) starts through LocalService.spawn: its one Popen layers on child_env.
    assert [env for where, env in calls if where.startswith("service.py")] == [
        "child_env(*env)"]


def test_own_libpq_pins_what_a_set_variable_would_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PGHOSTADDR", "10.0.0.9")
    pinned = own_libpq(host="/run/pg", port=15434, user="postgres", dbname="postgres")
    # given: kept as given
    assert (pinned["host"], pinned["port"], pinned["user"]) == ("/run/pg", 15434, "postgres")
    # the standby answers an admin connection; no read-only session, no other address
    assert pinned["target_session_attrs"] == "any"
    assert (pinned["options"], pinned["hostaddr"], pinned["sslrootcert"]) == ("", "", "")
    assert pinned["sslmode"] == "prefer"  # libpq's own default
    assert "service" not in pinned  # no neutral value: left to libpq


def test_own_libpq_adds_nothing_when_no_variable_is_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LIBPQ_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert own_libpq(host="h", port=1) == {"host": "h", "port": 1}
