"""Repositories over the bookkeeping tables, each on the caller's connection.

``ingest_offsets`` (the next offset to read, moved only by compare-and-set),
``topic_incarnations`` (each topic id a topic name had, numbered),
``dead_letters``, ``ingest_runs`` (the audit: one row per committed chunk), ``run_plans``
(the ranges pinned to an Airflow run) and ``offset_gaps`` (ranges retention deleted
before they were read); and the retention of the bookkeeping. None of them commits: the
unit of work does (the retention's caller, once per batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from kafka_ingest.errors import FencedError
from kafka_ingest.records import COUNTERS, ChunkCounts, LetterKey, ms_to_datetime


class OffsetsRepository:
    """``ingest_offsets``: the next offset to read, moved only by compare-and-set."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def get(self, pipeline: str, topic: str, partition: int) -> int | None:
        row = self.conn.execute(
            "SELECT next_offset FROM ingest_offsets"
            " WHERE pipeline = %s AND topic = %s AND partition = %s",
            (pipeline, topic, partition),
        ).fetchone()
        return int(row[0]) if row else None

    def all(self, pipeline: str, topic: str) -> dict[int, int]:
        rows = self.conn.execute(
            "SELECT partition, next_offset FROM ingest_offsets WHERE pipeline = %s AND topic = %s",
            (pipeline, topic),
        ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def of_pipelines(self, wanted: Sequence[tuple[str, str]]) -> dict[tuple[str, str, int], int]:
        """The stored offsets of several ``(pipeline, topic)``, by ``(pipeline, topic,
        partition)``, in one query."""
        if not wanted:
            return {}
        rows = self.conn.execute(
            "SELECT o.pipeline, o.topic, o.partition, o.next_offset FROM ingest_offsets o"
            " JOIN unnest(%s::text[], %s::text[]) AS w(pipeline, topic)"
            " ON o.pipeline = w.pipeline AND o.topic = w.topic",
            ([p for p, _ in wanted], [t for _, t in wanted])).fetchall()
        return {(p, t, int(part)): int(o) for p, t, part, o in rows}

    def topic_ids(self, pipeline: str, topic: str) -> dict[int, str | None]:
        """The topic id each stored offset belongs to (None: stored before it was kept)."""
        rows = self.conn.execute(
            "SELECT partition, topic_id FROM ingest_offsets WHERE pipeline = %s AND topic = %s",
            (pipeline, topic)).fetchall()
        return {int(p): t for p, t in rows}

    def cursor(self, pipeline: str, topic: str, partition: int) -> tuple[int, str | None] | None:
        """The stored next offset and the topic id it belongs to."""
        row = self.conn.execute(
            "SELECT next_offset, topic_id FROM ingest_offsets"
            " WHERE pipeline = %s AND topic = %s AND partition = %s",
            (pipeline, topic, partition)).fetchone()
        return (int(row[0]), row[1]) if row else None

    def adopt(self, pipeline: str, topic: str, topic_id: str) -> None:
        """Offsets stored before topic ids were kept belong to the topic as it is now."""
        self.conn.execute(
            "UPDATE ingest_offsets SET topic_id = %s"
            " WHERE pipeline = %s AND topic = %s AND topic_id IS NULL",
            (topic_id, pipeline, topic))

    def initialise(self, pipeline: str, topic: str, partition: int, offset: int,
                   topic_id: str | None = None) -> int:
        """Store ``offset`` (of the topic ``topic_id``) unless a value exists; return the
        stored value."""
        self.conn.execute(
            "INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset, topic_id)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (pipeline, topic, partition, offset, topic_id),
        )
        stored = self.get(pipeline, topic, partition)
        if stored is None:  # the INSERT above made or found the row in this transaction
            raise RuntimeError(f"{pipeline} {topic}[{partition}]: no stored offset after insert")
        return stored

    def reset(self, pipeline: str, topic: str, partition: int, offset: int,
              topic_id: str | None = None) -> int | None:
        """Set the stored offset by hand (operators only), as an offset of the topic
        ``topic_id`` (the one there now); return the previous value."""
        before = self.get(pipeline, topic, partition)
        self.conn.execute(
            "INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset, topic_id)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (pipeline, topic, partition)"
            " DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now(),"
            " topic_id = COALESCE(EXCLUDED.topic_id, ingest_offsets.topic_id)",
            (pipeline, topic, partition, offset, topic_id),
        )
        return before

    def remove(self, pipeline: str, topic: str, partition: int) -> int | None:
        """Forget the stored offset of a partition the topic no longer has (it was deleted
        and created again with fewer); return the previous value. Should the partition
        come back, it starts as a new partition does (the start policy)."""
        row = self.conn.execute(
            "DELETE FROM ingest_offsets WHERE pipeline = %s AND topic = %s AND partition = %s"
            " RETURNING next_offset", (pipeline, topic, partition)).fetchone()
        return int(row[0]) if row else None

    def advance(self, pipeline: str, topic: str, partition: int, expected: int, new: int) -> None:
        """Compare-and-set: exactly one row moves from ``expected`` to ``new``, or fence."""
        cur = self.conn.execute(
            "UPDATE ingest_offsets SET next_offset = %s, updated_at = now()"
            " WHERE pipeline = %s AND topic = %s AND partition = %s AND next_offset = %s",
            (new, pipeline, topic, partition, expected),
        )
        if cur.rowcount != 1:
            raise FencedError(pipeline, topic, partition, expected,
                              self.get(pipeline, topic, partition))


class IncarnationsRepository:
    """``topic_incarnations``: each topic id a topic name has had, numbered 1, 2, ... in
    the order first seen (see migration 0009)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def of(self, topic: str, topic_id: str) -> int:
        """The incarnation number of ``topic_id``, given the next number when first seen
        (under a transaction lock per topic name, so two runs seeing it at once agree)."""
        found = self._lookup(topic, topic_id)
        if found is not None:
            return found
        self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                          ("kafka-ingest incarnation " + topic,))
        self.conn.execute(
            "INSERT INTO topic_incarnations (topic, topic_id, incarnation)"
            " SELECT %s, %s, COALESCE(max(incarnation), 0) + 1 FROM topic_incarnations"
            " WHERE topic = %s ON CONFLICT (topic, topic_id) DO NOTHING",
            (topic, topic_id, topic))
        found = self._lookup(topic, topic_id)
        if found is None:  # made or found above, in this transaction
            raise RuntimeError(f"{topic}: no incarnation for topic id {topic_id} after insert")
        return found

    def known(self, topic: str, topic_id: str | None) -> int | None:
        """The number of ``topic_id`` if seen before, else None. No topic id (a letter
        written before ids were kept) is the topic's first incarnation (1 when none was
        numbered yet)."""
        if topic_id is not None:
            return self._lookup(topic, topic_id)
        row = self.conn.execute("SELECT min(incarnation) FROM topic_incarnations"
                                " WHERE topic = %s", (topic,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 1

    def _lookup(self, topic: str, topic_id: str) -> int | None:
        row = self.conn.execute(
            "SELECT incarnation FROM topic_incarnations WHERE topic = %s AND topic_id = %s",
            (topic, topic_id)).fetchone()
        return int(row[0]) if row else None


#: Insert a chunk's dead letters, parked, in one statement (the ``dead_letter_totals``
#: triggers then count them once per statement, not once per letter), or bump the
#: attempts of those already there. Given in source order, so two statements lock the
#: rows they share in the same order.
RECORD_LETTERS = (
    "INSERT INTO dead_letters (pipeline, source_topic, source_incarnation, source_partition,"
    " source_offset, kafka_key, kafka_timestamp, contract, error_class, error_detail,"
    " attempts, first_failed_at, dlq_topic, dlq_partition, dlq_offset, schema_id)"
    " SELECT %s, * FROM unnest(%s::text[], %s::int[], %s::int[], %s::bigint[], %s::bytea[],"
    " %s::timestamptz[], %s::text[], %s::text[], %s::text[], %s::int[], %s::timestamptz[],"
    " %s::text[], %s::int[], %s::bigint[], %s::bigint[])"
    " ON CONFLICT (pipeline, source_topic, source_incarnation, source_partition,"
    " source_offset) DO UPDATE"
    " SET error_class = EXCLUDED.error_class, error_detail = EXCLUDED.error_detail,"
    "     contract = EXCLUDED.contract,"
    "     attempts = GREATEST(dead_letters.attempts + 1, EXCLUDED.attempts),"
    "     last_failed_at = now(), status = 'parked', recovered_at = NULL,"
    "     dlq_topic = EXCLUDED.dlq_topic, schema_id = EXCLUDED.schema_id,"
    "     dlq_partition = COALESCE(EXCLUDED.dlq_partition, dead_letters.dlq_partition),"
    "     dlq_offset = COALESCE(EXCLUDED.dlq_offset, dead_letters.dlq_offset)")
#: Mark letters recovered, in one statement.
MARK_RECOVERED = (
    "UPDATE dead_letters d SET status = 'recovered', recovered_at = now(),"
    " attempts = d.attempts + 1"
    " FROM unnest(%s::text[], %s::int[], %s::int[], %s::bigint[])"
    " AS k(topic, incarnation, partition, off)"
    " WHERE d.pipeline = %s AND d.source_topic = k.topic"
    " AND d.source_incarnation = k.incarnation AND d.source_partition = k.partition"
    " AND d.source_offset = k.off")


class DeadLettersRepository:
    """``dead_letters``: one row per (pipeline, source topic, its incarnation, partition,
    offset): :attr:`~kafka_ingest.kafka.dlq.DeadLetter.letter_key`."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def record(self, pipeline: str, letters: Sequence[Any],
               delivered: Sequence[tuple[int, int] | None]) -> None:
        """Insert (or bump the attempt count of) each dead letter, parked."""
        if not letters:
            return
        # One row per source offset (a statement may not update a row twice): the last
        # letter of an offset wins, as the last of several statements would.
        by_source = {d.letter_key: (d, loc) for d, loc in zip(letters, delivered, strict=True)}
        columns = zip(*[
            (d.source_topic, d.source_incarnation, d.source_partition, d.source_offset, d.key,
             ms_to_datetime(d.timestamp_ms), d.contract, d.error_class, d.error_detail,
             d.attempts, d.first_failed_at, d.dlq_topic,
             loc[0] if loc else None, loc[1] if loc else None, d.schema_id)
            for _, (d, loc) in sorted(by_source.items(), key=lambda kv: kv[0])], strict=True)
        self.conn.execute(RECORD_LETTERS, (pipeline, *map(list, columns)))

    def mark_recovered(self, pipeline: str, keys: Sequence[LetterKey]) -> None:
        if not keys:
            return
        unique = sorted(set(keys))
        self.conn.execute(MARK_RECOVERED, (*([k[i] for k in unique] for i in range(4)),
                                           pipeline))

    def status_of(self, pipeline: str, keys: Sequence[LetterKey]) -> dict[LetterKey, str]:
        """The status of each letter of ``keys`` that ``dead_letters`` holds."""
        rows = self.conn.execute(
            "SELECT source_topic, source_incarnation, source_partition, source_offset, status"
            " FROM dead_letters WHERE pipeline = %s AND (source_topic, source_incarnation,"
            " source_partition, source_offset)"
            " IN (SELECT * FROM unnest(%s::text[], %s::int[], %s::int[], %s::bigint[]))",
            (pipeline, *([k[i] for k in keys] for i in range(4))),
        ).fetchall()
        return {(t, int(i), int(p), int(o)): s for t, i, p, o, s in rows}


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One committed chunk, as ``ingest_runs`` keeps it."""

    pipeline: str
    run_id: str
    mode: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    counts: ChunkCounts
    seconds: float


#: Append one committed chunk to the audit: its place, then every counter of
#: :class:`~kafka_ingest.records.ChunkCounts` (the ``ingest_totals`` trigger sums them).
ADD_RUN = sql.SQL(
    "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
    " end_offset, {}, seconds) VALUES ({})").format(
        sql.SQL(", ").join(map(sql.Identifier, COUNTERS)),
        sql.SQL(", ").join([sql.Placeholder()] * (8 + len(COUNTERS))))


class RunsRepository:
    """``ingest_runs``: the audit, one row per committed chunk."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def add(self, r: RunRecord) -> None:
        self.conn.execute(ADD_RUN, (r.pipeline, r.run_id, r.mode, r.topic, r.partition,
                                    r.start_offset, r.end_offset,
                                    *r.counts.as_dict().values(), r.seconds))


