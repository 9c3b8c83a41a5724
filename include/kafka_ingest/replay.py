"""DLQ replay: re-validate dead letters with the current contract and load the ones that pass.

A replay reads a bounded range of the DLQ topic (DESIGN §5), one task per DLQ partition:

- by default from the **replay cursor**, stored in ``ingest_offsets`` under
  ``(pipeline, dlq_topic, partition)`` and initialised at the DLQ's low watermark; it moves
  by compare-and-set in the same transaction as the rows a chunk recovers;
- or over an explicit ``{partition: [start, end]}`` of the DLQ topic, or a ``from``/``to``
  window (mapped with ``offsets_for_times`` on the DLQ records' timestamps, which are the
  original messages' timestamps). Explicit and time replays never move the cursor, nor
  does a replay with filters (it would skip the letters it filtered out) or a dry run.

Each DLQ record's ORIGINAL bytes are validated as if they were the source message
(:class:`~kafka_ingest.dlq.ReplayedMessage`), so a recovered row's provenance is the
original source topic, partition and offset, and they go through the same idempotent
upsert as ingestion. Passing letters are marked ``recovered`` in ``dead_letters``; the
others stay ``parked`` with the latest reason and one more attempt. Nothing is produced
to the DLQ again: the record that is there already is the one a later replay reads.

``dry_run`` does the same work inside a transaction that is rolled back (so the counts,
including rows Postgres itself would reject, are exact) and never moves the cursor.

Plans are pinned in ``run_plans`` under ``<pipeline>:replay`` (not the pipeline name: a
scheduled ingest run and a scheduled replay run of the same pipeline get the same Airflow
run id, and their plans must not mix).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.dlq import PREFIX, DeadLetter, ReplayedMessage, parse_dlq_message
from kafka_ingest.errors import (
    DATA_ERROR_CLASSES,
    DataError,
    ReconciliationError,
    TriggerParamsError,
)
from kafka_ingest.ranges import (
    Mode,
    OffsetRange,
    PartitionState,
    plan_between,
    plan_explicit,
    request_key,
)
from kafka_ingest.reader import (
    Chunk,
    KafkaClients,
    commit_offset,
    offsets_for_time,
    partitions_of,
    read_range,
    watermarks,
)
from kafka_ingest.service import request_from_params, resume_from_cursor
from kafka_ingest.sink import (
    OffsetsRepository,
    RunRecord,
    RunsRepository,
    UnitOfWork,
    lock_partition,
    translate_errors,
    unlock_partition,
)
from kafka_ingest.validate import dead_letter, validate_chunk

log = logging.getLogger(__name__)

#: Error classes a dead letter can carry (``data_error`` is a dead-lettered tombstone).
KNOWN_ERROR_CLASSES: tuple[str, ...] = (
    *(c.error_class for c in DATA_ERROR_CLASSES), DataError.error_class,
)
#: The outcomes every report carries, even at zero; rarer ones appear when they happen:
#: ``duplicate_in_dlq`` (the same source offset twice in the DLQ, from a retried
#: produce), ``not_a_dead_letter`` (a record without our headers), ``other_pipeline``,
#: ``truncated`` (value cut to fit the DLQ: backfill the source offset instead),
#: ``tombstone`` (a null value the current rule skips; left parked).
OUTCOMES = ("recovered", "still_parked", "already_recovered", "filtered_out")


def replay_key(pipeline: Pipeline) -> str:
    """The name replay plans are pinned under and its advisory locks are taken on."""
    return f"{pipeline.name}:replay"


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ReplayFilters:
    """Which dead letters a replay considers; the others are counted ``filtered_out``."""

    error_classes: frozenset[str] = frozenset()
    source_partition: int | None = None
    event_id: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ReplayFilters:
        """Checked filters from trigger params / CLI; :class:`TriggerParamsError` if bad."""
        classes = params.get("error_classes") or []
        if isinstance(classes, str):
            classes = [classes]
        unknown = sorted(set(classes) - set(KNOWN_ERROR_CLASSES))
        if unknown:
            raise TriggerParamsError(f"unknown error class(es) {', '.join(unknown)}; known: "
                                     f"{', '.join(KNOWN_ERROR_CLASSES)}")
        part = params.get("source_partition")
        if part is not None and (isinstance(part, bool) or not isinstance(part, int)
                                 or part < 0):
            raise TriggerParamsError(f"source_partition must be an integer >= 0, not {part!r}")
        event_id = params.get("event_id")
        if event_id is not None and (not isinstance(event_id, str) or not event_id):
            raise TriggerParamsError(f"event_id must be a non-empty string, not {event_id!r}")
        return cls(frozenset(classes), part, event_id)

    @property
    def active(self) -> bool:
        return bool(self.error_classes or self.source_partition is not None
                    or self.event_id is not None)

    def matches(self, letter: DeadLetter) -> bool:
        if self.error_classes and letter.error_class not in self.error_classes:
            return False
        if self.source_partition is not None and letter.source_partition != self.source_partition:
            return False
        return self.event_id is None or _event_id_of(letter.value) == self.event_id

    def to_dict(self) -> dict[str, Any]:
        return {"error_classes": sorted(self.error_classes),
                "source_partition": self.source_partition, "event_id": self.event_id}


def _event_id_of(value: bytes | None) -> str | None:
    """A JSON peek at ``event_id``; anything unparseable has none (matches no filter)."""
    if value is None:
        return None
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return None
    found = doc.get("event_id") if isinstance(doc, dict) else None
    return found if isinstance(found, str) else None


def replay_request(params: Mapping[str, Any], *, now: datetime) -> dict[str, Any]:
    """Check a replay's trigger params and return its plan request.

    The range part (``partitions`` of the DLQ topic, or ``from``/``to``) follows the
    ingest DAG's rules (:func:`kafka_ingest.service.request_from_params`); the filters are
    checked too, so every bad form fails here, before anything is read.
    """
    ReplayFilters.from_params(params)
    return request_from_params(params, run_type="manual", interval=None, now=now)


# --------------------------------------------------------------------------- planning


def plan_replay(pipeline: Pipeline, clients: KafkaClients, db: Any, *, run_id: str,
                request: Mapping[str, Any] | None = None,
                dry_run: bool = False) -> list[OffsetRange]:
    """Plan this replay's DLQ ranges and pin them to ``run_id``; a retry gets the same plan.

    Without a request: from the replay cursor (initialised at the low watermark unless
    ``dry_run``) to the high watermark, capped by ``max_records_per_partition``.
    """
    request = request or {}
    advance = not (request.get("partitions") or request.get("from_ms") is not None)
    key = replay_key(pipeline)
    asked = request_key({**request, "dry_run": dry_run})
    with db.session() as conn:
        runs = RunsRepository(conn)
        pinned = runs.pinned_plan(key, run_id, asked)
        if pinned:
            log.info("replay %s already planned; reusing its %d range(s)", run_id, len(pinned))
            return [OffsetRange(t, p, s, e, Mode.REPLAY, advance) for t, p, s, e, _ in pinned
                    if e > s]
        consumer = clients.consumer(_group(pipeline))
        try:
            ranges = _plan(pipeline, consumer, conn, request, dry_run=dry_run)
        finally:
            consumer.close()
        runs.pin_plan(key, run_id, asked, str(Mode.REPLAY),
                      [(r.topic, r.partition, r.start, r.end) for r in ranges])
        conn.commit()
    for r in ranges:
        log.info("replay planned %s[%d] [%d, %d)%s: %d DLQ records", r.topic, r.partition,
                 r.start, r.end, " (moves the cursor)" if r.advance_cursor else "", r.size)
    return ranges


def _group(pipeline: Pipeline) -> str:
    return f"{pipeline.group_id}.dlq-replay"


def _plan(pipeline: Pipeline, consumer: Any, conn: Any, request: Mapping[str, Any], *,
          dry_run: bool) -> list[OffsetRange]:
    topic = pipeline.dlq_topic
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    if request.get("partitions"):
        wanted = {int(p): (int(se[0]), int(se[1])) for p, se in request["partitions"].items()}
        return plan_explicit(topic, wanted, marks, mode=Mode.REPLAY)
    if request.get("from_ms") is not None:
        start = offsets_for_time(consumer, topic, parts, int(request["from_ms"]))
        end = offsets_for_time(consumer, topic, parts, int(request["to_ms"]))
        return plan_between(topic, start, end, mode=Mode.REPLAY)
    offsets = OffsetsRepository(conn)
    stored = offsets.all(pipeline.name, topic)
    ranges = []
    for p in parts:
        state = PartitionState(p, *marks[p], stored.get(p))
        first = _cursor_start(pipeline, state, offsets, dry_run=dry_run)
        last = min(state.high, first + pipeline.max_records_per_partition)
        if last > first:
            ranges.append(OffsetRange(topic, p, first, last, Mode.REPLAY, True))
    return ranges


def _cursor_start(pipeline: Pipeline, s: PartitionState, offsets: OffsetsRepository, *,
                  dry_run: bool) -> int:
    """The cursor, or the low watermark; a cursor below it jumps there, loudly.

    The DLQ records retention deleted are still listed in ``dead_letters``; only their
    bytes are gone (the source topic may still hold them: backfill those offsets).
    """
    topic = pipeline.dlq_topic
    if s.stored is None:
        if not dry_run:
            offsets.initialise(pipeline.name, topic, s.partition, s.low)
        return s.low
    if s.stored < s.low:
        log.error("GAP %s[%d]: DLQ records [%d, %d) were deleted by retention before they "
                  "were replayed; the replay cursor jumps to %d", topic, s.partition, s.stored,
                  s.low, s.low)
        if not dry_run:
            RunsRepository(offsets.conn).record_gap(replay_key(pipeline), topic, s.partition,
                                                    s.stored, s.low, None)
            offsets.advance(pipeline.name, topic, s.partition, s.stored, s.low)
        return s.low
    return s.stored


# --------------------------------------------------------------------------- replay


@dataclass
class ReplayReport:
    """What one DLQ partition slice did; summed by :func:`summarize_replay`."""

    pipeline: str
    topic: str
    partition: int
    start: int
    end: int
    dry_run: bool
    moves_cursor: bool
    read: int = 0
    inserted: int = 0
    duplicates: int = 0
    stale: int = 0
    chunks: int = 0
    seconds: float = 0.0
    resumed_from: int | None = None
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    #: outcome -> error class -> count; ``still_parked`` is by the latest reason,
    #: ``recovered`` by the reason the letter had before.
    reasons: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def count(self, outcome: str, error_class: str, n: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + n
        by_class = self.reasons.setdefault(outcome, {})
        by_class[error_class] = by_class.get(error_class, 0) + n

    def log_line(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.outcomes.items())
        return (f"{'DRY RUN ' if self.dry_run else ''}replay {self.pipeline} {self.topic}"
                f"[{self.partition}] [{self.start}, {self.end}): read {self.read}, {counts}")


def replay_range(pipeline: Pipeline, rng: OffsetRange, clients: KafkaClients, db: Any, *,
                 run_id: str, dry_run: bool = False,
                 filters: ReplayFilters | None = None) -> ReplayReport:
    """Replay one DLQ partition slice, chunk by chunk, under the replay's advisory lock."""
    filters = filters or ReplayFilters()
    # A filtered replay is targeted: moving the cursor would skip the filtered-out letters.
    moves = rng.advance_cursor and not dry_run and not filters.active
    report = ReplayReport(pipeline.name, rng.topic, rng.partition, rng.start, rng.end,
                          dry_run, moves)
    # Closes whatever was opened, in reverse, even on error; psycopg's connection errors
    # become transient errors (Airflow retries).
    with translate_errors("replay"), ExitStack() as cleanup:
        consumer = clients.consumer(_group(pipeline))
        cleanup.callback(consumer.close)
        conn = db.connect()
        cleanup.callback(conn.close)
        lock_partition(conn, replay_key(pipeline), rng.partition, timeout_s=db.lock_timeout_s)
        cleanup.callback(unlock_partition, conn, replay_key(pipeline), rng.partition)
        start = resume_from_cursor(conn, pipeline, rng) if moves else rng.start
        report.resumed_from = start if start != rng.start else None
        for chunk in read_range(consumer, rng.topic, rng.partition, start, rng.end,
                                chunk_size=pipeline.chunk_size,
                                max_chunk_bytes=pipeline.max_chunk_bytes):
            _replay_chunk(pipeline, chunk, conn, report, run_id, filters, moves=moves)
            if moves:
                commit_offset(consumer, rng.topic, rng.partition, chunk.end)
    log.info(report.log_line())
    return report


