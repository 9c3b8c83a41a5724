"""The service layer: plan a run, ingest one partition range, replay dead letters, report.

DAG tasks and the CLI call exactly these functions, so ``kafka-ingest run`` and the
Airflow DAG share one code path. Each function takes the Kafka clients and the database
as parameters (the hook and the Airflow connection build them in a DAG; the environment
does on the command line).

The invariants (DESIGN §3): the stored offset moves only by compare-and-set in the same
transaction as the rows it covers; dead letters are delivered before that commit; the
Kafka group offset is committed after it. A kill at any point leaves either the old
offset (the chunk is read again and the upsert absorbs it) or the new one with the rows.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.dlq import DeadLetter, produce_dead_letters
from kafka_ingest.errors import FencedError, ReconciliationError, TriggerParamsError
from kafka_ingest.ranges import (
    Mode,
    OffsetRange,
    PartitionState,
    plan_between,
    plan_explicit,
    plan_live,
    request_key,
    start_offset,
)
from kafka_ingest.reader import (
    Chunk,
    KafkaClients,
    commit_offset,
    committed_offsets,
    offsets_for_time,
    partitions_of,
    read_range,
    watermarks,
)
from kafka_ingest.sink import (
    Database,
    OffsetsRepository,
    RunRecord,
    RunsRepository,
    UnitOfWork,
    lock_partition,
    translate_errors,
    unlock_partition,
)
from kafka_ingest.validate import ValidationResult, dead_letter, validate_chunk

log = logging.getLogger(__name__)

#: Test seam: called with a stage name at each step of a chunk (crash-safety tests kill
#: the process there). Stages: "validated", "dlq_produced", "upserted", "db_committed",
#: "kafka_committed".
CHUNK_HOOK: Callable[[str], None] | None = None


def _at(stage: str) -> None:
    if CHUNK_HOOK is not None:
        CHUNK_HOOK(stage)


@dataclass
class RangeReport:
    """What one partition slice did; summed by the report task."""

    pipeline: str
    topic: str
    partition: int
    start: int
    end: int
    mode: str
    read: int = 0
    inserted: int = 0
    duplicates: int = 0
    stale: int = 0
    dead_lettered: int = 0
    tombstones: int = 0
    bytes: int = 0
    seconds: float = 0.0
    chunks: int = 0
    lag_after: int | None = None
    resumed_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_line(self) -> str:
        return (
            f"{self.pipeline} {self.topic}[{self.partition}] [{self.start}, {self.end}) "
            f"{self.mode}: read {self.read}, inserted {self.inserted}, duplicates "
            f"{self.duplicates}, stale {self.stale}, dead-lettered {self.dead_lettered}, "
            f"tombstones {self.tombstones}, lag after {self.lag_after}, {self.seconds:.2f}s"
        )


# --------------------------------------------------------------------------- planning


def plan_run(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str,
             request: Mapping[str, Any] | None = None) -> list[OffsetRange]:
    """Plan this run's ranges and pin them to ``run_id``; a retry gets the same plan.

    ``request`` (from the trigger form or the CLI) selects a backfill: ``partitions``
    ``{p: [start, end]}`` or ``from``/``to`` epoch milliseconds. Without it the run is
    live: from the stored offsets, capped by ``max_records_per_partition``.
    """
    request = request or {}
    key = request_key(request)
    with db.session() as conn:
        runs = RunsRepository(conn)
        pinned = runs.pinned_plan(pipeline.name, run_id, key)
        if pinned:
            log.info("run %s already planned; reusing its %d range(s)", run_id, len(pinned))
            return [OffsetRange(t, p, s, e, Mode(m), advance_cursor=Mode(m) is Mode.LIVE)
                    for t, p, s, e, m in pinned if e > s]
        consumer = clients.consumer(pipeline.group_id)
        try:
            ranges = _plan(pipeline, consumer, conn, run_id, request)
        finally:
            consumer.close()
        runs.pin_plan(pipeline.name, run_id, key, _mode_of(ranges, request),
                      [(r.topic, r.partition, r.start, r.end) for r in ranges])
        conn.commit()
    for r in ranges:
        log.info("planned %s[%d] [%d, %d) %s: %d messages", r.topic, r.partition, r.start,
                 r.end, r.mode, r.size)
    return ranges


def _mode_of(ranges: list[OffsetRange], request: Mapping[str, Any]) -> str:
    return str(ranges[0].mode) if ranges else ("backfill" if request else "live")


def _plan(pipeline: Pipeline, consumer: Any, conn: Any, run_id: str,
          request: Mapping[str, Any]) -> list[OffsetRange]:
    topic = pipeline.topic
    parts = partitions_of(consumer, topic, role="source topic")
    # Checked now, not at the first bad message (a 30 s delivery time-out, retried).
    partitions_of(consumer, pipeline.dlq_topic, role="dead-letter topic")
    marks = watermarks(consumer, topic, parts)
    if request.get("partitions"):
        wanted = {int(p): (int(se[0]), int(se[1])) for p, se in request["partitions"].items()}
        return plan_explicit(topic, wanted, marks)
    if request.get("from_ms") is not None:
        start = offsets_for_time(consumer, topic, parts, int(request["from_ms"]))
        end = offsets_for_time(consumer, topic, parts, int(request["to_ms"]))
        return plan_between(topic, start, end)
    offsets = OffsetsRepository(conn)
    stored = offsets.all(pipeline.name, topic)
    states = [PartitionState(p, *marks[p], stored.get(p)) for p in parts]
    ranges, gaps = plan_live(topic, states, max_records=pipeline.max_records_per_partition,
                             start_policy=pipeline.start_policy, on_gap=pipeline.on_offset_gap)
    runs = RunsRepository(conn)
    for gap in gaps:
        log.error("GAP %s[%d]: offsets [%d, %d) were deleted by retention before ingestion; "
                  "skipping them as on_offset_gap=skip says (recorded in offset_gaps)",
                  topic, gap.partition, gap.start, gap.low)
        runs.record_gap(pipeline.name, topic, gap.partition, gap.start, gap.low, run_id)
        offsets.initialise(pipeline.name, topic, gap.partition, gap.start)
        offsets.advance(pipeline.name, topic, gap.partition, gap.start, gap.low)
    for s in states:  # the start policy is applied once, then the stored offset rules
        if s.stored is None:
            offsets.initialise(pipeline.name, topic, s.partition,
                               start_offset(s, pipeline.start_policy))
    return ranges


def time_request(start: datetime, end: datetime, *, now: datetime) -> dict[str, int]:
    """A ``from``/``to`` backfill request, checked: aware, ordered, not in the future."""
    if start.tzinfo is None or end.tzinfo is None:
        raise TriggerParamsError("from and to need a UTC offset, e.g. 2026-01-01T00:00:00Z")
    if end <= start:
        raise TriggerParamsError(f"'to' ({end.isoformat()}) must be after 'from' "
                                 f"({start.isoformat()})")
    if end > now:
        raise TriggerParamsError(f"'to' ({end.isoformat()}) is in the future; the window "
                                 "must have ended")
    return {"from_ms": int(start.timestamp() * 1000), "to_ms": int(end.timestamp() * 1000)}


# --------------------------------------------------------------------------- ingest


def ingest_range(pipeline: Pipeline, rng: OffsetRange, clients: KafkaClients, db: Database,
                 *, run_id: str) -> RangeReport:
    """Ingest one partition slice, chunk by chunk, under the partition's advisory lock.

    Live slices resume from the stored offset (a retry finishes exactly the pinned slice);
    backfill slices read their whole range and never touch the stored offset.

    Reading and validating chunk k+1 overlaps with Postgres working on chunk k, in one
    writer thread. The per-chunk invariants hold unchanged: the writer runs one
    transaction at a time, in order, each one's compare-and-set starting where the last
    one ended; the Kafka commit of chunk k waits for its database commit. At most two
    chunks are in memory.
    """
    report = RangeReport(pipeline.name, rng.topic, rng.partition, rng.start, rng.end,
                         str(rng.mode))
    live = rng.mode is Mode.LIVE
    with ExitStack() as cleanup:  # closes whatever was opened, in reverse, even on error
        consumer = clients.consumer(pipeline.group_id)
        cleanup.callback(consumer.close)
        producer = clients.producer()
        cleanup.callback(producer.flush, 5)
        conn = db.connect()
        cleanup.callback(conn.close)
        # Postgres down or restarted mid-slice is transient (Airflow retries), not a raw
        # psycopg error. Leaving the executor waits for the chunk in flight.
        with translate_errors("ingest"), ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"sink-{rng.partition}") as writer:
            if live:  # a live slice owns its partition's cursor for the whole slice
                lock_partition(conn, pipeline.name, rng.partition, timeout_s=db.lock_timeout_s)
                cleanup.callback(unlock_partition, conn, pipeline.name, rng.partition)
            start = resume_from_cursor(conn, pipeline, rng) if live else rng.start
            report.resumed_from = start if start != rng.start else None
            in_flight: _InFlight | None = None
            for chunk in read_range(consumer, rng.topic, rng.partition, start, rng.end,
                                    chunk_size=pipeline.chunk_size,
                                    max_chunk_bytes=pipeline.max_chunk_bytes):
                t0 = time.monotonic()
                result = validate_chunk(chunk.messages, pipeline)
                _at("validated")
                if in_flight is not None:
                    _finish(in_flight, consumer, rng, report)
                future = writer.submit(_write_chunk, pipeline, rng, chunk, result, conn,
                                       producer, run_id, time.monotonic() - t0,
                                       db.lock_timeout_s)
                in_flight = _InFlight(future, chunk, result)
            if in_flight is not None:
                _finish(in_flight, consumer, rng, report)
            report.lag_after = _lag_after(consumer, rng)
    log.info(report.log_line())
    return report


@dataclass(frozen=True)
class _InFlight:
    future: Future[tuple[dict[str, int], float]]
    chunk: Chunk
    result: ValidationResult


def _finish(job: _InFlight, consumer: Any, rng: OffsetRange, report: RangeReport) -> None:
    """Wait for a chunk's transaction, count it, then commit its offset to Kafka."""
    counts, seconds = job.future.result()
    _add(report, job.result, counts, seconds)
    if rng.mode is Mode.LIVE:
        commit_offset(consumer, rng.topic, rng.partition, job.chunk.end)
        _at("kafka_committed")


