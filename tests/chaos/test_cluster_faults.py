"""Cluster faults: a 3-broker Kafka cluster (``stack.up(brokers=3)``: three KRaft nodes,
each broker and controller, a 3-voter quorum) with the pipeline's and DLQ topics at
replication factor 3 and ``min.insync.replicas=2``, a broker killed under a slice; and
Postgres running out of disk space under one. On a stack of this module's own.

Each test ends with :func:`assert_invariants` (every valid event once, every poison pill
once in ``dead_letters`` and at least once in the DLQ topic, offsets at the high
watermarks, group offsets equal).

A killed broker is noticed by the controller when its heartbeats stop
(``broker.session.timeout.ms``, Kafka's default 9 s); until then the partitions it led
are unavailable. The reader waits for data up to its idle time-out (30 s) and the DLQ
producer up to ``message.timeout.ms`` (30 s by default), both longer, so a leader lost
mid-slice costs time, not the task.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.engine import ingest
from kafka_ingest.errors import DatabaseUnavailable, DeliveryFailed, TransientError
from kafka_ingest.kafka.clients import FORCED_PRODUCER, KafkaClients
from kafka_ingest_dev import stack
from tests.support.fault_injection import Injector
from tests.support.faults import FaultStack, independent_stack, log_timing, timed_run
from tests.support.ingest import (
    assert_invariants,
    dead_letter_rows,
    read_topic,
    run,
    stored_offsets,
    table_ids,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.faults]

BROKERS = 3
COUNT = 2_000
CHUNK = 300
#: What `kafka-ingest topics create` makes the pipeline's topics with on the cluster.
REPLICATED = {"replication_factor": 3, "topic_config": {"min.insync.replicas": "2"}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[FaultStack]:
    with independent_stack(brokers=BROKERS) as made:
        yield made


@pytest.fixture(autouse=True)
def all_brokers_up(cluster: FaultStack) -> Iterator[None]:
    """Every test starts and ends with the three nodes running."""
    for node in range(1, BROKERS + 1):
        stack.start_broker(node)
    yield
    gc.collect()  # clients a failed run left behind (held by its traceback)
    for node in range(1, BROKERS + 1):
        stack.start_broker(node)


@pytest.fixture
def dsn(cluster: FaultStack) -> Iterator[str]:
    direct, _ = cluster.new_database()
    yield direct
    cluster.drop_database(direct)


def _leader(clients: KafkaClients, topic: str, partition: int) -> int:
    meta = clients.admin().list_topics(topic, timeout=10).topics[topic]
    return int(meta.partitions[partition].leader)


def _await_new_leader(clients: KafkaClients, topic: str, partition: int, gone: int,
                      timeout_s: float = 60.0) -> int:
    """Wait until the controller has elected a live leader other than ``gone``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            leader = _leader(clients, topic, partition)
            if leader not in (gone, -1):
                return leader
        time.sleep(0.2)
    raise AssertionError(f"{topic}[{partition}] has no leader but {gone} after {timeout_s} s")


def _kill_leader(clients: KafkaClients, topic: str, partition: int,
                 killed: list[int]) -> None:
    node = _leader(clients, topic, partition)
    assert stack.kill_broker(node) is not None
    killed.append(node)


def _complete(pipeline: Pipeline, clients: KafkaClients, db: Database, run_id: str,
              first: Any) -> tuple[Any, Any]:
    """The run, and if it failed (transient only), its retry: the pinned slices finish."""
    if first.error is None:
        return first, None
    assert isinstance(first.error, TransientError), repr(first.error)
    retried = timed_run(pipeline, clients, db, run_id=run_id)
    assert retried.error is None, retried.error
    return first, retried


# --------------------------------------------------------------------------- the cluster


