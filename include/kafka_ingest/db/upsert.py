"""The target table, written by binary ``COPY``: straight in, or through a staging table.

A chunk's rows travel in the table's own binary form (an epoch already a ``timestamptz``,
see :attr:`~kafka_ingest.contracts.columns.Column.convert`), so the same payload can go
into the target table or into a temporary staging table of the same columns. An append
chunk's payload holds one copy of each event, the one ``ON CONFLICT`` keeps (its lowest
place in the log), in key order (:func:`write_order`).

An append chunk first tries its keys as new: ``COPY`` straight into the target table, in
a savepoint. Postgres' unique index decides: when every key is new the table takes them
all, at 2.1 instead of 3.6 µs of server CPU a row (no staging table, no second pass, and
``COPY`` inserts a page of rows at a time); when one key is stored already (a replay, a
backfill, a duplicate another partition stored) it refuses the ``COPY``, the savepoint
rolls back, and the staged path runs on the same payload: ``COPY`` into the staging table,
then ``INSERT ... SELECT ... ON CONFLICT``: ``DO NOTHING`` on ``event_id`` for append
pipelines, ``DO UPDATE ... WHERE`` older for ``latest`` pipelines (which always take it).
What the table ends with is the same either way, so a replay never duplicates a row. A
slice whose chunk met a stored key skips the attempt for its next chunks, 1, 2, 4, ... up
to :data:`NEW_KEYS_MAX_PAUSE` of them (:class:`NewKeys`): a backfill over stored rows pays
one refused ``COPY``, not one a chunk. The outcome is then checked against the table. A
row Postgres rejects is isolated by bisecting the chunk (in savepoints) and returned for
the DLQ.

Deletes (``on_tombstone: delete``, ``latest`` pipelines keyed by the record key, in log
order): after the chunk's upsert, a tombstone of key K at offset o deletes K's row if the
row is older (``source_offset`` < o) and leaves a *deletion marker* (K, o) in the
pipeline's ``<table>_tombstones`` table. The upsert treats a marker like a stored version:
an event of K older than the marker is stale, so a replay or a backfill of older offsets
cannot resurrect the row; a newer event wins and removes the marker. A key therefore has a
row or a marker, never both, and a marker lives exactly as long as its key stays deleted:
a backfill may re-read any range the topic still holds, at any time (compaction keeps
older records until its cleaner runs, and ``delete.retention.ms`` only bounds how long the
*tombstone* stays), so no shorter lifetime is safe. Markers cost one small row per deleted
key: the key space the compacted topic itself holds.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from operator import eq, itemgetter
from typing import Any

import psycopg
from psycopg import sql
from psycopg.copy import FileWriter

from kafka_ingest.config import LOG_ORDER, Pipeline, UpsertMode
from kafka_ingest.db.locks import hold_keys
from kafka_ingest.db.tables import marker_table, row_columns
from kafka_ingest.errors import RejectedByDatabase
from kafka_ingest.records import Row, Tombstone

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
    """What one chunk's upsert did. ``rejected`` rows go to the DLQ, with the reason."""

    inserted: int
    duplicates: int
    stale: int
    rejected: list[tuple[Row, RejectedByDatabase]]
    #: Staged rows the table does not hold (nor a newer version of) after the INSERT:
    #: must be 0. Checked against the table, independently of the counts above.
    missing: int = 0


@dataclass(frozen=True)
class DeleteResult:
    """What one chunk's tombstones did: rows deleted, and tombstones whose key the table
    holds neither a marker for (at least as new) nor a newer row after them: must be 0."""

    deleted: int
    missing: int = 0


