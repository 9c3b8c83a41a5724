"""The target table, written by binary ``COPY``: straight in, or through a staging table.

A chunk's rows travel in the table's own binary form (an epoch already a ``timestamptz``,
see :attr:`~kafka_ingest.contracts.columns.Column.convert`; an integer column widened since
in its own width, see :class:`~kafka_ingest.db.tables.TargetShape`), so the same payload
can go into the target table or into a temporary staging table of the same columns. An
append chunk's payload holds one copy of each event, the one ``ON CONFLICT`` keeps (its
lowest place in the log), in key order (:func:`write_order`).

An append chunk first tries its keys as new: ``COPY`` straight into the target table, in
a savepoint. Postgres' unique index decides: when every key is new the table takes them
all, at 2.1 instead of 3.6 µs of server CPU a row (no staging table, no second pass, and
``COPY`` inserts a page of rows at a time); when one key is stored already (a replay, a
backfill, a duplicate another partition stored) it refuses the ``COPY``, the savepoint
rolls back, and the staged path runs on the same payload: ``COPY`` into the staging table,
then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING`` on ``event_id``. What the table ends
with is the same either way, so a replay never duplicates a row. A slice whose chunk met a
stored key skips the attempt for its next chunks, 1, 2, 4, ... up to
:data:`NEW_KEYS_MAX_PAUSE` of them (:class:`NewKeys`): a backfill over stored rows pays one
refused ``COPY``, not one a chunk. The outcome is then checked against the table. A row
Postgres rejects is isolated by bisecting the chunk (in savepoints) and returned for the
DLQ.

``latest`` tables keep one version per key: the staged rows are classified against the
stored version of their key (:data:`LATEST_VERDICTS`), the newest of each key replaces an
older stored one (``ON CONFLICT ... DO UPDATE ... WHERE`` older), and the outcome is
checked. A version is ordered by the pipeline's event time (then its place in the log), or
by its place in the log alone (``order_by: source_offset``). A place in the log is
(incarnation, offset) within one partition of one topic: a topic deleted and created again
is a new incarnation whose records are newer than every record of the old one
(:class:`~kafka_ingest.records.Source`), while offsets of two partitions, or two topics,
order nothing. A record log order cannot place against its key's stored version (the key
came from another partition: partitions were added, or producers hash keys differently;
or from another topic) is returned :class:`~kafka_ingest.errors.Unorderable` for the DLQ,
never applied in a guessed order nor counted stale.

Deletes (``on_tombstone: delete``, ``latest`` pipelines keyed by the record key, in log
order): after the chunk's upsert, a tombstone of key K at place o deletes K's row if the
row is older and leaves a *deletion marker* (K, o) in the pipeline's ``<table>_tombstones``
table. The upsert treats a marker like a stored version: an event of K older than the
marker is stale, so a replay or a backfill of older offsets cannot resurrect the row; a
newer event wins and removes the marker. A key therefore has a row or a marker, never
both, and a marker lives exactly as long as its key stays deleted: a backfill may re-read
any range the topic still holds, at any time (compaction keeps older records until its
cleaner runs, and ``delete.retention.ms`` only bounds how long the *tombstone* stays), so
no shorter lifetime is safe. Markers cost one small row per deleted key: the key space the
compacted topic itself holds.
"""

from __future__ import annotations

import io
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import compress, islice
from operator import eq, itemgetter
from typing import Any

import psycopg
from psycopg import sql
from psycopg.copy import FileWriter
from psycopg.pq import TransactionStatus

from kafka_ingest.config import LOG_ORDER, Pipeline, UpsertMode
from kafka_ingest.db.locks import hold_keys
from kafka_ingest.db.tables import (
    TargetShape,
    contract_shape,
    marker_table,
    row_columns,
    stage_table,
)
from kafka_ingest.errors import DataError, RejectedByDatabase, Unorderable
from kafka_ingest.records import Row, Source, Tombstone, row_source

#: What a single row can make Postgres or the encoder refuse (a value out of the column's
#: range or encoding, a constraint): the chunk is bisected and the row dead-lettered.
#: (``struct.error``: an int past its column's width, in psycopg's pure-Python dumpers.)
ROW_REFUSALS: tuple[type[Exception], ...] = (psycopg.DataError, psycopg.IntegrityError,
                                             UnicodeEncodeError, OverflowError, struct.error)


#: The most chunks a slice skips the new-keys attempt for after a refused one.
NEW_KEYS_MAX_PAUSE = 64