def resume_from_cursor(conn: Any, pipeline: Pipeline, rng: OffsetRange) -> int:
    """Where a slice that moves a stored cursor starts: where the cursor is now.

    A retry or a cleared task thus finishes exactly its pinned slice. A cursor behind the
    slice's start means another run rewound it: fence rather than guess.
    """
    stored = OffsetsRepository(conn).get(pipeline.name, rng.topic, rng.partition)
    conn.commit()
    if stored is None or stored < rng.start:
        raise FencedError(pipeline.name, rng.topic, rng.partition, rng.start, stored)
    if stored != rng.start:
        log.info("%s[%d]: stored offset is %d; resuming the pinned slice [%d, %d) there",
                 rng.topic, rng.partition, stored, rng.start, rng.end)
    return min(stored, rng.end)


def _write_chunk(pipeline: Pipeline, rng: OffsetRange, chunk: Chunk,
                 result: ValidationResult, conn: Any, producer: Any, run_id: str,
                 validate_s: float, lock_timeout_s: float) -> tuple[dict[str, int], float]:
    """One chunk's transaction (runs in the writer thread): rows, dead letters delivered
    and recorded, the stored offset moved by compare-and-set, the audit row, COMMIT.

    A backfill chunk takes the partition's lock for its transaction only: it waits for the
    live slice in progress (up to the lock time-out, then the task is retried), and a live
    slice waits at most for one backfill chunk."""
    t0 = time.monotonic()
    with UnitOfWork(conn, pipeline) as uow:
        if rng.mode is not Mode.LIVE:
            lock_partition(conn, pipeline.name, rng.partition, timeout_s=lock_timeout_s,
                           for_transaction=True)
        up = uow.rows.upsert(result.rows)
        _at("upserted")
        dead = result.dead + _rejected_letters(pipeline, chunk, up.rejected)
        delivered = produce_dead_letters(producer, dead, pipeline.name,
                                         pipeline.dlq_header_style)
        _at("dlq_produced")
        uow.dead_letters.record(pipeline.name, dead, delivered)
        if rng.mode is Mode.LIVE:
            uow.offsets.advance(pipeline.name, rng.topic, rng.partition, chunk.start, chunk.end)
        counts = {"inserted": up.inserted, "duplicates": up.duplicates, "stale": up.stale,
                  "dead_lettered": len(dead), "tombstones": result.tombstones}
        reconcile(chunk.partition, result.read, counts, missing=up.missing)
        seconds = validate_s + time.monotonic() - t0
        uow.runs.add(RunRecord(pipeline.name, run_id, str(rng.mode), rng.topic, rng.partition,
                               chunk.start, chunk.end, result.read, up.inserted, up.duplicates,
                               up.stale, len(dead), result.tombstones, result.bytes, seconds))
        uow.commit(partition=rng.partition, start=chunk.start, end=chunk.end)
    _at("db_committed")
    return counts, seconds


