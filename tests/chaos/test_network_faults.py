"""Network faults on the Kafka and Postgres links, injected with Toxiproxy at a precise step
of a chunk, on a stack of this module's own (``stack.up(faults=True)``: every client
connection of the code under test goes through a proxy; the test's own checks go direct).

Each test ends with :func:`assert_invariants`: every valid event once in the table, every
poison pill once in ``dead_letters`` and at least once in the DLQ topic, stored offsets at
the high watermarks, group offsets equal to them.

The time-outs these tests rely on are set short so the quick set stays quick (the full
set, ``KAFKA_INGEST_FAULTS_FULL=1``, also waits out the defaults):

- Postgres: the reply time-out (``KAFKA_INGEST_PG_REPLY_TIMEOUT_S``, default 60 s) =
  :data:`REPLY_S`; libpq ``connect_timeout`` 10 s; ``lock_timeout`` :data:`LOCK_S`.
- Kafka: ``message.timeout.ms`` (default 30 s) = :data:`DELIVERY_MS`;
  ``socket.timeout.ms`` (default 10 s) = :data:`SOCKET_MS`; the read's idle time-out 30 s.
"""

from __future__ import annotations

import gc
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import TopicPartition
from psycopg.conninfo import make_conninfo

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.db.connection import DEFAULT_REPLY_TIMEOUT_S, REPLY_TIMEOUT_ENV
from kafka_ingest.errors import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    DeliveryFailed,
    KafkaUnavailable,
    TransientError,
)
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest_dev.databases import airflow_postgres_conn
from kafka_ingest_dev.demo import run_dag
from kafka_ingest_dev.faults import BOTH, DOWNSTREAM
from tests.support.fault_injection import Injector
from tests.support.faults import (
    FaultStack,
    Outcome,
    independent_stack,
    log_timing,
    timed_run,
    write_pipelines,
)
from tests.support.ingest import assert_invariants, run, stored_offsets
from tests.support.interrupts import TaskTimeout, task_timeout_after

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.faults]

LOCK_S = 3.0
#: The reply time-out of these tests' Postgres connections (the default is 60 s).
REPLY_S = 5.0
#: librdkafka ``message.timeout.ms`` and ``socket.timeout.ms`` of these tests' clients.
DELIVERY_MS = 5_000
SOCKET_MS = 3_000
#: Beyond a time-out: the engine's clean-up (producer flush, unlock, close) and scheduling.
SLACK_S = 4.0
COUNT = 2_000
CHUNK = 300


@pytest.fixture(scope="module")
def fstack() -> Iterator[FaultStack]:
    with independent_stack(faults=True) as made:
        yield made


@pytest.fixture(autouse=True)
def healthy_network(fstack: FaultStack) -> Iterator[None]:
    """Every test starts and ends with the proxies clean (and the clients a failed run left
    behind, held by its traceback, destroyed while the network is healthy)."""
    fstack.toxiproxy.reset()
    yield
    fstack.toxiproxy.reset()
    gc.collect()


@pytest.fixture
def dsns(fstack: FaultStack) -> Iterator[tuple[str, str]]:
    """A fresh database: (direct DSN for the checks, DSN through the proxy for the code)."""
    direct, proxied = fstack.new_database()
    yield direct, proxied
    fstack.drop_database(direct)


def _db(proxied_dsn: str, *, reply_s: float | None = REPLY_S) -> Database:
    return Database(proxied_dsn, lock_timeout_s=LOCK_S,
                    reply_timeout_s=reply_s if reply_s is not None else 0)


def _clients(fstack: FaultStack, **extra: Any) -> KafkaClients:
    return fstack.proxied_clients(**{"message.timeout.ms": DELIVERY_MS,
                                     "socket.timeout.ms": SOCKET_MS, **extra})


def _retry(pipeline: Pipeline, clients: KafkaClients, db: Database, run_id: str) -> Outcome:
    """Airflow's retry of the failed task: the same run id, so the same pinned slices."""
    retried = timed_run(pipeline, clients, db, run_id=run_id)
    assert retried.error is None, retried.error
    return retried


