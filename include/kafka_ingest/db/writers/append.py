"""Append tables: every event once, ``ON CONFLICT (<identity>) DO NOTHING``.

An event is known by the pipeline's identity (:class:`~kafka_ingest.config.Identity`):
``event_id``, other payload fields, the record key's column, or the source position.

An append chunk first tries its keys as new: ``COPY`` straight into the target table, in
a savepoint. Postgres' unique index decides: when every key is new the table takes them
all, at 2.1 instead of 3.6 µs of server CPU a row (no staging table, no second pass, and
``COPY`` inserts a page of rows at a time); when one key is stored already (a replay, a
backfill, a duplicate another partition stored) it refuses the ``COPY``, the savepoint
rolls back, and the staged path runs on the same payload: ``COPY`` into the staging table,
then :data:`INSERT_NEW_EVENTS`. What the table ends with is the same either way, so a
replay never duplicates a row. A slice whose chunk met a stored key skips the attempt for
its next chunks, 1, 2, 4, ... up to :data:`NEW_KEYS_MAX_PAUSE` of them (:class:`NewKeys`):
a backfill over stored rows pays one refused ``COPY``, not one a chunk. A table identified
by the source position holds the incarnation of the topic in its key, which is the
chunk's, not a row's: the ``COPY`` leaves that column to its default, so it is tried only
for a chunk of the incarnation the column defaults to (1, the topic as first seen: read
from the table's own default, :data:`INCARNATION_DEFAULT`, once per slice); a chunk of a
topic created again takes the staged path, whose ``INSERT`` adds its incarnation.

The counts: ``inserted`` is what Postgres wrote (the ``COPY``'s or the ``INSERT``'s row
count); ``duplicates`` the rest of the chunk, copies in it and events stored before. That
every one of them is stored is checked against the table (:data:`MISSING_EVENTS`) unless
the write took one row per distinct event, which proves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from kafka_ingest.config import IdentitySource, Pipeline
from kafka_ingest.db.copy import row_identity
from kafka_ingest.db.tables import INCARNATION_COLUMN, TargetShape, row_columns
from kafka_ingest.db.writers.base import TableWriter, UpsertResult
from kafka_ingest.records import CopyPayload, Row, Source

#: The most chunks a slice skips the new-keys attempt for after a refused one.
NEW_KEYS_MAX_PAUSE = 64

#: The staged events into the table, of each the copy with the lowest place in the log
#: (what :func:`~kafka_ingest.db.copy.write_order` keeps), in key order. {d}: the identity's
#: columns (text in byte order), {k}: the primary key; {ic}/{iv}: the incarnation's column
#: and value (%(inc)s) of a source-position identity, else empty.
INSERT_NEW_EVENTS = (
    "INSERT INTO {t} ({c}{ic}) SELECT DISTINCT ON ({d}) {c}{iv} FROM {s}"
    ' ORDER BY {d}, source_topic COLLATE "C", source_partition,'
    " source_offset ON CONFLICT ({k}) DO NOTHING")
#: The default of a table's incarnation column as Postgres prints it ({t}: the table).
INCARNATION_DEFAULT = (
    "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d JOIN pg_attribute a"
    " ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
    " WHERE d.adrelid = %(table)s::regclass AND a.attname = %(column)s")
#: Staged events the table does not hold after the INSERT, one primary-key probe per
#: staged row (a scalar subquery is never turned into a join, so the cost stays per chunk
#: whatever the table's size; as an anti-join the planner, knowing nothing of the fresh
#: staging rows, hashed a scan of the whole table for every chunk). The probe filters the
#: staged rows before ``DISTINCT``, which then sorts only the missing ones (none, when all
#: is well): Postgres never pushes a filter holding a subquery into a ``DISTINCT``
#: subquery, and made distinct first the check cost 1.6 times as much on a chunk of
#: duplicates from other partitions (34 against 21 ms a check, chunks of 20,000 rows).
#: {i}: the identity's columns a staged row holds; {match}: stored row x is staged event s.
MISSING_EVENTS = (
    "SELECT count(*) FROM (SELECT DISTINCT {i} FROM {s} s"
    " WHERE (SELECT true FROM {t} x WHERE {match} LIMIT 1) IS NULL) m")


@dataclass
class NewKeys:
    """Whether a slice's next chunk tries its keys as new (see the module doc): after a
    chunk met a stored key (or its attempt wrote another count than one row per event: a
    letter twice in a replay, a trigger), the next 1, 2, 4, ... (at most
    :data:`NEW_KEYS_MAX_PAUSE`) chunks go straight to ``ON CONFLICT``; a chunk whose keys
    were all new ends the pause. A table that refuses ``COPY`` (row-level security) is
    never tried again in the slice."""

    pause: int = 0
    #: Chunks left to skip.
    skip: int = 0
    #: Postgres refused ``COPY`` into the table itself: every chunk takes the staged path.
    refused: bool = False

    def attempt(self) -> bool:
        if self.refused:
            return False
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


class AppendWriter(TableWriter):
    """An append table's writer (see the module doc)."""

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 shape: TargetShape | None = None, lock_timeout_s: float = 30.0,
                 new_keys: NewKeys | None = None) -> None:
        super().__init__(conn, pipeline, shape=shape, lock_timeout_s=lock_timeout_s)
        #: The slice's memory of stored keys met.
        self.new_keys = new_keys or NewKeys()
        self._identity = row_identity(pipeline)
        #: The incarnation is part of the key: see :meth:`_copies`.
        self._by_position = pipeline.identity_source is IdentitySource.SOURCE_POSITION
        #: The incarnation the table's column defaults to (None: not read yet; 0: none
        #: a chunk can have).
        self._default_incarnation: int | None = None
        self._insert, self._missing = _statements(self.table, self.stage, self._column_list,
                                                  pipeline)

    def _upsert_once(self, rows: list[Row], source: Source | None,
                     encoded: CopyPayload | None) -> UpsertResult:
        n = len(rows)
        # the payload holds one row per event (write_order); rows encoded here are counted
        distinct = (encoded.rows if encoded is not None
                    else len(set(map(self._identity, rows))))
        if self._copies(source) and self.new_keys.attempt():
            inserted = self._copy_new(rows, encoded, distinct)
            if inserted is not None:
                self.new_keys.all_new()
                return UpsertResult(inserted, n - inserted, 0, [])
            self.new_keys.met_stored_key()
        self._stage(rows, encoded)
        params = None
        if self._by_position:
            if source is None:
                raise TypeError("a table identified by the source position needs the rows' "
                                "source (its incarnation)")
            params = {"inc": source.incarnation}
        inserted = self.conn.execute(self._insert, params).rowcount
        # Every staged row not inserted is a duplicate (in the chunk, or already stored).
        # Counting "already stored" with a SELECT before the INSERT misses rows a concurrent
        # transaction (another partition's task) inserts meanwhile: ON CONFLICT skips them.
        # What is checked instead is the outcome: when the INSERT wrote one row per
        # distinct staged event, it wrote each of them; otherwise they are looked up.
        missing = 0 if inserted == distinct else self._scalar(self._missing, params)
        return UpsertResult(inserted, n - inserted, 0, [], missing)

    def _copies(self, source: Source | None) -> bool:
        """Whether the chunk may try its keys as new: any chunk, but for a table identified
        by the source position, only a chunk of the incarnation its column defaults to
        (the ``COPY`` leaves the column out)."""
        if not self._by_position:
            return True
        if self._default_incarnation is None:
            row = self.conn.execute(INCARNATION_DEFAULT, {
                "table": self.table.as_string(self.conn),
                "column": INCARNATION_COLUMN}).fetchone()
            text = str(row[0]) if row and row[0] is not None else ""
            self._default_incarnation = int(text) if text.isdigit() else 0
        return source is not None and source.incarnation == self._default_incarnation

    def _copy_new(self, rows: list[Row], encoded: CopyPayload | None, distinct: int) -> int | None:
        """The chunk's payload (one copy of each event) copied straight into the table as
        new keys: the rows copied, or ``None`` (nothing written) when a key is stored
        already, when the ``COPY`` wrote another count than one row per event (a trigger),
        or when Postgres refuses ``COPY`` into the table (row-level security): ``ON
        CONFLICT`` and its outcome check then decide."""
        try:
            with self.conn.transaction():
                copied = self._copy(self._copy_into_table, rows, encoded)
                if copied != distinct:
                    raise _NotOnePerEvent
        except (psycopg.errors.UniqueViolation, _NotOnePerEvent):
            return None
        except psycopg.errors.FeatureNotSupported:
            self.new_keys.refused = True
            return None
        return copied


