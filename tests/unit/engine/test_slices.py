"""The slice engine (``kafka_ingest.engine.slices.run_slice``) against fakes at its ports.

The real engine, the real ingest and replay writers, the real validation and DLQ
bookkeeping run here; only Kafka's clients and the Postgres session are fakes
(``tests/support/fakes.py``): stateful stand-ins, not scripted mocks. Each test sets up a log and a
database, runs a slice, and checks what ended up committed, stored and produced, and in
which order (from the one ``events`` list all fakes append to).

The engine reads and validates chunk k+1 while chunk k's transaction runs in a transaction
thread, and the group commits run in a committer thread of their own (newest wins: an
offset posted while another is on its way may be coalesced into the next commit), so
orderings are asserted per chunk, never as one global interleaving.

The pipeline is the shipped ``telemetry_metrics`` with ``chunk_size`` 3; the source
range is [0, 10) of partition 2, so the chunks are [0, 3), [3, 6), [6, 9), [9, 10); the
log holds 12 messages (2 past the range: the lag after the slice), and offset 4 is a
poison pill (no timestamp, no metric_value: a contract violation).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import DlqHeaderStyle, Pipeline
from kafka_ingest.contracts.columns import millis_to_pg
from kafka_ingest.engine import ingest, slices, stages, tuning
from kafka_ingest.engine.ingest import ingest_range, ingest_target
from kafka_ingest.engine.planning import PlanTarget
from kafka_ingest.engine.replay import replay_range, replay_target
from kafka_ingest.errors import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    DeliveryFailed,
    FencedError,
    OffsetOutOfRange,
    TopicRecreated,
)
from kafka_ingest.kafka.dlq import PREFIX, DeadLetter, headers_for, parse_dlq_message
from kafka_ingest.ranges import Mode, OffsetRange
from kafka_ingest.records import row_source
from kafka_ingest.requests import LiveRun, ReplayFilters, ReplayRequest
from tests.support.fakes import (
    Event,
    Events,
    FakeClients,
    FakeConsumer,
    FakeDatabase,
    FakeProducer,
    Msg,
)
from tests.support.interrupts import TaskTimeout, task_timeout_on_sigalrm

PARTITION = 2
N = 10  # the slice is [0, N)
LOG_SIZE = 12
POISON_AT = 4
CHUNKS = [(0, 3), (3, 6), (6, 9), (9, 10)]
VALID = [f"evt-{i:03d}" for i in range(N) if i != POISON_AT]  # the rows [0, N) must yield
POISON = b'{"event_id": "evt-poison", "device_id": "device-1", "version": 2}'
RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"


def metric(i: int) -> bytes:
    """A valid metric_event v2 (the shipped contract), event id ``evt-<i>``."""
    return json.dumps({"event_id": f"evt-{i:03d}", "device_id": f"device-{i % 3}",
                       "timestamp": 1_767_225_600.0 + i, "metric_value": 20.5 + i,
                       "version": 2}).encode()


@pytest.fixture
def pipeline(shipped: dict[str, Pipeline]) -> Pipeline:
    return shipped["telemetry_metrics"].model_copy(update={"chunk_size": 3})


class World:
    """A source log of one partition, a DLQ producer and a database, sharing one events
    list; the stored offset of the partition starts at 0 (as the planner leaves it)."""

    def __init__(self, pipeline: Pipeline, log: list[Msg] | None = None, *,
                 topic: str | None = None, partition: int = PARTITION,
                 producer: FakeProducer | None = None, with_producer: bool = True,
                 commit_failures: int = 0) -> None:
        self.pipeline = pipeline
        self.topic = topic or pipeline.topic
        self.partition = partition
        self.events: list[Event] = []
        self.log = log if log is not None else [
            Msg(i, value_=POISON if i == POISON_AT else metric(i), key_=b"device",
                topic_=self.topic, partition_=partition) for i in range(LOG_SIZE)]
        self.db = FakeDatabase(events=self.events,
                               offsets={(pipeline.name, self.topic, partition): 0})
        self.producer = producer or FakeProducer(events=self.events)
        self.producer.events = self.events
        self.commit_failures = commit_failures
        self.clients = FakeClients(self._consumer, self.producer if with_producer else None)
        self.ev = Events(self.events)

    def _consumer(self) -> FakeConsumer:
        return FakeConsumer(self.log, topic=self.topic, partition=self.partition,
                            events=self.events, commit_failures=self.commit_failures)

    @property
    def consumer(self) -> FakeConsumer:
        """The consumer of the latest slice."""
        return self.clients.consumers[-1]

    def range(self, start: int = 0, end: int = N, mode: Mode = Mode.LIVE) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, start, end, mode)

    def ingest(self, rng: OffsetRange | None = None) -> slices.SliceReport:
        return ingest_range(self.pipeline, rng or self.range(), self.clients, self.db,
                            run_id=RUN_ID)

    def stored(self) -> int | None:
        return self.db.offset(self.pipeline.name, self.topic, self.partition)

    def audit(self) -> list[tuple[int, int, str, int, int, int, int]]:
        """(start, end, mode, read, inserted, duplicates, dead_lettered) per audit row."""
        return [(r.start_offset, r.end_offset, r.mode, r.counts.read, r.counts.inserted,
                 r.counts.duplicates, r.counts.dead_lettered) for r in self.db.runs]


def assert_chunk_order(w: World, chunks: list[tuple[int, int]], *, kafka: bool) -> None:
    """For each chunk: its rows written, then its COMMIT, then (live) its Kafka commit,
    if the group commits of its slice did not coalesce it into a later one."""
    for start, end in chunks:
        txn = w.ev.txn_of_chunk(start, end)
        write = w.ev.first("upsert", txn)
        commit = w.ev.first("db_commit", txn, start, end)
        assert write < commit, (start, end)
        if kafka and ("kafka_commit", end) in w.events:
            assert commit < w.ev.first("kafka_commit", end), (start, end)


def assert_group_followed(committed: list[int], ends: list[int]) -> None:
    """The group's commits of a slice: chunk ends (or where it resumed) in rising order,
    never an older after a newer one, ending with the slice's last."""
    assert committed, "the group was told nothing"
    assert committed == sorted(set(committed)), committed
    assert set(committed) <= set(ends), (committed, ends)
    assert committed[-1] == ends[-1], (committed, ends)