@dataclass
class NewKeys:
    """Whether a slice's next append chunk tries its keys as new (see the module doc):
    after a chunk met a stored key (or its attempt wrote another count than one row per
    event: a letter twice in a replay, a trigger), the next 1, 2, 4, ... (at most
    :data:`NEW_KEYS_MAX_PAUSE`) chunks go straight to ``ON CONFLICT``; a chunk whose keys
    were all new ends the pause."""

    pause: int = 0
    #: Chunks left to skip.
    skip: int = 0

    def attempt(self) -> bool:
        if self.skip:
            self.skip -= 1
            return False
        return True

    def met_stored_key(self) -> None:
        self.pause = min(max(1, 2 * self.pause), NEW_KEYS_MAX_PAUSE)
        self.skip = self.pause

    def all_new(self) -> None:
        self.pause = self.skip = 0


class _NotOnePerEvent(Exception):
    """The COPY of new keys wrote another count than one row per event: rolled back."""


@dataclass(frozen=True)
class UpsertResult:
    """What one chunk's upsert did. ``rejected`` rows go to the DLQ, with the reason (a
    value Postgres refused, or a version log order cannot place)."""

    inserted: int
    duplicates: int
    stale: int
    rejected: list[tuple[Row, DataError]]
    #: Staged rows the table does not hold (nor a newer version of) after the INSERT:
    #: must be 0. Checked against the table, independently of the counts above.
    missing: int = 0


@dataclass(frozen=True)
class DeleteResult:
    """What one chunk's tombstones did: rows deleted, tombstones log order cannot place
    (for the DLQ), and tombstones whose key the table holds neither a marker for (at least
    as new) nor a newer row after them: must be 0."""

    deleted: int
    missing: int = 0
    rejected: list[tuple[Tombstone, DataError]] = field(default_factory=list)


def write_order(pipeline: Pipeline) -> Callable[[Sequence[Row]], Sequence[Row]]:
    """An append chunk's rows -> the rows its transaction writes, in that order: of each
    event (``event_id``) the copy ``ON CONFLICT`` keeps, its lowest place in the log (topic
    in byte order, partition, offset), in key order (byte order: Python compares strings
    by code point, which UTF-8 keeps). Two transactions writing copies of the same events
    (in two partitions) take their keys in the same order, so they wait for each other and
    never deadlock. ``latest`` pipelines: the rows as they are (their statements choose).

    C-level passes over the chunk (the sort is linear on keys that rise), then a Python step
    per copy: this runs for every chunk."""
    if pipeline.upsert.mode is UpsertMode.LATEST:
        return lambda rows: rows
    columns = [c.name for c in row_columns(pipeline)]
    event_id = itemgetter(columns.index("event_id"))
    place = itemgetter(*(columns.index(c) for c in ("source_topic", "source_partition",
                                                    "source_offset")))

    def order(rows: Sequence[Row]) -> Sequence[Row]:
        ordered = sorted(rows, key=event_id)
        ids = list(map(event_id, ordered))
        copies = list(compress(range(1, len(ids)), map(eq, ids, islice(ids, 1, None))))
        if not copies:
            return ordered
        keep = [True] * len(ordered)
        for i in copies:  # the same event as i - 1, which holds the lowest place so far
            if place(ordered[i]) > place(ordered[i - 1]):
                ordered[i - 1], ordered[i] = ordered[i], ordered[i - 1]
            keep[i - 1] = False  # i holds the lowest place of the copies up to it
        return list(compress(ordered, keep))

    return order


