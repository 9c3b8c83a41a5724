"""The one slice engine: live ingest, backfills and DLQ replay all run their slices here.

A slice is one partition's range ``[start, end)`` of one run. The engine owns the steps
every kind of slice shares, in this order (DESIGN §3):

1. **lock**: a slice that moves its cursor holds the (name, partition) advisory lock for
   the whole slice (it owns the cursor); one that does not takes it in each chunk's
   transaction, so a backfill interleaves with live slices chunk by chunk;
2. **resume**: a cursor-moving slice starts where its stored cursor is now, so a retry or
   a cleared task finishes exactly its pinned slice; a cursor behind the slice is fenced;
3. **read** chunk by chunk (bounded by offsets and bytes) and **prepare** each chunk
   (decode, validate, encode the rows for ``COPY``: CPU only) while the writer thread
   runs the previous chunk's transaction; one writer, one transaction at a time, in
   order, so at most two chunks are in memory;
4. **one transaction per chunk**: what the :class:`ChunkWriter` writes, the cursor moved
   by compare-and-set (exactly one row, or roll back: the fence against a zombie run),
   the audit row, COMMIT (a dry run rolls back instead);
5. only after the database commit, the same offset is **committed to Kafka** for the
   consumer group, so lag tools see it (logged and retried, never a reason to re-read);
   meanwhile the next chunk's transaction copies and inserts, but produces its dead
   letters only once that group commit is done.

What differs between ingest and replay is passed in: a :class:`SliceSpec` (names, the
group, whether it commits) and a :class:`ChunkWriter` (what a chunk's transaction writes).
A kill at any point leaves either the old cursor (the chunk is read again; the upsert
absorbs it) or the new one with the chunk's rows committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

from kafka_ingest.clients import KafkaClients
from kafka_ingest.config import Pipeline
from kafka_ingest.db import (
    CopyEncoder,
    Database,
    RunRecord,
    SliceSession,
    UnitOfWork,
    translate_errors,
)
from kafka_ingest.errors import OffsetOutOfRange
from kafka_ingest.ranges import OffsetRange
from kafka_ingest.reader import Chunk, commit_offset, read_range, watermarks
from kafka_ingest.records import ChunkCounts

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

    def write(self, uow: UnitOfWork, chunk: Chunk, prepared: P,
              producer: Any) -> ChunkResult:
        """Write the chunk inside its transaction (rows, dead letters); return its counts."""
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
                f"{self.known_dead}, tombstones {self.tombstones}, lag after {self.lag_after}, "
                f"{self.seconds:.2f}s")


@dataclass(frozen=True)
class _InFlight:
    future: Future[tuple[ChunkResult, float]]
    chunk: Chunk


def run_slice(spec: SliceSpec, writer: ChunkWriter[P], rng: OffsetRange,
                 clients: KafkaClients, db: Database, *,
                 report: SliceReport | None = None) -> SliceReport:
    """Run one partition slice, chunk by chunk; see the module docstring for the steps."""
    pipeline = spec.pipeline
    moves = rng.moves_cursor and spec.commits
    report = report or SliceReport(pipeline.name, rng.topic, rng.partition, rng.start,
                                   rng.end, str(rng.mode), dry_run=not spec.commits,
                                   moves_cursor=moves)
    with ExitStack() as cleanup:  # closes whatever was opened, in reverse, even on error
        consumer = clients.consumer(spec.group_id)
        cleanup.callback(consumer.close)
        producer = clients.producer() if writer.needs_producer else None
        if producer is not None:
            cleanup.callback(producer.flush, 5)
        session = db.open_slice()
        cleanup.callback(session.close)
        encoder = session.copy_encoder(pipeline)
        # Postgres down or restarted mid-slice is transient (Airflow retries), not a raw
        # psycopg error. Leaving the executor waits for the chunk in flight.
        with translate_errors(str(rng.mode)), ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"sink-{rng.partition}") as pool:
            if moves:
                session.lock(spec.lock_name, rng.partition)
                cleanup.callback(session.unlock, spec.lock_name, rng.partition)
            start = resume_from_cursor(session, pipeline, rng) if moves else rng.start
            report.resumed_from = start if start != rng.start else None
            if moves and start != rng.start:
                # An earlier attempt committed up to here; its Kafka commit may not have
                # followed (a kill between the two), and this slice may have nothing left
                # to read: say it to the group now, so lag tools are not left behind.
                commit_offset(consumer, rng.topic, rng.partition, start)
            in_flight: _InFlight | None = None
            chunks = cleanup.enter_context(closing(read_range(
                consumer, rng.topic, rng.partition, start, rng.end,
                chunk_size=pipeline.chunk_size, max_chunk_bytes=pipeline.max_chunk_bytes)))
            for chunk in chunks:
                t0 = time.monotonic()
                prepared = writer.prepare(chunk, encoder)
                at("validated")
                done, group_has_done = in_flight, threading.Event()
                if done is None:
                    group_has_done.set()
                else:
                    _count(done, report)  # its COMMIT is in
                job = _Transaction(spec, writer, rng, session,
                                   producer and _AfterGroupCommit(producer, group_has_done),
                                   moves=moves)
                in_flight = _InFlight(pool.submit(job, chunk, prepared,
                                                  time.monotonic() - t0), chunk)
                if done is not None:  # beside the next chunk's COPY and INSERT
                    try:
                        _commit_to_kafka(done, consumer, moves)
                    finally:
                        group_has_done.set()
            if in_flight is not None:
                _count(in_flight, report)
                _commit_to_kafka(in_flight, consumer, moves)
            report.lag_after = _lag_after(consumer, rng)
    log.info(report.log_line())
    return report


def _count(job: _InFlight, report: SliceReport) -> None:
    """Wait for a chunk's transaction (its COMMIT) and count it."""
    result, seconds = job.future.result()
    report.add_chunk(result, seconds)