def _replay_chunk(pipeline: Pipeline, chunk: Chunk, conn: Any, report: ReplayReport,
                  run_id: str, filters: ReplayFilters, *, moves: bool) -> None:
    t0 = time.monotonic()
    with UnitOfWork(conn, pipeline) as uow:
        eligible = _triage(pipeline, chunk.messages, filters, uow, report)
        recovered, parked, up = _revalidate(pipeline, eligible, uow, report)
        if not report.dry_run:
            uow.dead_letters.mark_recovered(pipeline.name, [d.source for d in recovered])
            uow.dead_letters.record(pipeline.name, parked,
                                    [_dlq_location(d) for d in parked])
            if moves:
                uow.offsets.advance(pipeline.name, chunk.topic, chunk.partition, chunk.start,
                                    chunk.end)
            uow.runs.add(RunRecord(
                pipeline.name, run_id, str(Mode.REPLAY), chunk.topic, chunk.partition,
                chunk.start, chunk.end, len(chunk.messages), up[0], up[1], up[2],
                len(parked), 0, sum(len(m.value() or b"") for m in chunk.messages),
                time.monotonic() - t0))
            uow.commit(partition=chunk.partition, start=chunk.start, end=chunk.end)
    report.read += len(chunk.messages)
    report.chunks += 1
    report.seconds += time.monotonic() - t0


