"""Fakes at the ports of the slice engine: Kafka's consumer and producer, and Postgres.

Fakes, not mocks (cosmicpython's "fake the port"): each one holds state and behaves the
way the real adapter does, so a test sets up a world, runs the real code against it and
then looks at what the world holds: what was committed, what is stored, what was
produced. No call is scripted or expected.

- :class:`FakeConsumer`: one partition's log served like ``confluent_kafka.Consumer``
  (assign + seek, ``consume(n)``, ``position``, watermarks, synchronous commits that can
  be told to fail, ``close``, and ``RuntimeError("Consumer closed")`` after it).
- :class:`FakeProducer`: the DLQ producer; delivery reports are served on ``poll`` and
  ``flush`` through the ``on_delivery`` callbacks, and can be made to fail or never come.
- :class:`FakeClients`: :class:`kafka_ingest.kafka.clients.KafkaClients`' methods; its
  ``committer`` is the real :class:`kafka_ingest.kafka.commits.GroupCommitter`, committing
  through fake consumers of its own (as the real one does).
- :class:`FakeDatabase`: what :class:`kafka_ingest.db.Database` opens for a slice:
  :class:`FakeSession` (advisory locks, the stored cursor, units of work) and
  :class:`FakeUnitOfWork`, whose repositories write into a pending state that only
  ``commit()`` moves into the committed state. The stored offset moves only by
  compare-and-set and raises :class:`~kafka_ingest.errors.FencedError` like the real
  one. Faults are injected per transaction (the n-th unit of work opened on the database)
  and stage.

Every fake appends to one shared ``events`` list, so a test can check the order of what
happened across them (:class:`Events` answers the usual questions about it). The engine
runs a chunk's transaction in a thread of its own while the main thread reads and validates
the next chunk: list appends are atomic, so the list is a true order of events, but only
per-chunk orderings are deterministic, not the global interleaving. The events:

============================================  ===========================================
``("assign", offset)`` / ``("unassign",)``    the consumer's partition assigned / dropped
``("kafka_commit", offset)``                  a synchronous commit that succeeded
``("kafka_commit_failed", offset)``           one that raised ``KafkaException``
``("consumer_close",)``                       the consumer closed
``("dlq_produce", topic, source_offset)``     a record handed to the producer
``("dlq_delivered", topic, partition, off)``  its delivery report (success)
``("dlq_failed", topic, source_offset)``      its delivery report (an error)
``("lock", name, partition)``                 a session-level advisory lock taken
``("unlock", name, partition)``               the session-level lock released
``("cursor", value)``                         the stored offset read by the session
``("session_close",)``                        the slice's connection closed
``("begin", txn)``                            unit of work number ``txn`` opened
``("upsert", txn, offsets)``                  rows upserted (their source offsets)
``("dead_letters", txn, offsets)``            dead letters recorded (source offsets)
``("recovered", txn, offsets)``               dead letters marked recovered
``("advance", txn, expected, new)``           the stored offset moved (compare-and-set)
``("audit", txn, start, end)``                the audit row of a chunk
``("db_commit", txn, start, end)``            the transaction committed
``("rollback", txn)``                         the transaction rolled back
``("set_offset", pipeline, topic, p, value)`` the stored offset set from outside
============================================  ===========================================
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kafka_ingest.config import Pipeline, UpsertMode
from kafka_ingest.db import RunRecord, UpsertResult
from kafka_ingest.errors import DatabaseUnavailable, DataError, FencedError, RejectedByDatabase
from kafka_ingest.kafka.commits import GroupCommitter
from kafka_ingest.kafka.dlq import CONNECT, PREFIX, DeadLetter
from kafka_ingest.records import CopyPayload, Row, Source, row_source, row_values
from kafka_ingest.records import LetterKey as RecordsLetterKey

TOPIC = "orders"
PARTITION = 3  # not 0, so a partition mix-up cannot pass by accident

Event = tuple[Any, ...]


# --------------------------------------------------------------------------- Kafka


@dataclass(frozen=True)
class Msg:
    """The read-only accessors of a consumed ``confluent_kafka.Message`` (or error event)."""

    offset_: int
    value_: bytes | None = b"0123456789"
    key_: bytes | None = None
    error_: KafkaError | None = None
    topic_: str = TOPIC
    partition_: int = PARTITION
    timestamp_: tuple[int, int] = (1, 1_767_225_600_000)
    headers_: tuple[tuple[str, bytes | None], ...] | None = None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def timestamp(self) -> tuple[int, int]:
        return self.timestamp_

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None if self.headers_ is None else list(self.headers_)

    def error(self) -> KafkaError | None:
        return self.error_


class FakeConsumer:
    """One partition's log behind the consumer port.

    ``batch``: how many messages one ``consume`` returns whatever ``num_messages`` asks
    (what librdkafka has queued); it may overshoot the chunk being read.
    ``stop_at_gaps``: a fetch ends where offsets are missing, and the next ``consume``
    returns nothing but moves the position past them (a fetch of only markers).
    ``stall_at``: offsets from here on exist but are never delivered, and the position
    never moves past them (a broker that stopped answering).
    ``commit_failures``: how many of the next commits raise ``KafkaException``.
    After :meth:`close`, every call but ``close`` raises ``RuntimeError("Consumer
    closed")``, as confluent-kafka's consumer does.
    """

    def __init__(self, log: list[Msg], *, low: int = 0, high: int | None = None,
                 batch: int | None = None, stop_at_gaps: bool = False,
                 stall_at: int | None = None, commit_failures: int = 0,
                 topic: str = TOPIC, partition: int = PARTITION,
                 events: list[Event] | None = None) -> None:
        self.log = sorted(log, key=lambda m: m.offset())
        self.low = low
        self.high = high if high is not None else (self.log[-1].offset() + 1 if log else low)
        self.batch = batch
        self.stop_at_gaps = stop_at_gaps
        self.stall_at = stall_at
        self.commit_failures = commit_failures
        self.topic = topic
        self.partition = partition
        self.events: list[Event] = events if events is not None else []
        self.next_offset: int | None = None  # None: nothing assigned
        self.assigned: list[tuple[str, int, int]] = []
        self.unassigned = 0
        self.consume_calls: list[tuple[int, float]] = []
        self.served: list[int] = []  # offsets of the messages handed out, in order
        self.watermark_calls: list[tuple[str, int, float | None, bool]] = []
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []
        self.succeeded: list[int] = []
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._check_open()
        (tp,) = partitions
        assert (tp.topic, tp.partition) == (self.topic, self.partition)
        self.assigned.append((tp.topic, tp.partition, tp.offset))
        self.next_offset = tp.offset
        self.events.append(("assign", tp.offset))

    def unassign(self) -> None:
        self._check_open()
        self.unassigned += 1
        self.next_offset = None
        self.events.append(("unassign",))

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Msg]:
        self._check_open()
        assert self.next_offset is not None, "consume() on a consumer with nothing assigned"
        assert num_messages >= 1
        self.consume_calls.append((num_messages, timeout))
        pending = [m for m in self.log if m.offset() >= self.next_offset
                   and (self.stall_at is None or m.offset() < self.stall_at)]
        if not pending:
            if self.stall_at is None:  # fetched up to the end: only markers were left
                self.next_offset = max(self.next_offset, self.high)
            time.sleep(min(timeout, 0.02))  # nothing queued: the poll times out
            return []
        if self.stop_at_gaps and pending[0].offset() > self.next_offset:
            self.next_offset = pending[0].offset()  # a fetch of only markers
            return []
        served: list[Msg] = []
        for m in pending[: self.batch or num_messages]:
            if self.stop_at_gaps and served and m.offset() != served[-1].offset() + 1:
                break
            served.append(m)
        self.next_offset = served[-1].offset() + 1
        self.served += [m.offset() for m in served]
        return served

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self._check_open()
        assert self.next_offset is not None
        return [TopicPartition(tp.topic, tp.partition, self.next_offset) for tp in partitions]

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        self._check_open()
        self.watermark_calls.append((partition.topic, partition.partition, timeout, cached))
        return self.low, self.high

    def commit(self, offsets: list[TopicPartition] | None = None,
               asynchronous: bool = True) -> None:
        self._check_open()
        committed = [(tp.topic, tp.partition, tp.offset) for tp in offsets or []]
        self.commits.append((committed, asynchronous))
        if self.commit_failures:
            self.commit_failures -= 1
            self.events += [("kafka_commit_failed", o) for _, _, o in committed]
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))
        self.succeeded += [o for _, _, o in committed]
        self.events += [("kafka_commit", o) for _, _, o in committed]

    def poll(self, timeout: float = -1) -> None:
        """Serves callbacks (librdkafka's logs); this consumer has no events of its own."""
        self._check_open()

    def committed_offsets(self) -> list[int]:
        """The offsets this consumer committed successfully, in order."""
        return list(self.succeeded)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.events.append(("consumer_close",))


def _source_offset(headers: Iterable[tuple[str, bytes | None]]) -> int | None:
    """The source offset a DLQ record's headers name (either header style), if any."""
    h = dict(headers)
    raw = h.get(PREFIX + "offset") or h.get(CONNECT["offset"])
    return int(raw) if raw else None


class FakeProducer:
    """The DLQ producer: queues records, serves delivery reports on ``poll``/``flush``.

    Delivered records get consecutive offsets per (topic, partition) and are kept in
    :attr:`delivered` (as :class:`Msg`, so they can be fed to a :class:`FakeConsumer`).
    ``fail_deliveries``: every report is an error (``_MSG_TIMED_OUT``). ``hold_reports``:
    no report ever comes, ``flush`` returns how many are still queued. ``produce_error``:
    ``produce`` raises it.
    """

    def __init__(self, *, events: list[Event] | None = None, fail_deliveries: bool = False,
                 hold_reports: bool = False, produce_error: Exception | None = None) -> None:
        self.events: list[Event] = events if events is not None else []
        self.fail_deliveries = fail_deliveries
        self.hold_reports = hold_reports
        self.produce_error = produce_error
        self.produced: list[Msg] = []
        self.delivered: list[Msg] = []
        self.failed: list[Msg] = []
        self.flushes = 0
        self._queue: list[tuple[Msg, Callable[[Any, Any], None] | None]] = []
        self._next: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = -1, on_delivery: Callable[[Any, Any], None] | None = None,
                timestamp: int = 0, headers: Sequence[tuple[str, bytes | None]] | None = None,
                **_: Any) -> None:
        if self.produce_error is not None:
            raise self.produce_error
        msg = Msg(-1, value_=value, key_=key, topic_=topic, partition_=max(partition, 0),
                  timestamp_=(1, timestamp) if timestamp else (0, -1),
                  headers_=tuple(headers or ()))
        with self._lock:
            self.produced.append(msg)
            self._queue.append((msg, on_delivery))
        self.events.append(("dlq_produce", topic, _source_offset(msg.headers_ or ())))

    def poll(self, timeout: float = -1) -> int:
        """Serve the queued delivery reports (all of them: the fake's broker is instant)."""
        if self.hold_reports:
            return 0
        with self._lock:
            queued, self._queue = self._queue, []
        for msg, on_delivery in queued:
            if self.fail_deliveries:
                self.failed.append(msg)
                self.events.append(("dlq_failed", msg.topic(),
                                    _source_offset(msg.headers_ or ())))
                if on_delivery is not None:
                    on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), msg)
                continue
            where = (msg.topic(), msg.partition())
            with self._lock:
                offset = self._next.get(where, 0)
                self._next[where] = offset + 1
            done = replace(msg, offset_=offset)
            self.delivered.append(done)
            self.events.append(("dlq_delivered", msg.topic(), msg.partition(), offset))
            if on_delivery is not None:
                on_delivery(None, done)
        return len(queued)

    def flush(self, timeout: float = -1) -> int:
        self.flushes += 1
        self.poll(0)
        return len(self._queue)