class CopyEncoder:
    """Rows -> the binary ``COPY`` payload of a chunk (:func:`write_order`), without I/O.

    The slice engine encodes chunk k+1 in its reading thread while the writer thread runs
    chunk k's transaction, so the writer only sends bytes. The encoder adapts values with
    its connection's adapters (a cursor of its own, never executed) and makes its dumpers
    when created, before any transaction of the slice uses the connection. ``shape``: the
    table's as the slice found it (default: as the contract makes it).
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline,
                 shape: TargetShape | None = None) -> None:
        self.types = list((shape or contract_shape(pipeline)).wire_types)
        self._order = write_order(pipeline)
        self._cursor = conn.cursor()
        self._copy(io.BytesIO())  # the dumpers, made now

    def _copy(self, buffer: io.BytesIO) -> psycopg.Copy:
        copy = psycopg.Copy(self._cursor, binary=True, writer=FileWriter(buffer))
        copy.set_types(self.types)
        return copy

    def encode(self, rows: Sequence[Row]) -> bytes | None:
        """The rows' ``COPY`` payload; ``None`` when a row is refused (one of
        :data:`ROW_REFUSALS`): the writer then encodes the rows in its savepoints, where
        the refused row is isolated and dead-lettered like one Postgres refuses."""
        try:
            return self._encode(rows)
        except ROW_REFUSALS:
            return None

    def _encode(self, rows: Sequence[Row]) -> bytes:
        buffer = io.BytesIO()
        with self._copy(buffer) as copy:
            write = copy.write_row
            for row in self._order(rows):
                write(row)
        return buffer.getvalue()


# --------------------------------------------------------------------------- latest SQL
#
# The statements of a latest table, named. Placeholders: {t} the table, {s} the staging
# table, {m} the marker table, {k} the key column, {o} the event-time column, {c} the row
# columns, {u} the updates of ON CONFLICT. Parameters: %(topic)s and %(inc)s, the source
# the staged rows came from (one topic, one incarnation: a chunk, or one group of a
# replay's letters). {m} appears only in the statements of deleting pipelines.

#: What each staged row of a latest chunk becomes, in this order of precedence:
#: ``copy``: the same record twice in the chunk; ``unorderable``: log order cannot place
#: it against another version of its key (dead-lettered); ``stored``: the stored version
#: is this record (a replay); ``stale``: the stored version or deletion marker is at
#: least as new; ``superseded``: a newer version of its key is in the chunk; ``write``:
#: the newest version of its key, newer than the stored one.
LATEST_VERDICTS = ("copy", "unorderable", "stored", "stale", "superseded", "write")

#: Log order: the staged rows with their copies, the newest place per key, whether the
#: key came from two partitions, and the key's stored row and marker (one probe each by
#: the primary key: LATERAL ... LIMIT 1 stays a nested loop whatever the table's size).
_LOG_STAGED = """
WITH s AS (
  SELECT {k}, source_partition AS p, source_offset AS o,
         row_number() OVER (PARTITION BY {k}, source_partition, source_offset) AS copy,
         dense_rank() OVER (PARTITION BY {k} ORDER BY source_offset DESC) AS newest,
         min(source_partition) OVER w <> max(source_partition) OVER w AS split
  FROM {s} WINDOW w AS (PARTITION BY {k})),
f AS (
  SELECT s.*, x.source_topic AS xt, x.source_incarnation AS xi, x.source_partition AS xp,
         x.source_offset AS xo{marker_columns}
  FROM s LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                   source_offset FROM {t} WHERE {k} = s.{k} LIMIT 1) x ON true
  {marker_join}),
v AS (
  SELECT f.*, CASE
    WHEN copy > 1 THEN 'copy'
    WHEN split OR (xt IS NOT NULL AND NOT (xt = %(topic)s AND (xi <> %(inc)s OR xp = p)))
         {marker_unorderable} THEN 'unorderable'
    WHEN xt = %(topic)s AND xi = %(inc)s AND xp = p AND xo = o THEN 'stored'
    WHEN (xt IS NOT NULL AND (xi, xo) > (%(inc)s, o)) {marker_stale} THEN 'stale'
    WHEN newest > 1 THEN 'superseded'
    ELSE 'write' END AS verdict
  FROM f)
"""
_LOG_MARKER_COLUMNS = (", m.source_topic AS mt, m.source_incarnation AS mi,"
                       " m.source_partition AS mp, m.source_offset AS mo")
_LOG_MARKER_JOIN = ("LEFT JOIN LATERAL (SELECT source_topic, source_incarnation,"
                    " source_partition, source_offset FROM {m} WHERE {k} = s.{k} LIMIT 1) m"
                    " ON true")
_LOG_MARKER_UNORDERABLE = ("OR (mt IS NOT NULL AND NOT (mt = %(topic)s"
                           " AND (mi <> %(inc)s OR mp = p)))")
_LOG_MARKER_STALE = "OR (mt IS NOT NULL AND (mi, mo) >= (%(inc)s, o))"

#: Event-time order: copies are the same event_id of a key; versions ordered by (event
#: time, incarnation, offset, partition); nothing is unorderable.
_TIME_STAGED = """
WITH s AS (
  SELECT {k}, event_id, {o} AS ts, source_partition AS p, source_offset AS o,
         row_number() OVER (PARTITION BY {k}, event_id
                            ORDER BY source_offset DESC, source_partition DESC) AS copy,
         dense_rank() OVER (PARTITION BY {k} ORDER BY {o} DESC, source_offset DESC,
                                                      source_partition DESC) AS newest
  FROM {s}),
f AS (
  SELECT s.*, x.event_id AS xe, x.{o} AS xts, x.source_incarnation AS xi,
         x.source_offset AS xo, x.source_partition AS xp
  FROM s LEFT JOIN LATERAL (SELECT event_id, {o}, source_incarnation, source_offset,
                                   source_partition FROM {t} WHERE {k} = s.{k} LIMIT 1) x
  ON true),