def _finish(fstack: FaultStack, pipeline: Pipeline, expected: Any, direct_dsn: str,
            clients: KafkaClients, db: Database, *, dlq_exactly_once: bool,
            group_lost: bool = False) -> None:
    """The invariants, and nothing left for a new run. ``group_lost``: the fault silenced
    the group coordinator after chunks were committed, so their group commits timed out;
    the consumer group (what lag tools see) catches up at the next live run, which
    re-syncs it to the stored offsets: run it first."""
    if group_lost:
        assert run(pipeline, clients, db) == []
    assert_invariants(pipeline, fstack.direct_clients(), direct_dsn, expected,
                      dlq_exactly_once=dlq_exactly_once)
    assert run(pipeline, clients, db) == []  # and nothing is left for a new run


# --------------------------------------------------------------------------- slow links


def _baseline_and_slowed(fstack: FaultStack, toxics: list[tuple[str, str, dict[str, Any]]],
                         *, count: int, chunk: int, partitions: int) -> tuple[float, float]:
    """Run the same kind of slice twice, each on a database of its own, without and with
    ``toxics`` (proxy, kind, attributes; on both directions for a bandwidth limit, on the
    replies for a latency) from the slice's first chunk on; each run must finish and end
    exactly."""
    seconds = []
    for slowed in (False, True):
        direct, proxied = fstack.new_database()
        pipeline = fstack.pipeline(partitions=partitions, chunk_size=chunk)
        expected = fstack.produce(pipeline, count=count)
        clients, db = fstack.proxied_clients(), _db(proxied, reply_s=None)

        def slow_down() -> None:
            for proxy, kind, attributes in toxics:
                for stream in BOTH if kind == "bandwidth" else (DOWNSTREAM,):
                    fstack.toxiproxy.add_toxic(proxy, kind, stream=stream, **attributes)

        with pytest.MonkeyPatch.context() as patched:
            injector = Injector("validated", slow_down if slowed else lambda: None).install(
                patched.setattr)
            outcome = timed_run(pipeline, clients, db, run_id=f"slow-{slowed}",
                                injector=injector)
        fstack.toxiproxy.reset()
        assert injector.fired_at is not None
        assert outcome.error is None, outcome.error
        assert sum(r.read for r in outcome.reports) > 0
        assert_invariants(pipeline, fstack.direct_clients(), direct, expected)
        fstack.drop_database(direct)
        seconds.append(outcome.seconds)
    return seconds[0], seconds[1]


@pytest.mark.parametrize("latency_ms", [
    pytest.param(300, id="300ms"),
    pytest.param(2000, id="2s", marks=pytest.mark.faults_full),
])
def test_latency_on_both_links_slows_the_slice_and_it_finishes(
        fstack: FaultStack, latency_ms: int) -> None:
    # Every reply from Kafka and from Postgres arrives latency_ms late: the slice's round
    # trips (connect, lock, cursor, each statement of each chunk, produce, commits) add up.
    base, slow = _baseline_and_slowed(
        fstack, [("kafka", "latency", {"latency": latency_ms}),
                       ("postgres", "latency", {"latency": latency_ms})],
        count=400, chunk=250, partitions=1)
    log_timing(f"latency {latency_ms} ms on Kafka and Postgres", baseline_s=base, slowed_s=slow)
    assert slow > base + 10 * latency_ms / 1000


def test_bandwidth_limit_on_both_links_slows_the_slice_and_it_finishes(
        fstack: FaultStack) -> None:
    # 64 KB/s each way on both links: ~200 KB of events are read, and COPYed, at that rate.
    base, slow = _baseline_and_slowed(
        fstack, [("kafka", "bandwidth", {"rate": 64}),
                       ("postgres", "bandwidth", {"rate": 64})],
        count=COUNT, chunk=CHUNK * 2, partitions=3)
    log_timing("bandwidth 64 KB/s on Kafka and Postgres", baseline_s=base, slowed_s=slow)
    assert slow > base + 2.0


