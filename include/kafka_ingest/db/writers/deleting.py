"""Deleting tables: a latest table keyed by the record key, in log order, whose
tombstones delete (``on_tombstone: delete``).

After the chunk's upsert, a tombstone of key K at place o deletes K's row if the row is
older and leaves a *deletion marker* (K, o) in the pipeline's marker table
(:func:`~kafka_ingest.db.tables.marker_table`). The upsert treats a marker like a stored
version: an event of K older than the marker is stale, so a replay or a backfill of older
offsets cannot resurrect the row; a newer event wins and removes the marker
(:data:`CLEAR_MARKERS`). A key therefore has a row or a marker, never both, and a marker
lives exactly as long as its key stays deleted: a backfill may re-read any range the topic
still holds, at any time (compaction keeps older records until its cleaner runs, and
``delete.retention.ms`` only bounds how long the *tombstone* stays), so no shorter lifetime
is safe. Markers cost one small row per deleted key: the key space the compacted topic
itself holds. A tombstone log order cannot place (its key's row or marker came from
another partition or topic) is returned for the DLQ, like a row.

A mirror's truncate (``on_truncate: truncate``, :data:`~kafka_ingest.records.EVERY_KEY`)
leaves no marker per key: it moves its partition's truncate point (``truncate_points``,
:data:`TRUNCATE_POINT`, forward only) and deletes every row, and every marker, placed
before it in its partition or in an older incarnation of the topic (:data:`TRUNCATED`);
the upsert counts a record placed before a truncate point stale, as it counts one older
than a marker (:data:`~kafka_ingest.db.writers.latest.TRUNCATED_BEFORE`), so a row the
table never held (dead-lettered, or before the offsets the mirror began at) cannot come
back either. Rows of the topic's other partitions are not ordered against it.

A deleting chunk's transaction holds its source partitions' keys until it ends (a
replay's, every partition's: an old incarnation's letters sit in other partitions than the
new one writes their keys in; :func:`~kafka_ingest.db.locks.hold_keys`): its rows and its
markers are two tables. A
tombstone left missing because another partition's transaction wrote its key between the
statements is decided again, as a row is (:mod:`~kafka_ingest.db.writers.latest`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from psycopg import sql

from kafka_ingest.config import OnTruncate
from kafka_ingest.db.locks import hold_keys
from kafka_ingest.db.tables import marker_table
from kafka_ingest.db.writers.base import DeleteResult
from kafka_ingest.db.writers.latest import (
    LOG_MARKER_COLUMNS,
    LOG_MARKER_EXCLUDES,
    LOG_MARKER_HOLDS,
    LOG_MARKER_JOIN,
    LOG_MARKER_STALE,
    LOG_MARKER_UNORDERABLE,
    RACE_ATTEMPTS,
    TRUNCATE_POINTS,
    LatestWriter,
    Raced,
    unorderable,
    where,
)
from kafka_ingest.errors import DataError
from kafka_ingest.records import EVERY_KEY, Source, Tombstone

log = logging.getLogger(__name__)

#: A key written again after its deletion keeps no marker: the row is newer.
CLEAR_MARKERS = """
DELETE FROM {m} m USING {t} x WHERE {mk} = {xk} AND {mk} IN (SELECT {k} FROM {s})
  AND x.source_topic = m.source_topic
  AND (x.source_incarnation, x.source_offset) > (m.source_incarnation, m.source_offset)
"""
# The deletes: {karrays} (%(k0)s, ...: a list per key column, cast to its type), %(parts)s,
# %(offs)s are the chunk's tombstones, unnested as u(k0, ..., p, o) ({kk}; {dk} the key
# of d, {dkl} its columns).
TOMBSTONES = """
WITH u AS (SELECT * FROM unnest({karrays}, %(parts)s::int4[], %(offs)s::int8[])
           AS u({kk}, p, o)),
d AS (SELECT DISTINCT ON ({kk}) {kk}, p, o FROM u ORDER BY {kk}, o DESC)
"""
#: Tombstones log order cannot place: a key in two partitions among them, or a stored
#: row or marker of the key from another partition or topic.
TOMBSTONES_UNORDERABLE = """
WITH u AS (SELECT * FROM unnest({karrays}, %(parts)s::int4[], %(offs)s::int8[])
           AS u({kk}, p, o)),
d AS (SELECT DISTINCT ON ({kk}) {kk}, p, o, min(p) OVER w <> max(p) OVER w AS split FROM u
      WINDOW w AS (PARTITION BY {kk}) ORDER BY {kk}, o DESC)
SELECT {dkl}, d.p, d.o, d.split, x.source_topic, x.source_incarnation, x.source_partition,
       x.source_offset, m.source_topic, m.source_incarnation, m.source_partition,
       m.source_offset