def _statements(table: sql.Identifier, stage: sql.Identifier, column_list: sql.Composable,
                pipeline: Pipeline) -> tuple[sql.Composed, sql.Composed]:
    """:data:`INSERT_NEW_EVENTS` and :data:`MISSING_EVENTS` for the pipeline's identity."""
    text = {c.name for c in row_columns(pipeline) if c.value_type == "text"}
    held = [c for c in pipeline.identity_columns if c != INCARNATION_COLUMN]
    by_position = INCARNATION_COLUMN in pipeline.identity_columns
    match = [sql.SQL("x.{c} = s.{c}").format(c=sql.Identifier(c)) for c in held]
    if by_position:
        match.append(sql.SQL("x.{} = %(inc)s").format(sql.Identifier(INCARNATION_COLUMN)))
    names = {
        "t": table, "s": stage, "c": column_list,
        "k": sql.SQL(", ").join(map(sql.Identifier, pipeline.conflict_columns)),
        "d": sql.SQL(", ").join(
            sql.SQL('{} COLLATE "C"' if c in text else "{}").format(sql.Identifier(c))
            for c in held),
        "i": sql.SQL(", ").join(map(sql.Identifier, held)),
        "match": sql.SQL(" AND ").join(match),
        "ic": sql.SQL(", {}").format(sql.Identifier(INCARNATION_COLUMN)) if by_position
        else sql.SQL(""),
        "iv": sql.SQL(", %(inc)s") if by_position else sql.SQL(""),
    }
    return sql.SQL(INSERT_NEW_EVENTS).format(**names), sql.SQL(MISSING_EVENTS).format(**names)


__all__ = ["INCARNATION_DEFAULT", "INSERT_NEW_EVENTS", "MISSING_EVENTS", "NEW_KEYS_MAX_PAUSE",
           "AppendWriter", "NewKeys"]