# --------------------------------------------------------------------------- resets


def _reset(fstack: FaultStack, proxy: str, *, heal_after_s: float | None = None) -> Any:
    """An action: reset every connection of ``proxy`` (both directions) from now on, or only
    for ``heal_after_s`` seconds."""
    def action() -> list[str]:
        names = fstack.toxiproxy.reset_peer(proxy)
        if heal_after_s is not None:
            threading.Timer(heal_after_s, fstack.toxiproxy.remove, (proxy, names)).start()
        return names
    return action


@pytest.mark.parametrize(("step", "proxy"), [
    pytest.param("validated", "kafka", id="kafka-during-read"),
    pytest.param("dlq_produce", "kafka", id="kafka-during-dlq-produce"),
])
def test_a_reset_that_heals_within_seconds_is_absorbed_by_librdkafka(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        step: str, proxy: str) -> None:
    # librdkafka reconnects and retries on its own (the DLQ producer is idempotent): a
    # connection reset that lasts a second costs a reconnect, not the task.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT)
    clients, db = _clients(fstack), _db(proxied)
    injector = Injector(step, _reset(fstack, proxy, heal_after_s=1.0)).install(
        monkeypatch.setattr)

    outcome = timed_run(pipeline, clients, db, run_id="reset-once", injector=injector)

    assert injector.fired_at is not None
    assert outcome.error is None, outcome.error
    log_timing(f"reset of the {proxy} link for 1 s at {step}", run_s=outcome.seconds,
               after_fault_s=outcome.after_fault or 0.0)
    _finish(fstack, pipeline, expected, direct, clients, db, dlq_exactly_once=True)


# (step, proxy, the transient error, whether the failed chunk's dead letters reached the
# DLQ, poison pills in the sample). The read's case has no poison: no DLQ produce comes
# first, so the read itself gives up, after its idle time-out (30 s).
RESETS = [
    pytest.param("copy", "postgres", DatabaseUnavailable, False, 1, id="postgres-during-copy"),
    pytest.param("commit", "postgres", CommitOutcomeUnknown, True, 1, id="postgres-at-commit"),
    pytest.param("dlq_produce", "kafka", DeliveryFailed, True, 1, id="kafka-during-dlq-produce"),
    pytest.param("validated", "kafka", KafkaUnavailable, False, 0, id="kafka-during-read",
                 marks=pytest.mark.faults_full),
]


@pytest.mark.parametrize(("step", "proxy", "error", "dlq_maybe_twice", "poison"), RESETS)
def test_connections_reset_until_the_task_fails_then_the_retry_finishes_the_slice(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        step: str, proxy: str, error: type[TransientError], dlq_maybe_twice: bool,
        poison: int) -> None:
    # Every connection through the proxy is reset from this step on (new ones too), until
    # the task has failed; then the network heals and the retry runs the pinned slices.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT, poison=poison)
    clients, db = _clients(fstack), _db(proxied)
    nth = 1 if step == "dlq_produce" else 2
    with monkeypatch.context() as patched:
        injector = Injector(step, _reset(fstack, proxy), nth=nth).install(patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="reset", injector=injector)

    assert injector.fired_at is not None, "the fault was never injected"
    assert isinstance(failed.error, error), repr(failed.error)
    assert isinstance(failed.error, TransientError)  # Airflow retries it
    fstack.toxiproxy.reset()
    retried = _retry(pipeline, clients, db, "reset")
    log_timing(f"reset_peer on {proxy} at {step}", failed_after_s=failed.after_fault or 0.0,
               retry_s=retried.seconds)
    _finish(fstack, pipeline, expected, direct, clients, db,
            dlq_exactly_once=not dlq_maybe_twice, group_lost=step == "validated")


# --------------------------------------------------------------------------- black holes


