"""What ``stack up --replica`` writes into each Postgres node's settings, from the files
that say each node's role: a standby streams from the other node through the slot (not
while replication is paused), a primary waits for its standby only under ``--sync`` and
only once a standby exists; the primary moves with ``stack failover``'s marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_ingest_dev import stack
from kafka_ingest_dev.stack import postgres


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> stack.Settings:
    monkeypatch.setenv("KAFKA_INGEST_STATE_DIR", str(tmp_path))
    monkeypatch.delenv(stack.INSTANCE_VARIABLE, raising=False)  # the stack's own Airflow
    monkeypatch.setenv("KAFKA_INGEST_PG_PORT", "25432")
    monkeypatch.setenv("KAFKA_INGEST_PG_STANDBY_PORT", "25434")
    s = stack.settings()
    for node in s.pg_nodes:
        node.data.mkdir(parents=True)
        (node.data / "PG_VERSION").write_text("15\n")
    return s


def _lines(s: stack.Settings, node: stack.PgNode) -> set[str]:
    return set(postgres.config(s, node).splitlines())


def test_a_standby_streams_from_the_primary_through_its_slot(settings: stack.Settings) -> None:
    primary, standby = settings.pg_nodes
    settings.replica_marker.write_text("async\n")
    (standby.data / "standby.signal").touch()
    got = _lines(settings, standby)
    assert "port = 25434" in got
    assert (f"primary_conninfo = 'host={primary.socket_dir} port=25432 user=postgres "
            f"application_name={stack.STANDBY_NAME}'") in got
    assert f"primary_slot_name = '{stack.STANDBY_NAME}'" in got
    assert not any(line.startswith("synchronous") for line in _lines(settings, primary))


def test_sync_makes_the_primary_wait_for_its_standby_only_while_it_runs(
        settings: stack.Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    primary, standby = settings.pg_nodes
    settings.replica_marker.write_text("sync\n")
    assert not any(line.startswith("synchronous") for line in _lines(settings, primary))
    (standby.data / "standby.signal").touch()
    # not running: no commit may wait for it (remote_apply has no time-out)
    assert not any(line.startswith("synchronous") for line in _lines(settings, primary))
    monkeypatch.setattr(stack.PgNode, "pid", lambda node: 4242)  # the standby runs
    assert {f"synchronous_standby_names = '{stack.STANDBY_NAME}'",
            "synchronous_commit = remote_apply"} <= _lines(settings, primary)


def test_a_paused_standby_has_no_primary_to_stream_from(settings: stack.Settings) -> None:
    _, standby = settings.pg_nodes
    settings.replica_marker.write_text("async\n")
    (standby.data / "standby.signal").touch()
    (standby.home / "replication-paused").write_text("paused\n")
    assert "primary_conninfo = ''" in _lines(settings, standby)


def test_after_a_failover_the_other_node_is_the_primary_everyone_is_pointed_at(
        settings: stack.Settings) -> None:
    first, second = settings.pg_nodes
    assert stack.primary_node(settings) == first
    (settings.state / "postgres-primary").write_text(f"{second.name}\n")
    assert stack.primary_node(settings) == second
    settings.replica_marker.write_text("async\n")
    env = stack.env()
    assert "port=25434" in env["KAFKA_INGEST_PG_DSN"] and env["PGPORT"] == "25434"
    assert "127.0.0.1:25434/airflow" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    both = stack.env(replica=True)
    assert "port=25432,25434" in both["KAFKA_INGEST_PG_DSN"]
    assert "target_session_attrs=read-write" in both["KAFKA_INGEST_PG_ADMIN_DSN"]
    assert both["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith(
        "/airflow?host=127.0.0.1:25432&host=127.0.0.1:25434&target_session_attrs=read-write")


def test_env_replica_without_a_standby_says_how_to_get_one(settings: stack.Settings) -> None:
    with pytest.raises(stack.StackError, match="stack up --replica"):
        stack.env(replica=True)