def test_three_nodes_a_three_voter_quorum_and_topics_with_three_replicas(
        cluster: FaultStack, dsn: str) -> None:
    clients = cluster.direct_clients()
    admin = clients.admin()
    assert len(admin.list_topics(timeout=10).brokers) == BROKERS
    voters = [line for line in stack.settings().node(2).props.read_text().splitlines()
              if line.startswith("controller.quorum.voters=")]
    assert len(voters) == 1 and voters[0].count("@") == BROKERS

    pipeline = cluster.pipeline(**REPLICATED)  # created as `kafka-ingest topics create` does
    cluster.produce(pipeline, count=50, poison=0)
    run(pipeline, clients, Database(dsn))  # makes the group offsets topic
    for topic in (pipeline.topic, pipeline.dlq_topic, "__consumer_offsets"):
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        assert {len(p.replicas) for p in meta.partitions.values()} == {3}, topic
        assert {len(p.isrs) for p in meta.partitions.values()} == {3}, topic
    for topic in (pipeline.topic, pipeline.dlq_topic):
        resource = ConfigResource(ResourceType.TOPIC, topic)
        config = admin.describe_configs([resource])[resource].result(timeout=10)
        assert config["min.insync.replicas"].value == "2", topic
    # The DLQ producer waits for every in-sync replica, whatever the connection says.
    assert FORCED_PRODUCER["acks"] == "all"
    assert FORCED_PRODUCER["enable.idempotence"] is True


# --------------------------------------------------------------------------- brokers


@pytest.mark.parametrize("clean", [
    pytest.param(False, id="killed"),
    pytest.param(True, id="stopped-cleanly", marks=pytest.mark.faults_full),
])
def test_the_source_partition_leader_lost_during_a_slice_loses_nothing(
        cluster: FaultStack, dsn: str, monkeypatch: pytest.MonkeyPatch, clean: bool) -> None:
    # The leader of the partition being read goes away between two chunks (SIGKILL: no
    # controlled shutdown; or SIGTERM: leadership handed over first).
    clients = cluster.direct_clients()
    db = Database(dsn)
    pipeline = cluster.pipeline(chunk_size=CHUNK, **REPLICATED)
    expected = cluster.produce(pipeline, count=COUNT)
    killed: list[int] = []

    def lose_leader() -> None:
        node = _leader(clients, pipeline.topic, 0)
        if clean:
            stack.stop_broker(node)
        else:
            assert stack.kill_broker(node) is not None
        killed.append(node)

    with monkeypatch.context() as patched:
        injector = Injector("validated", lose_leader, nth=2).install(patched.setattr)
        first = timed_run(pipeline, clients, db, run_id="leader", injector=injector)
    first, retried = _complete(pipeline, clients, db, "leader", first)
    assert killed, "the leader was never lost"
    stack.start_broker(killed[0])
    log_timing(f"source leader {'stopped' if clean else 'killed'} during a slice",
               run_s=first.seconds, after_fault_s=first.after_fault or 0.0,
               failed=first.error is not None,
               retry_s=retried.seconds if retried else 0.0)
    assert run(pipeline, clients, db) == []  # re-syncs the group if a commit was lost
    assert_invariants(pipeline, clients, dsn, expected, dlq_exactly_once=False)