@pytest.mark.parametrize(("streams", "landed"), [
    pytest.param((DOWNSTREAM,), True, id="reply-lost-commit-landed"),
    pytest.param(BOTH, False, id="request-lost-commit-not-landed"),
])
def test_a_black_holed_postgres_commit_fails_within_the_reply_timeout_and_the_retry_resolves_it(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        streams: tuple[str, ...], landed: bool) -> None:
    # A timeout toxic with timeout 0: the proxy keeps the connection and drops every byte,
    # so TCP keepalives and tcp_user_timeout never fire. Only the reply time-out ends the
    # wait; the COMMIT's outcome is then unknown, and the retry reads the stored offset.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT)
    clients, db = _clients(fstack), _db(proxied)
    with monkeypatch.context() as patched:
        injector = Injector("commit", lambda: fstack.toxiproxy.black_hole(
            "postgres", streams=streams), nth=2).install(patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="black-hole", injector=injector)

    assert isinstance(failed.error, CommitOutcomeUnknown), repr(failed.error)
    assert failed.after_fault is not None
    assert REPLY_S - 0.5 < failed.after_fault < REPLY_S + SLACK_S, failed.after_fault
    partition, start, end = (injector.chunk[k] for k in ("partition", "start", "end"))
    fstack.toxiproxy.reset()
    assert stored_offsets(direct, pipeline)[partition] == (end if landed else start)

    retried = _retry(pipeline, clients, db, "black-hole")
    # The retry learnt the outcome from the stored offset: it resumed after the chunk if
    # the COMMIT landed, at the chunk if not (the pinned slices start at 0 here).
    resumed = {r.partition: r.resumed_from for r in retried.reports}
    assert resumed[partition] == ((end if landed else start) or None)
    log_timing(f"Postgres black hole ({'+'.join(streams)}) at COMMIT",
               failed_after_s=failed.after_fault, reply_timeout_s=REPLY_S,
               retry_s=retried.seconds, landed=landed)
    _finish(fstack, pipeline, expected, direct, clients, db, dlq_exactly_once=False)


@pytest.mark.parametrize("step", [
    pytest.param("dlq_produce", id="during-dlq-produce"),
])
def test_a_black_holed_kafka_fails_the_dlq_produce_within_message_timeout_then_retry_finishes(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        step: str) -> None:
    # No delivery report ever comes back: librdkafka fails each dead letter after
    # message.timeout.ms, the chunk rolls back, and the task's clean-up (producer flush,
    # consumer close, unlock) does not wait on the silent broker.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT)
    clients, db = _clients(fstack), _db(proxied)
    with monkeypatch.context() as patched:
        injector = Injector(step, lambda: fstack.toxiproxy.black_hole("kafka")).install(
            patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="kafka-black-hole", injector=injector)

    assert isinstance(failed.error, DeliveryFailed), repr(failed.error)
    assert failed.after_fault is not None
    assert failed.after_fault < DELIVERY_MS / 1000 + SLACK_S + 5.0, failed.after_fault
    fstack.toxiproxy.reset()
    retried = _retry(pipeline, clients, db, "kafka-black-hole")
    log_timing("Kafka black hole during the DLQ produce", failed_after_s=failed.after_fault,
               message_timeout_s=DELIVERY_MS / 1000, retry_s=retried.seconds)
    _finish(fstack, pipeline, expected, direct, clients, db, dlq_exactly_once=False)