v AS (
  SELECT f.*, CASE
    WHEN copy > 1 THEN 'copy'
    WHEN xe = event_id THEN 'stored'
    WHEN xe IS NOT NULL AND (xts, xi, xo, xp) >= (ts, %(inc)s, o, p) THEN 'stale'
    WHEN newest > 1 THEN 'superseded'
    ELSE 'write' END AS verdict
  FROM f)
"""
_VERDICTS = "SELECT verdict, count(*) FROM v GROUP BY verdict"
_UNORDERABLE = ("SELECT p, o, split, xt, xi, xp, xo{marker_details} FROM v"
                " WHERE verdict = 'unorderable'")

#: Write the newest version of each key that is newer than the stored one; the ON
#: CONFLICT's WHERE decides against the row as it is when the key is locked.
_LOG_INSERT = """
INSERT INTO {t} ({c}, source_incarnation)
SELECT DISTINCT ON ({k}) {c}, %(inc)s FROM (
  SELECT *, min(source_partition) OVER w <> max(source_partition) OVER w AS split
  FROM {s} WINDOW w AS (PARTITION BY {k})) s
WHERE NOT split
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = s.{k} AND (NOT (x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = s.source_partition))
      OR (x.source_incarnation, x.source_offset) >= (%(inc)s, s.source_offset)))
  {marker_excludes}
ORDER BY {k}, source_offset DESC
ON CONFLICT ({k}) DO UPDATE SET {u}, source_incarnation = EXCLUDED.source_incarnation,
  ingested_at = now()
WHERE {t}.source_topic = EXCLUDED.source_topic
  AND ({t}.source_incarnation <> EXCLUDED.source_incarnation
       OR {t}.source_partition = EXCLUDED.source_partition)
  AND ({t}.source_incarnation, {t}.source_offset)
      < (EXCLUDED.source_incarnation, EXCLUDED.source_offset)
"""
_LOG_MARKER_EXCLUDES = """AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = s.{k}
      AND (NOT (m.source_topic = %(topic)s
                AND (m.source_incarnation <> %(inc)s OR m.source_partition = s.source_partition))
           OR (m.source_incarnation, m.source_offset) >= (%(inc)s, s.source_offset)))"""
_TIME_INSERT = """
INSERT INTO {t} ({c}, source_incarnation)
SELECT DISTINCT ON ({k}) {c}, %(inc)s FROM {s} s
WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = s.{k} AND x.event_id = s.event_id)
ORDER BY {k}, {o} DESC, source_offset DESC, source_partition DESC
ON CONFLICT ({k}) DO UPDATE SET {u}, source_incarnation = EXCLUDED.source_incarnation,
  ingested_at = now()
WHERE ({t}.{o}, {t}.source_incarnation, {t}.source_offset, {t}.source_partition)
      < (EXCLUDED.{o}, EXCLUDED.source_incarnation, EXCLUDED.source_offset,
         EXCLUDED.source_partition)
"""
#: A key written again after its deletion keeps no marker: the row is newer.
_CLEAR_MARKERS = """
DELETE FROM {m} m USING {t} x WHERE m.{k} = x.{k} AND m.{k} IN (SELECT {k} FROM {s})
  AND x.source_topic = m.source_topic
  AND (x.source_incarnation, x.source_offset) > (m.source_incarnation, m.source_offset)
"""
#: The outcome: staged rows (but copies and the unorderable ones) whose key holds neither
#: this record nor a version at least as new, in the table or in a marker: must be 0.
_LOG_MISSING = """
SELECT count(*) FROM (SELECT DISTINCT {k}, source_partition, source_offset FROM {s}) s
WHERE NOT EXISTS (SELECT 1 FROM unnest(%(skip_p)s::int4[], %(skip_o)s::int8[]) u(p, o)
                  WHERE u.p = s.source_partition AND u.o = s.source_offset)
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = s.{k} AND x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = s.source_partition)
      AND (x.source_incarnation, x.source_offset) >= (%(inc)s, s.source_offset))
  {marker_holds}
"""
_LOG_MARKER_HOLDS = """AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = s.{k}
      AND m.source_topic = %(topic)s
      AND (m.source_incarnation <> %(inc)s OR m.source_partition = s.source_partition)
      AND (m.source_incarnation, m.source_offset) >= (%(inc)s, s.source_offset))"""
_TIME_MISSING = """
SELECT count(*) FROM {s} s
WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = s.{k} AND (x.event_id = s.event_id
      OR (x.{o}, x.source_incarnation, x.source_offset, x.source_partition)
         >= (s.{o}, %(inc)s, s.source_offset, s.source_partition)))
"""

# Deletes (log order, deleting pipelines). %(keys)s, %(parts)s, %(offs)s: the chunk's
# tombstones; {kt}: the key's type.
_TOMBSTONES = """
WITH u AS (SELECT * FROM unnest(%(keys)s::{kt}[], %(parts)s::int4[], %(offs)s::int8[])
           AS u(k, p, o)),