FROM d LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                 source_offset FROM {t} WHERE {lk} = {dk} LIMIT 1) x ON true
       LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                 source_offset FROM {m} WHERE {lk} = {dk} LIMIT 1) m ON true
WHERE d.split
   OR (x.source_topic IS NOT NULL AND NOT (x.source_topic = %(topic)s
       AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)))
   OR (m.source_topic IS NOT NULL AND NOT (m.source_topic = %(topic)s
       AND (m.source_incarnation <> %(inc)s OR m.source_partition = d.p)))
"""
DELETE_OLDER = """
DELETE FROM {t} x USING d WHERE {xk} = {dk} AND x.source_topic = %(topic)s
  AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)
  AND (x.source_incarnation, x.source_offset) < (%(inc)s, d.o)
"""
MARK_DELETED = """
INSERT INTO {m} ({k}, source_topic, source_incarnation, source_partition, source_offset)
SELECT {kk}, %(topic)s, %(inc)s, p, o FROM d
WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {dk})
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
#: A truncate at (%(p)s, %(o)s): its partition's truncate point, moved forward only
#: (migration 0011; :data:`~kafka_ingest.db.writers.latest.TRUNCATED_BEFORE` makes every
#: record placed before it stale).
TRUNCATE_POINT = """
INSERT INTO truncate_points AS tp (pipeline, source_topic, source_partition,
                                   source_incarnation, source_offset)
VALUES (%(pipeline)s, %(topic)s, %(p)s, %(inc)s, %(o)s)
ON CONFLICT (pipeline, source_topic, source_partition) DO UPDATE
  SET source_incarnation = EXCLUDED.source_incarnation,
      source_offset = EXCLUDED.source_offset, truncated_at = now()
WHERE (tp.source_incarnation, tp.source_offset)
      < (EXCLUDED.source_incarnation, EXCLUDED.source_offset)
"""
#: What a truncate deletes from the table ({t}) and from the markers ({m}, which the
#: truncate point subsumes): every row placed before it in its partition, and every row
#: of an older incarnation of the topic.
TRUNCATED = """
DELETE FROM {into} WHERE source_topic = %(topic)s AND (source_incarnation < %(inc)s
  OR (source_incarnation = %(inc)s AND source_partition = %(p)s AND source_offset < %(o)s))
"""
#: The outcome: each key ends deleted at least as late, or with a newer row.
DELETES_MISSING = """
SELECT count(*) FROM d
WHERE NOT EXISTS (SELECT 1 FROM {m} m WHERE {mk} = {dk} AND m.source_topic = %(topic)s
      AND (m.source_incarnation <> %(inc)s OR m.source_partition = d.p)
      AND (m.source_incarnation, m.source_offset) >= (%(inc)s, d.o))
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {dk} AND x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = d.p)
      AND (x.source_incarnation, x.source_offset) > (%(inc)s, d.o))
"""