def test_a_group_commit_to_a_silent_coordinator_gives_up_within_socket_timeout(
        fstack: FaultStack) -> None:
    # librdkafka's own synchronous commit waits forever here, and a consumer with it
    # pending waits forever in close() too. The committer's owner waits at most
    # socket.timeout.ms, also when Airflow's execution_timeout interrupts that wait (a
    # SIGALRM handler raising in the main thread); the reading consumer closes at once,
    # and the commit's own consumer is left to its thread. Postgres stays the truth and
    # the next live run re-syncs the group.
    pipeline = fstack.pipeline(partitions=1)
    fstack.produce(pipeline, count=50, poison=0)
    clients = _clients(fstack)
    consumer = clients.consumer(pipeline.group_id)
    consumer.assign([TopicPartition(pipeline.topic, 0, 0)])
    assert consumer.consume(10, timeout=10)
    group = clients.committer(pipeline.group_id)
    group.post(pipeline.topic, 0, 5)
    assert group.close() is True

    fstack.toxiproxy.black_hole("kafka")
    group = clients.committer(pipeline.group_id)
    started = time.monotonic()
    group.post(pipeline.topic, 0, 10)
    assert group.close() is False
    gave_up = time.monotonic() - started

    interrupted = clients.committer(pipeline.group_id)
    interrupted.post(pipeline.topic, 0, 11)
    started = time.monotonic()
    with task_timeout_after(0.5), pytest.raises(TaskTimeout):
        interrupted.close()
    interrupted_after = time.monotonic() - started
    started = time.monotonic()
    consumer.close()
    closed = time.monotonic() - started
    log_timing("Kafka black hole at the group commit", gave_up_after_s=gave_up,
               socket_timeout_s=SOCKET_MS / 1000, interrupted_after_s=interrupted_after,
               close_s=closed)
    assert SOCKET_MS / 1000 - 0.5 < gave_up < SOCKET_MS / 1000 + 2.0
    assert interrupted_after < 2.0
    assert closed < 2.0




def test_connecting_to_a_black_holed_postgres_fails_within_connect_timeout(
        fstack: FaultStack, dsns: tuple[str, str]) -> None:
    # A retry while the black hole lasts: the proxy accepts the TCP connection and drops
    # the startup packet; libpq's connect_timeout (10 s unless the DSN says) ends it.
    _, proxied = dsns
    fstack.toxiproxy.black_hole("postgres")
    db = Database(make_conninfo(proxied, connect_timeout=3), reply_timeout_s=REPLY_S)
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable, match="timeout"):
        db.connect()
    waited = time.monotonic() - started
    log_timing("connect through a Postgres black hole", failed_after_s=waited,
               connect_timeout_s=3.0)
    assert 2.5 < waited < 3 + SLACK_S


@pytest.mark.faults_full
def test_planning_against_a_black_holed_kafka_fails_within_the_metadata_timeout(
        fstack: FaultStack, dsns: tuple[str, str]) -> None:
    # The plan asks the brokers for the partitions and watermarks, each request bounded
    # (10 s); a silent cluster fails the plan task as transient.
    _, proxied = dsns
    pipeline = fstack.pipeline()
    fstack.produce(pipeline, count=100, poison=0)
    fstack.toxiproxy.black_hole("kafka")
    started = time.monotonic()
    outcome = timed_run(pipeline, _clients(fstack), _db(proxied), run_id="plan-black-hole")
    log_timing("plan against a Kafka black hole", failed_after_s=outcome.seconds,
               error=type(outcome.error).__name__)
    assert isinstance(outcome.error, KafkaUnavailable), repr(outcome.error)
    assert time.monotonic() - started < 10 + 10 + SLACK_S