def test_the_dlq_leader_killed_before_the_produce_delays_the_delivery_and_loses_nothing(
        cluster: FaultStack, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The DLQ partition's leader dies just before a chunk's dead letters are produced:
    # librdkafka retries them (idempotent, acks=all) until a new leader is elected.
    clients = cluster.direct_clients()
    db = Database(dsn)
    pipeline = cluster.pipeline(chunk_size=CHUNK, partitions=1, **REPLICATED)
    expected = cluster.produce(pipeline, count=COUNT)
    killed: list[int] = []
    with monkeypatch.context() as patched:
        injector = Injector("dlq_produce", lambda: _kill_leader(
            clients, pipeline.dlq_topic, 0, killed)).install(patched.setattr)
        first = timed_run(pipeline, clients, db, run_id="dlq-leader", injector=injector)
    first, retried = _complete(pipeline, clients, db, "dlq-leader", first)
    stack.start_broker(killed[0])
    log_timing("DLQ leader killed before the DLQ produce", run_s=first.seconds,
               after_fault_s=first.after_fault or 0.0, failed=first.error is not None,
               retry_s=retried.seconds if retried else 0.0)
    assert run(pipeline, clients, db) == []
    assert_invariants(pipeline, clients, dsn, expected, dlq_exactly_once=False)


def test_dead_letters_acknowledged_before_their_leader_is_killed_are_not_lost(
        cluster: FaultStack, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # acks=all with min.insync.replicas=2 of 3: a dead letter acknowledged to the
    # producer is on at least two brokers. Kill the leader right after the acknowledgement:
    # each acknowledged record is still at its offset, served by the new leader.
    clients = cluster.direct_clients()
    db = Database(dsn)
    pipeline = cluster.pipeline(chunk_size=CHUNK, partitions=1, **REPLICATED)
    expected = cluster.produce(pipeline, count=COUNT)
    acked: list[tuple[int, int, int]] = []  # (DLQ partition, DLQ offset, source offset)
    real_produce = ingest.produce_dead_letters

    def recording(producer: Any, letters: Any, *args: Any, **kwargs: Any) -> Any:
        positions = real_produce(producer, letters, *args, **kwargs)
        acked.extend((p, o, letter.source_offset)
                     for (p, o), letter in zip(positions, letters, strict=True))
        return positions

    killed: list[int] = []
    monkeypatch.setattr(ingest, "produce_dead_letters", recording)
    with monkeypatch.context() as patched:
        injector = Injector("dlq_produced", lambda: _kill_leader(
            clients, pipeline.dlq_topic, 0, killed)).install(patched.setattr)
        first = timed_run(pipeline, clients, db, run_id="acked", injector=injector)
    assert killed and acked
    acked_before_kill = list(acked)
    _await_new_leader(clients, pipeline.dlq_topic, 0, killed[0])
    dlq = read_topic(clients, pipeline.dlq_topic)  # from the new leader, one node down
    for partition, offset, source_offset in acked_before_kill:
        record = dlq.get((partition, offset))
        assert record is not None, f"acknowledged DLQ record {partition}@{offset} lost"
        assert record.headers["kafka-ingest.offset"] == str(source_offset).encode()
    first, retried = _complete(pipeline, clients, db, "acked", first)
    stack.start_broker(killed[0])
    log_timing("DLQ leader killed after the acknowledgement", acked=len(acked_before_kill),
               run_s=first.seconds, failed=first.error is not None,
               retry_s=retried.seconds if retried else 0.0)
    assert run(pipeline, clients, db) == []
    assert_invariants(pipeline, clients, dsn, expected, dlq_exactly_once=False)


@pytest.mark.faults_full
def test_two_brokers_lost_during_the_dlq_produce_acknowledge_nothing_then_the_retry_finishes(
        cluster: FaultStack, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two of three nodes down: the quorum is lost and no partition has two in-sync
    # replicas, so no dead letter can be acknowledged (acks=all, min.insync.replicas=2).
    # The chunk fails after message.timeout.ms, nothing committed; the nodes come back and
    # the retry finishes.
    clients = cluster.direct_clients(**{"message.timeout.ms": 8000})
    db = Database(dsn)
    pipeline = cluster.pipeline(chunk_size=CHUNK, partitions=1, **REPLICATED)
    expected = cluster.produce(pipeline, count=COUNT)
    killed: list[int] = []

    def lose_two() -> None:
        leader = _leader(clients, pipeline.dlq_topic, 0)
        for node in [leader, *(n for n in range(1, BROKERS + 1) if n != leader)][:2]:
            assert stack.kill_broker(node) is not None
            killed.append(node)

    with monkeypatch.context() as patched:
        injector = Injector("dlq_produce", lose_two).install(patched.setattr)
        failed = timed_run(pipeline, clients, db, run_id="two-down", injector=injector)
    assert isinstance(failed.error, TransientError), repr(failed.error)
    for node in killed:
        stack.start_broker(node)
    retried = timed_run(pipeline, clients, db, run_id="two-down")
    assert retried.error is None, retried.error
    log_timing("two of three brokers killed during the DLQ produce",
               failed_after_s=failed.after_fault or 0.0, error=type(failed.error).__name__,
               retry_s=retried.seconds)
    assert isinstance(failed.error, DeliveryFailed | TransientError)
    assert run(pipeline, clients, db) == []
    assert_invariants(pipeline, clients, dsn, expected, dlq_exactly_once=False)


# --------------------------------------------------------------------------- disk space


def _superuser(dsn: str) -> psycopg.Connection[Any]:
    """The ``postgres`` superuser over the stack's private unix socket (trust)."""
    s = stack.settings()
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    return psycopg.connect(host=str(s.pg_nodes[0].socket_dir), port=s.pg_port, user="postgres",
                           dbname=dbname, autocommit=True)


@contextlib.contextmanager
def _small_filesystem(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted under /tmp, owned by the ``postgres`` OS user."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem for Postgres needs root")
    mountpoint = Path(tempfile.mkdtemp(prefix="kafka-ingest-disk-"))
    mountpoint.chmod(0o755)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(mountpoint)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        mountpoint.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        space = mountpoint / "tablespace"
        space.mkdir()
        shutil.chown(space, "postgres", "postgres")
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        mountpoint.rmdir()


def _fill(path: Path) -> Path:
    """Take every free byte of the filesystem holding ``path``; return the filler."""
    filler = path / "filler"
    with filler.open("wb") as out:
        chunk = b"\0" * 65536
        with contextlib.suppress(OSError):  # ENOSPC: full
            while True:
                out.write(chunk)
                out.flush()
    stat = os.statvfs(path)
    assert stat.f_bavail * stat.f_frsize < 65536
    return filler


def test_postgres_out_of_disk_space_fails_the_chunk_cleanly_and_ingest_resumes_with_space(
        cluster: FaultStack, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The target table lives in a tablespace on a 16 MB tmpfs. After the first chunks, the
    # filesystem is filled: the next chunk's INSERT cannot extend the table (SQLSTATE
    # 53100), the task fails as transient with a message that says so, nothing of that
    # chunk is written; once the space is back the retry finishes the slice.
    clients = cluster.direct_clients()
    db = Database(dsn)
    pipeline = cluster.pipeline(chunk_size=CHUNK, partitions=1)
    expected = cluster.produce(pipeline, count=COUNT)
    with _small_filesystem("16m") as mountpoint:
        name = f"tiny_{mountpoint.name.rsplit('-', 1)[-1].lower()}"
        with _superuser(dsn) as su:
            su.execute(f"CREATE TABLESPACE {name} LOCATION '{mountpoint / 'tablespace'}'")
        try:
            with _superuser(dsn) as su:
                su.execute(f"ALTER TABLE {pipeline.table} SET TABLESPACE {name}")
                for (index,) in su.execute("SELECT indexname FROM pg_indexes WHERE tablename"
                                           " = %s", (pipeline.table,)).fetchall():
                    su.execute(f'ALTER INDEX "{index}" SET TABLESPACE {name}')
            fillers: list[Path] = []
            with monkeypatch.context() as patched:
                injector = Injector("validated", lambda: fillers.append(_fill(mountpoint)),
                                    nth=3).install(patched.setattr)
                failed = timed_run(pipeline, clients, db, run_id="disk", injector=injector)

            # Transient (Airflow retries it) and saying what is wrong: "Postgres live
            # failed: DiskFull: could not extend file ...: No space left on device" (or
            # "wrote only 4096 of 8192 bytes"), "HINT: Check free disk space."
            assert isinstance(failed.error, DatabaseUnavailable), repr(failed.error)
            assert "DiskFull: could not extend file" in str(failed.error), failed.error
            assert "Check free disk space" in str(failed.error), failed.error
            # Nothing half-written: the stored offset is at a chunk boundary, the table
            # holds exactly the rows of the offsets below it, no dead letter above it.
            stored = stored_offsets(dsn, pipeline)[0]
            assert stored % CHUNK == 0 and 0 < stored < COUNT
            with psycopg.connect(dsn) as conn:
                above = conn.execute(
                    f"SELECT count(*) FROM {pipeline.table} WHERE source_offset >= %s",
                    (stored,)).fetchone()
            assert above == (0,)
            assert all(o < stored for _, o in dead_letter_rows(dsn, pipeline))
            rows_before = len(table_ids(dsn, pipeline.table))

            fillers[0].unlink()  # the space is back
            retried = timed_run(pipeline, clients, db, run_id="disk")
            assert retried.error is None, retried.error
            log_timing("Postgres out of disk space", failed_after_s=failed.after_fault or 0.0,
                       rows_kept=rows_before, retry_s=retried.seconds)
            assert run(pipeline, clients, db) == []
            assert_invariants(pipeline, clients, dsn, expected)
        finally:
            with _superuser(dsn) as su:
                su.execute(f"DROP TABLE IF EXISTS {pipeline.table}")
            cluster.drop_database(dsn)
            with _superuser(cluster.admin_dsn) as su:
                su.execute(f"DROP TABLESPACE IF EXISTS {name}")
