"""The one slice engine: live ingest, backfills and DLQ replay all run their slices here.

A slice is one partition's range ``[start, end)`` of one run. What differs between ingest
and replay is passed in: a :class:`SliceSpec` (names, the group, whether it commits) and a
:class:`ChunkWriter` (what a chunk's transaction writes). The steps (DESIGN §3):

1. **lock**: a slice that moves its cursor holds the (name, partition) advisory lock of
   its session for the whole slice: it owns the cursor. A slice that does not (a backfill,
   a dry run) takes no lock: it moves nothing another run could fence, and its upserts are
   idempotent, so it runs beside live slices without waiting for them or holding them up;
2. **resume**: a cursor-moving slice starts where its stored cursor is now, so a retry or
   a cleared task finishes exactly its pinned slice; a cursor moved back behind the slice
   (a reset by hand, or commits a failover lost) is followed back: the slice reads from
   there, at most ``max_records_per_partition`` of it. Every slice first learns which
   incarnation of its topic it reads (:class:`~kafka_ingest.records.Source`); a cursor
   stored for a topic deleted and created again since is refused
   (:class:`~kafka_ingest.errors.TopicRecreated`);
3. **read** chunk by chunk (bounded by offsets and bytes) and **prepare** each chunk
   (decode, validate, encode the rows for ``COPY``: CPU only);
4. **one transaction per chunk** in the writer thread: what the :class:`ChunkWriter`
   writes (rows, dead letters produced and their delivery reports checked), the cursor
   moved by compare-and-set (exactly one row, or roll back: the fence against a zombie
   run), the audit row, COMMIT (a dry run rolls back instead);
5. after the COMMIT, the chunk's offset is **posted to the consumer group** for lag
   tools (:mod:`kafka_ingest.kafka.commits`: in the background, newest wins, never a reason
   to fail or to wait; the stored offset is the truth).

Three threads, each started and joined by :func:`run_slice`, for chunks 1, 2, 3::

    main       read+prepare 1 | read+prepare 2  | read+prepare 3  |
    writer                    | txn 1 .. COMMIT | txn 2 .. COMMIT | txn 3 .. COMMIT |
    committer                                   | group <- end 1  | group <- end 2  | <- end 3

The rules, each tested with fakes in ``tests/unit/test_slices.py``:

- one transaction at a time, in chunk order: chunk k+1 goes to the writer only once
  chunk k's COMMIT is in, so at most two chunks are in memory (one written, one prepared);
- preparing chunk k+1 overlaps chunk k's transaction (Postgres works in its own process);
- an offset goes to the group only after its chunk's COMMIT; the group commit overlaps
  everything and holds nothing up; the slice's last wait for it is bounded by
  ``socket.timeout.ms``, and one still unanswered then is left to the committer's thread;
- every other wait is bounded by the time-outs of what it waits for: a transaction by
  the Postgres reply time-out of each request and the DLQ's ``message.timeout.ms``.

A kill at any point leaves either the old cursor (the chunk is read again; the upsert
absorbs it; its dead letters may reach the DLQ topic again, with the same letter id, while
``dead_letters`` holds each once) or the new one with the chunk's rows committed.
"""

from __future__ import annotations

import gc
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Protocol, TypeVar

from kafka_ingest.config import Pipeline
from kafka_ingest.db import (
    CopyEncoder,
    Database,
    RunRecord,
    SliceSession,
    UnitOfWork,
    translate_errors,
)
from kafka_ingest.errors import OffsetOutOfRange, TopicRecreated
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import watermarks
from kafka_ingest.kafka.reader import Chunk, read_range
from kafka_ingest.ranges import OffsetRange
from kafka_ingest.records import ChunkCounts, Source

log = logging.getLogger(__name__)

#: Test seam: called with a stage name at each step of a chunk (the crash-safety tests
#: kill the process there). Stages: "validated", "upserted", "dlq_produced",
#: "db_committed", "kafka_committed".
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


P = TypeVar("P")