@pytest.mark.faults_full
@pytest.mark.parametrize(("step", "proxy", "streams", "error", "bound_s"), [
    pytest.param("commit", "postgres", (DOWNSTREAM,), CommitOutcomeUnknown,
                 DEFAULT_REPLY_TIMEOUT_S, id="postgres-commit-default-reply-timeout-60s"),
    pytest.param("dlq_produce", "kafka", BOTH, DeliveryFailed, 30.0,
                 id="kafka-dlq-produce-default-message-timeout-30s"),
])
def test_the_default_timeouts_bound_black_holes_too(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch,
        step: str, proxy: str, streams: tuple[str, ...], error: type[TransientError],
        bound_s: float) -> None:
    # With nothing configured: a black-holed COMMIT fails after the default reply
    # time-out (60 s), a black-holed DLQ produce after message.timeout.ms (30 s).
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT)
    monkeypatch.delenv(REPLY_TIMEOUT_ENV, raising=False)
    clients, db = fstack.proxied_clients(), Database(proxied)
    assert db.reply_timeout_s == DEFAULT_REPLY_TIMEOUT_S
    with monkeypatch.context() as patched:
        injector = Injector(step, lambda: fstack.toxiproxy.black_hole(
            proxy, streams=streams), nth=1).install(patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="defaults", injector=injector)
    fstack.toxiproxy.reset()
    assert isinstance(failed.error, error), repr(failed.error)
    assert failed.after_fault is not None
    assert bound_s - 1 < failed.after_fault < bound_s + SLACK_S + 5, failed.after_fault
    retried = _retry(pipeline, clients, db, "defaults")
    log_timing(f"{proxy} black hole at {step}, default time-outs",
               failed_after_s=failed.after_fault, bound_s=bound_s, retry_s=retried.seconds)
    _finish(fstack, pipeline, expected, direct, clients, db, dlq_exactly_once=False)


@pytest.mark.faults_full
def test_a_black_holed_kafka_after_the_database_commit_is_bounded(
        fstack: FaultStack, dsns: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # Kafka goes silent right after a chunk's COMMIT: the group commit gives up after
    # socket.timeout.ms, then the next Kafka step (the read's idle time-out, 30 s, or the
    # next DLQ produce) fails the task; nothing the database committed is lost.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK)
    expected = fstack.produce(pipeline, count=COUNT)
    clients, db = _clients(fstack), _db(proxied)
    with monkeypatch.context() as patched:
        injector = Injector("db_committed", lambda: fstack.toxiproxy.black_hole("kafka"),
                            nth=1).install(patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="after-commit", injector=injector)
    assert isinstance(failed.error, TransientError), repr(failed.error)
    assert failed.after_fault is not None and failed.after_fault < 30 + SOCKET_MS / 1000 + 15
    fstack.toxiproxy.reset()
    retried = _retry(pipeline, clients, db, "after-commit")
    log_timing("Kafka black hole after the database commit",
               failed_after_s=failed.after_fault, retry_s=retried.seconds)
    _finish(fstack, pipeline, expected, direct, clients, db, dlq_exactly_once=False,
            group_lost=True)


# --------------------------------------------------------------------------- the DAG


HOOK_DIR = Path(__file__).resolve().parent / "dag_faults"
DAG_ID = "telemetry_metrics_ingest"


def _ingest_tries(fstack: FaultStack) -> list[tuple[int, str, int]]:
    """(map index, state, try number) of the newest run's ingest tasks."""
    dsn = make_conninfo(fstack.admin_dsn, dbname="airflow")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT ti.map_index, ti.state, ti.try_number FROM task_instance ti"
            " WHERE ti.dag_id = %s AND ti.task_id = 'ingest' AND ti.run_id ="
            " (SELECT run_id FROM dag_run WHERE dag_id = %s ORDER BY id DESC LIMIT 1)"
            " ORDER BY ti.map_index", (DAG_ID, DAG_ID)).fetchall()
    return [(int(m), str(s), int(t)) for m, s, t in rows]


DAG_FAULTS = [
    pytest.param({"step": "commit", "nth": 2, "proxy": "postgres", "kind": "timeout",
                  "streams": [DOWNSTREAM], "attributes": {"timeout": 0}},
                 "CommitOutcomeUnknown", id="postgres-black-hole-at-commit"),
    pytest.param({"step": "copy", "nth": 2, "proxy": "postgres", "kind": "reset_peer",
                  "streams": list(BOTH), "attributes": {"timeout": 0}},
                 "DatabaseUnavailable", id="postgres-reset-during-copy"),
    pytest.param({"step": "dlq_produce", "nth": 1, "proxy": "kafka", "kind": "timeout",
                  "streams": list(BOTH), "attributes": {"timeout": 0}},
                 "DeliveryFailed", id="kafka-black-hole-during-dlq-produce",
                 marks=pytest.mark.faults_full),
    pytest.param({"step": "dlq_produce", "nth": 1, "proxy": "kafka", "kind": "reset_peer",
                  "streams": list(BOTH), "attributes": {"timeout": 0}},
                 "DeliveryFailed", id="kafka-reset-during-dlq-produce",
                 marks=pytest.mark.faults_full),
]