def _copied_types(pipeline: Pipeline) -> list[str]:
    """The types the row's values travel as, in row order (:attr:`Column.wire_type`)."""
    return [c.wire_type for c in row_columns(pipeline)]


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
    when created, before any transaction of the slice uses the connection.
    """

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline) -> None:
        self.types = _copied_types(pipeline)
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


class RowsRepository:
    """The pipeline's target table, written by ``COPY`` straight in or through a staging
    table (see the module doc)."""

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 lock_timeout_s: float = 30.0, new_keys: NewKeys | None = None) -> None:
        self.conn = conn
        self.pipeline = pipeline
        self.lock_timeout_s = lock_timeout_s
        #: The slice's memory of stored keys met (a repository of its own: try each chunk).
        self.new_keys = new_keys or NewKeys()
        cols = row_columns(pipeline)
        #: The columns a row fills, in row order: the target table's and the staging
        #: table's alike.
        self.columns = [c.name for c in cols]
        self.types = _copied_types(pipeline)
        self._order = write_order(pipeline)
        self._event_id = itemgetter(self.columns.index("event_id"))
        self._stage_columns = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.ddl))
                               for c in cols]
        #: The table's columns, as the statements name them.
        self._column_list = sql.SQL(", ").join(map(sql.Identifier, self.columns))
        self.table = sql.Identifier(pipeline.table)
        self.stage = sql.Identifier(f"stage_{pipeline.table}")
        marker = marker_table(pipeline)
        self.marker = sql.Identifier(marker) if marker else None
        self._conflict = sql.SQL(", ").join(map(sql.Identifier, pipeline.conflict_columns))
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

    def upsert(self, rows: Sequence[Row], *, encoded: bytes | None = None) -> UpsertResult:
        """Upsert ``rows``; rows Postgres rejects are isolated by bisection, not fatal.

        ``encoded``: the rows already encoded by a :class:`CopyEncoder` (sent as they are;
        the bisection, if any, encodes its halves again)."""
        # Before any savepoint: this statement also opens the chunk's transaction when
        # nothing has yet, and psycopg's transaction() outside one is a transaction of its
        # own that COMMITs. (Making the stage only when the staged path runs broke
        # test_uow_rolls_back_by_default for that reason.)
        self._ensure_stage()
        return self._upsert_isolating(list(rows), encoded)

    def _upsert_isolating(self, rows: list[Row], encoded: bytes | None = None) -> UpsertResult:
        if not rows:
            return UpsertResult(0, 0, 0, [])
        try:
            with self.conn.transaction():  # a savepoint inside the chunk's transaction
                return self._upsert_once(rows, encoded)
        except ROW_REFUSALS as exc:
            if len(rows) == 1:
                reason = RejectedByDatabase(f"{type(exc).__name__}: {str(exc).strip()}")
                return UpsertResult(0, 0, 0, [(rows[0], reason)])
        mid = len(rows) // 2
        left = self._upsert_isolating(rows[:mid])
        right = self._upsert_isolating(rows[mid:])
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
        # No JIT for this transaction's statements: compiling them (tens to hundreds of ms
        # once a chunk's estimated cost passes jit_above_cost) costs more than running
        # them. SET LOCAL: the server's setting is untouched outside the chunk.
        self.conn.execute(sql.SQL("SET LOCAL jit = off; TRUNCATE {}").format(self.stage))
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

    def _upsert_once(self, rows: list[Row], encoded: bytes | None = None) -> UpsertResult:
        if self.pipeline.upsert.mode is UpsertMode.LATEST:
            self._stage(rows, encoded)
            return self._upsert_latest(len(rows))
        return self._upsert_append(rows, encoded)

    def _upsert_append(self, rows: list[Row], encoded: bytes | None) -> UpsertResult:
        n = len(rows)
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
        return UpsertResult(inserted, n - inserted, 0, [], self._missing(
            "SELECT count(DISTINCT s.event_id) FROM {s} s"
            " WHERE (SELECT true FROM {t} x WHERE x.event_id = s.event_id LIMIT 1) IS NULL",
            {}))

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

    def _missing(self, query: str, extra: dict[str, sql.Composable]) -> int:
        row = self.conn.execute(
            sql.SQL(query).format(t=self.table, s=self.stage, **extra)
        ).fetchone()
        return int(row[0]) if row else 0

    def _upsert_latest(self, n: int) -> UpsertResult:
        key = sql.Identifier(self.pipeline.upsert.key or "")
        order = sql.Identifier(self.pipeline.upsert.order_by)
        cols = self._column_list
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c))
            for c in self.columns if c != self.pipeline.upsert.key
        )
        # A deletion marker counts as a stored version of its key (see the module doc).
        marked = sql.SQL("") if self.marker is None else sql.SQL(
            " OR EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = s.{k}"
            " AND s.source_offset <= m.source_offset)").format(m=self.marker, k=key)
        unmarked = sql.SQL("") if self.marker is None else sql.SQL(
            " AND NOT EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = {s}.{k}"
            " AND {s}.source_offset <= m.source_offset)").format(
                m=self.marker, k=key, s=self.stage)
        # The same event: by event_id, or in log order by its place in the log, since a
        # record sent again later under the same event_id is a newer version there (what
        # compaction keeps), and a chunk boundary must not decide which one wins.
        log_order = self.pipeline.upsert.order_by == LOG_ORDER

        def same(stored: str, staged: sql.Composable) -> sql.Composable:
            if not log_order:
                return sql.SQL("{x}.event_id = {y}.event_id").format(
                    x=sql.Identifier(stored), y=staged)
            return sql.SQL("{x}.{k} = {y}.{k} AND {x}.source_partition = {y}.source_partition"
                           " AND {x}.source_offset = {y}.source_offset").format(
                               x=sql.Identifier(stored), y=staged, k=key)

        # The CTE below holds source_offset already: the log order needs no second copy.
        o_staged = sql.SQL("") if log_order else sql.SQL(", {}").format(order)
        copies = sql.SQL("source_partition, source_offset" if log_order else "event_id")
        fmt = {"t": self.table, "s": self.stage, "k": key, "o": order, "c": cols, "u": updates,
               "marked": marked, "unmarked": unmarked, "o_staged": o_staged, "copies": copies,
               "stored": same("x", sql.Identifier("s")),
               "replayed": same("x", self.stage)}
        # Classify each staged row before writing. "copy" 1 is the copy of an event the
        # INSERT below would pick (same event => same key and time; the highest offset wins).
        row = self.conn.execute(sql.SQL(
            "WITH s AS (SELECT event_id, {k}{o_staged}, source_partition, source_offset,"
            " row_number() OVER (PARTITION BY {copies} ORDER BY source_offset DESC,"
            " source_partition DESC) AS copy"
            " FROM {s}), f AS (SELECT s.copy, EXISTS (SELECT 1 FROM {t} x"
            " WHERE {stored}) AS stored, (EXISTS (SELECT 1 FROM {t} y"
            " WHERE y.{k} = s.{k} AND (s.{o}, s.source_offset) <= (y.{o}, y.source_offset))"
            "{marked}) AS older FROM s)"
            " SELECT count(*) FILTER (WHERE copy > 1),"
            " count(*) FILTER (WHERE copy = 1 AND stored),"
            " count(*) FILTER (WHERE copy = 1 AND NOT stored AND older) FROM f"
        ).format(**fmt)).fetchone()
        dup_in_chunk, dup_stored, stale_stored = (int(v) for v in row) if row else (0, 0, 0)
        cur = self.conn.execute(sql.SQL(
            "INSERT INTO {t} ({c}) SELECT DISTINCT ON ({k}) {c} FROM {s}"
            # A replay of the stored event is a duplicate (counted above), not a newer
            # version: its later source_offset must not rewrite the row nor count twice.
            " WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE {replayed}){unmarked}"
            " ORDER BY {k}, {o} DESC, source_offset DESC, source_partition DESC"
            " ON CONFLICT ({k}) DO UPDATE SET {u}, ingested_at = now()"
            " WHERE ({t}.{o}, {t}.source_offset) < (EXCLUDED.{o}, EXCLUDED.source_offset)"
        ).format(**fmt))
        inserted = cur.rowcount
        # The rest lost, inside the chunk, to a newer event of the same entity: stale too.
        superseded = n - inserted - dup_in_chunk - dup_stored - stale_stored
        # The outcome, checked against the table: each staged event is stored, or its entity
        # holds a version at least as new.
        if self.marker is not None and inserted:  # a newer version of a deleted key is back
            self.conn.execute(sql.SQL(
                "DELETE FROM {m} m USING {s} WHERE m.{k} = {s}.{k}"
                " AND m.source_offset < {s}.source_offset").format(**fmt, m=self.marker))
        missing = self._missing(
            "SELECT count(*) FROM {s} s WHERE NOT EXISTS (SELECT 1 FROM {t} x"
            " WHERE x.{k} = s.{k} AND (({stored})"
            " OR (x.{o}, x.source_offset) >= (s.{o}, s.source_offset))) AND NOT (false{marked})",
            {"k": key, "o": order, "marked": marked, "stored": fmt["stored"]})
        return UpsertResult(inserted, dup_in_chunk + dup_stored, stale_stored + superseded, [],
                            missing)

    def delete(self, tombstones: Sequence[Tombstone]) -> DeleteResult:
        """Apply a chunk's tombstones after its upsert (see the module doc): delete each
        key's row when it is older, and remember the deletion in a marker."""
        if not tombstones or self.marker is None:
            return DeleteResult(0)
        key_column = next(c for c in self.pipeline.sink_columns
                          if c.name == self.pipeline.upsert.key)
        fmt = {"t": self.table, "m": self.marker, "k": sql.Identifier(key_column.name),
               "kt": sql.SQL(key_column.copy_type)}
        params = ([t.key for t in tombstones], [t.partition for t in tombstones],
                  [t.offset for t in tombstones])
        # The newest tombstone per key (a key lives in one partition: offsets order it).
        newest = sql.SQL(
            "WITH d AS (SELECT DISTINCT ON (k) k, p, o FROM unnest(%s::{kt}[], %s::int4[],"
            " %s::int8[]) AS u(k, p, o) ORDER BY k, o DESC)").format(**fmt)
        deleted = self.conn.execute(sql.Composed([newest, sql.SQL(
            " DELETE FROM {t} x USING d WHERE x.{k} = d.k AND x.source_offset < d.o"
        ).format(**fmt)]), params).rowcount
        self.conn.execute(sql.Composed([newest, sql.SQL(
            " INSERT INTO {m} ({k}, source_partition, source_offset) SELECT k, p, o FROM d"
            " WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE x.{k} = d.k AND x.source_offset > d.o)"
            " ON CONFLICT ({k}) DO UPDATE SET source_partition = EXCLUDED.source_partition,"
            " source_offset = EXCLUDED.source_offset, deleted_at = now()"
            " WHERE {m}.source_offset < EXCLUDED.source_offset").format(**fmt)]), params)
        # The outcome: each key ends deleted at least as late, or with a newer row.
        row = self.conn.execute(sql.Composed([newest, sql.SQL(
            " SELECT count(*) FROM d WHERE NOT EXISTS (SELECT 1 FROM {m} m WHERE m.{k} = d.k"
            " AND m.source_offset >= d.o) AND NOT EXISTS (SELECT 1 FROM {t} x"
            " WHERE x.{k} = d.k AND x.source_offset > d.o)").format(**fmt)]), params).fetchone()
        return DeleteResult(deleted, int(row[0]) if row else 0)