def _dlq_location(letter: DeadLetter) -> tuple[int, int] | None:
    if letter.dlq_partition is None or letter.dlq_offset is None:
        return None
    return (letter.dlq_partition, letter.dlq_offset)


def _triage(pipeline: Pipeline, messages: Sequence[Any], filters: ReplayFilters,
            uow: UnitOfWork, report: ReplayReport) -> list[DeadLetter]:
    """The letters this replay re-validates; every other record is counted by outcome."""
    letters: dict[tuple[str, int, int], DeadLetter] = {}
    for msg in messages:
        letter, skip = _letter_of(pipeline, msg)
        if letter is None:
            report.count(skip, "-")
        elif not filters.matches(letter):
            report.count("filtered_out", letter.error_class)
        elif letter.source in letters:
            report.count("duplicate_in_dlq", letter.error_class)
        else:
            letters[letter.source] = letter
    status = uow.dead_letters.status_of(pipeline.name, list(letters)) if letters else {}
    eligible = []
    for key, letter in letters.items():
        if status.get(key) == "recovered":
            report.count("already_recovered", letter.error_class)
        else:
            eligible.append(letter)
    return eligible


def _letter_of(pipeline: Pipeline, msg: Any) -> tuple[DeadLetter | None, str]:
    """Parse one DLQ record, or say why it is not replayed."""
    headers = {k: v for k, v in (msg.headers() or ())}
    owner = headers.get(PREFIX + "pipeline") or headers.get("__connect.errors.connector.name")
    if owner is not None and owner.decode("utf-8", "replace") != pipeline.name:
        return None, "other_pipeline"
    if PREFIX + "value.truncated" in headers or PREFIX + "key.truncated" in headers:
        return None, "truncated"  # not the original bytes: backfill the source offset
    try:
        return parse_dlq_message(msg), ""
    except ValueError as exc:
        log.warning("%s", exc)
        return None, "not_a_dead_letter"