# --------------------------------------------------------------------------- 1. a live slice


def test_a_live_slice_commits_each_chunk_to_postgres_then_to_kafka(pipeline: Pipeline) -> None:
    # The core guarantee: a chunk's offset reaches Kafka only after its rows, dead letters,
    # cursor and audit row were committed in one transaction, chunk after chunk, in order.
    w = World(pipeline)
    report = w.ingest()

    assert_chunk_order(w, CHUNKS, kafka=True)
    assert_group_followed(w.clients.committed_offsets(), [3, 6, 9, 10])
    assert {(tuple(offsets), asynchronous) for offsets, asynchronous
            in w.clients.group_commits()} <= {(((pipeline.topic, PARTITION, end),), False)
                                              for end in (3, 6, 9, 10)}  # synchronous
    assert w.consumer.commits == []  # never through the reading consumer
    assert w.ev.of("advance") == [("advance", 1, 0, 3), ("advance", 2, 3, 6),
                                  ("advance", 3, 6, 9), ("advance", 4, 9, 10)]
    assert w.stored() == 10
    assert w.audit() == [(0, 3, "live", 3, 3, 0, 0), (3, 6, "live", 3, 2, 0, 1),
                         (6, 9, "live", 3, 3, 0, 0), (9, 10, "live", 1, 1, 0, 0)]
    assert {r.run_id for r in w.db.runs} == {RUN_ID}
    assert sorted(w.db.rows) == VALID
    assert row_source(w.db.rows["evt-007"]) == (pipeline.topic, PARTITION, 7, b"device",
                                           millis_to_pg(int(datetime(2026, 1, 1, tzinfo=UTC)
                                                            .timestamp() * 1000)))
    # The poison pill: produced to the DLQ, its delivery report read (the DLQ offset it
    # got is what the dead_letters row holds), recorded in chunk [3, 6)'s transaction.
    (dlq,) = w.producer.delivered
    assert (dlq.topic(), dlq.partition(), dlq.offset(), dlq.value()) == (
        "telemetry-metrics-dlq", 0, 0, POISON)
    assert dict(dlq.headers() or [])[PREFIX + "offset"] == b"4"
    stored = w.db.dead_letters[(pipeline.name, pipeline.topic, 1, PARTITION, POISON_AT)]
    assert (stored.status, stored.attempts, stored.dlq_partition, stored.dlq_offset) == (
        "parked", 1, 0, 0)
    assert stored.letter.error_class == "contract_violation"
    txn = w.ev.txn_of_chunk(3, 6)
    delivered = w.ev.first("dlq_delivered", "telemetry-metrics-dlq", 0, 0)
    recorded = w.ev.first("dead_letters", txn, (4,))
    assert (w.ev.first("upsert", txn, (3, 5)) < delivered < recorded
            < w.ev.first("db_commit", txn))
    # Nothing past the slice's end is read; the report sums the chunks.
    assert w.consumer.served == list(range(N))
    assert (report.read, report.inserted, report.duplicates, report.dead_lettered,
            report.chunks, report.lag_after, report.resumed_from) == (10, 9, 0, 1, 4, 2, None)
    assert w.clients.group_ids == ["kafka-ingest.telemetry_metrics"]
    assert w.consumer.closed and w.db.sessions[0].closed
    assert w.ev.of("rollback") == []




@pytest.mark.parametrize("stage", ["upsert", "dead_letters", "advance", "commit", "committed"])
def test_an_interrupt_in_the_main_thread_ends_the_slice_with_nothing_left_waiting(
        pipeline: Pipeline, stage: str) -> None:
    # Airflow's execution_timeout raises in the main thread, wherever it is: here while
    # chunk 2's transaction is at ``stage`` in the transaction thread (the main thread is then
    # preparing chunk 3, handing it over or waiting), with the group commit of chunk 1
    # unanswered. The slice must end within the group's time-out, leave no thread of its
    # own waiting, release its lock and connection, and never close the consumer whose
    # commit is pending (librdkafka would wait in close() forever).
    release, committing = threading.Event(), threading.Event()
    w = held_world(pipeline, release, commit_timeout_s=0.5, started=committing)
    main = threading.main_thread().ident
    assert main is not None

    def interrupt() -> None:  # once chunk 1's group commit is on its way
        assert committing.wait(10)
        signal.pthread_kill(main, signal.SIGALRM)

    w.db.inject(2, stage, interrupt)
    started = time.monotonic()
    try:
        with task_timeout_on_sigalrm(), pytest.raises(TaskTimeout):
            w.ingest()
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < w.clients.commit_timeout_s + 5.0
    assert w.db.held_locks() == {}
    assert w.consumer.closed and w.db.sessions[0].closed
    assert not any(t.name.startswith("transaction-") for t in threading.enumerate())
    (held,) = w.clients.commit_consumers
    deadline = time.monotonic() + 10
    while not held.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.closed and not held.closed_while_pending