class FakeClients:
    """:class:`kafka_ingest.kafka.clients.KafkaClients` for a slice: a new consumer from
    ``consumer_factory`` per call (a rerun reads the same log afresh), one producer, and
    the real group committer over consumers of its own (``commit_consumers``)."""

    def __init__(self, consumer_factory: Callable[[], FakeConsumer],
                 producer: FakeProducer | None = None, *,
                 commit_timeout_s: float = 5.0,
                 commit_consumer_factory: Callable[[], Any] | None = None) -> None:
        self.consumer_factory = consumer_factory
        self.commit_consumer_factory = commit_consumer_factory or consumer_factory
        self._producer = producer
        self.commit_timeout_s = commit_timeout_s
        self.registry = None  # the slices here read JSON: no schema registry
        self.consumers: list[FakeConsumer] = []
        self.commit_consumers: list[FakeConsumer] = []
        self.group_ids: list[str] = []
        self.producers_handed_out = 0
        #: Kafka's id of each topic (a topic re-created: set another one).
        self.topic_ids: dict[str, str] = {}

    def topic_id(self, topic: str, *, role: str = "topic") -> str:
        return self.topic_ids.get(topic, f"id-of-{topic}")

    def consumer(self, group_id: str) -> FakeConsumer:
        consumer = self.consumer_factory()
        self.consumers.append(consumer)
        self.group_ids.append(group_id)
        return consumer

    def committer(self, group_id: str, *,
                  on_commit: Callable[[], None] | None = None) -> GroupCommitter:
        def commit_consumer() -> Any:
            consumer = self.commit_consumer_factory()
            self.commit_consumers.append(consumer)
            return consumer

        return GroupCommitter(commit_consumer, group_id, timeout_s=self.commit_timeout_s,
                              on_commit=on_commit)

    def group_commits(self) -> list[tuple[list[tuple[str, int, int]], bool]]:
        """Every commit the committers' consumers were asked for, in order."""
        return [c for consumer in self.commit_consumers for c in consumer.commits]

    def committed_offsets(self, slice_number: int | None = None) -> list[int]:
        """The offsets the group acknowledged, in order: of every committer, or of the
        ``slice_number``-th one made (one per slice that moves its cursor; -1: the last)."""
        chosen = (self.commit_consumers if slice_number is None
                  else [self.commit_consumers[slice_number]])
        return [o for consumer in chosen for o in consumer.succeeded]

    def producer(self) -> FakeProducer:
        if self._producer is None:
            raise AssertionError("no producer was configured: this slice should not need one")
        self.producers_handed_out += 1
        return self._producer


