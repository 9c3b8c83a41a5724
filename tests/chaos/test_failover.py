"""Postgres fails over (``stack up --replica``, ``stack failover``): the primary is
SIGKILLed in the middle of a slice and its standby promoted, every client on the
multi-host connection string (``target_session_attrs=read-write``) moving to it.

With asynchronous replication the transactions the old primary acknowledged last are
gone on the new one. The offsets live in the same transactions as the rows, so they
roll back together: the new primary holds the rows of exactly the offsets it stores, and
the next run re-reads what was lost. The Kafka group offset, posted after each commit,
is then ahead of the stored one; the lag shown comes from the stored offset. With
synchronous replication (``remote_apply``) nothing acknowledged is lost.

The module runs on a stack of its own (its own state dir and free ports: failing the
shared stack's Postgres over would cut every other test's connections), taken down at the
end, and with this process's environment what docs/faults.md's shell has after
``eval "$(kafka-ingest stack env --replica)"`` (``PGPORT=15432,15434`` and the rest): the
servers and tools a failover starts must not read those. Each test ends with the
invariants checked exactly (DESIGN §3).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.engine import slices
from kafka_ingest.engine.ingest import ingest_range, plan_run
from kafka_ingest.engine.replay import run_replay
from kafka_ingest.errors import DatabaseUnavailable, TransientError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.ops.lag import lag
from kafka_ingest.requests import LiveRun, OffsetWindow, ReplayFilters, ReplayRequest
from kafka_ingest_dev import stack
from kafka_ingest_dev.databases import fresh_database
from kafka_ingest_dev.samples import produce_sample
from kafka_ingest_dev.stack.standby import kill_postmaster
from tests.support.airflow_api import poll
from tests.support.ingest import (
    Expected,
    assert_invariants,
    dead_letter_rows,
    execute,
    expected_from_sample,
    group_offsets,
    highs,
    produce,
    query,
    row_provenance,
    run,
    stored_offsets,
    versioned_metric,
    with_version,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

COUNT = 6_000  # 2,000 per partition: four chunks each
CHUNK = 500


@pytest.fixture(scope="module")
def replica_env() -> Iterator[dict[str, str]]:
    """A stack of its own with an asynchronous standby, then this process's environment
    exported from ``stack env --replica`` as docs/faults.md's failover section does; the stack
    is taken down and removed afterwards. The state dir is a mkdtemp directly under /tmp:
    as root the ``postgres`` user must traverse every parent."""
    state = Path(tempfile.mkdtemp(prefix="kafka-ingest-failover-"))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in stack.isolated_env(state).items():
            mp.setenv(name, value)
        try:
            stack.up(report=print, replica="async")
            shell = stack.env(replica=True)
            for name, value in shell.items():
                mp.setenv(name, value)
            # What made the old primary's rebuild fail: no server can listen on this.
            assert "," in os.environ["PGPORT"] and os.environ["PGTARGETSESSIONATTRS"]
            yield shell
        finally:
            try:
                stack.down(report=print)
            finally:
                shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def kafka_config(replica_env: dict[str, str]) -> dict[str, Any]:
    """The module's own stack's Kafka (the shared stack's is not started for it)."""
    return {"bootstrap.servers": replica_env["KAFKA_BOOTSTRAP_SERVERS"]}


@pytest.fixture(scope="module")
def clients(kafka_config: dict[str, Any]) -> KafkaClients:
    return KafkaClients(kafka_config)


@pytest.fixture
def pg_dsn(replica_env: dict[str, str]) -> Iterator[str]:
    """A fresh database reached through both nodes' addresses."""
    with fresh_database(replica_env["KAFKA_INGEST_PG_ADMIN_DSN"]) as dsn:
        assert "target_session_attrs=read-write" in dsn
        yield dsn


@pytest.fixture
def db(pg_dsn: str) -> Database:
    return Database(pg_dsn, lock_timeout_s=5.0)


@pytest.fixture
def sync_replication(replica_env: dict[str, str]) -> Iterator[None]:
    stack.up(replica="sync")
    try:
        yield
    finally:
        stack.up(replica="async")


def _produce(clients: KafkaClients, pipeline: Pipeline) -> Expected:
    sample = produce_sample(clients, pipeline, count=COUNT, poison=1)
    return expected_from_sample(pipeline, sample, count=COUNT, poison=1)


class FailoverAt:
    """A chunk hook: after the ``pause_after``-th commit the standby stops receiving WAL
    (None: it never does), after the ``fail_after``-th the primary is killed and the
    standby promoted, in the writer's thread, so the slice's next transaction meets the
    dead connection. It records the stored offsets the old primary acknowledged."""

    def __init__(self, dsn: str, pipeline: Pipeline, *, fail_after: int,
                 pause_after: int | None = None) -> None:
        self.dsn, self.pipeline = dsn, pipeline
        self.fail_after, self.pause_after = fail_after, pause_after
        self.commits = 0
        self.acknowledged: dict[int, int] = {}
        self.rows_acknowledged = 0
        self.done: stack.Failover | None = None
        self.failed_over_at = 0.0
        self.lock = threading.Lock()

    def __call__(self, stage: str) -> None:
        if stage != "db_committed":
            return
        with self.lock:
            self.commits += 1
            if self.commits == self.pause_after:
                stack.pause_replication()
            if self.commits == self.fail_after:
                self.acknowledged = stored_offsets(self.dsn, self.pipeline)
                self.rows_acknowledged = len(row_provenance(self.dsn, self.pipeline.table))
                self.done = stack.failover()
                self.failed_over_at = time.monotonic()


def _failover_mid_run(pipeline: Pipeline, clients: KafkaClients, db: Database,
                      monkeypatch: pytest.MonkeyPatch, hook: FailoverAt) -> None:
    """A run whose primary is killed part way: the slice meets the dead connection and
    fails as an infrastructure error (for Airflow to retry), nothing dead-lettered."""
    ranges = plan_run(pipeline, clients, db, run_id="failover")
    monkeypatch.setattr(slices, "CHUNK_HOOK", hook)
    with pytest.raises(TransientError):
        for rng in ranges:
            ingest_range(pipeline, rng, clients, db, run_id="failover")
    monkeypatch.setattr(slices, "CHUNK_HOOK", None)
    assert hook.done is not None, "the run ended before the failover"
    assert stack.primary_node(stack.settings()).name == hook.done.promoted


def _rows_match_offsets(dsn: str, pipeline: Pipeline) -> dict[int, int]:
    """Rows and stored offsets agree: every row comes from an offset below its partition's
    stored one; returns the rows per partition."""
    stored = stored_offsets(dsn, pipeline)
    per_partition: dict[int, int] = {}
    for _, partition, offset in row_provenance(dsn, pipeline.table):
        assert offset < stored.get(partition, 0), (partition, offset, stored)
        per_partition[partition] = per_partition.get(partition, 0) + 1
    return per_partition


def test_async_failover_loses_rows_and_offsets_together_and_the_next_run_rereads_them(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, db: Database,
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    # The standby stops receiving after the first chunk; two more are acknowledged by
    # the old primary only, then it dies.
    hook = FailoverAt(pg_dsn, pipeline, pause_after=1, fail_after=3)
    _failover_mid_run(pipeline, clients, db, monkeypatch, hook)

    partition = 0  # the first slice: the plan stored every partition's start (0)
    assert hook.acknowledged == {0: 3 * CHUNK, 1: 0, 2: 0}
    assert hook.done is not None and (hook.done.unapplied_bytes or 0) > 0
    # What the new primary has: the first chunk, its rows and its offset, together.
    stored = stored_offsets(pg_dsn, pipeline)
    assert stored == {0: CHUNK, 1: 0, 2: 0}
    rows = _rows_match_offsets(pg_dsn, pipeline)
    assert 0 < sum(rows.values()) < hook.rows_acknowledged
    lost_rows = hook.rows_acknowledged - sum(rows.values())
    print(f"async failover: 2 chunk transactions lost, {lost_rows} rows with their offsets; "
          f"{hook.done.line()}")
    assert query(pg_dsn, "SELECT count(*) FROM ingest_runs")[0][0] == 1
    # The group offset was posted after the lost commits: ahead of the stored one. The
    # lag shown is the stored offset's (the truth), not the group's.
    assert (group_offsets(clients, pipeline)[partition] or 0) > CHUNK
    end = highs(clients, pipeline.topic)
    shown = {r.partition: r for r in lag(pipeline, clients, db)}
    assert shown[partition].lag == end[partition] - CHUNK
    group_lag = shown[partition].group_lag
    assert group_lag is not None and group_lag < shown[partition].lag

    reports = run(pipeline, clients, db)  # the next run, on the new primary
    reread = {r.partition: r.read for r in reports}
    assert reread[partition] == end[partition] - CHUNK  # the lost chunks read again
    print(f"async failover: recovered {time.monotonic() - hook.failed_over_at:.1f} s after "
          f"the promotion, {reread[partition]} messages of partition {partition} re-read")
    # The lost chunks' pills reached the DLQ topic before their transaction was lost:
    # the topic may hold them twice (same letter id), the dead_letters table once.
    assert_invariants(pipeline, clients, pg_dsn, expected, dlq_exactly_once=False)
    assert run(pipeline, clients, db) == []


@pytest.mark.usefixtures("sync_replication")
def test_sync_failover_loses_nothing_acknowledged(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, db: Database,
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    hook = FailoverAt(pg_dsn, pipeline, fail_after=3)
    _failover_mid_run(pipeline, clients, db, monkeypatch, hook)

    partition = 0
    assert hook.acknowledged == {0: 3 * CHUNK, 1: 0, 2: 0}
    assert stored_offsets(pg_dsn, pipeline) == hook.acknowledged  # nothing lost
    rows = _rows_match_offsets(pg_dsn, pipeline)
    assert sum(rows.values()) == hook.rows_acknowledged
    assert hook.done is not None
    print(f"sync failover: nothing lost; {hook.done.line()}")

    reports = run(pipeline, clients, db)
    end = highs(clients, pipeline.topic)
    assert {r.partition: r.read for r in reports}[partition] == end[partition] - 3 * CHUNK
    assert_invariants(pipeline, clients, pg_dsn, expected)


def test_failover_during_a_backfill_then_the_backfill_again_is_exact(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, db: Database,
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    run(pipeline, clients, db)
    assert_invariants(pipeline, clients, pg_dsn, expected)
    # The table loses its rows (a bad deploy, a restore): a backfill re-reads everything.
    execute(pg_dsn, f"DELETE FROM {pipeline.table}")
    end = highs(clients, pipeline.topic)
    window = OffsetWindow(partitions={p: (0, hi) for p, hi in end.items()})
    ranges = plan_run(pipeline, clients, db, run_id="backfill", request=window)
    hook = FailoverAt(pg_dsn, pipeline, pause_after=1, fail_after=3)
    monkeypatch.setattr(slices, "CHUNK_HOOK", hook)
    with pytest.raises(TransientError):
        for rng in ranges:
            ingest_range(pipeline, rng, clients, db, run_id="backfill")
    monkeypatch.setattr(slices, "CHUNK_HOOK", None)
    assert hook.done is not None
    assert stored_offsets(pg_dsn, pipeline) == end  # a backfill moves no cursor
    assert 0 < len(row_provenance(pg_dsn, pipeline.table)) < hook.rows_acknowledged

    again = run(pipeline, clients, db, request=window)
    assert sum(r.read for r in again) == sum(end.values())
    assert_invariants(pipeline, clients, pg_dsn, expected)


def test_failover_during_a_dlq_replay_then_the_replay_again_is_exact(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, db: Database,
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ingested under metric_event v1 while producers already send v2: the v2 events are
    # parked as unknown_version; the contract moves to v2 and the DLQ is replayed.
    v1 = make_pipeline("telemetry_metrics", partitions=2, chunk_size=10,
                       contract={"event_type": "metric_event", "version": 1})
    v2 = with_version(v1, 2)
    tag = uuid.uuid4().hex[:6]
    good = [f"{tag}-good-{i}" for i in range(40)]
    fixable = [f"{tag}-v2-{i}" for i in range(80)]
    for partition in (0, 1):
        produce(clients, v1.topic,
                [(b"k", versioned_metric(e, version=1)) for e in good[partition::2]]
                + [(b"k", versioned_metric(e, version=2)) for e in fixable[partition::2]],
                partition=partition)
    run(v1, clients, db)
    assert len(dead_letter_rows(pg_dsn, v1)) == len(fixable)

    hook = FailoverAt(pg_dsn, v1, pause_after=1, fail_after=3)  # 40 letters: 4 chunks each
    monkeypatch.setattr(slices, "CHUNK_HOOK", hook)
    with pytest.raises(TransientError):
        run_replay(v2, ReplayRequest(LiveRun(), False, ReplayFilters()), clients, db,
                   run_id="replay-failover")
    monkeypatch.setattr(slices, "CHUNK_HOOK", None)
    assert hook.done is not None
    loaded = {e for e, _, _ in row_provenance(pg_dsn, v1.table)}
    assert set(good) < loaded and not set(fixable) <= loaded  # stopped part way

    again = run_replay(v2, ReplayRequest(LiveRun(), False, ReplayFilters()), clients, db,
                       run_id="replay-again")
    assert again["outcomes"]["recovered"] + len(loaded - set(good)) == len(fixable)
    rows = row_provenance(pg_dsn, v1.table)
    assert sorted(e for e, _, _ in rows) == sorted(good + fixable)  # each event once
    statuses = query(pg_dsn, "SELECT status, count(*) FROM dead_letters GROUP BY 1")
    assert statuses == [("recovered", len(fixable))]
    cursor = dict(query(pg_dsn, "SELECT partition, next_offset FROM ingest_offsets WHERE"
                                " topic = %s", (v1.dlq_topic,)))
    assert cursor == highs(clients, v1.dlq_topic)  # the replay cursor at the DLQ's end


def test_the_cli_and_the_airflow_connection_follow_the_new_primary(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, pg_dsn: str,
        replica_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from kafka_ingest.cli import main
    from kafka_ingest_dev.databases import airflow_postgres_conn
    from kafka_ingest_hook import postgres_database
    from tests.support.pipelines import write_pipelines_file

    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES",
                       str(write_pipelines_file(tmp_path / "p.yaml", pipeline)))
    monkeypatch.setenv("KAFKA_INGEST_PG_DSN", pg_dsn)
    monkeypatch.setenv("AIRFLOW_CONN_PG_FAILOVER", airflow_postgres_conn(pg_dsn))
    hooked = postgres_database("pg_failover")

    def server_port() -> int:
        with hooked.connect() as conn:
            row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
        assert row is not None and row[1] is False  # a primary, never the standby
        return int(row[0])

    first = server_port()
    stack.failover()
    promoted = stack.primary_node(stack.settings()).port
    assert promoted != first
    assert server_port() == promoted  # the same Airflow connection, the other server
    assert main(["run", pipeline.name]) == 0  # the same environment, the other server
    assert_invariants(pipeline, clients, pg_dsn, expected)
    stack.failover()  # and back
    assert server_port() == first
    capsys.readouterr()
    assert main(["lag", pipeline.name]) == 0  # back on the first server, same environment
    printed = capsys.readouterr()
    assert pipeline.name in printed.out and "differs" not in printed.err  # group re-synced
    assert {r.partition: r.lag for r in lag(pipeline, clients, Database(pg_dsn))
            } == dict.fromkeys(range(3), 0)


def _in_recovery(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            return bool(conn.execute("SELECT pg_is_in_recovery()").fetchone()[0])  # type: ignore[index]
    except psycopg.OperationalError:
        return False


def test_a_dsn_naming_both_servers_reaches_the_primary_unless_it_says_otherwise(
        pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The standby named first and no target_session_attrs: libpq's own default (any)
    # takes the first that answers, the standby; a connection of the project skips it.
    settings = stack.settings()
    primary = stack.primary_node(settings)
    standby = next(node for node in settings.pg_nodes if node != primary)
    params = {k: v for k, v in conninfo_to_dict(pg_dsn).items()
              if k != "target_session_attrs"}
    params.update(host="127.0.0.1,127.0.0.1", port=f"{standby.port},{primary.port}")
    monkeypatch.delenv("PGTARGETSESSIONATTRS")  # the shell's own would win over the default
    both = make_conninfo(**params)
    with Database(both).session() as conn:
        row = conn.execute("SELECT inet_server_port(), pg_is_in_recovery()").fetchone()
    assert row == (primary.port, False)
    # The standby the previous test's failover rebuilt may still be starting (it takes
    # longer on a busy machine): libpq would pass it over for the next host.
    standby_dsn = make_conninfo(pg_dsn, host="127.0.0.1", port=str(standby.port),
                                target_session_attrs="any")
    poll("the standby to accept connections in recovery",
         lambda: _in_recovery(standby_dsn), standby.stop_timeout_s)
    # A DSN that says `any` is taken at its word: it lands on the standby, whose refusal
    # to write is a transient error saying how to reach the primary, not a traceback.
    with pytest.raises(DatabaseUnavailable) as refused, \
            Database(make_conninfo(both, target_session_attrs="any")).session() as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        conn.execute("CREATE TABLE written_on_a_standby (id int)")
    assert "ReadOnlySqlTransaction" in str(refused.value)
    assert "point the DSN at the primary" in str(refused.value)


def test_stack_failover_from_the_readme_shell(replica_env: dict[str, str]) -> None:
    # docs/faults.md's failover section as typed: the shell holds `stack env --replica`'s
    # exports (PGPORT=<a>,<b>, PGTARGETSESSIONATTRS=read-write, ...) when `stack failover`
    # kills the primary, promotes the standby and rebuilds the old primary as its standby;
    # `stack status` exits 1 if a part is down.
    settings = stack.settings()
    old = stack.primary_node(settings)
    script = ('eval "$(kafka-ingest stack env --replica)"\n'
              "kafka-ingest stack failover\n"
              "kafka-ingest stack status\n")
    done = subprocess.run(["bash", "-ec", script], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    new = stack.primary_node(settings)
    assert new != old and old.standby and not new.standby
    assert f"promoted {new.name}" in done.stdout
    assert f"{old.name} rebuilt as its standby" in done.stdout, done.stdout


def test_a_failover_cut_short_after_the_kill_is_finished_by_the_next_up(
        make_pipeline: Callable[..., Pipeline], clients: KafkaClients, db: Database,
        pg_dsn: str) -> None:
    # `stack failover` dies right after SIGKILLing the primary (a time-out, a crash): the
    # standby is not promoted yet. The next `stack up` must promote it, never bring the
    # old primary back as a second one, and make the old one its standby.
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    settings = stack.settings()
    old = stack.primary_node(settings)
    new = next(node for node in settings.pg_nodes if node != old)
    pid = stack.postmaster_pid()
    assert pid is not None and new.standby
    kill_postmaster(pid)
    settings.primary_marker.write_text(f"{new.name}\n")  # what failover records first

    stack.up(replica="async")
    assert stack.primary_node(settings) == new and not new.standby and old.standby
    states = {part.name: part for part in stack.status()}
    assert states[new.name].up and states[old.name].up, states
    run(pipeline, clients, db)  # on the promoted node, through both addresses
    assert_invariants(pipeline, clients, pg_dsn, expected)
