"""The one slice engine: live ingest, backfills and DLQ replay all run their slices here.

A slice is one partition's range ``[start, end)`` of one run. What differs between ingest
and replay is passed in: a :class:`SliceSpec` (names, the group, a dry run, filters) and a
:class:`ChunkWriter` (what a chunk's transaction writes). Whether the slice moves its
cursor is decided by :func:`~kafka_ingest.ranges.moves_cursor`, from the range and the spec
(DESIGN §3). :func:`run_slice` opens what the slice needs, each part by a named owner,
closed in reverse even on error:

1. **tuning** (:func:`~kafka_ingest.engine.tuning.for_a_slice`): the switch interval and
   the garbage collector, restored after;
2. **ports** (:func:`_open_ports`): the slice's consumer, its producer (the DLQ: when its
   writer needs one) and its database session; and which incarnation of its topic it
   reads (:class:`~kafka_ingest.records.Source`);
3. **the cursor** (:func:`_claim_cursor`), for a slice that moves it: the (name,
   partition) advisory lock of its session for the whole slice (it owns the cursor), the
   resume point (:func:`resume_from_cursor`: where the stored cursor is now, so a retry or
   a cleared task finishes exactly its pinned slice; a cursor moved back is followed
   back; a cursor of a topic since re-created is refused), and the group committer its
   offsets are posted to (:mod:`kafka_ingest.kafka.commits`). A slice that moves no
   cursor (a backfill, a filtered replay, a dry run) takes no lock: it moves nothing
   another run could fence, and its upserts are idempotent, so it runs beside live
   slices without waiting for them or holding them up;
4. **the reader** of its range, chunk by chunk (bounded by offsets and bytes).

Each chunk then goes through four stages (:class:`_SliceStages`), overlapped as
:mod:`kafka_ingest.engine.stages` draws it:

- **read** the chunk;
- **prepare** it in the slice's thread (decode, validate, encode the rows for ``COPY``:
  CPU only), beside the transaction of the chunk before;
- **transact**: one transaction in the transaction thread: what the :class:`ChunkWriter`
  writes (rows, dead letters produced and their delivery reports checked), the cursor
  moved by compare-and-set (exactly one row, or roll back: the fence against a zombie
  run), the audit row, COMMIT (a dry run rolls back instead);
- **post**, after the COMMIT: the chunk's counts into the report, and its end offset to
  the consumer group for lag tools (in the background, newest wins, never a reason to
  fail or to wait; the stored offset is the truth).

Three threads, each started and joined within :func:`run_slice`, for chunks 1, 2, 3 (a
``|`` is a hand-off: the transaction before has ended, the next one starts)::

    slice        read+prepare 1 | read+prepare 2 | post 1, read+prepare 3 | post 2        | post 3
    transaction                 | txn 1 . COMMIT | txn 2 ......... COMMIT | txn 3 . COMMIT |
    committer                                    | group <- end 1         | group <- end 2 | <- 3

The rules, each tested with fakes in ``tests/unit/engine/test_slices.py`` (and the overlap's with
plain stages in ``tests/unit/engine/test_stages.py``):

- one transaction at a time, in chunk order: chunk k+1 goes to the transaction thread
  only once chunk k's COMMIT is in, so at most two chunks are in memory (one written,
  one prepared);
- preparing chunk k+1 overlaps chunk k's transaction (Postgres works in its own process);
- an offset goes to the group only after its chunk's COMMIT; the group commit overlaps
  everything and holds nothing up; the slice's last wait for it is bounded by
  ``socket.timeout.ms``, and one still unanswered then is left to the committer's thread;
- the lock is taken before the cursor is read and anything consumed, and released only
  after the group's last wait, and never under a running transaction (an interrupt, even
  twice, waits for the transaction in flight first);
- every other wait is bounded by the time-outs of what it waits for: a transaction by
  the Postgres reply time-out of each request and the DLQ's ``message.timeout.ms``.

A kill at any point leaves either the old cursor (the chunk is read again; the upsert
absorbs it; its dead letters may reach the DLQ topic again, with the same letter id, while
``dead_letters`` holds each once) or the new one with the chunk's rows committed.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from kafka_ingest.config import Pipeline
from kafka_ingest.db import (
    CopyEncoder,
    Database,
    RunRecord,
    SliceSession,
    UnitOfWork,
    translate_errors,
)
from kafka_ingest.engine import tuning
from kafka_ingest.engine.stages import run_stages
from kafka_ingest.errors import OffsetOutOfRange, TopicRecreated
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.commits import GroupCommitter
from kafka_ingest.kafka.metadata import watermarks
from kafka_ingest.kafka.reader import Chunk, read_range
from kafka_ingest.ranges import OffsetRange, moves_cursor
from kafka_ingest.records import ChunkCounts, Source

log = logging.getLogger(__name__)

#: Test seam: called with a stage name at each step of a chunk (the crash-safety tests
#: kill the process there): "validated" (the end of prepare), "upserted" and
#: "dlq_produced" (inside transact, by the writer), "db_committed" (after the COMMIT, the
#: end of transact), "kafka_committed" (in the committer's thread, after a group commit).
CHUNK_HOOK: Callable[[str], None] | None = None


def at(stage: str) -> None:
    """Mark a step of a chunk (see :data:`CHUNK_HOOK`)."""
    if CHUNK_HOOK is not None:
        CHUNK_HOOK(stage)


@dataclass(frozen=True)
class ChunkResult:
    """What one chunk's transaction did: the counts, and replay's outcomes by reason."""

    counts: ChunkCounts
    #: (outcome, error class) -> messages; empty for ingest.
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: The chunk's latest event time in epoch ms, as its prepare step found it (ingest;
    #: None for replay, whose runs set no watermark).
    latest_event_ms: int | None = None


P = TypeVar("P")


class ChunkWriter(Protocol[P]):
    """What a kind of slice does with a chunk (a strategy, run by the slice's stages): the
    only part ingest and replay differ in."""

    @property
    def needs_producer(self) -> bool:
        """Whether :meth:`write` needs a producer (the DLQ)."""
        ...

    def prepare(self, chunk: Chunk, encoder: CopyEncoder) -> P:
        """Decode, validate and encode for ``COPY`` (CPU only, no I/O): runs in the slice's
        thread, beside the transaction of the chunk before."""
        ...

    def write(self, uow: UnitOfWork, chunk: Chunk, prepared: P, producer: Any,
              source: Source) -> ChunkResult:
        """Write the chunk, read from ``source`` (the incarnation of the topic the slice
        reads), inside its transaction (rows, dead letters); return its counts."""
        ...


@dataclass(frozen=True, kw_only=True)
class SliceSpec:
    """Where a kind of slice differs besides its writer."""

    pipeline: Pipeline
    run_id: str
    #: The advisory lock's name (replay: ``<pipeline>:replay``).
    lock_name: str
    #: The consumer group the cursor is committed to, for lag tools.
    group_id: str
    #: A dry run: every transaction rolls back, nothing is committed anywhere.
    dry_run: bool = False
    #: The writer acts on some records of the range only (a replay with filters).
    filtered: bool = False
    #: Outcomes every report carries, even at zero (replay's).
    outcomes: tuple[str, ...] = ()

    def moves_cursor(self, rng: OffsetRange) -> bool:
        """Whether the slice of ``rng`` moves its cursor (:func:`moves_cursor`)."""
        return moves_cursor(from_cursor=bool(rng.from_cursor), dry_run=self.dry_run,
                            filtered=self.filtered)


@dataclass
class SliceReport(ChunkCounts):
    """What one partition slice did: its chunks' counts summed, and more; summed in turn by
    the run's report task (XCom: a dict)."""

    pipeline: str
    topic: str
    partition: int
    start: int
    end: int
    mode: str
    dry_run: bool = False
    moves_cursor: bool = False
    seconds: float = 0.0
    chunks: int = 0
    lag_after: int | None = None
    resumed_from: int | None = None
    #: The latest event time (epoch ms) of the records the slice's committed chunks
    #: loaded, by the pipeline's ``event_time`` or the Kafka timestamp; None before any
    #: (the run's event-time watermark: ops/lineage.py).
    max_event_time_ms: int | None = None
    #: Replay only: outcome -> count, and outcome -> error class -> count.
    outcomes: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)

    def add_chunk(self, result: ChunkResult, seconds: float) -> None:
        self.add(result.counts)
        self.seconds += seconds
        self.chunks += 1
        for (outcome, error_class), n in result.outcomes.items():
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
            by_class = self.reasons.setdefault(outcome, {})
            by_class[error_class] = by_class.get(error_class, 0) + n

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_line(self) -> str:
        head = (f"{'DRY RUN ' if self.dry_run else ''}{self.pipeline} {self.topic}"
                f"[{self.partition}] [{self.start}, {self.end}) {self.mode}: read {self.read}")
        if self.outcomes:
            return head + "".join(f", {k} {v}" for k, v in self.outcomes.items())
        return (f"{head}, inserted {self.inserted}, duplicates {self.duplicates}, stale "
                f"{self.stale}, dead-lettered {self.dead_lettered}, already dead-lettered "
                f"{self.known_dead}, tombstones {self.tombstones}"
                f"{f' ({self.deleted} rows deleted)' if self.deleted else ''}, lag after "
                f"{self.lag_after}, {self.seconds:.2f}s")


