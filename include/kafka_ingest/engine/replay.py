"""DLQ replay: re-validate dead letters with the current contract and load the ones that pass.

A replay reads a bounded range of the DLQ topic (DESIGN §5), one slice per DLQ partition,
planned by the one planner and run by the one slice engine:

- by default from the **replay cursor**, stored in ``ingest_offsets`` under
  ``(pipeline, dlq_topic, partition)`` and initialised at the DLQ's low watermark; it moves
  by compare-and-set in the same transaction as the rows a chunk recovers;
- or over an explicit ``{partition: [start, end]}`` of the DLQ topic, or a ``from``/``to``
  window (mapped with ``offsets_for_times`` on the DLQ records' timestamps, which are the
  original messages' timestamps). Explicit and time replays never move the cursor, nor
  does a replay with filters (it would skip the letters it filtered out) or a dry run.

Each DLQ record's ORIGINAL bytes are validated as if they were the source message
(:class:`~kafka_ingest.kafka.dlq.ReplayedMessage`), so a recovered row's provenance is the
original source topic, partition and offset, and they go through the same idempotent
upsert as ingestion. Passing letters are marked ``recovered`` in ``dead_letters``; the
others stay ``parked`` with the latest reason and one more attempt. Nothing is produced
to the DLQ again: the record that is there already is the one a later replay reads.

``dry_run`` does the same work inside transactions that are rolled back (so the counts,
including rows Postgres itself would reject, are exact) and never moves the cursor.

Plans are pinned and locks taken under ``<pipeline>:replay`` (not the pipeline name: a
scheduled ingest run and a scheduled replay run of the same pipeline get the same Airflow
run id, and their plans must not mix).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kafka_ingest.config import OnOffsetGap, Pipeline, StartPolicy
from kafka_ingest.db import CopyEncoder, Database, DeleteResult, UnitOfWork
from kafka_ingest.decode.decoder import RegistryDecoder, open_decoder
from kafka_ingest.decode.validate import ValidationResult, dead_letter, validate_chunk
from kafka_ingest.engine.planning import PlanTarget, plan
from kafka_ingest.engine.slices import ChunkResult, SliceReport, SliceSpec, run_slice
from kafka_ingest.errors import ReconciliationError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.dlq import PREFIX, DeadLetter, ReplayedMessage, parse_dlq_message
from kafka_ingest.kafka.reader import Chunk
from kafka_ingest.ranges import Mode, OffsetRange
from kafka_ingest.records import REPLAYED, ChunkCounts, Position, Source, row_source
from kafka_ingest.requests import (
    LiveRun,
    ReplayFilters,
    ReplayRequest,
    ValueReader,
    letter_identity,
)

log = logging.getLogger(__name__)

#: The outcomes every report carries, even at zero; rarer ones appear when they happen:
#: ``duplicate_in_dlq`` (the same source offset twice in the DLQ, from a retried
#: produce), ``not_a_dead_letter`` (a record without our headers), ``other_pipeline``,
#: ``truncated`` (value cut to fit the DLQ: backfill the source offset instead),
#: ``headers_dropped`` (the record's own headers dropped to fit the DLQ, and the pipeline
#: fills columns from headers: backfill the source offset instead),
#: ``tombstone`` (a null value the current rule skips; left parked),
#: ``unknown_incarnation`` (the letter names a source topic id this database never saw,
#: so its records cannot be ordered against the stored ones; left parked).
OUTCOMES = ("recovered", "still_parked", "already_recovered", "filtered_out")


def replay_key(pipeline: Pipeline) -> str:
    """The name replay plans are pinned under and its advisory locks are taken on."""
    return f"{pipeline.name}:replay"


def replay_group(pipeline: Pipeline) -> str:
    """The consumer group the replay cursor is committed to."""
    return f"{pipeline.group_id}.dlq-replay"


def replay_target(pipeline: Pipeline, request: ReplayRequest) -> PlanTarget:
    """Replay plans over the DLQ topic from its own cursor (earliest; gaps skipped)."""
    return PlanTarget(
        plan_name=replay_key(pipeline), topic=pipeline.dlq_topic, role="dead-letter topic",
        group_id=replay_group(pipeline), cursor_mode=Mode.REPLAY, window_mode=Mode.REPLAY,
        start_policy=StartPolicy.EARLIEST, on_gap=OnOffsetGap.SKIP,
        dry_run=request.dry_run, filtered=request.filters.active,
    )


def plan_replay(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str,
                request: ReplayRequest | None = None) -> list[OffsetRange]:
    """Plan this replay's DLQ ranges and pin them to ``run_id``; a retry gets the same plan.

    From the replay cursor by default (initialised at the low watermark unless a dry
    run) to the high watermark, capped by ``max_records_per_partition``.
    """
    request = request or ReplayRequest(LiveRun())
    return plan(pipeline, replay_target(pipeline, request), request.range, clients, db,
                run_id=run_id, request_key=request.key)


# --------------------------------------------------------------------------- one chunk


#: The letters of one source incarnation in a chunk: (source topic, its topic id as the
#: letters name it; None: letters written before topic ids were kept).
Origin = tuple[str, str | None]


@dataclass(frozen=True)
class _Group:
    """A chunk's letters of one source incarnation, re-validated: their positions are
    unique within it (the same offset of a re-created topic is another letter)."""

    letters: dict[Position, DeadLetter]
    result: ValidationResult


@dataclass(frozen=True)
class _Triaged:
    """A chunk of DLQ records, parsed, filtered and re-validated (no database yet)."""

    groups: dict[Origin, _Group]
    outcomes: Counter[tuple[str, str]]
    bytes: int


@dataclass(frozen=True)
class ReplayWriter:
    """Re-validates a chunk of dead letters and loads the ones that now pass."""

    pipeline: Pipeline
    filters: ReplayFilters
    dry_run: bool
    #: The registry format's decoder (None: JSON): letters keep their wire header.
    decoder: RegistryDecoder | None = None
    needs_producer: bool = False
    #: Letters met earlier in this slice: a second DLQ record of the same source record
    #: (a retried produce) is a duplicate whichever chunk it is in, so a dry run (whose
    #: chunks see nothing of each other's writes) counts exactly what the real run would.
    seen: set[tuple[Origin, Position]] = field(default_factory=set)

    @cached_property
    def read(self) -> ValueReader | None:
        """How the filters read a letter's payload (and a registry-encoded key): the
        registry format's decoder; None: as JSON."""
        return None if self.decoder is None else self.decoder.read_python

    @cached_property
    def identity_of(self) -> Callable[[DeadLetter], str | None]:
        """A letter's identity, as the ``identity`` filter writes it."""
        return letter_identity(self.pipeline, self.read)

    def prepare(self, chunk: Chunk, encoder: CopyEncoder) -> _Triaged:
        # Which rows load is known only inside the transaction (each letter's status):
        # they are encoded there, not here.
        outcomes: Counter[tuple[str, str]] = Counter()
        by_origin: dict[Origin, dict[Position, DeadLetter]] = {}
        for msg in chunk.messages:
            letter, skip = _letter_of(self.pipeline, msg)
            if letter is None:
                outcomes[(skip, "-")] += 1
                continue
            origin = (letter.source_topic, letter.source_topic_id)
            if not self.filters.matches(letter, self.identity_of, self.read):
                outcomes[("filtered_out", letter.error_class)] += 1
            elif (origin, letter.source) in self.seen:
                outcomes[("duplicate_in_dlq", letter.error_class)] += 1
            else:
                by_origin.setdefault(origin, {})[letter.source] = letter
                self.seen.add((origin, letter.source))
        # No "the registry knows none of the chunk's ids" check here (ingest has one): a
        # DLQ chunk holds the failures alone, unknown_schema poison among them, which would
        # fail it for good; a letter of an unknown id stays parked, and nothing is lost.
        groups = {origin: _Group(letters, validate_chunk(
            [ReplayedMessage(d) for d in letters.values()], self.pipeline, self.decoder))
            for origin, letters in by_origin.items()}
        size = sum(len(m.value() or b"") for m in chunk.messages)
        return _Triaged(groups, outcomes, size)

    def write(self, uow: UnitOfWork, chunk: Chunk, prepared: _Triaged, producer: Any,
              source: Source) -> ChunkResult:
        """Load each group of letters as rows of the incarnation it came from (``source``
        is the DLQ topic's, which the rows do not come from)."""
        outcomes = Counter(prepared.outcomes)
        counts = ChunkCounts(read=len(chunk.messages), bytes=prepared.bytes)
        for (topic, topic_id), group in prepared.groups.items():
            incarnation = uow.incarnations.known(topic, topic_id)
            if incarnation is None:  # a topic id this database never saw: cannot order it
                outcomes[("unknown_incarnation", "-")] += len(group.letters)
                continue
            letters = {pos: replace(d, source_incarnation=incarnation)
                       for pos, d in group.letters.items()}
            self._write_group(uow, chunk, Source(topic, topic_id, incarnation), letters,
                              group.result, outcomes, counts)
        return ChunkResult(counts, outcomes)

    def _write_group(self, uow: UnitOfWork, chunk: Chunk, origin: Source,
                     letters: dict[Position, DeadLetter], result: ValidationResult,
                     outcomes: Counter[tuple[str, str]], counts: ChunkCounts) -> None:
        status = uow.dead_letters.status_of(self.pipeline.name,
                                            [d.letter_key for d in letters.values()])
        eligible = {}
        for key, letter in letters.items():
            if status.get(letter.letter_key) == "recovered":
                outcomes[("already_recovered", letter.error_class)] += 1
            else:
                eligible[key] = letter
        recovered, parked, loaded = self._load(uow, chunk, origin, result, eligible, outcomes)
        if not self.dry_run:
            uow.dead_letters.mark_recovered(self.pipeline.name,
                                            [d.letter_key for d in recovered])
            uow.dead_letters.record(self.pipeline.name, parked,
                                    [_dlq_location(d) for d in parked])
        counts.add(loaded)

    def _load(self, uow: UnitOfWork, chunk: Chunk, origin: Source, result: ValidationResult,
              eligible: dict[Position, DeadLetter], outcomes: Counter[tuple[str, str]],
              ) -> tuple[list[DeadLetter], list[DeadLetter], ChunkCounts]:
        """Upsert the rows that now pass; return (recovered, still parked, counts)."""
        rows = [r for r in result.rows if row_source(r).position in eligible]
        dead = [d for d in result.dead if d.source in eligible]
        deletes = [t for t in result.deletes if (t.topic, t.partition, t.offset) in eligible]
        # every partition's keys: an old incarnation's letters sit in other partitions
        # than the new one writes their keys in (see hold_keys)
        uow.rows.serialize([*(row_source(r).partition for r in rows),
                            *(t.partition for t in deletes)], every=True)
        up = uow.rows.upsert(rows, source=origin)
        removed = (uow.rows.delete(deletes, source=origin) if deletes else DeleteResult(0))
        if up.missing or removed.missing:  # rolled back with the chunk's transaction
            raise ReconciliationError(chunk.partition, len(eligible),
                                      {"recovered": len(rows) + len(deletes)},
                                      missing=up.missing + removed.missing)
        rejected = {row_source(row).position: reason for row, reason in up.rejected}
        rejected.update({(t.topic, t.partition, t.offset): reason
                         for t, reason in removed.rejected})
        dead += [dead_letter(ReplayedMessage(eligible[pos]), self.pipeline, reason)
                 for pos, reason in rejected.items()]
        recovered = [eligible[row_source(r).position] for r in rows
                     if row_source(r).position not in rejected]
        recovered += [eligible[(t.topic, t.partition, t.offset)] for t in deletes
                      if (t.topic, t.partition, t.offset) not in rejected]
        for d in recovered:
            outcomes[("recovered", d.error_class)] += 1
        parked = []
        for new in dead:
            old = eligible[new.source]
            parked.append(replace(new, attempts=old.attempts + 1,
                                  first_failed_at=old.first_failed_at,
                                  dlq_partition=old.dlq_partition, dlq_offset=old.dlq_offset,
                                  source_topic_id=old.source_topic_id,
                                  source_incarnation=old.source_incarnation))
            outcomes[("still_parked", new.error_class)] += 1
        tombstones = len(eligible) - len(rows) - len(deletes) - (len(dead) - len(rejected))
        if tombstones:
            outcomes[("tombstone", "data_error")] += tombstones
        counts = ChunkCounts(inserted=up.inserted, duplicates=up.duplicates, stale=up.stale,
                             dead_lettered=len(parked), deleted=removed.deleted)
        return recovered, parked, counts