def test_an_interrupt_while_the_slice_waits_for_its_transaction_never_unlocks_under_it(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    # Preparing chunk 3 fails while chunk 2's transaction is still running; the slice then
    # waits for that transaction before releasing its lock and connection, and an
    # interrupt in that wait (Airflow's time-out) must not cut it short: unlocking or
    # closing the connection under a running transaction frees the partition too early.
    # Chunk 2's COMMIT is held until the slice waits for it, then the interrupt comes, and
    # the COMMIT goes on once the slice waits again (each step seen, none slept for).
    main = threading.main_thread().ident
    assert main is not None
    commit_started, prepare_failed = threading.Event(), threading.Event()
    waiting, waiting_again = threading.Event(), threading.Event()
    real_wait = stages.wait

    def watched_wait(futures: Any, timeout: float | None = None) -> Any:
        if not prepare_failed.is_set():
            return real_wait(futures, timeout=timeout)
        # The slice is leaving: it waits for the transaction. (Waited for in short slices
        # here: a signal that lands just before a blocking wait is handled only when it
        # returns.)
        (waiting_again if waiting.is_set() else waiting).set()
        deadline = time.monotonic() + (timeout or 10.0)
        while True:
            done = real_wait(futures, timeout=0.01)
            if not done.not_done or time.monotonic() > deadline:
                return done

    seen: dict[str, bool] = {}

    def held_commit() -> None:  # chunk 2's COMMIT
        commit_started.set()
        seen["the slice waits"] = waiting.wait(10)
        signal.pthread_kill(main, signal.SIGALRM)
        seen["and waits on after the interrupt"] = waiting_again.wait(10)

    w = World(pipeline)
    w.db.inject(2, "commit", held_commit)
    real_prepare = ingest.IngestWriter.prepare

    def failing_prepare(self: Any, chunk: Any, encoder: Any) -> Any:
        if chunk.start == 6:
            assert commit_started.wait(10)
            prepare_failed.set()
            raise RuntimeError("prepare failed")
        return real_prepare(self, chunk, encoder)

    monkeypatch.setattr(ingest.IngestWriter, "prepare", failing_prepare)
    monkeypatch.setattr(stages, "wait", watched_wait)
    with task_timeout_on_sigalrm(), pytest.raises(TaskTimeout):
        w.ingest()
    assert seen == {"the slice waits": True, "and waits on after the interrupt": True}
    committed = w.events.index(("db_commit", 2, 3, 6))
    assert committed < w.events.index(("unlock", "telemetry_metrics", PARTITION))
    assert committed < w.events.index(("session_close",))
    assert w.stored() == 6


# --------------------------------------------------------------------------- 2. the lock


class _HeldCommits(FakeConsumer):
    """A commit consumer whose commits return only once ``release`` is set (a slow or
    silent coordinator); records whether it was closed with a commit pending."""

    def __init__(self, *args: Any, release: threading.Event, started: threading.Event,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.release = release
        self.started = started
        self.pending = 0
        self.closed_while_pending = False

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.pending += 1
        self.started.set()
        self.release.wait(30)
        self.pending -= 1
        super().commit(*args, **kwargs)

    def close(self) -> None:
        self.closed_while_pending = self.closed_while_pending or self.pending > 0
        super().close()


def held_world(pipeline: Pipeline, release: threading.Event, *,
               commit_timeout_s: float = 5.0,
               started: threading.Event | None = None) -> World:
    """A world whose group commits are held until ``release`` (``started``: set when the
    first one is on its way)."""
    w = World(pipeline)
    w.clients.commit_timeout_s = commit_timeout_s
    started = started or threading.Event()
    w.clients.commit_consumer_factory = lambda: _HeldCommits(
        w.log, topic=w.topic, partition=w.partition, events=w.events, release=release,
        started=started)
    return w


def test_a_slow_group_commit_holds_up_no_transaction_and_the_newest_offset_wins(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    # The group commit of chunk 1 stays unanswered until every chunk's transaction has
    # committed: none of them waited for it, and the group then gets the newest offsets
    # posted (those overwritten while the first was on its way are coalesced), never an
    # older one after a newer.
    release = threading.Event()
    commits = {"n": 0}

    def release_after_the_last_commit(stage: str) -> None:
        if stage == "db_committed":
            commits["n"] += 1
            if commits["n"] == len(CHUNKS):
                release.set()

    monkeypatch.setattr(slices, "CHUNK_HOOK", release_after_the_last_commit)
    w = held_world(pipeline, release)
    w.ingest()

    last_txn = w.ev.txn_of_chunk(*CHUNKS[-1])
    assert w.ev.first("db_commit", last_txn) < w.ev.first("kafka_commit")
    committed = w.clients.committed_offsets()
    assert_group_followed(committed, [3, 6, 9, 10])
    assert len(committed) < len(CHUNKS), committed
    assert w.stored() == 10


def test_a_group_commit_that_never_answers_keeps_no_transaction_open_and_ends_the_slice(
        pipeline: Pipeline, caplog: pytest.LogCaptureFixture) -> None:
    # A silent coordinator: no group commit ever returns. Every chunk still commits to
    # Postgres at once (no transaction waits on the coordinator), the slice ends after the
    # committer's time-out, and the consumer with the commit pending is not closed under it.
    release = threading.Event()
    w = held_world(pipeline, release, commit_timeout_s=0.3)
    started = time.monotonic()
    report = w.ingest()
    took = time.monotonic() - started

    assert [e[1:] for e in w.ev.of("db_commit")] == [
        (w.ev.txn_of_chunk(s, e), s, e) for s, e in CHUNKS]
    assert w.ev.of("kafka_commit") == []
    assert (report.read, w.stored()) == (N, 10)
    assert took < w.clients.commit_timeout_s + 5.0  # not the 30 s a held commit waits
    assert "not answered within" in caplog.text
    (held,) = w.clients.commit_consumers
    assert not held.closed
    release.set()  # the coordinator answers at last: the committer's thread closes it
    deadline = time.monotonic() + 10
    while not held.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held.closed and not held.closed_while_pending
    # the held commit, then what was posted meanwhile, newest only
    assert_group_followed(held.succeeded, [3, 6, 9, 10])
    assert len(held.succeeded) <= 2, held.succeeded


def test_a_live_slice_holds_the_session_lock_from_before_the_first_read_to_the_end(
        pipeline: Pipeline) -> None:
    # The live slice owns the cursor: one lock, taken before the cursor is read and
    # anything is consumed, released only after the last Kafka commit.
    w = World(pipeline)
    w.ingest()

    lock = ("lock", "telemetry_metrics", PARTITION)
    unlock = ("unlock", "telemetry_metrics", PARTITION)
    assert w.ev.of("lock") == [lock]
    assert w.ev.of("unlock") == [unlock]
    assert (w.events.index(lock) < w.ev.first("cursor")
            < w.ev.first("assign") < w.ev.first("begin"))
    assert w.events.index(unlock) > w.events.index(("kafka_commit", 10))
    assert w.events.index(unlock) < w.events.index(("session_close",))
    assert w.db.held_locks() == {}


def test_a_failing_live_slice_still_releases_its_lock_and_closes_everything(
        pipeline: Pipeline) -> None:
    # A lock left behind would block every later run of the partition for good.
    w = World(pipeline)
    w.db.inject(2, "upsert", RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        w.ingest()

    assert w.ev.of("lock") == [("lock", "telemetry_metrics", PARTITION)]
    assert w.ev.of("unlock") == [("unlock", "telemetry_metrics", PARTITION)]
    assert w.db.held_locks() == {}
    assert w.consumer.closed and w.db.sessions[0].closed
    assert w.producer.flushes >= 1  # the producer is flushed on the way out


def test_a_backfill_takes_no_lock_and_never_touches_the_cursor_or_the_group(
        pipeline: Pipeline) -> None:
    # A backfill moves no cursor, so nothing can fence it and its upserts are idempotent:
    # it takes no lock, and runs while a live slice holds the partition (here another
    # session holds it the whole time) instead of waiting for it and timing out.
    w = World(pipeline)
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 7)  # the live cursor
    live = w.db.open_slice()
    live.lock(pipeline.name, PARTITION)
    report = w.ingest(w.range(0, N, Mode.BACKFILL))

    assert w.ev.of("lock") == [("lock", "telemetry_metrics", PARTITION)]  # the live one
    assert w.ev.of("cursor") == [] and w.ev.of("advance") == []
    assert w.stored() == 7
    assert w.clients.group_commits() == [] and w.consumer.commits == []
    assert_chunk_order(w, CHUNKS, kafka=False)
    assert w.audit() == [(0, 3, "backfill", 3, 3, 0, 0), (3, 6, "backfill", 3, 2, 0, 1),
                         (6, 9, "backfill", 3, 3, 0, 0), (9, 10, "backfill", 1, 1, 0, 0)]
    assert sorted(w.db.rows) == VALID
    assert (report.moves_cursor, report.read, report.inserted) == (False, 10, 9)
    live.close()
    assert w.db.held_locks() == {}


# --------------------------------------------------------------------------- the cursor rule


def replay_world(pipeline: Pipeline) -> World:
    """A DLQ partition of four letters ingest parked (source offsets 0-3, all valid now),
    its replay cursor at 0."""
    records = [dlq_record(pipeline, i, i, metric(i)) for i in range(4)]
    w = World(pipeline, records, topic=pipeline.dlq_topic, partition=0, with_producer=False)
    w.db.set_offset(pipeline.name, pipeline.dlq_topic, 0, 0)
    seed_dead_letters(w.db, pipeline, records, recovered=[])
    return w


FILTERED = ReplayFilters(error_classes=frozenset({"contract_violation"}))


@pytest.mark.parametrize(
    ("kind", "mode", "from_cursor", "options", "moves"),
    [
        pytest.param("ingest", Mode.LIVE, True, {}, True, id="live ingest"),
        pytest.param("ingest", Mode.BACKFILL, False, {}, False, id="backfill"),
        pytest.param("replay", Mode.REPLAY, True, {}, True, id="replay from the cursor"),
        pytest.param("replay", Mode.REPLAY, False, {}, False, id="replay of a window"),
        pytest.param("replay", Mode.REPLAY, True, {"filters": FILTERED}, False,
                     id="filtered replay from the cursor"),
        pytest.param("replay", Mode.REPLAY, True, {"dry_run": True}, False,
                     id="dry-run replay from the cursor"),
    ],
)
def test_a_slice_owns_and_moves_its_cursor_exactly_when_the_rule_says(
        pipeline: Pipeline, kind: str, mode: Mode, from_cursor: bool, options: dict[str, Any],
        moves: bool) -> None:
    # ranges.moves_cursor decides (its table: test_ranges.py); the engine follows it: a
    # slice that moves its cursor locks it, reads it, advances it chunk by chunk and tells
    # the group; one that does not does none of these.
    if kind == "ingest":
        w = World(pipeline)
        rng = OffsetRange(w.topic, w.partition, 0, N, mode, from_cursor=from_cursor)
        report = ingest_range(pipeline, rng, w.clients, w.db, run_id=RUN_ID)
    else:
        w = replay_world(pipeline)
        rng = OffsetRange(w.topic, w.partition, 0, 4, mode, from_cursor=from_cursor)
        report = replay_range(pipeline, rng, w.clients, w.db, run_id=RUN_ID, **options)
    assert report.moves_cursor is moves
    assert report.read == rng.size
    assert bool(w.ev.of("lock")) is moves
    assert bool(w.ev.of("cursor")) is moves
    assert bool(w.ev.of("advance")) is moves
    assert bool(w.clients.group_commits()) is moves
    assert w.stored() == (rng.end if moves else 0)
    assert w.db.held_locks() == {}


@pytest.mark.parametrize(
    ("target", "moves", "writes"),
    [
        pytest.param(ingest_target, True, True, id="ingest"),
        pytest.param(lambda p: replay_target(p, ReplayRequest(LiveRun())), True, True,
                     id="replay"),
        pytest.param(lambda p: replay_target(p, ReplayRequest(LiveRun(), filters=FILTERED)),
                     False, True, id="filtered replay"),
        pytest.param(lambda p: replay_target(p, ReplayRequest(LiveRun(), dry_run=True)),
                     False, False, id="dry-run replay"),
    ],
)
def test_the_planner_asks_the_same_rule(pipeline: Pipeline,
                                        target: Callable[[Pipeline], PlanTarget],
                                        moves: bool, writes: bool) -> None:
    # The planner re-syncs the group and logs "moves the cursor" for cursor ranges that
    # move; window ranges never do; a dry run initialises no cursor and records no gap.
    planned = target(pipeline)
    assert planned.moves_cursor(from_cursor=True) is moves
    assert planned.moves_cursor(from_cursor=False) is False
    assert planned.writes is writes


# --------------------------------------------------------------------------- 3. failure, resume


@pytest.mark.parametrize("stage", ["upsert", "advance", "audit", "commit"])
def test_a_failed_chunk_commits_nothing_and_a_rerun_resumes_at_it(pipeline: Pipeline,
                                                                  stage: str) -> None:
    # Wherever chunk [3, 6)'s transaction fails, [0, 3) stays committed (rows, cursor and
    # Kafka), [3, 6) leaves no trace, and a retry of the same pinned slice starts at 3:
    # nothing is read twice into the table, nothing is skipped.
    w = World(pipeline)
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    w.db.inject(2, stage, lost)
    with pytest.raises(DatabaseUnavailable) as caught:  # psycopg's error, mapped
        w.ingest()
    assert caught.value.__cause__ is lost

    first = w.consumer
    assert w.ev.of("db_commit") == [("db_commit", 1, 0, 3)]
    assert ("rollback", 2) in w.events
    assert w.clients.committed_offsets() == [3]
    assert w.stored() == 3
    assert sorted(w.db.rows) == ["evt-000", "evt-001", "evt-002"]
    assert w.audit() == [(0, 3, "live", 3, 3, 0, 0)]
    assert w.db.dead_letters == {}
    assert first.closed and w.db.sessions[0].closed
    # The reader let go of the partition before the consumer was closed.
    assert w.events.index(("unassign",)) < w.events.index(("consumer_close",))

    report = w.ingest()

    second = w.consumer
    assert second is not first
    assert report.resumed_from == 3
    assert second.assigned == [(pipeline.topic, PARTITION, 3)]
    assert second.served == list(range(3, N))
    # the resumed slice first tells the group where the earlier attempt got to
    assert_group_followed(w.clients.committed_offsets(-1), [3, 6, 9, 10])
    assert (report.read, report.inserted, report.duplicates, report.dead_lettered) == (
        7, 6, 0, 1)
    assert w.stored() == 10
    assert sorted(w.db.rows) == VALID
    assert w.audit() == [(0, 3, "live", 3, 3, 0, 0), (3, 6, "live", 3, 2, 0, 1),
                         (6, 9, "live", 3, 3, 0, 0), (9, 10, "live", 1, 1, 0, 0)]


def test_a_lost_commit_reply_is_resolved_by_the_stored_offset(pipeline: Pipeline) -> None:
    # COMMIT landed but its reply was lost (CommitOutcomeUnknown): the Kafka commit must
    # not be sent blind, and the retry must learn from the stored offset that [3, 6) is in.
    w = World(pipeline)
    w.db.inject(2, "committed", CommitOutcomeUnknown(pipeline.name, PARTITION, 3, 6))
    with pytest.raises(CommitOutcomeUnknown):
        w.ingest()
    assert w.stored() == 6
    assert w.clients.committed_offsets() == [3]

    report = w.ingest()
    assert report.resumed_from == 6
    assert w.consumer.served == [6, 7, 8, 9]
    # the landed COMMIT told to Kafka, then each chunk
    assert_group_followed(w.clients.committed_offsets(-1), [6, 9, 10])
    assert sorted(w.db.rows) == VALID
    assert [(r.start_offset, r.end_offset) for r in w.db.runs] == CHUNKS


# --------------------------------------------------------------------------- 4. DLQ delivery


def test_an_undelivered_dead_letter_fails_the_chunk_before_its_commit(
        pipeline: Pipeline) -> None:
    # A dead letter the DLQ did not acknowledge must not be recorded as parked, nor its
    # chunk's offset committed: it would be lost. The chunk rolls back; a retry redoes it.
    w = World(pipeline, producer=FakeProducer(fail_deliveries=True))
    with pytest.raises(DeliveryFailed) as caught:
        w.ingest()
    assert caught.value.failures == ["offset 4: _MSG_TIMED_OUT: Local: Message timed out"]

    txn = 2  # chunk [3, 6)
    assert ("dlq_failed", "telemetry-metrics-dlq", 4) in w.events
    assert ("rollback", txn) in w.events
    assert w.ev.of("db_commit") == [("db_commit", 1, 0, 3)]
    assert w.ev.of("dead_letters") == []
    assert w.clients.committed_offsets() == [3]
    assert w.stored() == 3
    assert w.db.dead_letters == {}
    assert sorted(w.db.rows) == ["evt-000", "evt-001", "evt-002"]


def test_a_missing_delivery_report_fails_the_chunk_too(pipeline: Pipeline) -> None:
    # flush() returning with reports outstanding proves nothing was delivered.
    w = World(pipeline, producer=FakeProducer(hold_reports=True))
    with pytest.raises(DeliveryFailed, match="no delivery report"):
        w.ingest()
    assert w.ev.of("db_commit") == [("db_commit", 1, 0, 3)]
    assert w.clients.committed_offsets() == [3]
    assert w.stored() == 3


# --------------------------------------------------------------------------- 5. the fence


def test_a_cursor_moved_by_another_run_fences_the_chunk(pipeline: Pipeline) -> None:
    # A zombie (or overlapping) run must never commit over the cursor another run moved:
    # the compare-and-set finds 6 where [3, 6) expected 3, and the chunk rolls back.
    w = World(pipeline)
    w.db.inject(2, "advance",
                lambda: w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 6))
    with pytest.raises(FencedError) as caught:
        w.ingest()
    err = caught.value
    assert (err.pipeline, err.topic, err.partition, err.expected, err.found) == (
        pipeline.name, pipeline.topic, PARTITION, 3, 6)

    assert w.ev.of("db_commit") == [("db_commit", 1, 0, 3)]
    assert ("rollback", 2) in w.events
    assert w.stored() == 6  # the other run's value, untouched
    assert sorted(w.db.rows) == ["evt-000", "evt-001", "evt-002"]
    assert [(r.start_offset, r.end_offset) for r in w.db.runs] == [(0, 3)]
    assert w.db.dead_letters == {}
    assert w.clients.committed_offsets() == [3]
    assert w.db.held_locks() == {}


# --------------------------------------------------------------------------- 6. resume


def test_a_slice_resumes_where_the_stored_offset_is(pipeline: Pipeline) -> None:
    # A retried or cleared task finishes exactly its pinned slice: from the stored offset.
    w = World(pipeline)
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 6)
    report = w.ingest()

    assert report.resumed_from == 6
    assert w.consumer.assigned == [(pipeline.topic, PARTITION, 6)]
    assert w.consumer.served == [6, 7, 8, 9]
    assert [(r.start_offset, r.end_offset) for r in w.db.runs] == [(6, 9), (9, 10)]
    assert_group_followed(w.clients.committed_offsets(), [6, 9, 10])  # where it resumed, ...
    assert sorted(w.db.rows) == ["evt-006", "evt-007", "evt-008", "evt-009"]
    assert (report.read, report.chunks, w.stored()) == (4, 2, 10)


def test_a_slice_already_done_reads_nothing(pipeline: Pipeline) -> None:
    # A retry after the last chunk committed (but before the task reported) is a no-op.
    w = World(pipeline)
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 10)
    report = w.ingest()

    assert (report.resumed_from, report.read, report.chunks) == (10, 0, 0)
    assert w.consumer.assigned == []
    assert w.ev.of("begin") == []
    assert w.stored() == 10
    # ... except that the group learns the stored offset: a kill between the last database
    # commit and its Kafka commit must not leave lag tools behind for good.
    assert w.clients.committed_offsets() == [10]