class ChunkWriter(Protocol[P]):
    """What a kind of slice does with a chunk: the only part ingest and replay differ in."""

    @property
    def needs_producer(self) -> bool:
        """Whether :meth:`write` needs a producer (the DLQ)."""
        ...

    def prepare(self, chunk: Chunk, encoder: CopyEncoder) -> P:
        """Decode, validate and encode for ``COPY`` (CPU only, no I/O): runs beside the
        writer thread."""
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
    #: False: a dry run; every transaction rolls back, nothing is committed anywhere.
    commits: bool = True


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
              clients: KafkaClients, db: Database, *,
              report: SliceReport | None = None) -> SliceReport:
    """Run one partition slice, chunk by chunk; see the module docstring for the steps."""
    pipeline = spec.pipeline
    moves = rng.moves_cursor and spec.commits
    report = report or SliceReport(pipeline.name, rng.topic, rng.partition, rng.start,
                                   rng.end, str(rng.mode), dry_run=not spec.commits,
                                   moves_cursor=moves)
    with ExitStack() as owned:  # what the slice opens, closed in reverse, even on error
        # Postgres down or restarted mid-slice is transient (Airflow retries), not a raw
        # psycopg error: in the steps and in the clean-up alike.
        owned.enter_context(translate_errors(str(rng.mode)))
        owned.enter_context(_switch_interval(SWITCH_INTERVAL_S))
        owned.enter_context(_young_collections(GC_YOUNG_THRESHOLD))
        consumer = owned.enter_context(closing(clients.consumer(spec.group_id)))
        producer = clients.producer() if writer.needs_producer else None
        if producer is not None:
            owned.callback(producer.flush, 5)
        session = owned.enter_context(closing(db.open_slice()))
        encoder = session.copy_encoder(pipeline)
        topic_id = clients.topic_id(rng.topic)
        source = Source(rng.topic, topic_id, session.incarnation(rng.topic, topic_id))
        start, end, group = rng.start, rng.end, None
        if moves:
            session.lock(spec.lock_name, rng.partition)
            owned.callback(session.unlock, spec.lock_name, rng.partition)
            start, end = resume_from_cursor(session, pipeline, rng, source)
            group = owned.enter_context(clients.committer(
                spec.group_id, on_commit=partial(at, "kafka_committed")))
            if start != rng.start:
                # An earlier attempt committed up to here; its group commit may not have
                # followed (a kill between the two): tell the group now.
                report.resumed_from = start
                group.post(rng.topic, rng.partition, start)
        chunks = owned.enter_context(closing(read_range(
            consumer, rng.topic, rng.partition, start, end,
            chunk_size=pipeline.chunk_size, max_chunk_bytes=pipeline.max_chunk_bytes)))
        transaction = _Transaction(spec, writer, rng, session, producer, moves, source)

        def committed(done: _Committed | None) -> None:
            if done is not None:
                report.add_chunk(done.result, done.seconds)
                if group is not None:
                    group.post(done.chunk.topic, done.chunk.partition, done.chunk.end)

        with _Writer(rng.partition) as sink:
            for chunk in chunks:
                t0 = time.monotonic()
                prepared = writer.prepare(chunk, encoder)
                at("validated")
                committed(sink.hand_over(chunk, partial(
                    transaction, chunk, prepared, time.monotonic() - t0)))
            committed(sink.finish())
        report.lag_after = _lag_after(consumer, rng.topic, rng.partition, end)
    log.info(report.log_line())
    return report


#: The interpreter's thread switch interval while a slice runs (Python's default: 5 ms).
#: The main thread validates (CPU, holding the GIL) while the writer thread's transaction
#: comes back from Postgres a few dozen times a chunk (each block of the COPY, each
#: statement) and needs the GIL for a moment each time: at 5 ms it waits up to that long
#: every time, and a chunk's transaction took 165 ms instead of 125 (200k events, 20k a
#: chunk, measured here); at 0.5 ms the writer is back at once and validation loses
#: nothing measurable.
SWITCH_INTERVAL_S = 0.0005