def _dlq_location(letter: DeadLetter) -> tuple[int, int] | None:
    if letter.dlq_partition is None or letter.dlq_offset is None:
        return None
    return (letter.dlq_partition, letter.dlq_offset)


def _letter_of(pipeline: Pipeline, msg: Any) -> tuple[DeadLetter | None, str]:
    """Parse one DLQ record, or say why it is not replayed."""
    headers = {k: v for k, v in (msg.headers() or ())}
    owner = headers.get(PREFIX + "pipeline") or headers.get("__connect.errors.connector.name")
    if owner is not None and owner.decode("utf-8", "replace") != pipeline.name:
        return None, "other_pipeline"
    if PREFIX + "value.truncated" in headers or PREFIX + "key.truncated" in headers:
        return None, "truncated"  # not the original bytes: backfill the source offset
    if PREFIX + "headers.dropped" in headers and pipeline.headers:
        # the record's own headers did not fit in the DLQ: its header columns would load
        # NULL (or the letter park as a missing required header); backfill the offset
        return None, "headers_dropped"
    try:
        return parse_dlq_message(msg), ""
    except ValueError as exc:
        log.warning("%s", exc)
        return None, "not_a_dead_letter"


# --------------------------------------------------------------------------- a slice, a run


def replay_range(pipeline: Pipeline, rng: OffsetRange, clients: KafkaClients, db: Database,
                 *, run_id: str, dry_run: bool = False,
                 filters: ReplayFilters | None = None) -> SliceReport:
    """Replay one DLQ partition slice, chunk by chunk; one that moves the replay cursor
    holds the replay's advisory lock (see :func:`~kafka_ingest.ranges.moves_cursor`)."""
    filters = filters or ReplayFilters()
    spec = SliceSpec(pipeline=pipeline, run_id=run_id, lock_name=replay_key(pipeline),
                     group_id=replay_group(pipeline), dry_run=dry_run,
                     filtered=filters.active, outcomes=OUTCOMES)
    with open_decoder(pipeline, clients.registry) as decoder:
        return run_slice(spec, ReplayWriter(pipeline, filters, dry_run, decoder), rng,
                         clients, db)