# --------------------------------------------------------------------------- Postgres


#: Where a fault can be injected into a unit of work: before the named repository call
#: takes effect ("advance" runs before the compare-and-set, so a callable there can move
#: the stored offset under the chunk), before COMMIT ("commit": nothing lands) or after
#: it ("committed": the commit landed, then the error, as with a lost reply).
STAGES = ("upsert", "dead_letters", "advance", "audit", "commit", "committed")


@dataclass(frozen=True)
class Fault:
    """At stage ``stage`` of the ``transaction``-th unit of work, raise ``action`` (an
    exception) or call it (a callable: something happening meanwhile)."""

    transaction: int
    stage: str
    action: BaseException | Callable[[], None]


@dataclass(frozen=True)
class StoredLetter:
    """A ``dead_letters`` row."""

    letter: DeadLetter
    status: str = "parked"
    attempts: int = 1
    dlq_partition: int | None = None
    dlq_offset: int | None = None


#: (pipeline, source topic, incarnation, partition, offset)
LetterKey = tuple[str, str, int, int, int]
OffsetKey = tuple[str, str, int]  # (pipeline, topic, partition)


class FakeDatabase:
    """The pipelines' database, as the slice engine sees it (:meth:`open_slice`).

    Committed state: :attr:`rows` (the target table by ``event_id``; append semantics:
    insert if absent), :attr:`dead_letters`, :attr:`runs` (the audit), :attr:`offsets`
    (the stored cursors). Advisory locks exclude other sessions; a lock not free within
    ``lock_timeout_s`` raises :class:`DatabaseUnavailable`, as the real session does.
    ``reject``: event ids Postgres refuses (returned as rejected rows by the upsert).
    """

    def __init__(self, *, events: list[Event] | None = None, lock_timeout_s: float = 0.5,
                 offsets: dict[OffsetKey, int] | None = None,
                 reject: Iterable[str] = ()) -> None:
        self.events: list[Event] = events if events is not None else []
        self.lock_timeout_s = lock_timeout_s
        self.offsets: dict[OffsetKey, int] = dict(offsets or {})
        #: The topic id each stored offset belongs to (absent: stored before ids were kept).
        self.offset_topic_ids: dict[OffsetKey, str] = {}
        #: (topic, topic id) -> incarnation, numbered as first seen.
        self.incarnations: dict[tuple[str, str], int] = {}
        self.rows: dict[str, Row] = {}
        self.dead_letters: dict[LetterKey, StoredLetter] = {}
        self.runs: list[RunRecord] = []
        self.reject = set(reject)
        self.faults: list[Fault] = []
        self.sessions: list[FakeSession] = []
        self.transactions = 0  # units of work opened so far
        self.state = threading.RLock()
        # (name, partition) -> [session holding it, session-level count, xact-level count]
        self._locks: dict[tuple[str, int], list[Any]] = {}
        self._lock_changed = threading.Condition(self.state)

    # ------------------------------------------------------------------ set-up, faults

    def inject(self, transaction: int, stage: str,
               action: BaseException | Callable[[], None]) -> None:
        """Fail (or disturb) the ``transaction``-th unit of work at ``stage``."""
        assert stage in STAGES, f"unknown stage {stage!r}; one of {STAGES}"
        self.faults.append(Fault(transaction, stage, action))

    def set_offset(self, pipeline: str, topic: str, partition: int, value: int) -> None:
        """Store an offset from outside the slice (another run, an operator)."""
        with self.state:
            self.offsets[(pipeline, topic, partition)] = value
        self.events.append(("set_offset", pipeline, topic, partition, value))

    def offset(self, pipeline: str, topic: str, partition: int) -> int | None:
        return self.offsets.get((pipeline, topic, partition))

    def held_locks(self) -> dict[tuple[str, int], int]:
        """(name, partition) -> how many times its holder took it (session locks nest)."""
        with self.state:
            return {k: v[1] for k, v in self._locks.items()}

    # ------------------------------------------------------------------ the port

    def open_slice(self) -> FakeSession:
        session = FakeSession(self, len(self.sessions) + 1)
        self.sessions.append(session)
        return session

    # ------------------------------------------------------------------ internals

    def _fault(self, transaction: int, stage: str) -> None:
        for fault in self.faults:
            if (fault.transaction, fault.stage) == (transaction, stage):
                if isinstance(fault.action, BaseException):
                    raise fault.action
                fault.action()

    def _acquire(self, session: FakeSession, name: str, partition: int) -> None:
        key = (name, partition)
        deadline = time.monotonic() + self.lock_timeout_s
        with self._lock_changed:
            while key in self._locks and self._locks[key][0] is not session:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DatabaseUnavailable(
                        "advisory lock", f"{name}[{partition}] is being written by another "
                        f"run for over {self.lock_timeout_s}s")
                self._lock_changed.wait(left)
            held = self._locks.setdefault(key, [session, 0])
            held[1] += 1

    def _release(self, session: FakeSession, key: tuple[str, int], *,
                 every: bool = False) -> bool:
        with self._lock_changed:
            held = self._locks.get(key)
            if held is None or held[0] is not session:
                return False
            held[1] = 0 if every else held[1] - 1
            if held[1] == 0:
                del self._locks[key]
                self._lock_changed.notify_all()
            return True

    def _release_all(self, session: FakeSession) -> None:
        with self.state:
            keys = [k for k, v in self._locks.items() if v[0] is session]
        for key in keys:
            self._release(session, key, every=True)