@contextmanager
def _switch_interval(seconds: float) -> Iterator[None]:
    """``sys.setswitchinterval(seconds)`` for the block, the previous one restored after."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


#: The cyclic garbage collector's first threshold while a slice runs (Python's default:
#: 700). A chunk allocates a few objects per message (the message, the validated event,
#: its row) and keeps them until its transaction is in, so at 700 the collector ran
#: hundreds of times a chunk, each time over young objects that were all alive, and its
#: older generations over the whole heap (an Airflow task's is large). What was in the
#: heap before the slice is frozen out of the collections, and the collector runs once
#: every 100,000 allocations: per 1M events, the slice process's CPU went from 7.5 s to
#: 5.7 s, the same as with the collector off (``benchmarks/bench_ingest.py --events
#: 1000000 --only project``). Reference cycles are still collected.
GC_YOUNG_THRESHOLD = 100_000


@contextmanager
def _young_collections(threshold: int) -> Iterator[None]:
    """Freeze the heap out of the collections and raise the first collection threshold to
    ``threshold`` for the block; the previous thresholds restored and the heap unfrozen
    after. A process that froze its heap before (Airflow's LocalExecutor forks its task
    processes frozen) is left as it was: only the threshold is raised, since freezing
    more there could never be undone for the objects frozen after its own freeze."""
    previous, frozen = gc.get_threshold(), gc.get_freeze_count()
    if not frozen:
        gc.freeze()
    gc.set_threshold(max(previous[0], threshold), *previous[1:])
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        if not frozen:
            gc.unfreeze()


@dataclass(frozen=True)
class _Committed:
    """A chunk whose transaction is in, with its result."""

    chunk: Chunk
    result: ChunkResult
    seconds: float


class _Writer:
    """The slice's one writer thread: chunk transactions one at a time, in order.

    :meth:`hand_over` first waits for the transaction in flight (its COMMIT), then starts
    the next one, so the caller prepares chunk k+1 while chunk k is written. Leaving the
    block waits for the transaction in flight, bounded by its own time-outs.
    """

    #: How often a long wait for a transaction says that it is still waiting.
    NAG_S = 60.0

    def __init__(self, partition: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{partition}")
        self._in_flight: tuple[Chunk, Future[tuple[ChunkResult, float]]] | None = None

    def hand_over(self, chunk: Chunk,
                  job: Callable[[], tuple[ChunkResult, float]]) -> _Committed | None:
        """Wait for the transaction in flight, start ``job`` (``chunk``'s); return the one
        that finished."""
        done = self.finish()
        self._in_flight = (chunk, self._pool.submit(job))
        return done

    def finish(self) -> _Committed | None:
        """Wait for the transaction in flight, if any, and return it."""
        if self._in_flight is None:
            return None
        chunk, future = self._in_flight
        self._wait(chunk, future)
        self._in_flight = None
        result, seconds = future.result()
        return _Committed(chunk, result, seconds)

    def _wait(self, chunk: Chunk, future: Future[tuple[ChunkResult, float]]) -> None:
        while not wait([future], timeout=self.NAG_S).done:
            log.warning("%s[%d]: still waiting for the transaction of chunk [%d, %d)",
                        chunk.topic, chunk.partition, chunk.start, chunk.end)

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # The transaction in flight is waited for even through an interrupt (Airflow's
        # time-out raising here, twice): the slice's lock and connection are released
        # after this block, never under a transaction still running. The wait is bounded
        # by the transaction's own time-outs; the first interrupt is raised after it. (It
        # waits on the future: a thread join cut short by an exception marks a thread that
        # still runs as stopped, in Python 3.11, so joining again would not wait.)
        interrupted: BaseException | None = None
        while self._in_flight is not None:
            try:
                self._wait(*self._in_flight)
                self._in_flight = None
            except BaseException as caught:
                interrupted = interrupted or caught
        self._pool.shutdown(wait=interrupted is None)
        if interrupted is not None:
            raise interrupted


@dataclass(frozen=True)
class _Transaction:
    """One chunk's transaction, run in the writer thread."""

    spec: SliceSpec
    writer: ChunkWriter[Any]
    rng: OffsetRange
    session: SliceSession
    producer: Any
    moves: bool
    source: Source

    def __call__(self, chunk: Chunk, prepared: Any,
                 prepare_s: float) -> tuple[ChunkResult, float]:
        t0 = time.monotonic()
        spec = self.spec
        with self.session.unit_of_work(spec.pipeline) as uow:
            result = self.writer.write(uow, chunk, prepared, self.producer, self.source)
            seconds = prepare_s + time.monotonic() - t0
            if not spec.commits:
                return result, seconds  # a dry run: the unit of work rolls back
            if self.moves:
                uow.offsets.advance(spec.pipeline.name, chunk.topic, chunk.partition,
                                    chunk.start, chunk.end)
            uow.runs.add(RunRecord(
                pipeline=spec.pipeline.name, run_id=spec.run_id, mode=str(self.rng.mode),
                topic=chunk.topic, partition=chunk.partition, start_offset=chunk.start,
                end_offset=chunk.end, counts=result.counts, seconds=seconds))
            uow.commit(partition=chunk.partition, start=chunk.start, end=chunk.end)
        at("db_committed")
        return result, seconds


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