def run_replay(pipeline: Pipeline, request: ReplayRequest, clients: KafkaClients,
               db: Database, *, run_id: str) -> dict[str, Any]:
    """Plan and replay one DLQ run with the DAG's code path, partitions in turn."""
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=request)
    reports = [replay_range(pipeline, r, clients, db, run_id=run_id, dry_run=request.dry_run,
                            filters=request.filters).to_dict() for r in ranges]
    return {"run_id": run_id, "filters": request.filters.to_dict(),
            **summarize_replay(reports, dry_run=request.dry_run)}


def summarize_replay(reports: Iterable[Mapping[str, Any]], *,
                     dry_run: bool | None = None) -> dict[str, Any]:
    """Sum the mapped results of one replay run: counts by outcome and by reason.

    ``dry_run`` is the run's own setting; without it, it is read off the reports (so a
    dry run with nothing to replay would look real: pass it)."""
    total: Counter[str] = Counter(dict.fromkeys(REPLAYED, 0))
    outcomes: Counter[str] = Counter(dict.fromkeys(OUTCOMES, 0))
    reasons: dict[str, Counter[str]] = {}
    seen_dry_run = False
    parts = 0
    for r in reports:
        parts += 1
        seen_dry_run = seen_dry_run or bool(r.get("dry_run"))
        for key in REPLAYED:
            total[key] += int(r.get(key) or 0)
        outcomes.update(r.get("outcomes") or {})
        for outcome, by_class in (r.get("reasons") or {}).items():
            reasons.setdefault(outcome, Counter()).update(by_class)
    return {"dry_run": seen_dry_run if dry_run is None else dry_run, "partitions": parts,
            **total, "outcomes": dict(outcomes),
            "reasons": {k: dict(v) for k, v in reasons.items()}}
