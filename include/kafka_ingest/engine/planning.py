"""The one planner: a run's ranges per partition, from a cursor, explicit offsets or a time
window, pinned to the run so that a retry finishes exactly the same slices.

Ingest and replay plan the same way over different topics; what differs is a
:class:`PlanTarget`. For each partition of the target topic:

- a :class:`~kafka_ingest.requests.LiveRun` starts at the stored cursor (or the start
  policy), ends at the high watermark capped by ``max_records_per_partition``; a start
  below the low watermark fails or is recorded in ``offset_gaps`` and skipped, never
  silently; a cursor past the high watermark is a permanent error;
- an :class:`~kafka_ingest.requests.OffsetWindow` is checked against the watermarks;
- a :class:`~kafka_ingest.requests.TimeWindow` is mapped with ``offsets_for_times``.

Only cursor ranges may move the cursor (:func:`~kafka_ingest.ranges.moves_cursor` says which
do). Empty ranges make no task.

Every plan learns which incarnation of the topic it reads (Kafka's topic id, numbered in
``topic_incarnations``: see :class:`~kafka_ingest.records.Source`). A cursor stored for
another topic id is refused (:class:`~kafka_ingest.errors.TopicRecreated`): the topic was
deleted and created again, and reading on from the old topic's offsets would skip the new
one's records; cursors stored before topic ids were kept are adopted by the topic there now.

A cursor run that moves cursors (live ingest, an unfiltered replay that is not a dry run)
also re-syncs the consumer group: for every partition of the topic, planned or not, whose
group offset differs from the stored offset, the stored offset is committed to the group
(Postgres is the source of truth). A kill between a chunk's database commit and its Kafka
commit would otherwise leave the group behind for good when the next run plans nothing
for that partition. A partition with no stored offset is never committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kafka_ingest.config import OnOffsetGap, Pipeline, StartPolicy
from kafka_ingest.db import (
    Database,
    GapsRepository,
    OffsetsRepository,
    PinnedRange,
    PlansRepository,
)
from kafka_ingest.db.repositories import IncarnationsRepository
from kafka_ingest.db.tables import apply_tables, check_table
from kafka_ingest.decode.decoder import open_registry
from kafka_ingest.decode.schemas import check_subject
from kafka_ingest.errors import KafkaRefused, KafkaUnavailable, TopicRecreated
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.metadata import (
    committed_offsets,
    offsets_for_time,
    partitions_of,
    watermarks,
)
from kafka_ingest.ranges import (
    Mode,
    OffsetRange,
    PartitionState,
    moves_cursor,
    plan_between,
    plan_explicit,
    plan_live,
    start_offset,
)
from kafka_ingest.requests import LiveRun, OffsetWindow, RangeRequest, TimeWindow

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PlanTarget:
    """What one planner plans over: where ingest and replay differ."""

    #: The name plans are pinned and gaps recorded under (replay: ``<pipeline>:replay``;
    #: a scheduled ingest run and a scheduled replay run share their Airflow run id).
    plan_name: str
    topic: str
    role: str
    group_id: str
    #: The mode of cursor ranges (live, replay) and of window ranges (backfill, replay).
    cursor_mode: Mode
    window_mode: Mode
    start_policy: StartPolicy
    on_gap: OnOffsetGap
    #: A dry run: planning initialises no cursor and records no gap.
    dry_run: bool = False
    #: The run acts on some records of its ranges only (a replay with filters).
    filtered: bool = False
    #: Other topics that must exist before anything is read (topic, role).
    must_exist: tuple[tuple[str, str], ...] = ()

    @property
    def writes(self) -> bool:
        """Whether planning may initialise cursors and record gaps (not a dry run)."""
        return not self.dry_run

    def moves_cursor(self, *, from_cursor: bool) -> bool:
        """Whether this run's ranges (planned from the cursor, or not) move their cursor."""
        return moves_cursor(from_cursor=from_cursor, dry_run=self.dry_run,
                            filtered=self.filtered)