d AS (SELECT DISTINCT ON (k) k, p, o FROM u ORDER BY k, o DESC)
"""
#: Tombstones log order cannot place: a key in two partitions among them, or a stored
#: row or marker of the key from another partition or topic.
_TOMBSTONES_UNORDERABLE = """
WITH u AS (SELECT * FROM unnest(%(keys)s::{kt}[], %(parts)s::int4[], %(offs)s::int8[])
           AS u(k, p, o)),
d AS (SELECT DISTINCT ON (k) k, p, o, min(p) OVER w <> max(p) OVER w AS split FROM u
      WINDOW w AS (PARTITION BY k) ORDER BY k, o DESC)
SELECT d.k, d.p, d.o, d.split, x.source_topic, x.source_incarnation, x.source_partition,
       x.source_offset, m.source_topic, m.source_incarnation, m.source_partition,
       m.source_offset
FROM d LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                 source_offset FROM {t} WHERE {k} = d.k LIMIT 1) x ON true
       LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                 source_offset FROM {m} WHERE {k} = d.k LIMIT 1) m ON true
WHERE d.split
   OR (x.source_topic IS NOT NULL AND NOT (x.source_topic = %(topic)s
       AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)))
   OR (m.source_topic IS NOT NULL AND NOT (m.source_topic = %(topic)s
       AND (m.source_incarnation <> %(inc)s OR m.source_partition = d.p)))
"""
_DELETE_OLDER = """
DELETE FROM {t} x USING d WHERE x.{k} = d.k AND x.source_topic = %(topic)s
  AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)
  AND (x.source_incarnation, x.source_offset) < (%(inc)s, d.o)
"""
_MARK_DELETED = """
INSERT INTO {m} ({k}, source_topic, source_incarnation, source_partition, source_offset)
SELECT k, %(topic)s, %(inc)s, p, o FROM d WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = d.k)
ON CONFLICT ({k}) DO UPDATE SET source_topic = EXCLUDED.source_topic,
  source_incarnation = EXCLUDED.source_incarnation,
  source_partition = EXCLUDED.source_partition, source_offset = EXCLUDED.source_offset,
  deleted_at = now()
WHERE {m}.source_topic = EXCLUDED.source_topic
  AND ({m}.source_incarnation <> EXCLUDED.source_incarnation
       OR {m}.source_partition = EXCLUDED.source_partition)
  AND ({m}.source_incarnation, {m}.source_offset)
      < (EXCLUDED.source_incarnation, EXCLUDED.source_offset)
"""
#: The outcome: each key ends deleted at least as late, or with a newer row.
_DELETES_MISSING = """
SELECT count(*) FROM d
WHERE NOT EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = d.k AND m.source_topic = %(topic)s
      AND (m.source_incarnation <> %(inc)s OR m.source_partition = d.p)
      AND (m.source_incarnation, m.source_offset) >= (%(inc)s, d.o))
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = d.k AND x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)
      AND (x.source_incarnation, x.source_offset) > (%(inc)s, d.o))