def run_slice(spec: SliceSpec, writer: ChunkWriter[P], rng: OffsetRange,
              clients: KafkaClients, db: Database) -> SliceReport:
    """Run one partition slice, chunk by chunk; see the module docstring for the steps."""
    moves = spec.moves_cursor(rng)
    report = SliceReport(spec.pipeline.name, rng.topic, rng.partition, rng.start, rng.end,
                         str(rng.mode), dry_run=spec.dry_run, moves_cursor=moves,
                         outcomes=dict.fromkeys(spec.outcomes, 0))
    with ExitStack() as owned:  # closed in reverse, even on error
        # Postgres down or restarted mid-slice is transient (Airflow retries), not a raw
        # psycopg error: in the steps and in the clean-up alike.
        owned.enter_context(translate_errors(str(rng.mode)))
        owned.enter_context(tuning.for_a_slice())
        ports = owned.enter_context(_open_ports(spec, writer, rng, clients, db))
        claim = owned.enter_context(_claim_cursor(spec, rng, ports, clients, report)
                                    if moves else _no_claim(rng))
        chunks = owned.enter_context(closing(read_range(
            ports.consumer, rng.topic, rng.partition, claim.start, claim.end,
            chunk_size=spec.pipeline.chunk_size, max_chunk_bytes=spec.pipeline.max_chunk_bytes)))
        stages = _SliceStages(spec, writer, str(rng.mode), moves, ports, report, claim.group)
        run_stages(chunks, stages, name=f"transaction-{rng.partition}")
        report.lag_after = _lag_after(ports.consumer, rng.topic, rng.partition, claim.end)
    log.info(report.log_line())
    return report


