"""Ingest: what one chunk of a source topic writes, and the run around it.

A chunk's transaction (run by :mod:`kafka_ingest.engine.slices`): the valid rows upserted (rows
Postgres rejects are isolated and join the dead letters), the dead letters produced to
the DLQ topic with every delivery report checked, then recorded in ``dead_letters``, and
the counts reconciled against what was read and against the table. Live runs and
backfills both write chunks this way; they differ in the range (planned by
:mod:`kafka_ingest.engine.planning`), in whether the cursor moves (backfills never), and in
what a poison pill already in ``dead_letters`` becomes: a backfill neither produces nor
records it again (it is counted as ``known_dead``), while a live run re-reading a chunk
after a crash produces it again (at-least-once into the DLQ, as documented).

DAG tasks and the CLI call exactly these functions, so ``kafka-ingest run`` and the
Airflow DAG share one code path.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.db import CopyEncoder, Database, DeleteResult, UnitOfWork, UpsertResult
from kafka_ingest.decode.decoder import RegistryDecoder, open_decoder
from kafka_ingest.decode.validate import (
    ValidationResult,
    dead_letter,
    latest_event_ms,
    validate_chunk,
)
from kafka_ingest.engine.planning import PlanTarget, plan
from kafka_ingest.engine.slices import ChunkResult, SliceReport, SliceSpec, at, run_slice
from kafka_ingest.errors import ReconciliationError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.dlq import DeadLetter, produce_dead_letters
from kafka_ingest.kafka.reader import Chunk
from kafka_ingest.ranges import Mode, OffsetRange
from kafka_ingest.records import COUNTERS, ChunkCounts, Source, row_source
from kafka_ingest.requests import LiveRun, RangeRequest, request_key

log = logging.getLogger(__name__)


def ingest_target(pipeline: Pipeline) -> PlanTarget:
    """Ingest plans over the source topic; its dead-letter topic must exist too."""
    return PlanTarget(
        plan_name=pipeline.name, topic=pipeline.topic, role="source topic",
        group_id=pipeline.group_id, cursor_mode=Mode.LIVE, window_mode=Mode.BACKFILL,
        start_policy=pipeline.start_policy, on_gap=pipeline.on_offset_gap,
        must_exist=((pipeline.dlq_topic, "dead-letter topic"),),
    )


def plan_run(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str,
             request: RangeRequest | None = None) -> list[OffsetRange]:
    """Plan an ingest run (live, or a backfill window) and pin it to ``run_id``."""
    request = request or LiveRun()
    return plan(pipeline, ingest_target(pipeline), request, clients, db, run_id=run_id,
                request_key=request_key(request))


@dataclass(frozen=True)
class IngestWriter:
    """Validates a chunk of source messages and writes it (see the module docstring)."""

    pipeline: Pipeline
    #: A backfill chunk: dead letters whose source offset is already in ``dead_letters``
    #: (any status) are counted as known, neither produced nor recorded again.
    backfill: bool = False
    #: The registry format's decoder (None: JSON).
    decoder: RegistryDecoder | None = None
    needs_producer: bool = True

    def prepare(self, chunk: Chunk, encoder: CopyEncoder) -> ValidationResult:
        unknown = self.decoder.unknown_reads if self.decoder is not None else 0
        result = validate_chunk(chunk.messages, self.pipeline, self.decoder)
        if self.decoder is not None and self.decoder.unknown_reads != unknown:
            # a schema id the registry does not know: poison only beside known ones
            self.decoder.require_a_known_id(
                chunk.messages, f"{chunk.topic}[{chunk.partition}] offsets [{chunk.start}, "
                f"{chunk.end})")
        if result.rows:  # None if a row is refused: isolated in the transaction instead
            result.encoded = encoder.encode(result.rows)
        result.latest_event_ms = latest_event_ms(result, self.pipeline)
        return result

    def write(self, uow: UnitOfWork, chunk: Chunk, prepared: ValidationResult,
              producer: Any, source: Source) -> ChunkResult:
        pipeline = self.pipeline
        uow.rows.serialize([chunk.partition])  # a deleting pipeline's keys, until COMMIT
        up = uow.rows.upsert(prepared.rows, source=source, encoded=prepared.encoded)
        deletes = (uow.rows.delete(prepared.deletes, source=source) if prepared.deletes
                   else DeleteResult(0))
        at("upserted")
        dead = [*prepared.dead, *_rejected_letters(pipeline, chunk, up, deletes)]
        dead = [replace(d, source_topic_id=source.topic_id,
                        source_incarnation=source.incarnation) for d in dead]
        dead, known = _known_letters(uow, pipeline, dead) if self.backfill else (dead, 0)
        delivered = produce_dead_letters(producer, dead, pipeline.name,
                                         pipeline.dlq_header_style)
        at("dlq_produced")
        uow.dead_letters.record(pipeline.name, dead, delivered)
        counts = ChunkCounts(read=prepared.read, inserted=up.inserted,
                             duplicates=up.duplicates, stale=up.stale,
                             dead_lettered=len(dead), known_dead=known,
                             tombstones=prepared.tombstones - len(deletes.rejected),
                             deleted=deletes.deleted,
                             bytes=prepared.bytes)
        reconcile(chunk.partition, counts, missing=up.missing + deletes.missing)
        return ChunkResult(counts, latest_event_ms=prepared.latest_event_ms)


def _known_letters(uow: UnitOfWork, pipeline: Pipeline,
                   dead: list[DeadLetter]) -> tuple[list[DeadLetter], int]:
    """Split off the dead letters already in ``dead_letters`` (one query): return the new
    ones and how many were known."""
    if not dead:
        return dead, 0
    known = uow.dead_letters.status_of(pipeline.name, [d.letter_key for d in dead])
    fresh = [d for d in dead if d.letter_key not in known]
    return fresh, len(dead) - len(fresh)


def _rejected_letters(pipeline: Pipeline, chunk: Chunk, up: UpsertResult,
                      deletes: DeleteResult) -> list[DeadLetter]:
    """The rows and tombstones the table refused (a value, or a version log order cannot
    place), as dead letters of their messages."""
    if not up.rejected and not deletes.rejected:
        return []
    by_offset = {m.offset(): m for m in chunk.messages}
    return [*(dead_letter(by_offset[row_source(row).offset], pipeline, reason)
              for row, reason in up.rejected),
            *(dead_letter(by_offset[tombstone.offset], pipeline, reason)
              for tombstone, reason in deletes.rejected)]


def reconcile(partition: int, counts: ChunkCounts, *, missing: int = 0) -> None:
    """read = inserted + duplicates + stale + dead letters + known dead + tombstones, and
    no valid row missing from the table after the upsert; or fail loudly (the chunk rolls
    back)."""
    accounted = counts.accounted()
    if sum(accounted.values()) != counts.read or missing:
        raise ReconciliationError(partition, counts.read, accounted, missing=missing)


def ingest_range(pipeline: Pipeline, rng: OffsetRange, clients: KafkaClients, db: Database,
                 *, run_id: str) -> SliceReport:
    """Ingest one partition slice: live slices resume from and move the stored offset;
    backfill slices read their whole range and never touch it."""
    spec = SliceSpec(pipeline=pipeline, run_id=run_id, lock_name=pipeline.name,
                     group_id=pipeline.group_id)
    with open_decoder(pipeline, clients.registry) as decoder:
        writer = IngestWriter(pipeline, backfill=rng.mode is Mode.BACKFILL, decoder=decoder)
        return run_slice(spec, writer, rng, clients, db)


def run_ingest(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str,
               request: RangeRequest | None = None, workers: int = 1) -> dict[str, Any]:
    """Plan and ingest one run with the DAG's code path.

    ``workers`` > 1 runs the partitions' slices in that many processes at once, as the
    DAG's mapped tasks do on separate workers (each slice is still one process with its
    own clients, connection and lock; validation holds the GIL, so threads would not do).
    A worker never outlives this process, even one killed with SIGKILL
    (:func:`die_with_parent`).
    """
    ranges = plan_run(pipeline, clients, db, run_id=run_id, request=request)
    if workers > 1 and len(ranges) > 1:
        spawn = multiprocessing.get_context("spawn")  # never fork librdkafka's threads
        with ProcessPoolExecutor(min(workers, len(ranges)), mp_context=spawn,
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
            futures = [pool.submit(_ingest_range_dict, pipeline, r, clients, db, run_id)
                       for r in ranges]
            try:
                reports = [f.result() for f in futures]
            except BaseException:  # a slice failed, or an interrupt: start no other one
                pool.shutdown(cancel_futures=True)
                raise
    else:
        reports = [_ingest_range_dict(pipeline, r, clients, db, run_id) for r in ranges]
    return {"run_id": run_id, **summarize(reports)}


def die_with_parent(parent_pid: int) -> None:
    """In a worker process: be killed when the process that started it dies.

    A worker orphaned by a SIGKILLed parent (an OOM kill, a supervisor's time-out) would
    finish its slice as a writer nobody owns, or wait on its task pipe for good. Linux's
    parent-death signal ends it with its parent. The signal comes when the *thread* that
    started the worker ends: Python 3.11's pool (spawn, no ``max_tasks_per_child``) starts
    its workers in ``submit``, so from the thread that runs :func:`run_ingest`, which must
    be the parent's main thread. If the parent is already gone, the worker exits at once.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _ingest_range_dict(pipeline: Pipeline, rng: OffsetRange, clients: KafkaClients,
                       db: Database, run_id: str) -> dict[str, Any]:
    return ingest_range(pipeline, rng, clients, db, run_id=run_id).to_dict()


def rows_changed(summary: Mapping[str, Any]) -> int:
    """Rows a run's summary says it changed in the table: inserted or updated, and
    deleted (a run that only deleted rows changed the table too)."""
    return int(summary.get("inserted") or 0) + int(summary.get("deleted") or 0)


def summarize(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum the mapped results of one run: every counter of
    :class:`~kafka_ingest.records.ChunkCounts`, the seconds, partitions, lag and DLQ rate."""
    total: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
    seconds = 0.0
    lag = 0
    parts = 0
    for r in reports:
        parts += 1
        for key in COUNTERS:
            total[key] += int(r.get(key) or 0)
        seconds += float(r.get("seconds") or 0.0)
        lag += int(r.get("lag_after") or 0)
    read = total["read"]
    return {**total, "seconds": seconds, "partitions": parts, "lag_after": lag,
            "dlq_rate": round(total["dead_lettered"] / read, 6) if read else 0.0}