"""


def _where(topic: Any, incarnation: Any, partition: Any, offset: Any) -> str:
    return f"topic {topic!r} partition {partition} (incarnation {incarnation}) offset {offset}"


def _unorderable(key: Any, here: str, split: bool, stored: Sequence[Any],
                 marker: Sequence[Any]) -> Unorderable:
    """Why a record of ``key`` at ``here`` cannot be placed, naming what it met."""
    if split:
        met = "a record of the same key from another partition in the same chunk"
    elif stored and stored[0] is not None:
        met = f"its stored row, from {_where(*stored)}"
    else:
        met = f"its deletion marker, from {_where(*marker)}"
    return Unorderable(
        f"key {key!r} at {here}: log order cannot place it against {met} (offsets order "
        "a key's records only within one partition of one topic: were partitions added, "
        "or do producers hash keys differently?); to take it, delete the key's row (and "
        "marker) and replay this letter")


class RowsRepository:
    """The pipeline's target table, written by ``COPY`` straight in or through a staging
    table (see the module doc)."""

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 shape: TargetShape | None = None, lock_timeout_s: float = 30.0,
                 new_keys: NewKeys | None = None) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.lock_timeout_s = lock_timeout_s
        #: The slice's memory of stored keys met (a repository of its own: try each chunk).
        self.new_keys = new_keys or NewKeys()
        shape = shape or contract_shape(pipeline)
        #: The columns a row fills, in row order: the target table's and the staging
        #: table's alike.
        self.columns = [c.name for c in row_columns(pipeline)]
        self.types = list(shape.wire_types)
        self._order = write_order(pipeline)
        self._event_id = (itemgetter(self.columns.index("event_id"))
                          if "event_id" in self.columns else None)
        self._stage_columns = [sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(ddl))
                               for name, ddl in zip(self.columns, shape.stage_types,
                                                    strict=True)]
        #: The table's columns, as the statements name them.
        self._column_list = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        self.table = sql.Identifier(pipeline.table)
        self.stage = sql.Identifier(stage_table(pipeline))
        marker = marker_table(pipeline)
        self.marker = sql.Identifier(marker) if marker else None
        self._conflict = sql.SQL(", ").join(map(sql.Identifier, pipeline.conflict_columns))
        self._log_order = pipeline.upsert.order_by == LOG_ORDER
        self._stage_ready = False
        #: Postgres refused ``COPY`` into the table itself (row-level security): every
        #: chunk takes the staged path.
        self._copy_refused = False

    def serialize(self, partitions: Iterable[int]) -> None:
        """A deleting pipeline's chunk transaction holds its source partitions' keys until
        it ends (:func:`~kafka_ingest.db.locks.hold_keys`): taken before any write."""
        if self.marker is not None:
            hold_keys(self.conn, f"{self.pipeline.table}:keys", partitions,
                      timeout_s=self.lock_timeout_s)

    def upsert(self, rows: Sequence[Row], *, source: Source | None = None,
               encoded: bytes | None = None) -> UpsertResult:
        """Upsert ``rows``, all read from ``source`` (one incarnation of one topic; needed
        by ``latest`` tables, which order versions by it); rows Postgres rejects are
        isolated by bisection, not fatal.

        ``encoded``: the rows already encoded by a :class:`CopyEncoder` (sent as they are;
        the bisection, if any, encodes its halves again). Runs inside the chunk's
        transaction (a :class:`~kafka_ingest.db.uow.UnitOfWork`): its savepoints would
        otherwise be transactions of their own."""
        if self.conn.info.transaction_status == TransactionStatus.IDLE:
            raise RuntimeError("the upsert runs inside a transaction (a unit of work)")
        return self._upsert_isolating(list(rows), source, encoded)

    def _upsert_isolating(self, rows: list[Row], source: Source | None,
                          encoded: bytes | None = None) -> UpsertResult:
        if not rows:
            return UpsertResult(0, 0, 0, [])
        try:
            with self.conn.transaction():  # a savepoint inside the chunk's transaction
                return self._upsert_once(rows, source, encoded)
        except ROW_REFUSALS as exc:
            if len(rows) == 1:
                reason = RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
                return UpsertResult(0, 0, 0, [(rows[0], reason)])
        mid = len(rows) // 2
        left = self._upsert_isolating(rows[:mid], source)
        right = self._upsert_isolating(rows[mid:], source)
        return UpsertResult(
            left.inserted + right.inserted,
            left.duplicates + right.duplicates,
            left.stale + right.stale,
            left.rejected + right.rejected,
            left.missing + right.missing,
        )

    def _ensure_stage(self) -> None:
        if self._stage_ready:
            return
        self.conn.execute(
            sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} ({}) ON COMMIT DELETE ROWS").format(
                self.stage, sql.SQL(", ").join(self._stage_columns)
            )
        )
        self._stage_ready = True

    def _copy(self, table: sql.Identifier, rows: list[Row], encoded: bytes | None) -> int:
        """``COPY`` the chunk's payload into ``table``: the rows it copied."""
        stmt = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            table, self._column_list)
        with self.conn.cursor() as cur:
            with cur.copy(stmt) as copy:
                self._send(copy, rows, encoded)
            return cur.rowcount

    def _stage(self, rows: list[Row], encoded: bytes | None) -> None:
        self._ensure_stage()
        self.conn.execute(sql.SQL("TRUNCATE {}").format(self.stage))
        self._copy(self.stage, rows, encoded)

    def _send(self, copy: psycopg.Copy, rows: list[Row], encoded: bytes | None) -> None:
        """The COPY's data: the payload encoded ahead, or the rows encoded now (in the
        same order, :func:`write_order`)."""
        if encoded is not None:
            copy.write(encoded)
            return
        copy.set_types(self.types)
        write = copy.write_row
        for row in self._order(rows):
            write(row)

    def _upsert_once(self, rows: list[Row], source: Source | None,
                     encoded: bytes | None = None) -> UpsertResult:
        if self.pipeline.upsert.mode is not UpsertMode.LATEST:
            return self._upsert_append(rows, encoded)
        if source is None:
            raise TypeError("a latest table's upsert needs the rows' source (topic and "
                            "incarnation)")
        self._stage(rows, encoded)
        return self._upsert_latest(rows, source)

    # ------------------------------------------------------------------------ append

    def _upsert_append(self, rows: list[Row], encoded: bytes | None) -> UpsertResult:
        n = len(rows)
        if self._event_id is None:
            raise TypeError("an append table's upsert needs an event_id column")
        distinct = len(set(map(self._event_id, rows)))
        if not self._copy_refused and self.new_keys.attempt():
            inserted = self._copy_new(rows, encoded, distinct)
            if inserted is not None:
                self.new_keys.all_new()
                return UpsertResult(inserted, n - inserted, 0, [])
            self.new_keys.met_stored_key()
        self._stage(rows, encoded)
        cols = self._column_list
        cur = self.conn.execute(
            sql.SQL(
                'INSERT INTO {t} ({c}) SELECT DISTINCT ON (event_id COLLATE "C") {c} FROM {s}'
                ' ORDER BY event_id COLLATE "C", source_topic COLLATE "C", source_partition,'
                " source_offset ON CONFLICT ({k}) DO NOTHING"
            ).format(t=self.table, c=cols, s=self.stage, k=self._conflict)
        )
        inserted = cur.rowcount
        # Every staged row not inserted is a duplicate (in the chunk, or already stored).
        # Counting "already stored" with a SELECT before the INSERT misses rows a concurrent
        # transaction (another partition's task) inserts meanwhile: ON CONFLICT skips them,
        # so the chunk failed reconciliation. What is checked instead is the outcome: every
        # staged event_id is in the table now. When the INSERT wrote one row per distinct
        # staged event_id, it wrote each of them: nothing to look up. Otherwise the ones it
        # skipped are looked up, one primary-key probe per staged row (a scalar subquery is
        # never turned into a join, so the cost stays per chunk whatever the table's size;
        # as an anti-join the planner, knowing nothing of the fresh staging rows, hashed a
        # scan of the whole table for every chunk).
        if inserted == distinct:
            return UpsertResult(inserted, n - inserted, 0, [])
        missing = self._scalar(
            "SELECT count(DISTINCT s.event_id) FROM {s} s"
            " WHERE (SELECT true FROM {t} x WHERE x.event_id = s.event_id LIMIT 1) IS NULL",
            {})
        return UpsertResult(inserted, n - inserted, 0, [], missing)

    def _copy_new(self, rows: list[Row], encoded: bytes | None, distinct: int) -> int | None:
        """The chunk's payload (one copy of each event) copied straight into the table as
        new keys: the rows copied, or ``None`` (nothing written) when a key is stored
        already, when the ``COPY`` wrote another count than one row per event (a trigger),
        or when Postgres refuses ``COPY`` into the table (row-level security): ``ON
        CONFLICT`` and its outcome check then decide."""
        try:
            with self.conn.transaction():
                copied = self._copy(self.table, rows, encoded)
                if copied != distinct:
                    raise _NotOnePerEvent
        except (psycopg.errors.UniqueViolation, _NotOnePerEvent):
            return None
        except psycopg.errors.FeatureNotSupported:
            self._copy_refused = True
            return None
        return copied

    # ------------------------------------------------------------------------ latest

    def _sql(self, template: str, **fragments: str) -> sql.Composed:
        """One of the named statements, formatted for this table."""
        key = self.pipeline.upsert.key or ""
        text = template.format(
            **{name: value.format(m="{m}", k="{k}") for name, value in fragments.items()},
            t="{t}", s="{s}", m="{m}", k="{k}", o="{o}", c="{c}", u="{u}", kt="{kt}")
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c))
            for c in self.columns if c != key)
        key_type = next((c.copy_type for c in self.pipeline.sink_columns if c.name == key),
                        "text")
        return sql.SQL(text).format(
            t=self.table, s=self.stage, m=self.marker or sql.Identifier("-"),
            k=sql.Identifier(key), o=sql.Identifier(self.pipeline.upsert.order_by),
            c=self._column_list, u=updates, kt=sql.SQL(key_type))

    def _marker_fragments(self) -> dict[str, str]:
        """The marker parts of the log-order statements (empty without a marker table)."""
        have = self.marker is not None
        return {
            "marker_columns": _LOG_MARKER_COLUMNS if have else "",
            "marker_join": _LOG_MARKER_JOIN if have else "",
            "marker_unorderable": _LOG_MARKER_UNORDERABLE if have else "",
            "marker_stale": _LOG_MARKER_STALE if have else "",
            "marker_details": ", mt, mi, mp, mo" if have else "",
            "marker_excludes": _LOG_MARKER_EXCLUDES if have else "",
            "marker_holds": _LOG_MARKER_HOLDS if have else "",
        }

    def _upsert_latest(self, rows: list[Row], source: Source) -> UpsertResult:
        params: dict[str, Any] = {"topic": source.topic, "inc": source.incarnation}
        frags = self._marker_fragments() if self._log_order else {}
        staged = _LOG_STAGED if self._log_order else _TIME_STAGED
        verdicts: Counter[str] = Counter(dict.fromkeys(LATEST_VERDICTS, 0))
        for verdict, n in self.conn.execute(self._sql(staged + _VERDICTS, **frags), params):
            verdicts[verdict] = int(n)
        rejected = (self._unorderable_rows(rows, source, staged, frags, params)
                    if verdicts["unorderable"] else [])
        insert = _LOG_INSERT if self._log_order else _TIME_INSERT
        inserted = self.conn.execute(self._sql(insert, **frags), params).rowcount
        if self.marker is not None and inserted:
            self.conn.execute(self._sql(_CLEAR_MARKERS))
        skipped = [row_source(row) for row, _ in rejected]
        missing = self._scalar(_LOG_MISSING if self._log_order else _TIME_MISSING,
                               {**params, "skip_p": [s.partition for s in skipped],
                                "skip_o": [s.offset for s in skipped]}, **frags)
        # A version the chunk classified "write" that the INSERT did not write lost to a
        # newer one committed meanwhile (a backfill beside a live slice): stale, as the
        # outcome check above proves (else it counts the row missing).
        lost = verdicts["write"] - inserted
        return UpsertResult(inserted, verdicts["copy"] + verdicts["stored"],
                            verdicts["stale"] + verdicts["superseded"] + lost, rejected,
                            missing)

    def _unorderable_rows(self, rows: list[Row], source: Source, staged: str,
                          frags: dict[str, str],
                          params: dict[str, Any]) -> list[tuple[Row, DataError]]:
        """The staged rows log order cannot place, each with what it met."""
        by_place = {(row_source(r).partition, row_source(r).offset): r for r in rows}
        key_at = self.columns.index(self.pipeline.upsert.key or "")
        found = self.conn.execute(self._sql(staged + _UNORDERABLE, **frags), params)
        rejected: list[tuple[Row, DataError]] = []
        for p, o, split, *stored in found:
            row = by_place[(p, o)]
            here = _where(source.topic, source.incarnation, p, o)
            rejected.append((row, _unorderable(row[key_at], here, split, stored[:4],
                                               stored[4:])))
        return rejected

    def _scalar(self, template: str, params: dict[str, Any], **frags: str) -> int:
        row = self.conn.execute(self._sql(template, **frags), params).fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------------ deletes

    def delete(self, tombstones: Sequence[Tombstone], *,
               source: Source | None = None) -> DeleteResult:
        """Apply a chunk's tombstones, all read from ``source``, after its upsert (see the
        module doc): delete each key's row when it is older, and remember the deletion in
        a marker; a tombstone log order cannot place is returned for the DLQ."""
        if not tombstones or self.marker is None:
            return DeleteResult(0)
        if source is None:
            raise TypeError("deletes need the tombstones' source (topic and incarnation)")
        params: dict[str, Any] = {"topic": source.topic, "inc": source.incarnation,
                                  **self._tombstone_params(tombstones)}
        bad = {}
        for k, p, o, split, *stored in self.conn.execute(
                self._sql(_TOMBSTONES_UNORDERABLE), params):
            here = _where(source.topic, source.incarnation, p, o)
            bad[k] = _unorderable(k, here, split, stored[:4], stored[4:])
        rejected: list[tuple[Tombstone, DataError]] = [(t, bad[t.key]) for t in tombstones
                                                       if t.key in bad]
        kept = [t for t in tombstones if t.key not in bad]
        if not kept:
            return DeleteResult(0, 0, rejected)
        params.update(self._tombstone_params(kept))
        deleted = self.conn.execute(self._sql(_TOMBSTONES + _DELETE_OLDER), params).rowcount
        self.conn.execute(self._sql(_TOMBSTONES + _MARK_DELETED), params)
        missing = self._scalar(_TOMBSTONES + _DELETES_MISSING, params)
        return DeleteResult(deleted, missing, rejected)

    @staticmethod
    def _tombstone_params(tombstones: Sequence[Tombstone]) -> dict[str, list[Any]]:
        return {"keys": [t.key for t in tombstones], "parts": [t.partition for t in tombstones],
                "offs": [t.offset for t in tombstones]}


__all__ = [
    "LATEST_VERDICTS",
    "NEW_KEYS_MAX_PAUSE",
    "ROW_REFUSALS",
    "CopyEncoder",
    "DeleteResult",
    "NewKeys",
    "RowsRepository",
    "UpsertResult",
    "write_order",
]