def _add(report: RangeReport, result: ValidationResult, counts: Mapping[str, int],
         seconds: float) -> None:
    report.read += result.read
    report.bytes += result.bytes
    report.inserted += counts["inserted"]
    report.duplicates += counts["duplicates"]
    report.stale += counts["stale"]
    report.dead_lettered += counts["dead_lettered"]
    report.tombstones += counts["tombstones"]
    report.seconds += seconds
    report.chunks += 1


def reconcile(partition: int, read: int, counts: Mapping[str, int], *, missing: int = 0) -> None:
    """read = inserted + duplicates + stale + dead letters + tombstones, and no valid row
    missing from the table after the upsert; or fail loudly (the chunk rolls back)."""
    if sum(counts.values()) != read or missing:
        raise ReconciliationError(partition, read, dict(counts), missing=missing)


def _rejected_letters(pipeline: Pipeline, chunk: Chunk,
                      rejected: list[tuple[tuple[Any, ...], Any]]) -> list[DeadLetter]:
    if not rejected:
        return []
    by_offset = {m.offset(): m for m in chunk.messages}
    return [dead_letter(by_offset[row[-3]], pipeline, reason) for row, reason in rejected]


def _lag_after(consumer: Any, rng: OffsetRange) -> int | None:
    try:
        _, high = watermarks(consumer, rng.topic, [rng.partition])[rng.partition]
    except Exception:  # lag is a report, not a reason to fail a committed slice
        log.warning("could not read the high watermark for the lag report", exc_info=True)
        return None
    return max(0, high - rng.end)