def plan(pipeline: Pipeline, target: PlanTarget, request: RangeRequest, clients: KafkaClients,
         db: Database, *, run_id: str, request_key: str) -> list[OffsetRange]:
    """Plan this run's ranges and pin them to ``run_id``; a retry gets the same plan."""
    cursor = isinstance(request, LiveRun)
    with db.session() as conn:
        plans = PlansRepository(conn)
        pinned = plans.pinned(target.plan_name, run_id, request_key)
        if pinned:
            log.info("run %s already planned; reusing its %d range(s)", run_id, len(pinned))
            return [OffsetRange(p.topic, p.partition, p.start, p.end, Mode(p.mode),
                                from_cursor=cursor) for p in pinned if p.end > p.start]
        # Before any data moves: a contract that cannot read what the producers write fails
        # the run here, then a table that does not match the contract.
        with open_registry(pipeline, clients.registry) as registry:
            if registry is not None:
                check_subject(pipeline, registry)
        ensure_table(conn, pipeline)
        wait_s = clients.request_timeout_s  # a cluster out of reach fails after this
        consumer = clients.consumer(target.group_id)
        try:
            ranges, behind = _plan(pipeline, target, request, consumer, conn, run_id,
                                   topic_id=lambda: clients.topic_id(target.topic,
                                                                     role=target.role),
                                   wait_s=wait_s)
        finally:
            consumer.close()
        plans.pin(target.plan_name, run_id, request_key,
                  [PinnedRange(r.topic, r.partition, r.start, r.end, str(r.mode)) for r in ranges])
        conn.commit()
    if behind:  # offsets stored (committed) before this plan, not its own; bounded wait
        with clients.committer(target.group_id) as group:
            for partition, offset in sorted(behind.items()):
                group.post(target.topic, partition, offset)
    moves = target.moves_cursor(from_cursor=cursor)
    for r in ranges:
        log.info("planned %s[%d] [%d, %d) %s%s: %d messages", r.topic, r.partition, r.start,
                 r.end, r.mode, " (moves the cursor)" if moves else "", r.size)
    return ranges


def ensure_table(conn: Any, pipeline: Pipeline) -> None:
    """Check the target table against the contract; :class:`SchemaDrift` names what does
    not match. A pipeline with ``auto_create``/``auto_evolve`` gets the changes the check
    allows applied instead (by the role it runs as, which must be allowed to)."""
    try:
        plan = check_table(conn, pipeline)
    finally:
        conn.rollback()  # the catalog reads end their transaction
    if plan.changes:
        for change in apply_tables(conn, pipeline).changes:
            log.warning("%s: applied %s: %s", pipeline.name, change.why,
                        " ".join(change.statement.split()))


def _plan(pipeline: Pipeline, target: PlanTarget, request: RangeRequest, consumer: Any,
          conn: Any, run_id: str, *, topic_id: Callable[[], str],
          wait_s: float) -> tuple[list[OffsetRange], dict[int, int]]:
    """The ranges, and the stored offsets the group is behind on (see :func:`_behind`).
    Each request to the cluster waits at most ``wait_s`` (its ``socket.timeout.ms``);
    ``topic_id`` asks the cluster for the topic's id, once it is known to exist (the
    incarnation it names is numbered here)."""
    topic = target.topic
    parts = partitions_of(consumer, topic, role=target.role, timeout_s=wait_s)
    source_id = topic_id()
    IncarnationsRepository(conn).of(topic, source_id)
    for other, role in target.must_exist:
        # Checked now, not at the first bad message (a 30 s delivery time-out, retried).
        partitions_of(consumer, other, role=role, timeout_s=wait_s)
    marks = watermarks(consumer, topic, parts, timeout_s=wait_s)
    if isinstance(request, OffsetWindow):
        return plan_explicit(topic, request.partitions, marks, mode=target.window_mode), {}
    if isinstance(request, TimeWindow):
        start = offsets_for_time(consumer, topic, parts, request.from_ms, timeout_s=wait_s)
        end = offsets_for_time(consumer, topic, parts, request.to_ms, timeout_s=wait_s)
        return plan_between(topic, start, end, mode=target.window_mode), {}
    return _plan_cursor(pipeline, target, conn, consumer, [
        PartitionState(p, *marks[p], None) for p in parts], run_id, source_id)