def test_a_cursor_deleted_after_planning_fails_without_reading(pipeline: Pipeline) -> None:
    # Nothing stored for a slice that moves the cursor: not this run's to finish. Fail
    # loudly, read nothing, leave the lock.
    w = World(pipeline)
    del w.db.offsets[(pipeline.name, pipeline.topic, PARTITION)]
    with pytest.raises(OffsetOutOfRange, match="no offset is stored"):
        w.ingest(w.range(3, N))

    assert w.consumer.assigned == []
    assert w.consumer.served == []
    assert w.ev.of("begin") == []
    assert w.stored() is None
    assert w.ev.of("unlock") == [("unlock", "telemetry_metrics", PARTITION)]
    assert w.db.held_locks() == {}


@pytest.mark.parametrize("max_records", [100, 5])
def test_a_cursor_moved_back_behind_the_slice_is_followed_back(pipeline: Pipeline,
                                                               max_records: int) -> None:
    # The cursor moved back after the run was planned: by hand, or by a failover to a
    # standby that never got the commits of [2, 3) (offsets live with the rows: both were
    # lost). The retry of the pinned slice [3, N) reads from the cursor, so nothing between
    # is skipped, at most max_records_per_partition of it; the cursor ends where it read to.
    pipeline = pipeline.model_copy(update={"max_records_per_partition": max_records})
    w = World(pipeline)
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 2)
    report = w.ingest(w.range(3, N))

    end = min(N, 2 + max_records)
    assert report.resumed_from == 2
    assert report.read == end - 2
    assert w.stored() == end
    assert w.db.runs[0].start_offset == 2  # the first chunk starts at the cursor
    assert w.db.runs[-1].end_offset == end
    assert w.db.held_locks() == {}