def _revalidate(pipeline: Pipeline, letters: list[DeadLetter], uow: UnitOfWork,
                report: ReplayReport) -> tuple[list[DeadLetter], list[DeadLetter],
                                               tuple[int, int, int]]:
    """Validate the original bytes with the current contract and upsert what passes.

    Returns (recovered, still parked with the new reason, (inserted, duplicates, stale)).
    """
    by_source = {d.source: d for d in letters}
    result = validate_chunk([ReplayedMessage(d) for d in letters], pipeline)
    up = uow.rows.upsert(result.rows)
    if up.missing:  # rolled back with the chunk's transaction
        raise ReconciliationError(report.partition, len(letters),
                                  {"recovered": len(result.rows)}, missing=up.missing)
    rejected = [dead_letter(_RowMessage(row), pipeline, reason) for row, reason in up.rejected]
    rejected_keys = {d.source for d in rejected}
    recovered = [by_source[(r[-5], r[-4], r[-3])] for r in result.rows
                 if (r[-5], r[-4], r[-3]) not in rejected_keys]
    for d in recovered:
        report.count("recovered", d.error_class)
    parked = []
    for new in [*result.dead, *rejected]:
        old = by_source[new.source]
        parked.append(replace(new, attempts=old.attempts + 1, first_failed_at=old.first_failed_at,
                              dlq_partition=old.dlq_partition, dlq_offset=old.dlq_offset))
        report.count("still_parked", new.error_class)
    tombstones = result.tombstones
    if tombstones:
        report.count("tombstone", "data_error", tombstones)
    report.inserted += up.inserted
    report.duplicates += up.duplicates
    report.stale += up.stale
    return recovered, parked, (up.inserted, up.duplicates, up.stale)