def _check_topic_id(pipeline: Pipeline, target: PlanTarget, offsets: OffsetsRepository,
                    topic_id: str) -> None:
    """Refuse cursors stored for another incarnation of the topic; adopt unmarked ones
    (stored before topic ids were kept) for the topic there now."""
    stored = offsets.topic_ids(pipeline.name, target.topic)
    old = sorted(p for p, t in stored.items() if t is not None and t != topic_id)
    if old:
        raise TopicRecreated(pipeline.name, target.topic, str(stored[old[0]]), topic_id, old,
                             dlq=target.topic == pipeline.dlq_topic)
    if target.writes and None in stored.values():
        offsets.adopt(pipeline.name, target.topic, topic_id)


def _plan_cursor(pipeline: Pipeline, target: PlanTarget, conn: Any, consumer: Any,
                 parts: list[PartitionState], run_id: str,
                 topic_id: str) -> tuple[list[OffsetRange], dict[int, int]]:
    # The group is read before the stored offsets: a slice commits to Postgres before it
    # commits to Kafka, so stored offsets read afterwards are never older than the group's.
    group = _group_offsets(consumer, target, [s.partition for s in parts])
    offsets = OffsetsRepository(conn)
    _check_topic_id(pipeline, target, offsets, topic_id)
    stored = offsets.all(pipeline.name, target.topic)
    states = [replace(s, stored=stored.get(s.partition)) for s in parts]
    ranges, gaps = plan_live(target.topic, states,
                             max_records=pipeline.max_records_per_partition,
                             start_policy=target.start_policy, on_gap=target.on_gap,
                             mode=target.cursor_mode)
    for gap in gaps:
        log.error("GAP %s[%d]: offsets [%d, %d) were deleted by retention before they were "
                  "read; skipping them as configured%s", target.topic, gap.partition,
                  gap.start, gap.low, " (recorded in offset_gaps)" if target.writes else "")
        if target.writes:
            GapsRepository(conn).record(target.plan_name, target.topic, gap.partition,
                                        gap.start, gap.low, run_id)
            offsets.initialise(pipeline.name, target.topic, gap.partition, gap.start,
                               topic_id)
            offsets.advance(pipeline.name, target.topic, gap.partition, gap.start, gap.low)
    if target.writes:  # the start policy is applied once, then the stored cursor rules
        for s in states:
            if s.stored is None:
                offsets.initialise(pipeline.name, target.topic, s.partition,
                                   start_offset(s, target.start_policy), topic_id)
    return ranges, _behind(target, stored, group) if group is not None else {}


def _group_offsets(consumer: Any, target: PlanTarget,
                   partitions: list[int]) -> dict[int, int | None] | None:
    """The group's committed offsets, when this plan re-syncs the group (a cursor run that
    moves cursors); ``None`` when it does not, or they cannot be read (lag is a report:
    never a reason to fail a run)."""
    if not target.moves_cursor(from_cursor=True):
        return None
    try:
        return committed_offsets(consumer, target.topic, partitions)
    except (KafkaUnavailable, KafkaRefused) as exc:
        log.warning("could not read the committed offsets of group %s on %s; not re-syncing "
                    "it this run: %s", target.group_id, target.topic, exc)
        return None


def _behind(target: PlanTarget, stored: dict[int, int],
            group: dict[int, int | None]) -> dict[int, int]:
    """The stored offsets where the group's differs (stored ones only), each said loudly."""
    behind: dict[int, int] = {}
    for partition, offset in sorted(stored.items()):
        if partition not in group or group[partition] == offset:
            continue
        log.warning("group %s %s[%d]: committed offset %s differs from the stored offset %d "
                    "(a kill between the database and the Kafka commit, or a reset); "
                    "re-syncing the group to the stored offset", target.group_id,
                    target.topic, partition, group[partition], offset)
        behind[partition] = offset
    return behind
