"""The operator CLI reads its settings from the environment only: a missing one is an
error naming the variable, never a fallback to a local address or credential."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kafka_ingest.cli import grant_target, main

SETTINGS = ("KAFKA_INGEST_KAFKA_CONFIG", "KAFKA_BOOTSTRAP_SERVERS", "KAFKA_INGEST_PG_DSN",
            "KAFKA_INGEST_PG_ADMIN_DSN")


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("KAFKA_INGEST_PIPELINES", raising=False)  # the shipped pipelines


@pytest.mark.parametrize(("argv", "message"), [
    # Kafka is needed first: both ways to give it are named
    (["run", "telemetry_metrics"],
     "set KAFKA_INGEST_KAFKA_CONFIG or KAFKA_BOOTSTRAP_SERVERS (the Kafka cluster to use)"),
    (["lag"], "set KAFKA_INGEST_KAFKA_CONFIG or KAFKA_BOOTSTRAP_SERVERS"),
    # only the database is needed
    (["migrate"], "set KAFKA_INGEST_PG_ADMIN_DSN or --dsn (the schema owner's Postgres database"),
    (["status"], "set KAFKA_INGEST_PG_DSN"),
])
def test_a_missing_setting_is_named(no_settings: None, argv: list[str], message: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_database_is_named_when_kafka_is_given(no_settings: None,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    assert main(["run", "telemetry_metrics"]) == 2
    assert "set KAFKA_INGEST_PG_DSN" in capsys.readouterr().err


@pytest.mark.parametrize("raw", ["not json", "[1, 2]"])
def test_a_kafka_config_that_is_not_a_json_object_is_refused(
        no_settings: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        raw: str) -> None:
    monkeypatch.setenv("KAFKA_INGEST_KAFKA_CONFIG", raw)
    monkeypatch.setenv("KAFKA_INGEST_PG_DSN", "postgresql://u@127.0.0.1:1/db")
    assert main(["run", "telemetry_metrics"]) == 2
    assert "KAFKA_INGEST_KAFKA_CONFIG is not a JSON object" in capsys.readouterr().err


def test_the_dev_commands_come_from_the_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    # kafka_ingest_dev is installed in development: its commands are offered.
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "stack" in out and "demo" in out and "produce-sample" in out


def test_pools_needs_no_setting_and_prints_what_airflow_pools_import_reads(
        no_settings: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    body = {"contract": {"event_type": "metric_event", "version": 2}, "table": "t_rows",
            "pool": "pg_writers"}
    doc = {"pipelines": {"a": {**body, "topic": "a", "dlq_topic": "a-dlq", "pool_slots": 3},
                         "b": {**body, "topic": "b", "dlq_topic": "b-dlq"}}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES", str(tmp_path / "p.yaml"))
    assert main(["pools"]) == 0
    assert json.loads(capsys.readouterr().out) == {"pg_writers": {
        "slots": 3, "include_deferred": False, "description": "kafka-ingest: slices of a, b"}}


@pytest.mark.parametrize(("given", "env", "expected"), [
    # `stack env --secure` names the runtime role: a plain `migrate` grants it
    (None, "kafka_ingest_app", ("kafka_ingest_app", "KAFKA_INGEST_PG_GRANT_TO")),
    # a deployment says it on the command line, whatever the environment holds
    ("pipelines_rt", "kafka_ingest_app", ("pipelines_rt", "--grant-to")),
    # empty (the plaintext stack's value), or given empty: grant nothing
    (None, "", (None, "KAFKA_INGEST_PG_GRANT_TO")),
    ("", "kafka_ingest_app", (None, "--grant-to")),
    (None, None, (None, "KAFKA_INGEST_PG_GRANT_TO")),
])
def test_migrate_grants_to_the_role_the_environment_names_unless_told(
        monkeypatch: pytest.MonkeyPatch, given: str | None, env: str | None,
        expected: tuple[str | None, str]) -> None:
    if env is None:
        monkeypatch.delenv("KAFKA_INGEST_PG_GRANT_TO", raising=False)
    else:
        monkeypatch.setenv("KAFKA_INGEST_PG_GRANT_TO", env)
    assert grant_target(given) == expected


#: Imported only by the commands that use them: together a quarter of every command's start.
ON_DEMAND = ("confluent_kafka.schema_registry", "authlib", "prometheus_client")


def test_a_command_imports_the_registry_client_and_prometheus_only_when_it_uses_them() -> None:
    """``kafka-ingest`` imports the runtime, not the registry client (0.2 s of
    CPU with authlib and cryptography) nor prometheus_client: a pipeline without a registry
    and every command but ``exporter`` never pay for them. A registry client made imports
    it, and its errors are still told apart from an HTTP library's."""
    prefixes = tuple(m + "." for m in ON_DEMAND)
    script = f"""
import json, sys
import kafka_ingest, kafka_ingest.cli.main
start = sorted(m for m in sys.modules if (m + '.').startswith({prefixes!r}))
from kafka_ingest.kafka.registry import RegistrySettings, SchemaRegistry, map_registry_error
before = type(map_registry_error("x", ConnectionRefusedError("refused"))).__name__
SchemaRegistry(RegistrySettings(config={{"url": "http://127.0.0.1:1"}}))
from confluent_kafka.schema_registry.error import SchemaRegistryError
after = type(map_registry_error("x", SchemaRegistryError(503, 50003, "down"))).__name__
print(json.dumps([start, "confluent_kafka.schema_registry" in sys.modules, before, after]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    start, loaded, before, after = json.loads(done.stdout)
    assert start == []
    assert loaded
    assert (before, after) == ("RegistryUnavailable", "RegistryUnavailable")