class _AfterGroupCommit:
    """The DLQ producer as chunk k+1's transaction sees it: usable once chunk k's offset
    is committed to the consumer group. The transaction's COPY and INSERT overlap with
    that commit; its dead letters go out only after it, so a process killed once the group
    has chunk k has produced nothing of chunk k+1 (its transaction rolls back unseen)."""

    def __init__(self, producer: Any, ready: threading.Event) -> None:
        self._producer = producer
        self._ready = ready

    def __getattr__(self, name: str) -> Any:
        self._ready.wait()
        return getattr(self._producer, name)


def _commit_to_kafka(job: _InFlight, consumer: Any, moves: bool) -> None:
    """After the chunk's database commit, its offset to the consumer group."""
    if moves:
        commit_offset(consumer, job.chunk.topic, job.chunk.partition, job.chunk.end)
        at("kafka_committed")


@dataclass(frozen=True)
class _Transaction:
    """One chunk's transaction, run in the writer thread."""

    spec: SliceSpec
    writer: ChunkWriter[Any]
    rng: OffsetRange
    session: SliceSession
    producer: Any
    moves: bool

    def __call__(self, chunk: Chunk, prepared: Any,
                 prepare_s: float) -> tuple[ChunkResult, float]:
        t0 = time.monotonic()
        spec = self.spec
        with self.session.unit_of_work(spec.pipeline) as uow:
            if not self.moves:  # a slice that does not own the cursor locks per chunk
                self.session.lock(spec.lock_name, chunk.partition, for_transaction=True)
            result = self.writer.write(uow, chunk, prepared, self.producer)
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


def resume_from_cursor(session: SliceSession, pipeline: Pipeline, rng: OffsetRange) -> int:
    """Where a slice that moves a stored cursor starts: where the cursor is now.

    A retry or a cleared task thus finishes exactly its pinned slice. A cursor behind the
    slice's start means someone moved it back by hand: fail rather than guess.
    """
    stored = session.cursor(pipeline.name, rng.topic, rng.partition)
    if stored is None or stored < rng.start:
        raise OffsetOutOfRange(
            f"{pipeline.name} {rng.topic}[{rng.partition}]",
            f"the stored offset is {stored}, behind this run's slice [{rng.start}, "
            f"{rng.end}); it was moved back after the run was planned, so the slice is not "
            "this run's to finish")
    if stored != rng.start:
        log.info("%s[%d]: stored offset is %d; resuming the pinned slice [%d, %d) there",
                 rng.topic, rng.partition, stored, rng.start, rng.end)
    return min(stored, rng.end)


def _lag_after(consumer: Any, rng: OffsetRange) -> int | None:
    try:
        _, high = watermarks(consumer, rng.topic, [rng.partition])[rng.partition]
    except Exception:  # lag is a report, not a reason to fail a committed slice
        log.warning("could not read the high watermark for the lag report", exc_info=True)
        return None
    return max(0, high - rng.end)