def test_a_cursor_of_a_topic_since_re_created_is_refused(pipeline: Pipeline) -> None:
    # The stored offset belongs to the topic as it was (its topic id); the topic there now
    # has another id: reading on from the old offsets would skip the new topic's records.
    w = World(pipeline)
    w.ingest(w.range(0, 3))
    assert w.db.offset_topic_ids[(pipeline.name, pipeline.topic, PARTITION)] == (
        f"id-of-{pipeline.topic}")  # adopted by the first slice
    w.clients.topic_ids[pipeline.topic] = "a-new-id"
    with pytest.raises(TopicRecreated, match="deleted and re-created"):
        w.ingest(w.range(3, N))
    assert w.stored() == 3
    assert w.db.held_locks() == {}


# --------------------------------------------------------------------------- 7. dry-run replay


def dlq_record(pipeline: Pipeline, dlq_offset: int, source_offset: int, value: bytes | None,
               *, owner: str | None = None) -> Msg:
    """A DLQ record as ingest writes it: original bytes, provenance and reason in headers."""
    letter = DeadLetter(
        source_topic=pipeline.topic, source_partition=PARTITION, source_offset=source_offset,
        key=b"device", value=value, timestamp_ms=1_767_225_600_000,
        error_class="contract_violation", error_detail="metric_value: Field required",
        contract="metric_event.v2", dlq_topic=pipeline.dlq_topic)
    headers = headers_for(letter, owner or pipeline.name, DlqHeaderStyle.BOTH)
    return Msg(dlq_offset, value_=value, key_=b"device", topic_=pipeline.dlq_topic,
               partition_=0, headers_=tuple(headers))