def summarize(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum the mapped results of one run."""
    total: Counter[str] = Counter()
    lag = 0
    parts = 0
    for r in reports:
        parts += 1
        for key in ("read", "inserted", "duplicates", "stale", "dead_lettered", "tombstones",
                    "bytes"):
            total[key] += int(r.get(key) or 0)
        total["seconds"] += float(r.get("seconds") or 0.0)  # type: ignore[assignment]
        lag += int(r.get("lag_after") or 0)
    read = total["read"]
    return {**total, "partitions": parts, "lag_after": lag,
            "dlq_rate": round(total["dead_lettered"] / read, 6) if read else 0.0}


# --------------------------------------------------------------------------- status


def lag(pipeline: Pipeline, clients: KafkaClients, db: Database) -> list[dict[str, Any]]:
    """Per partition: stored offset, Kafka group offset, watermarks and lag."""
    consumer = clients.consumer(pipeline.group_id)
    try:
        parts = partitions_of(consumer, pipeline.topic)
        marks = watermarks(consumer, pipeline.topic, parts)
        group = committed_offsets(consumer, pipeline.topic, parts)
    finally:
        consumer.close()
    with db.session() as conn:
        stored = OffsetsRepository(conn).all(pipeline.name, pipeline.topic)
    rows = []
    for p in parts:
        low, high = marks[p]
        s = stored.get(p)
        rows.append({"pipeline": pipeline.name, "topic": pipeline.topic, "partition": p,
                     "stored_offset": s, "group_offset": group.get(p), "low": low,
                     "high": high, "lag": high - (s if s is not None else low)})
    return rows


def request_from_params(params: Mapping[str, Any], *, run_type: str,
                        interval: tuple[datetime, datetime] | None,
                        now: datetime) -> dict[str, Any]:
    """Turn a run's trigger params (or Airflow backfill interval) into a plan request.

    Manual runs: ``partitions`` ``{"0": [start, end]}`` or ``from``/``to`` (ISO-8601),
    not both; neither means a live run. Airflow backfill runs (``run_type == "backfill"``)
    map their data interval to offsets by time. Raises :class:`TriggerParamsError` with
    what to fix.
    """
    partitions = params.get("partitions") or {}
    start, end = params.get("from"), params.get("to")
    if partitions and (start or end):
        raise TriggerParamsError("give either 'partitions' (offsets) or 'from'/'to' (time), "
                                 "not both")
    if partitions:
        return {"partitions": _offset_request(partitions)}
    if start or end:
        if not (start and end):
            raise TriggerParamsError("a time backfill needs both 'from' and 'to'")
        return time_request(_parse_time("from", start), _parse_time("to", end), now=now)
    if run_type == "backfill" and interval is not None:
        return time_request(interval[0], interval[1], now=now)
    return {}


def _offset_request(partitions: Any) -> dict[int, tuple[int, int]]:
    if not isinstance(partitions, Mapping):
        raise TriggerParamsError('partitions must be an object like {"0": [0, 100]}')
    out: dict[int, tuple[int, int]] = {}
    for p, bounds in partitions.items():
        part = _whole_number(p)
        if part is None or part < 0 or not _offset_pair(bounds):
            raise TriggerParamsError(
                f'partitions[{p!r}] must be [start, end] offsets (whole numbers), '
                f'e.g. {{"0": [0, 100]}}; got {bounds!r}'
            )
        lo, hi = bounds
        if hi < lo:
            raise TriggerParamsError(f"partition {part}: end {hi} is before start {lo}")
        out[part] = (lo, hi)
    return out


def _whole_number(value: Any) -> int | None:
    """A partition id from a form: an int, or a string of digits (JSON object keys)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:  # "zero", "²" (a digit to str.isdigit, not to int)
            return None
    return None


def _offset_pair(bounds: Any) -> bool:
    return (isinstance(bounds, list | tuple) and len(bounds) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds))


def _parse_time(name: str, value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise TriggerParamsError(f"{name!r} is not an ISO-8601 time: {value!r} "
                                 "(e.g. 2026-01-01T00:00:00Z)") from None


__all__ = [
    "CHUNK_HOOK",
    "RangeReport",
    "ingest_range",
    "lag",
    "plan_run",
    "reconcile",
    "request_from_params",
    "resume_from_cursor",
    "summarize",
    "time_request",
]