class PinnedRange(NamedTuple):
    topic: str
    partition: int
    start: int
    end: int
    mode: str


class PlansRepository:
    """``run_plans``: the ranges pinned to a run, per (plan name, run id, request)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def pinned(self, name: str, run_id: str, request_key: str) -> list[PinnedRange]:
        """The ranges pinned to this run for this request (empty if none)."""
        return [
            PinnedRange(t, int(p), int(s), int(e), m)
            for t, p, s, e, m in self.conn.execute(
                "SELECT topic, partition, start_offset, end_offset, mode FROM run_plans"
                " WHERE pipeline = %s AND run_id = %s AND request_key = %s"
                " ORDER BY topic, partition",
                (name, run_id, request_key),
            )
        ]

    def pin(self, name: str, run_id: str, request_key: str,
            ranges: Sequence[PinnedRange]) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO run_plans (pipeline, run_id, request_key, mode, topic, partition,"
                " start_offset, end_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                [(name, run_id, request_key, r.mode, r.topic, r.partition, r.start, r.end)
                 for r in ranges],
            )


class GapsRepository:
    """``offset_gaps``: offsets retention deleted before they were read, recorded loudly."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def record(self, name: str, topic: str, partition: int, start: int, end: int,
               run_id: str | None) -> None:
        self.conn.execute(
            "INSERT INTO offset_gaps (pipeline, topic, partition, from_offset, to_offset, run_id)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (name, topic, partition, start, end, run_id),
        )