def seed_dead_letters(db: FakeDatabase, pipeline: Pipeline, records: list[Msg],
                      recovered: list[int]) -> None:
    """Store the ``dead_letters`` rows ingest left, through a committed unit of work."""
    session = db.open_slice()
    with session.unit_of_work(pipeline) as uow:
        letters = [parse_dlq_message(m) for m in records]
        uow.dead_letters.record(pipeline.name, letters, [(0, m.offset()) for m in records])
        uow.dead_letters.mark_recovered(
            pipeline.name, [d.letter_key for d in letters if d.source_offset in recovered])
        uow.commit()
    session.close()


def test_a_dry_run_replay_counts_every_outcome_and_commits_nothing(
        pipeline: Pipeline) -> None:
    # A dry run must be exact (the same work, inside transactions) and leave no trace: no
    # row, no dead-letter status, no cursor, no audit row, no Kafka commit.
    records = [
        dlq_record(pipeline, 0, 4, metric(4)),  # passes now: recovered
        dlq_record(pipeline, 1, 4, metric(4)),  # the same letter again: duplicate_in_dlq
        dlq_record(pipeline, 2, 7, POISON),  # fails again: still_parked
        dlq_record(pipeline, 3, 8, metric(8)),  # recovered by an earlier replay
        dlq_record(pipeline, 4, 9, metric(9), owner="orders_created"),  # other_pipeline
        Msg(5, value_=metric(5), topic_=pipeline.dlq_topic, partition_=0),  # no headers
    ]
    w = World(pipeline, records, topic=pipeline.dlq_topic, partition=0,
              with_producer=False)
    w.db.set_offset(pipeline.name, pipeline.dlq_topic, 0, 0)  # the replay cursor
    seed_dead_letters(w.db, pipeline, [records[0], records[2], records[3]], recovered=[8])
    seeded = dict(w.db.dead_letters)
    before = len(w.events)

    rng = OffsetRange(pipeline.dlq_topic, 0, 0, 6, Mode.REPLAY, from_cursor=True)
    report = replay_range(pipeline, rng, w.clients, w.db, run_id=RUN_ID, dry_run=True)

    assert report.outcomes == {"recovered": 1, "still_parked": 1, "already_recovered": 1,
                               "filtered_out": 0, "duplicate_in_dlq": 1,
                               "other_pipeline": 1, "not_a_dead_letter": 1}
    assert report.reasons["recovered"] == {"contract_violation": 1}
    assert (report.dry_run, report.moves_cursor, report.read, report.inserted,
            report.chunks) == (True, False, 6, 1, 2)
    after = Events(w.events[before:])
    assert after.of("begin") == [("begin", 2), ("begin", 3)]
    assert after.of("rollback") == [("rollback", 2), ("rollback", 3)]
    assert after.of("db_commit") == []
    # Dry runs do not own the cursor: no lock.
    assert after.of("lock") == []
    assert w.db.rows == {}
    assert w.db.dead_letters == seeded
    assert w.db.runs == []
    assert w.db.offset(pipeline.name, pipeline.dlq_topic, 0) == 0
    assert w.clients.group_commits() == []
    assert w.clients.group_ids == ["kafka-ingest.telemetry_metrics.dlq-replay"]
    assert w.clients.producers_handed_out == 0