#: How long the slice's producer may take to deliver what is still queued when the slice
#: ends (every dead letter's delivery was awaited in its chunk already).
PRODUCER_FLUSH_S = 5.0


@dataclass(frozen=True)
class _Ports:
    """What a slice talks to, opened and closed by :func:`_open_ports`."""

    consumer: Any
    #: The DLQ producer; None when the writer needs none.
    producer: Any
    session: SliceSession
    #: Encodes the rows of the session's target table for ``COPY``.
    encoder: CopyEncoder
    #: The incarnation of the topic the slice reads.
    source: Source


@contextmanager
def _open_ports(spec: SliceSpec, writer: ChunkWriter[Any], rng: OffsetRange,
                clients: KafkaClients, db: Database) -> Iterator[_Ports]:
    """Open the slice's consumer, its producer (when its writer needs one) and its database
    session (with its ``COPY`` encoder, made from the target table as it is now), and learn
    which incarnation of its topic it reads; the session is closed, the producer flushed
    (bounded) and the consumer closed after the block, in that order."""
    with ExitStack() as opened:
        consumer = opened.enter_context(closing(clients.consumer(spec.group_id)))
        producer = clients.producer() if writer.needs_producer else None
        if producer is not None:
            opened.callback(producer.flush, PRODUCER_FLUSH_S)
        session = opened.enter_context(closing(db.open_slice()))
        encoder = session.copy_encoder(spec.pipeline)
        topic_id = clients.topic_id(rng.topic)
        source = Source(rng.topic, topic_id, session.incarnation(rng.topic, topic_id))
        yield _Ports(consumer, producer, session, encoder, source)


@dataclass(frozen=True)
class _Claim:
    """What a slice reads, and the group its offsets are posted to (None: it moves no
    cursor)."""

    start: int
    end: int
    group: GroupCommitter | None


@contextmanager
def _claim_cursor(spec: SliceSpec, rng: OffsetRange, ports: _Ports, clients: KafkaClients,
                  report: SliceReport) -> Iterator[_Claim]:
    """Own the cursor of a slice that moves it: lock it for the block, resume from it, and
    open the group committer its offsets are posted to. After the block: the group's last
    wait (bounded by ``socket.timeout.ms``), then the lock released."""
    with ExitStack() as held:
        ports.session.lock(spec.lock_name, rng.partition)
        held.callback(ports.session.unlock, spec.lock_name, rng.partition)
        start, end = resume_from_cursor(ports.session, spec.pipeline, rng, ports.source)
        group = held.enter_context(clients.committer(
            spec.group_id, on_commit=partial(at, "kafka_committed")))
        if start != rng.start:
            # An earlier attempt committed up to here; its group commit may not have
            # followed (a kill between the two): tell the group now.
            report.resumed_from = start
            group.post(rng.topic, rng.partition, start)
        yield _Claim(start, end, group)


@contextmanager
def _no_claim(rng: OffsetRange) -> Iterator[_Claim]:
    """A slice that moves no cursor: its whole range, no lock, no group."""
    yield _Claim(rng.start, rng.end, None)


@dataclass(frozen=True)
class _Prepared(Generic[P]):
    """A chunk, prepared by its writer."""

    chunk: Chunk
    prepared: P
    seconds: float


@dataclass(frozen=True)
class _Committed:
    """A chunk whose transaction is in, with its result."""

    chunk: Chunk
    result: ChunkResult
    seconds: float