#: One batch of each table's retention: a function of migration 0010 (the runtime role may
#: execute them, and may not delete), called with the pipeline, the age in days, the batch
#: size (and, for the checks, how many of the newest to keep); each says what may go.
PRUNE: dict[str, str] = {
    "ingest_runs": "SELECT prune_ingest_runs(%s, now() - %s * interval '1 day', %s)",
    "run_plans": "SELECT prune_run_plans(%s, now() - %s * interval '1 day', %s)",
    "monitor_checks": "SELECT prune_monitor_checks(%s, now() - %s * interval '1 day', %s, %s)",
    "recovered_letters": "SELECT prune_recovered_letters(%s, now() - %s * interval '1 day', %s)",
}


class RetentionRepository:
    """Deletes, one bounded batch at a time, the bookkeeping a pipeline's retention lets
    go: chunks of ``ingest_runs``, done plans of ``run_plans`` (its ingest and replay
    plans), ``monitor_checks`` beyond those the rules read, recovered ``dead_letters``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def prune(self, table: str, pipeline: str, days: int, batch: int, *,
              keep: int = 1) -> int:
        """Delete one batch of ``table`` (a key of :data:`PRUNE`) older than ``days``
        (``batch`` rows; of ``run_plans``, ``batch`` plans with all their rows) and return
        how many rows went: fewer than ``batch``, nothing older is left (a batch of plans
        may hold more rows than ``batch``: one more call finds that out)."""
        args = (pipeline, days, keep, batch) if table == "monitor_checks" else (
            pipeline, days, batch)
        row = self.conn.execute(PRUNE[table], args).fetchone()
        return int(row[0]) if row else 0