# --------------------------------------------------------------------------- 8. CHUNK_HOOK


STAGES = ["validated", "upserted", "dlq_produced", "db_committed"]


def test_the_chunk_hook_sees_each_chunks_stages_in_the_documented_order(
        pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    # The crash-safety tests kill the process at these stages: each must be reached once
    # per chunk, in order, and "db_committed" only after the COMMIT; "kafka_committed"
    # once per group commit (at most one per chunk: newest wins), each right after it.
    w = World(pipeline)
    monkeypatch.setattr(slices, "CHUNK_HOOK", lambda stage: w.events.append(("at", stage)))
    w.ingest()

    marks = [e[1] for e in w.ev.of("at")]
    assert {s: marks.count(s) for s in STAGES} == dict.fromkeys(STAGES, len(CHUNKS))
    position: dict[str, list[int]] = {s: [] for s in [*STAGES, "kafka_committed"]}
    for i, e in enumerate(w.events):
        if e[0] == "at":
            position[e[1]].append(i)
    for k, (start, end) in enumerate(CHUNKS):  # the k-th mark of each stage is chunk k's
        at = [position[s][k] for s in STAGES]
        assert at == sorted(at), (start, end, at)
        txn = w.ev.txn_of_chunk(start, end)
        assert w.events.index(("db_commit", txn, start, end)) < position["db_committed"][k]
    committed = [i for i, e in enumerate(w.events) if e[0] == "kafka_commit"]
    assert len(position["kafka_committed"]) == len(committed) <= len(CHUNKS)
    assert all(c < m for c, m in zip(committed, position["kafka_committed"], strict=True))


# --------------------------------------------------------------------------- Kafka commits


def test_a_failing_kafka_commit_never_fails_the_slice(pipeline: Pipeline,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Postgres is the source of truth: a lost group commit only makes lag tools lag; the
    # slice goes on and the stored offset is right. Each offset is tried three times at
    # most (fewer when a newer one was posted meanwhile); the last one, three times.
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    w = World(pipeline, commit_failures=100)
    report = w.ingest()

    assert w.clients.committed_offsets() == []
    failed = [e[1] for e in w.ev.of("kafka_commit_failed")]
    assert failed == sorted(failed) and set(failed) <= {3, 6, 9, 10}
    assert all(failed.count(o) <= 3 for o in failed) and failed.count(10) == 3
    assert w.stored() == 10
    assert sorted(w.db.rows) == VALID
    assert (report.read, report.chunks) == (10, 4)


def test_a_letter_twice_in_the_dlq_counts_the_same_in_a_dry_run_and_a_real_one(
        pipeline: Pipeline) -> None:
    # A retried produce can put the same source letter in the DLQ twice, in different
    # chunks. A dry run's chunks see nothing of each other's (rolled back) writes, so the
    # second copy must be told apart within the slice, or the dry run would count it as
    # recovered a second time while the real run says already recovered.
    def run(dry_run: bool) -> dict[str, int]:
        records = [dlq_record(pipeline, 0, 4, metric(4)), dlq_record(pipeline, 1, 5, metric(5)),
                   dlq_record(pipeline, 2, 6, metric(6)), dlq_record(pipeline, 3, 4, metric(4))]
        w = World(pipeline, records, topic=pipeline.dlq_topic, partition=0,
                  with_producer=False)
        w.db.set_offset(pipeline.name, pipeline.dlq_topic, 0, 0)
        seed_dead_letters(w.db, pipeline, records[:3], recovered=[])
        rng = OffsetRange(pipeline.dlq_topic, 0, 0, 4, Mode.REPLAY, from_cursor=True)
        report = replay_range(pipeline, rng, w.clients, w.db, run_id=RUN_ID, dry_run=dry_run)
        assert report.chunks == 2  # chunk_size 3: the copy is in the second chunk
        return report.outcomes

    expected = {"recovered": 3, "still_parked": 0, "already_recovered": 0, "filtered_out": 0,
                "duplicate_in_dlq": 1}
    assert run(dry_run=True) == expected
    assert run(dry_run=False) == expected


# --------------------------------------------------------------------------- known dead letters


def test_a_backfill_dead_letters_a_poison_pill_once_and_never_again(pipeline: Pipeline) -> None:
    # A backfill over a range whose poison pill was never dead-lettered dead-letters it
    # (once); a later backfill over the same range finds it in dead_letters and counts it
    # as known_dead: neither produced to the DLQ nor recorded again, attempts stay 1, and
    # the chunk still reconciles (read = ... + dead_lettered + known_dead + ...).
    w = World(pipeline)
    key = (pipeline.name, pipeline.topic, 1, PARTITION, POISON_AT)
    first = w.ingest(w.range(0, N, Mode.BACKFILL))

    assert (first.dead_lettered, first.known_dead) == (1, 0)
    assert len(w.producer.produced) == len(w.producer.delivered) == 1
    letter = w.db.dead_letters[key]
    assert (letter.status, letter.attempts) == ("parked", 1)
    before = len(w.events)

    again = w.ingest(w.range(0, N, Mode.BACKFILL))

    assert (again.read, again.inserted, again.duplicates, again.dead_lettered,
            again.known_dead) == (N, 0, N - 1, 0, 1)
    assert len(w.producer.produced) == 1  # the first backfill's, only
    after = Events(w.events[before:])
    assert after.of("dlq_produce") == [] and after.of("dead_letters") == []
    assert w.db.dead_letters[key] == letter
    assert [(r.start_offset, r.counts.dead_lettered, r.counts.known_dead)
            for r in w.db.runs[len(CHUNKS):]] == [(0, 0, 0), (3, 0, 1), (6, 0, 0), (9, 0, 0)]
    assert "dead-lettered 0, already dead-lettered 1," in again.log_line()
    assert w.stored() == 0  # backfills never move the cursor


def test_a_live_slice_re_reading_a_known_poison_pill_dead_letters_it_again(
        pipeline: Pipeline) -> None:
    # Live runs meet a known offset only when a chunk is read again (after a crash, or a
    # cursor moved back by hand): producing it again is the documented at-least-once into
    # the DLQ, and attempts counts it. Only backfills skip known dead letters.
    w = World(pipeline)
    w.ingest()
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 0)
    report = w.ingest()

    assert (report.dead_lettered, report.known_dead) == (1, 0)
    assert len(w.producer.delivered) == 2
    assert w.db.dead_letters[(pipeline.name, pipeline.topic, 1, PARTITION, POISON_AT)].attempts == 2


def test_a_slice_shortens_the_thread_switch_interval_only_while_it_runs(
        pipeline: Pipeline) -> None:
    # The transaction thread must get the GIL back quickly from the validating main thread
    # (tuning.SWITCH_INTERVAL_S); the process's own setting is back once the slice ends,
    # also when it fails.

    before = sys.getswitchinterval()
    seen: list[float] = []
    w = World(pipeline)
    w.db.inject(1, "upsert", lambda: seen.append(sys.getswitchinterval()))
    w.ingest()
    assert seen == [min(before, tuning.SWITCH_INTERVAL_S)]
    assert sys.getswitchinterval() == before
    w.db.inject(5, "upsert", RuntimeError("boom"))
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 0)
    with pytest.raises(RuntimeError):
        w.ingest()
    assert sys.getswitchinterval() == before