@dataclass(frozen=True)
class _SliceStages(Generic[P]):
    """The stages of one slice's chunks (:class:`~kafka_ingest.engine.stages.Stages`),
    bound to what :func:`run_slice` opened for it."""

    spec: SliceSpec
    writer: ChunkWriter[P]
    mode: str
    moves: bool
    ports: _Ports
    report: SliceReport
    group: GroupCommitter | None

    def prepare(self, chunk: Chunk) -> _Prepared[P]:
        t0 = time.monotonic()
        prepared = self.writer.prepare(chunk, self.ports.encoder)
        at("validated")
        return _Prepared(chunk, prepared, time.monotonic() - t0)

    def transact(self, job: _Prepared[P]) -> _Committed:
        """The chunk's transaction, in the transaction thread."""
        t0 = time.monotonic()
        spec, chunk = self.spec, job.chunk
        with self.ports.session.unit_of_work(spec.pipeline) as uow:
            result = self.writer.write(uow, chunk, job.prepared, self.ports.producer,
                                       self.ports.source)
            seconds = job.seconds + time.monotonic() - t0
            if spec.dry_run:
                return _Committed(chunk, result, seconds)  # the unit of work rolls back
            if self.moves:
                uow.offsets.advance(spec.pipeline.name, chunk.topic, chunk.partition,
                                    chunk.start, chunk.end)
            uow.runs.add(RunRecord(
                pipeline=spec.pipeline.name, run_id=spec.run_id, mode=self.mode,
                topic=chunk.topic, partition=chunk.partition, start_offset=chunk.start,
                end_offset=chunk.end, counts=result.counts, seconds=seconds))
            uow.commit(partition=chunk.partition, start=chunk.start, end=chunk.end)
        at("db_committed")
        return _Committed(chunk, result, seconds)

    def post(self, done: _Committed) -> None:
        self.report.add_chunk(done.result, done.seconds)
        latest = done.result.latest_event_ms
        if latest is not None and (self.report.max_event_time_ms or 0) < latest:
            self.report.max_event_time_ms = latest
        if self.group is not None:
            self.group.post(done.chunk.topic, done.chunk.partition, done.chunk.end)

    def describe(self, job: _Prepared[P]) -> str:
        c = job.chunk
        return f"{c.topic}[{c.partition}] chunk [{c.start}, {c.end})"


def resume_from_cursor(session: SliceSession, pipeline: Pipeline, rng: OffsetRange,
                       source: Source) -> tuple[int, int]:
    """Where a slice that moves a stored cursor starts and ends: from where the cursor is
    now, to the pinned end.

    A retry or a cleared task thus finishes exactly its pinned slice. A cursor behind the
    slice's start was moved back after the run was planned: by hand (``reset-offsets``),
    or by a failover to a standby that had not received the commits of the runs before
    (offsets live with the rows: it lost both). The slice then reads from the cursor, at
    most ``max_records_per_partition`` of it, so nothing between the two is skipped. A
    cursor stored for another topic id is refused: the topic was deleted and created again
    since (:class:`TopicRecreated`); one stored before topic ids were kept is adopted.
    """
    where = f"{pipeline.name} {rng.topic}[{rng.partition}]"
    found = session.cursor(pipeline.name, rng.topic, rng.partition)
    if found is None:
        raise OffsetOutOfRange(where, f"no offset is stored, but this run's slice [{rng.start}"
                               f", {rng.end}) moves it; it was deleted after the run was "
                               "planned, so the slice is not this run's to finish")
    stored, stored_id = found
    if stored_id is None and source.topic_id is not None:
        session.adopt(pipeline.name, rng.topic, source.topic_id)
    elif stored_id != source.topic_id:
        raise TopicRecreated(pipeline.name, rng.topic, str(stored_id), str(source.topic_id),
                             [rng.partition], dlq=rng.topic == pipeline.dlq_topic)
    if stored < rng.start:
        end = min(rng.end, stored + pipeline.max_records_per_partition)
        log.warning("%s: the stored offset is %d, behind this run's slice [%d, %d): it was "
                    "moved back since the run was planned (a reset, or a failover that lost "
                    "commits); reading [%d, %d) from it instead", where, stored, rng.start,
                    rng.end, stored, end)
        return stored, end
    if stored != rng.start:
        log.info("%s: stored offset is %d; resuming the pinned slice [%d, %d) there", where,
                 stored, rng.start, rng.end)
    return min(stored, rng.end), rng.end


def _lag_after(consumer: Any, topic: str, partition: int, end: int) -> int | None:
    try:
        _, high = watermarks(consumer, topic, [partition])[partition]
    except Exception:  # lag is a report, not a reason to fail a committed slice
        log.warning("could not read the high watermark for the lag report", exc_info=True)
        return None
    return max(0, high - end)