@dataclass(frozen=True)
class _RowMessage:
    """A row Postgres rejected, seen as a message so it becomes a dead letter again."""

    row: tuple[Any, ...]

    def topic(self) -> str:
        return str(self.row[-5])

    def partition(self) -> int:
        return int(self.row[-4])

    def offset(self) -> int:
        return int(self.row[-3])

    def key(self) -> bytes | None:
        key: bytes | None = self.row[-2]
        return key

    def value(self) -> bytes | None:
        return None  # the DLQ record keeps the bytes; the table keeps no value

    def timestamp(self) -> tuple[int, int]:
        ts = self.row[-1]
        return (0, -1) if ts is None else (1, int(ts.timestamp() * 1000))


def summarize_replay(reports: Iterable[Mapping[str, Any]], *,
                     dry_run: bool | None = None) -> dict[str, Any]:
    """Sum the mapped results of one replay run: counts by outcome and by reason.

    ``dry_run`` is the run's own setting; without it, it is read off the reports (so a
    dry run with nothing to replay would look real: pass it)."""
    total: Counter[str] = Counter(dict.fromkeys(("read", "inserted", "duplicates", "stale"), 0))
    outcomes: Counter[str] = Counter(dict.fromkeys(OUTCOMES, 0))
    reasons: dict[str, Counter[str]] = {}
    seen_dry_run = False
    parts = 0
    for r in reports:
        parts += 1
        seen_dry_run = seen_dry_run or bool(r.get("dry_run"))
        for key in ("read", "inserted", "duplicates", "stale"):
            total[key] += int(r.get(key) or 0)
        outcomes.update(r.get("outcomes") or {})
        for outcome, by_class in (r.get("reasons") or {}).items():
            reasons.setdefault(outcome, Counter()).update(by_class)
    return {"dry_run": seen_dry_run if dry_run is None else dry_run, "partitions": parts,
            **total, "outcomes": dict(outcomes),
            "reasons": {k: dict(v) for k, v in reasons.items()}}


__all__ = [
    "KNOWN_ERROR_CLASSES",
    "OUTCOMES",
    "ReplayFilters",
    "ReplayReport",
    "plan_replay",
    "replay_key",
    "replay_range",
    "replay_request",
    "summarize_replay",
]