class FakeSession:
    """One slice's connection (:class:`kafka_ingest.db.SliceSession`): locks, the cursor,
    one unit of work at a time."""

    def __init__(self, db: FakeDatabase, number: int) -> None:
        self.db = db
        self.number = number
        self.lock_timeout_s = db.lock_timeout_s
        self.current: FakeUnitOfWork | None = None
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise psycopg.OperationalError("the connection is closed")

    def lock(self, name: str, partition: int) -> None:
        self._check_open()
        self.db._acquire(self, name, partition)
        self.db.events.append(("lock", name, partition))

    def unlock(self, name: str, partition: int) -> None:
        if self.closed:  # a closed connection released its locks already
            return
        self.db._release(self, (name, partition))
        self.db.events.append(("unlock", name, partition))

    def cursor(self, pipeline: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        self._check_open()
        value = self.db.offset(pipeline, topic, partition)
        self.db.events.append(("cursor", value))
        if value is None:
            return None
        return value, self.db.offset_topic_ids.get((pipeline, topic, partition))

    def adopt(self, pipeline: str, topic: str, topic_id: str) -> None:
        with self.db.state:
            for key in self.db.offsets:
                if key[:2] == (pipeline, topic):
                    self.db.offset_topic_ids.setdefault(key, topic_id)

    def incarnation(self, topic: str, topic_id: str) -> int:
        with self.db.state:
            numbers = self.db.incarnations
            if (topic, topic_id) not in numbers:
                numbers[(topic, topic_id)] = 1 + sum(t == topic for t, _ in numbers)
            return numbers[(topic, topic_id)]

    def copy_encoder(self, pipeline: Pipeline) -> FakeEncoder:
        self._check_open()
        return FakeEncoder()

    def unit_of_work(self, pipeline: Pipeline) -> FakeUnitOfWork:
        self._check_open()
        if self.current is not None:
            raise RuntimeError(f"transaction {self.current.txn} is still open on this "
                               "connection: one transaction at a time")
        with self.db.state:
            self.db.transactions += 1
            txn = self.db.transactions
        self.current = FakeUnitOfWork(self, pipeline, txn)
        return self.current

    def close(self) -> None:
        if self.closed:
            return
        if self.current is not None:  # the server rolls back an open transaction
            self.current._end("rollback")
        self.db._release_all(self)
        self.closed = True
        self.db.events.append(("session_close",))


class FakeUnitOfWork:
    """One transaction: the repositories write into pending state; :meth:`commit` moves it
    into the database's committed state; leaving the ``with`` without it rolls back."""

    def __init__(self, session: FakeSession, pipeline: Pipeline, txn: int) -> None:
        self.session = session
        self.db = session.db
        self.pipeline = pipeline
        self.txn = txn
        self.committed = False
        self.ended = False
        self.pending_rows: dict[str, Row] = {}
        self.pending_letters: dict[LetterKey, StoredLetter] = {}
        self.pending_runs: list[RunRecord] = []
        self.pending_offsets: dict[OffsetKey, int] = {}
        self.advances: list[tuple[OffsetKey, int]] = []
        self.rows = _Rows(self)
        self.offsets = _Offsets(self)
        self.dead_letters = _DeadLetters(self)
        self.runs = _Runs(self)
        self.incarnations = _Incarnations(self)
        self.db.events.append(("begin", txn))

    def __enter__(self) -> FakeUnitOfWork:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.ended:
            self._end("rollback")

    def fault(self, stage: str) -> None:
        self.db._fault(self.txn, stage)

    def commit(self, *, partition: int = -1, start: int = -1, end: int = -1) -> None:
        assert not self.ended, f"transaction {self.txn} already ended"
        self.fault("commit")
        with self.db.state:
            # An UPDATE of the cursor blocked behind another transaction re-checks its
            # WHERE once that one commits: a cursor moved meanwhile fences this one.
            for key, expected in self.advances:
                if self.db.offsets.get(key) != expected:
                    self._end("rollback")
                    raise FencedError(*key, expected, self.db.offsets.get(key))
            for event_id, row in self.pending_rows.items():
                self.db.rows.setdefault(event_id, row)
            self.db.dead_letters.update(self.pending_letters)
            self.db.runs += self.pending_runs
            self.db.offsets.update(self.pending_offsets)
        self.committed = True
        self.db.events.append(("db_commit", self.txn, start, end))
        self._end(None)
        self.fault("committed")

    def rollback(self) -> None:
        self._end("rollback")

    def _end(self, event: str | None) -> None:
        if self.ended:
            return
        self.ended = True
        if event is not None:
            self.db.events.append((event, self.txn))
        if self.session.current is self:
            self.session.current = None

    # what this transaction sees: its own writes over the committed state
    def stored_row(self, event_id: str) -> Row | None:
        return self.pending_rows.get(event_id) or self.db.rows.get(event_id)

    def stored_letter(self, key: LetterKey) -> StoredLetter | None:
        return self.pending_letters.get(key) or self.db.dead_letters.get(key)

    def stored_offset(self, key: OffsetKey) -> int | None:
        if key in self.pending_offsets:
            return self.pending_offsets[key]
        return self.db.offsets.get(key)


class FakeEncoder:
    """:class:`kafka_ingest.db.CopyEncoder`: "encodes" rows as their source offsets, so
    the fake table can check that what was encoded is what it is given."""

    def encode(self, rows: Sequence[Row]) -> CopyPayload:
        return CopyPayload(repr([row_source(r).offset for r in rows]).encode(), len(rows))


class _Rows:
    """The target table (append pipelines: ``ON CONFLICT (event_id) DO NOTHING``)."""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self.uow = uow

    def serialize(self, partitions: Iterable[int], *, every: bool = False) -> None:
        """Append pipelines only: nothing to hold (see ``TableWriter.serialize``)."""

    def upsert(self, rows: Sequence[Row], *, source: Source | None = None,
               encoded: CopyPayload | None = None) -> UpsertResult:
        if encoded is not None and encoded != FakeEncoder().encode(rows):
            raise AssertionError("the encoded payload is not these rows")
        uow = self.uow
        if uow.pipeline.upsert.mode is not UpsertMode.APPEND:
            raise NotImplementedError("the fake table knows append pipelines only")
        uow.fault("upsert")
        inserted = duplicates = 0
        rejected: list[tuple[Row, DataError]] = []
        for row in rows:
            event_id = row_values(row)[0]
            if event_id in uow.db.reject:
                rejected.append((row, RejectedByDatabase(f"{event_id}: refused (fake)")))
            elif uow.stored_row(event_id) is None:
                uow.pending_rows[event_id] = row
                inserted += 1
            else:
                duplicates += 1
        uow.db.events.append(("upsert", uow.txn, tuple(row_source(r).offset for r in rows)))
        return UpsertResult(inserted, duplicates, 0, rejected)


class _Offsets:
    """``ingest_offsets``: moved only by compare-and-set."""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self.uow = uow

    def get(self, pipeline: str, topic: str, partition: int) -> int | None:
        return self.uow.stored_offset((pipeline, topic, partition))

    def advance(self, pipeline: str, topic: str, partition: int, expected: int,
                new: int) -> None:
        uow = self.uow
        uow.fault("advance")
        key = (pipeline, topic, partition)
        with uow.db.state:
            found = uow.stored_offset(key)
            if found != expected:  # the UPDATE ... WHERE next_offset = expected hit 0 rows
                raise FencedError(pipeline, topic, partition, expected, found)
            uow.pending_offsets[key] = new
            if key not in dict(uow.advances):
                uow.advances.append((key, expected))
        uow.db.events.append(("advance", uow.txn, expected, new))


class _DeadLetters:
    """``dead_letters``: one row per source position; insert or bump, as the real one."""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self.uow = uow

    def record(self, pipeline: str, letters: Sequence[DeadLetter],
               delivered: Sequence[tuple[int, int] | None]) -> None:
        if not letters:
            return
        uow = self.uow
        uow.fault("dead_letters")
        for d, loc in zip(letters, delivered, strict=True):
            key = (pipeline, *d.letter_key)
            old = uow.stored_letter(key)
            attempts = d.attempts if old is None else max(old.attempts + 1, d.attempts)
            uow.pending_letters[key] = StoredLetter(
                d, "parked", attempts,
                loc[0] if loc else (old.dlq_partition if old else None),
                loc[1] if loc else (old.dlq_offset if old else None))
        uow.db.events.append(("dead_letters", uow.txn,
                              tuple(d.source_offset for d in letters)))

    def mark_recovered(self, pipeline: str, keys: Sequence[RecordsLetterKey]) -> None:
        if not keys:
            return
        uow = self.uow
        for k in keys:
            old = uow.stored_letter((pipeline, *k))
            if old is not None:
                uow.pending_letters[(pipeline, *k)] = replace(
                    old, status="recovered", attempts=old.attempts + 1)
        uow.db.events.append(("recovered", uow.txn, tuple(k[3] for k in keys)))

    def status_of(self, pipeline: str,
                  keys: Sequence[RecordsLetterKey]) -> dict[RecordsLetterKey, str]:
        found = {k: self.uow.stored_letter((pipeline, *k)) for k in keys}
        return {k: v.status for k, v in found.items() if v is not None}


class _Incarnations:
    """``topic_incarnations``, as the replay reads it."""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self.uow = uow

    def known(self, topic: str, topic_id: str | None) -> int | None:
        if topic_id is None:
            return 1
        return self.uow.db.incarnations.get((topic, topic_id))


class _Runs:
    """``ingest_runs``: the audit, one row per committed chunk."""

    def __init__(self, uow: FakeUnitOfWork) -> None:
        self.uow = uow

    def add(self, record: RunRecord) -> None:
        uow = self.uow
        uow.fault("audit")
        uow.pending_runs.append(record)
        uow.db.events.append(("audit", uow.txn, record.start_offset, record.end_offset))


@dataclass
class Events:
    """Questions about a shared events list (the answers the ordering tests compare)."""

    events: list[Event] = field(default_factory=list)

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e[0] == kind]

    def first(self, *prefix: Any) -> int:
        """The position of the first event starting with ``prefix``; fails if none."""
        for i, e in enumerate(self.events):
            if e[:len(prefix)] == prefix:
                return i
        raise AssertionError(f"no event starting with {prefix} in {self.events}")

    def txn_of_chunk(self, start: int, end: int) -> int:
        """The transaction that committed chunk ``[start, end)``."""
        (txn,) = [e[1] for e in self.of("db_commit") if e[2:] == (start, end)]
        return txn