@pytest.mark.parametrize(("fault", "error_name"), DAG_FAULTS)
def test_the_ingest_dag_recovers_from_the_fault_with_airflows_own_retry(
        fstack: FaultStack, dsns: tuple[str, str], tmp_path: Path,
        fault: dict[str, Any], error_name: str) -> None:
    # `airflow dags test` runs the real DAG (plan -> mapped ingest -> report) against the
    # proxies; the fault is injected inside the ingest task (dag_faults/sitecustomize.py)
    # and lasts until Airflow has marked the task up_for_retry; then the network heals and
    # Airflow's retry (retries=3, 10 s exponential back-off) finishes the slice.
    direct, proxied = dsns
    pipeline = fstack.pipeline(chunk_size=CHUNK, schedule=None, retries=2)
    expected = fstack.produce(pipeline, count=COUNT)
    kafka_extra = {**json.loads(fstack.proxied_env["KAFKA_INGEST_KAFKA_CONFIG"]),
                   "message.timeout.ms": DELIVERY_MS, "socket.timeout.ms": SOCKET_MS,
                   "group.id": "kafka-ingest"}
    env = {
        **fstack.direct_env,
        "KAFKA_INGEST_PIPELINES": str(write_pipelines(tmp_path / "p.yaml", pipeline)),
        "AIRFLOW_CONN_POSTGRES_DEFAULT": airflow_postgres_conn(proxied),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps({"conn_type": "kafka", "extra": kafka_extra}),
        REPLY_TIMEOUT_ENV: str(REPLY_S),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOK_DIR),
                                                    os.environ.get("PYTHONPATH")])),
        "KAFKA_INGEST_TEST_FAULT": json.dumps({**fault, "url": fstack.toxiproxy.url}),
    }
    result: dict[str, Any] = {}

    def dag_run() -> None:
        result["proc"] = run_dag(DAG_ID, env, log_file=tmp_path / "dag.log")

    started = time.time()
    runner = threading.Thread(target=dag_run, name="airflow-dags-test")
    runner.start()
    healed_at = None
    while runner.is_alive():
        if healed_at is None and any(s == "up_for_retry" for _, s, _ in _ingest_tries(fstack)):
            fstack.toxiproxy.reset()  # the task failed: the network heals
            healed_at = time.time()
        runner.join(0.2)
    ended = time.time()
    proc = result["proc"]
    output = proc.stdout + proc.stderr

    assert proc.returncode == 0, output[-4000:]
    injected = re.search(rf"FAULT-INJECTED {fault['kind']} on {fault['proxy']} .* "
                         r"wall=([0-9.]+)", output)
    assert injected is not None, output[-4000:]
    assert error_name in output, output[-4000:]
    assert healed_at is not None, "no ingest task went up_for_retry"
    tries = _ingest_tries(fstack)
    assert all(state == "success" for _, state, _ in tries), tries
    assert max(t for _, _, t in tries) == 2, tries  # one failure, one retry, no more
    # failed: from the fault to Airflow's up_for_retry (polled every 0.2 s); recovered:
    # from the fault to the end of the DAG run (Airflow's retry delay included).
    fault_at = float(injected.group(1))
    log_timing(f"DAG {fault['kind']} on {fault['proxy']} at {fault['step']}",
               failed_after_s=healed_at - fault_at, recovered_after_s=ended - fault_at,
               dag_run_s=ended - started)
    assert_invariants(pipeline, fstack.direct_clients(), direct, expected,
                      dlq_exactly_once=False)