class DeletingWriter(LatestWriter):
    """A deleting table's writer (see the module doc)."""

    MARKERS: ClassVar[dict[str, str]] = {
        "marker_columns": LOG_MARKER_COLUMNS, "marker_join": LOG_MARKER_JOIN,
        "marker_unorderable": LOG_MARKER_UNORDERABLE, "marker_stale": LOG_MARKER_STALE,
        "marker_details": ", mt, mi, mp, mo", "marker_excludes": LOG_MARKER_EXCLUDES,
        "marker_holds": LOG_MARKER_HOLDS}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clear_markers = self.statement(CLEAR_MARKERS)
        self._tombstones_unorderable = self.statement(TOMBSTONES_UNORDERABLE)
        self._delete_older = self.statement(TOMBSTONES + DELETE_OLDER)
        self._mark_deleted = self.statement(TOMBSTONES + MARK_DELETED)
        self._deletes_missing = self.statement(TOMBSTONES + DELETES_MISSING)
        self._truncate_point = self.statement(TRUNCATE_POINT)
        self._truncated_rows = self.statement(TRUNCATED.replace("{into}", "{t}"))
        self._truncated_markers = self.statement(TRUNCATED.replace("{into}", "{m}"))

    def _fragments(self) -> dict[str, str]:
        """A table that follows truncates also counts a record placed before one stale."""
        fragments = super()._fragments()
        if self.log_order and self.pipeline.on_truncate is OnTruncate.TRUNCATE:
            fragments = {**fragments, **TRUNCATE_POINTS}
        return fragments

    @property
    def _marker(self) -> sql.Identifier:
        return sql.Identifier(str(marker_table(self.pipeline)))

    def serialize(self, partitions: Iterable[int], *, every: bool = False) -> None:
        """The chunk's transaction holds its source partitions' keys (or every
        partition's) until it ends: taken before any write."""
        hold_keys(self.conn, f"{self.pipeline.table}:keys", partitions,
                  timeout_s=self.lock_timeout_s, every=every)

    def _after_insert(self, inserted: int) -> None:
        if inserted:  # a newer version of a deleted key is back
            self.conn.execute(self._clear_markers)

    def delete(self, tombstones: Sequence[Tombstone], *,
               source: Source | None = None) -> DeleteResult:
        """Apply a chunk's tombstones, all read from ``source``, after its upsert (see the
        module doc): delete each key's row when it is older, and remember the deletion in
        a marker; a tombstone log order cannot place is returned for the DLQ."""
        if not tombstones:
            return DeleteResult(0)
        if source is None:
            raise TypeError("deletes need the tombstones' source (topic and incarnation)")
        keyed = [t for t in tombstones if t.key is not EVERY_KEY]
        done = self._delete_keys(keyed, source) if keyed else DeleteResult(0)
        # after the keys' deletes: a marker one of them left before a truncate goes with it
        truncated = sum(self._truncate(t, source) for t in tombstones if t.key is EVERY_KEY)
        return DeleteResult(done.deleted + truncated, done.missing, done.rejected)

    def _delete_keys(self, tombstones: Sequence[Tombstone], source: Source) -> DeleteResult:
        for attempt in range(1, RACE_ATTEMPTS + 1):
            try:
                with self.conn.transaction():  # a savepoint: a race rolls back to here
                    return self._delete_once(tombstones, source,
                                             last=attempt == RACE_ATTEMPTS)
            except Raced:
                log.info("%s: a version of a key of this chunk's tombstones was committed "
                         "from another partition meanwhile; deciding them again",
                         self.pipeline.name)
        raise AssertionError("the last attempt reports what it found")  # pragma: no cover

    def _delete_once(self, tombstones: Sequence[Tombstone], source: Source, *,
                     last: bool) -> DeleteResult:
        """The tombstones' statements; :class:`Raced` (unless ``last``) when one is left
        missing: another partition's transaction wrote its key between them (see
        :mod:`~kafka_ingest.db.writers.latest`)."""
        params: dict[str, Any] = {"topic": source.topic, "inc": source.incarnation,
                                  **self._tombstone_params(tombstones)}
        bad = {}
        width = len(self.keys)
        for found in self.conn.execute(self._tombstones_unorderable, params):
            k = found[0] if width == 1 else tuple(found[:width])
            p, o, split, *stored = found[width:]
            here = where(source.topic, source.incarnation, p, o)
            bad[k] = unorderable(k, here, split, stored[:4], stored[4:])
        rejected: list[tuple[Tombstone, DataError]] = [(t, bad[t.key]) for t in tombstones
                                                       if t.key in bad]
        kept = [t for t in tombstones if t.key not in bad]
        if not kept:
            return DeleteResult(0, 0, rejected)
        params.update(self._tombstone_params(kept))
        deleted = self.conn.execute(self._delete_older, params).rowcount
        self.conn.execute(self._mark_deleted, params)
        missing = self._scalar(self._deletes_missing, params)
        if missing and not last:
            raise Raced
        return DeleteResult(deleted, missing, rejected)


    def _tombstone_params(self, tombstones: Sequence[Tombstone]) -> dict[str, list[Any]]:
        """The tombstones as arrays: one per key column (a composite key is a tuple), their
        partitions and offsets."""
        keys = ([[t.key] for t in tombstones] if len(self.keys) == 1
                else [t.key for t in tombstones])
        columns = list(zip(*keys, strict=True)) if keys else [()] * len(self.keys)
        return {**{f"k{n}": list(c) for n, c in enumerate(columns)},
                "parts": [t.partition for t in tombstones],
                "offs": [t.offset for t in tombstones]}

    def _truncate(self, truncate: Tombstone, source: Source) -> int:
        """A truncate (:data:`~kafka_ingest.records.EVERY_KEY`) at its place: its
        partition's truncate point moved to it, and every row placed before it deleted
        (the chunk's rows are written by now: those before it go too, those after stay),
        with the markers it subsumes. The rows deleted."""
        params = {"pipeline": self.pipeline.name, "topic": source.topic,
                  "inc": source.incarnation, "p": truncate.partition, "o": truncate.offset}
        self.conn.execute(self._truncate_point, params)
        self.conn.execute(self._truncated_markers, params)
        return self.conn.execute(self._truncated_rows, params).rowcount


__all__ = ["CLEAR_MARKERS", "DELETES_MISSING", "DELETE_OLDER", "MARK_DELETED", "TOMBSTONES",
           "TOMBSTONES_UNORDERABLE", "TRUNCATED", "TRUNCATE_POINT",
           "DeletingWriter"]