def test_a_slice_freezes_the_heap_and_collects_young_objects_less_often_only_while_it_runs(
        pipeline: Pipeline) -> None:
    # The collector's first threshold is tuning.GC_YOUNG_THRESHOLD while a slice runs, and
    # what was in the heap before it is frozen out of the collections; both are as they
    # were once the slice ends, also when it fails.
    import gc

    before, frozen = gc.get_threshold(), gc.get_freeze_count()
    seen: list[tuple[tuple[int, int, int], int]] = []
    w = World(pipeline)
    w.db.inject(1, "upsert", lambda: seen.append((gc.get_threshold(), gc.get_freeze_count())))
    w.ingest()
    [(threshold, count)] = seen
    assert threshold == (max(before[0], tuning.GC_YOUNG_THRESHOLD), *before[1:])
    assert count > frozen
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, frozen)
    w.db.inject(5, "upsert", RuntimeError("boom"))
    w.db.set_offset(pipeline.name, pipeline.topic, PARTITION, 0)
    with pytest.raises(RuntimeError):
        w.ingest()
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, frozen)


def test_a_process_frozen_before_the_slice_is_left_frozen_as_it_was(pipeline: Pipeline) -> None:
    # Airflow's LocalExecutor forks its task processes with a frozen heap: the slice then
    # only raises the threshold; it freezes nothing more (that could never be undone).
    import gc

    gc.freeze()
    try:
        frozen, seen = gc.get_freeze_count(), []
        w = World(pipeline)
        w.db.inject(1, "upsert", lambda: seen.append(gc.get_freeze_count()))
        w.ingest()
        # (frozen objects can still be freed: the count may only fall, never grow)
        assert len(seen) == 1 and seen[0] <= frozen and gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_slice_reports_the_latest_kafka_timestamp_it_loaded(pipeline: Pipeline) -> None:
    # What the run's event-time watermark is made of (ops/lineage.py): the greatest
    # timestamp of the committed chunks, not the last one in log order (a producer's
    # CreateTime may go back), and a record without one counts for nothing.
    stamps = {i: (1, 1_767_225_600_000 + 1000 * i) for i in range(LOG_SIZE)}
    stamps[5] = (1, 1_767_225_600_000 + 60_000)  # late in time, early in the log
    stamps[9] = (0, -1)  # no timestamp
    log = [Msg(i, value_=metric(i), key_=b"device", topic_=pipeline.topic,
               partition_=PARTITION, timestamp_=stamps[i]) for i in range(LOG_SIZE)]
    report = World(pipeline, log).ingest()
    assert report.max_event_time_ms == 1_767_225_600_000 + 60_000
    assert report.to_dict()["max_event_time_ms"] == report.max_event_time_ms


def test_a_slice_reports_the_latest_event_time_of_its_event_time_field(
        pipeline: Pipeline) -> None:
    # event_time: timestamp (the payload's seconds, converted to a timestamptz): the
    # watermark is by that field, whatever the Kafka timestamps say; a record that fails
    # the contract has no event time, so it counts for nothing
    by_field = pipeline.model_copy(update={"event_time": "timestamp"})
    log = [Msg(i, value_=metric(i), key_=b"device", topic_=pipeline.topic,
               partition_=PARTITION, timestamp_=(1, 2_000_000_000_000 - i))
           for i in range(LOG_SIZE)]
    last = N - 1  # the slice reads [0, N)
    log[last] = Msg(last, value_=b"{not json", topic_=pipeline.topic, partition_=PARTITION,
                    timestamp_=(1, 2_100_000_000_000))
    report = World(by_field, log).ingest()
    # metric(i)'s timestamp is 1_767_225_600 + i seconds; the last valid one read is N - 2
    assert report.read == N and report.dead_lettered == 1
    assert report.max_event_time_ms == (1_767_225_600 + N - 2) * 1000
