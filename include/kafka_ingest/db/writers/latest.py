"""Latest tables: one version per key, the newest wins.

The staged rows of a chunk are classified against the stored version of their key
(:data:`LATEST_VERDICTS`), the newest of each key replaces an older stored one (``ON
CONFLICT ... DO UPDATE ... WHERE`` older), and the outcome is checked against the table.
A version is ordered by the pipeline's event time (then its place in the log), or by its
place in the log alone (``order_by: source_offset``). A place in the log is (incarnation,
offset) within one partition of one topic: a topic deleted and created again is a new
incarnation whose records are newer than every record of the old one
(:class:`~kafka_ingest.records.Source`), while offsets of two partitions, or two topics,
order nothing. A record log order cannot place against its key's stored version (the key
came from another partition: partitions were added, or producers hash keys differently;
or from another topic) is returned :class:`~kafka_ingest.errors.Unorderable` for the DLQ,
never applied in a guessed order nor counted stale.

The counts are the classification's (``inserted`` the INSERT's row count): a version the
classification wrote that the INSERT did not lost to a newer one committed meanwhile
(stale), which the outcome check proves (it counts the row missing otherwise). Each
statement decides from its own snapshot: when the outcome check finds a row missing (or
the unorderable rows listed are not the ones counted), a transaction of another partition
committed a version of the key meanwhile (its first records reached two partitions at
once), so the chunk is decided again from the table as it is now (in a savepoint, up to
:data:`RACE_ATTEMPTS` times), where that record is unorderable; a row still missing then
is reported.

The statements are named templates, formatted once per slice. Placeholders: {t} the
table, {s} the staging table, {m} the marker table (:mod:`~kafka_ingest.db.writers.deleting`),
{k} the key column, {o} the event-time column, {c} the row columns, {u} the updates of ON
CONFLICT; the marker fragments are empty for tables without markers. Parameters:
%(topic)s and %(inc)s, the source the staged rows came from (one topic, one incarnation:
a chunk, or one group of a replay's letters).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import psycopg
from psycopg import sql

from kafka_ingest.config import (
    LOG_ORDER,
    UNAVAILABLE,
    UNAVAILABLE_DATES,
    UNAVAILABLE_JSON,
    UNAVAILABLE_UUID,
    IdentitySource,
    Pipeline,
)
from kafka_ingest.db.tables import TargetShape
from kafka_ingest.db.writers.base import TableWriter, UpsertResult
from kafka_ingest.errors import DataError, UnavailableValue, Unorderable
from kafka_ingest.records import CopyPayload, Row, Source, row_source

log = logging.getLogger(__name__)

#: What each staged row of a latest chunk becomes, in this order of precedence:
#: ``copy``: the same record twice in the chunk; ``unorderable``: log order cannot place
#: it against another version of its key (dead-lettered); ``stored``: the stored version
#: is this record (a replay); ``stale``: the stored version or deletion marker is at
#: least as new; ``superseded``: a newer version of its key is in the chunk; ``write``:
#: the newest version of its key, newer than the stored one, but ``unavailable``: such a
#: version of a change event that leaves a column out (Debezium's placeholder,
#: :func:`kept_columns`) while the table holds no row of its key to keep the column from
#: (dead-lettered: writing it would store the placeholder).
LATEST_VERDICTS = ("copy", "unorderable", "stored", "stale", "superseded", "unavailable",
                   "write")

#: How many times a chunk's rows are classified and written when a concurrent transaction
#: changed what the classification decided from (see the module doc).
RACE_ATTEMPTS = 3

#: Log order: the staged rows with their copies, the newest place per key, whether the
#: key came from two partitions, and the key's stored row and marker (one probe each by
#: the primary key: LATERAL ... LIMIT 1 stays a nested loop whatever the table's size).
LOG_STAGED = """
WITH s AS (
  SELECT {k}, source_partition AS p, source_offset AS o,
         row_number() OVER (PARTITION BY {k}, source_partition, source_offset) AS copy,
         dense_rank() OVER (PARTITION BY {k} ORDER BY source_offset DESC) AS newest,
         min(source_partition) OVER w <> max(source_partition) OVER w AS split{held}
  FROM {s} WINDOW w AS (PARTITION BY {k})),
f AS (
  SELECT s.*, x.source_topic AS xt, x.source_incarnation AS xi, x.source_partition AS xp,
         x.source_offset AS xo{marker_columns}
  FROM s LEFT JOIN LATERAL (SELECT source_topic, source_incarnation, source_partition,
                                   source_offset FROM {t} WHERE {lk} = {sk} LIMIT 1) x ON true
  {marker_join}),
v AS (
  SELECT f.*, CASE
    WHEN copy > 1 THEN 'copy'
    WHEN split OR (xt IS NOT NULL AND NOT (xt = %(topic)s AND (xi <> %(inc)s OR xp = p)))
         {marker_unorderable} THEN 'unorderable'
    WHEN xt = %(topic)s AND xi = %(inc)s AND xp = p AND xo = o THEN 'stored'
    WHEN (xt IS NOT NULL AND (xi, xo) > (%(inc)s, o)) {marker_stale} {truncate_stale}
         THEN 'stale'
    WHEN newest > 1 THEN 'superseded'
    {held_verdict}
    ELSE 'write' END AS verdict
  FROM f)
"""
LOG_MARKER_COLUMNS = (", m.source_topic AS mt, m.source_incarnation AS mi,"
                       " m.source_partition AS mp, m.source_offset AS mo")
LOG_MARKER_JOIN = ("LEFT JOIN LATERAL (SELECT source_topic, source_incarnation,"
                    " source_partition, source_offset FROM {m} WHERE {lk} = {sk} LIMIT 1) m"
                    " ON true")
LOG_MARKER_UNORDERABLE = ("OR (mt IS NOT NULL AND NOT (mt = %(topic)s"
                           " AND (mi <> %(inc)s OR mp = p)))")
LOG_MARKER_STALE = "OR (mt IS NOT NULL AND (mi, mo) >= (%(inc)s, o))"

#: Event-time order: copies are the same record of a key (see :func:`same_record`: {ids}
#: the identity's columns, {sids}/{lids}/{xids} them staged, looked up and stored,
#: {stored} the two equal);
#: versions ordered by (event time, incarnation, offset, partition); nothing is
#: unorderable.
TIME_STAGED = """
WITH s AS (
  SELECT {k}{sids}, {o} AS ts, source_partition AS p, source_offset AS o,
         row_number() OVER (PARTITION BY {k}, {ids}
                            ORDER BY source_offset DESC, source_partition DESC) AS copy,
         dense_rank() OVER (PARTITION BY {k} ORDER BY {o} DESC, source_offset DESC,
                                                      source_partition DESC) AS newest
  FROM {s}),
f AS (
  SELECT s.*, x.{o} AS xts, x.source_incarnation AS xi, x.source_offset AS xo,
         x.source_partition AS xp{xids}
  FROM s LEFT JOIN LATERAL (SELECT {o}, source_incarnation, source_offset,
                                   source_partition{lids} FROM {t} WHERE {lk} = {sk} LIMIT 1) x
  ON true),
v AS (
  SELECT f.*, CASE
    WHEN copy > 1 THEN 'copy'
    WHEN {stored} THEN 'stored'
    WHEN xp IS NOT NULL AND (xts, xi, xo, xp) >= (ts, %(inc)s, o, p) THEN 'stale'
    WHEN newest > 1 THEN 'superseded'
    ELSE 'write' END AS verdict
  FROM f)
"""
VERDICTS = "SELECT verdict, count(*) FROM v GROUP BY verdict"
UNORDERABLE = ("SELECT p, o, split, xt, xi, xp, xo{marker_details} FROM v"
                " WHERE verdict = 'unorderable'")
#: The ``unavailable`` rows ({held_names}: the columns each leaves out, of staged row x).
UNAVAILABLE_ROWS = """
SELECT DISTINCT ON (v.p, v.o) v.p, v.o, {held_names} FROM v
JOIN {s} x ON x.source_partition = v.p AND x.source_offset = v.o
WHERE v.verdict = 'unavailable'
"""

#: Write the newest version of each key that is newer than the stored one; the ON
#: CONFLICT's WHERE decides against the row as it is when the key is locked.
LOG_INSERT = """
INSERT INTO {t} ({c}, source_incarnation)
SELECT DISTINCT ON ({k}) {c}, %(inc)s FROM (
  SELECT *, min(source_partition) OVER w <> max(source_partition) OVER w AS split
  FROM {s} WINDOW w AS (PARTITION BY {k})) s
WHERE NOT split
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {sk} AND (NOT (x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = s.source_partition))
      OR (x.source_incarnation, x.source_offset) >= (%(inc)s, s.source_offset)))
  {marker_excludes} {truncate_excludes} {held_excludes}
ORDER BY {k}, source_offset DESC
ON CONFLICT ({k}) DO UPDATE SET {u}, source_incarnation = EXCLUDED.source_incarnation,
  ingested_at = now()
WHERE {t}.source_topic = EXCLUDED.source_topic
  AND ({t}.source_incarnation <> EXCLUDED.source_incarnation
       OR {t}.source_partition = EXCLUDED.source_partition)
  AND ({t}.source_incarnation, {t}.source_offset)
      < (EXCLUDED.source_incarnation, EXCLUDED.source_offset)
"""
LOG_MARKER_EXCLUDES = """AND NOT EXISTS (SELECT 1 FROM {m} m WHERE {mk} = {sk}
      AND (NOT (m.source_topic = %(topic)s
                AND (m.source_incarnation <> %(inc)s OR m.source_partition = s.source_partition))
           OR (m.source_incarnation, m.source_offset) >= (%(inc)s, s.source_offset)))"""
#: A chunk with ``unavailable`` rows writes no version of their keys (%(held_p)s,
#: %(held_o)s: their places): the older versions of such a key in the chunk are superseded
#: by the dead-lettered one.
HELD_EXCLUDES = """AND NOT EXISTS (SELECT 1 FROM {s} x
      JOIN unnest(%(held_p)s::int4[], %(held_o)s::int8[]) h(p, o)
        ON x.source_partition = h.p AND x.source_offset = h.o WHERE {xk} = {sk})"""
TIME_INSERT = """
INSERT INTO {t} ({c}, source_incarnation)
SELECT DISTINCT ON ({k}) {c}, %(inc)s FROM {s} s
WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {sk} AND {same})
ORDER BY {k}, {o} DESC, source_offset DESC, source_partition DESC
ON CONFLICT ({k}) DO UPDATE SET {u}, source_incarnation = EXCLUDED.source_incarnation,
  ingested_at = now()
WHERE ({t}.{o}, {t}.source_incarnation, {t}.source_offset, {t}.source_partition)
      < (EXCLUDED.{o}, EXCLUDED.source_incarnation, EXCLUDED.source_offset,
         EXCLUDED.source_partition)
"""
#: The outcome: staged rows (but copies and the unorderable ones) whose key holds neither
#: this record nor a version at least as new, in the table or in a marker: must be 0.
LOG_MISSING = """
SELECT count(*) FROM (SELECT DISTINCT {k}, source_partition, source_offset FROM {s}) s
WHERE NOT EXISTS (SELECT 1 FROM unnest(%(skip_p)s::int4[], %(skip_o)s::int8[]) u(p, o)
                  WHERE u.p = s.source_partition AND u.o = s.source_offset)
  AND NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {sk} AND x.source_topic = %(topic)s
      AND (x.source_incarnation <> %(inc)s OR x.source_partition = s.source_partition)
      AND (x.source_incarnation, x.source_offset) >= (%(inc)s, s.source_offset))
  {marker_holds} {truncate_holds}
"""
LOG_MARKER_HOLDS = """AND NOT EXISTS (SELECT 1 FROM {m} m WHERE {mk} = {sk}
      AND m.source_topic = %(topic)s
      AND (m.source_incarnation <> %(inc)s OR m.source_partition = s.source_partition)
      AND (m.source_incarnation, m.source_offset) >= (%(inc)s, s.source_offset))"""
#: A mirror's truncate points (``on_truncate: truncate``; migration 0011): a record of
#: partition {p} at offset {o} placed before its partition's newest truncate, or from an
#: older incarnation of the topic than a truncate of any partition, is older than the
#: truncate (which deleted its key's row, if the table held it): stale, like a record
#: older than its key's deletion marker. The first EXISTS names no row, so Postgres
#: evaluates it once a statement (an InitPlan): a topic never truncated costs no probe
#: per row; one truncated costs a probe of a table of a row per partition.
TRUNCATED_BEFORE = """(EXISTS (SELECT 1 FROM truncate_points
                WHERE pipeline = %(pipeline)s AND source_topic = %(topic)s)
    AND EXISTS (SELECT 1 FROM truncate_points tp
      WHERE tp.pipeline = %(pipeline)s AND tp.source_topic = %(topic)s
        AND (tp.source_incarnation > %(inc)s OR (tp.source_incarnation = %(inc)s
             AND tp.source_partition = {p} AND tp.source_offset > {o}))))"""
#: The truncate fragments of the log-order statements (see :data:`TRUNCATED_BEFORE`).
TRUNCATE_POINTS = {
    "truncate_stale": "OR " + TRUNCATED_BEFORE.format(p="p", o="o"),
    "truncate_excludes": "AND NOT " + TRUNCATED_BEFORE.format(
        p="s.source_partition", o="s.source_offset"),
    "truncate_holds": "AND NOT " + TRUNCATED_BEFORE.format(
        p="s.source_partition", o="s.source_offset"),
}
TIME_MISSING = """
SELECT count(*) FROM {s} s
WHERE NOT EXISTS (SELECT 1 FROM {t} x WHERE {xk} = {sk} AND ({same}
      OR (x.{o}, x.source_incarnation, x.source_offset, x.source_partition)
         >= (s.{o}, %(inc)s, s.source_offset, s.source_partition)))
"""


def same_record(pipeline: Pipeline) -> dict[str, sql.Composable]:
    """What tells, in event-time order, that a latest table's stored version is a staged
    record (a replay of it): its identity's columns, equal column by column; for a table
    identified by its record key, which is the entity key every version shares, its place
    in the log (partition, offset, and the staged rows' incarnation; one topic writes a
    latest table). The fragments of :data:`TIME_STAGED` ({ids}, {sids}, {lids}, {xids},
    {stored}) and of the statements on stored row ``x`` and staged row ``s`` ({same})."""
    if pipeline.identity_source is IdentitySource.RECORD_KEY:
        place = sql.SQL("source_partition, source_offset")
        return {"ids": place, "sids": sql.SQL(""), "lids": sql.SQL(""), "xids": sql.SQL(""),
                "stored": sql.SQL("xp = p AND xo = o AND xi = %(inc)s"),
                "same": sql.SQL("x.source_partition = s.source_partition AND x.source_offset"
                                " = s.source_offset AND x.source_incarnation = %(inc)s")}
    columns = [sql.Identifier(c) for c in pipeline.identity_columns]
    named = [(c, sql.Identifier(f"sid{n}"), sql.Identifier(f"xid{n}"))
             for n, c in enumerate(columns)]
    return {
        "ids": sql.SQL(", ").join(columns),
        "sids": sql.SQL("").join(sql.SQL(", {} AS {}").format(c, i) for c, i, _ in named),
        "lids": sql.SQL("").join(sql.SQL(", {} AS {}").format(c, x) for c, _, x in named),
        "xids": sql.SQL("").join(sql.SQL(", x.{}").format(x) for _, _, x in named),
        "stored": sql.SQL(" AND ").join(sql.SQL("{} = {}").format(x, i) for _, i, x in named),
        "same": sql.SQL(" AND ").join(sql.SQL("x.{c} = s.{c}").format(c=c) for c in columns),
    }


#: The key's places in the statements: {k} its columns (a list: select lists, PARTITION
#: BY, ON CONFLICT), {lk} them as one value, {sk}/{xk}/{mk} that of the staged row s, the
#: stored row x, the marker m; the tombstones' (:mod:`~kafka_ingest.db.writers.deleting`):
#: {kk} the unnested columns k0, k1, ..., {dk} them as the value of d, {dkl} as its
#: columns, {karrays} the arrays they are unnested from, each cast to its column's type.
_KEY_PLACES = ("k", "lk", "sk", "xk", "mk", "kk", "dk", "dkl", "karrays")


def key_places(pipeline: Pipeline) -> dict[str, sql.Composable]:
    """The key's places (:data:`_KEY_PLACES`) for a latest table keyed by
    ``upsert.keys``: one column, or several (a composite key, compared as a row value)."""
    keys = pipeline.upsert.keys
    types = {c.name: c.value_type for c in pipeline.sink_columns}
    one = len(keys) == 1

    def value(parts: list[sql.Composable]) -> sql.Composable:
        return parts[0] if one else sql.SQL("({})").format(sql.SQL(", ").join(parts))

    def qualified(alias: str) -> sql.Composable:
        return value([sql.SQL(f"{alias}.{{}}").format(sql.Identifier(k)) for k in keys])

    unnested = [sql.SQL(f"k{n}") for n in range(len(keys))]
    return {
        "k": sql.SQL(", ").join(map(sql.Identifier, keys)),
        "lk": value([sql.Identifier(k) for k in keys]),
        "sk": qualified("s"), "xk": qualified("x"), "mk": qualified("m"),
        "kk": sql.SQL(", ").join(unnested),
        "dk": value([sql.SQL(f"d.k{n}") for n in range(len(keys))]),
        "dkl": sql.SQL(", ").join(sql.SQL(f"d.k{n}") for n in range(len(keys))),
        "karrays": sql.SQL(", ").join(
            sql.SQL(f"%(k{n})s::{{}}[]").format(sql.SQL(types.get(k, "text")))
            for n, k in enumerate(keys)),
    }


#: A change event's placeholder of a column Debezium left out, by the column's value type
#: (the types whose values Postgres TOASTs; see :mod:`~kafka_ingest.decode.envelopes`).
_UNAVAILABLE: dict[str, sql.Composable] = {
    "text": sql.Literal(UNAVAILABLE),
    "bytea": sql.SQL("convert_to({}, 'UTF8')").format(sql.Literal(UNAVAILABLE)),
    "jsonb": sql.SQL("{}::jsonb").format(sql.Literal(json.dumps(list(UNAVAILABLE_JSON)))),
    # arrays: of text, the placeholder alone; of integers, the placeholder's bytes
    "text[]": sql.SQL("{}::text[]").format(sql.Literal(list(UNAVAILABLE_JSON))),
    "int4[]": sql.SQL("{}::int4[]").format(sql.Literal(list(UNAVAILABLE.encode()))),
    "int8[]": sql.SQL("{}::int8[]").format(sql.Literal(list(UNAVAILABLE.encode()))),
    # of dates, those bytes as days; of uuids, the name-based UUID of those bytes
    "date[]": sql.SQL("{}::date[]").format(sql.Literal(list(UNAVAILABLE_DATES))),
    "uuid[]": sql.SQL("{}::uuid[]").format(sql.Literal([UNAVAILABLE_UUID])),
}


def kept_columns(pipeline: Pipeline) -> dict[str, sql.Composable]:
    """The columns an update keeps when they carry the placeholder of a change event
    (``envelope: debezium``: a TOASTed value the update left unchanged), each with its
    placeholder as SQL; none for other pipelines."""
    if pipeline.envelope is None:
        return {}
    return {c.name: _UNAVAILABLE[c.value_type] for c in pipeline.sink_columns
            if c.value_type in _UNAVAILABLE}


def left_out(pipeline: Pipeline) -> dict[str, sql.Composable]:
    """What finds a staged row that carries a placeholder of :func:`kept_columns`: {held},
    a column ``held`` of :data:`LOG_STAGED`'s staged rows, and {held_verdict}, its verdict
    (none for a table without such columns); {held_names}, the names of the columns staged
    row ``x`` carries one in (:data:`UNAVAILABLE_ROWS`)."""
    kept = kept_columns(pipeline)
    if not kept:
        return {"held": sql.SQL(""), "held_verdict": sql.SQL(""),
                "held_names": sql.SQL("NULL::text[]")}

    def holds(name: str, *alias: str) -> sql.Composable:
        return sql.SQL("{} = {}").format(sql.Identifier(*alias, name), kept[name])

    return {
        "held": sql.SQL(", coalesce({}, false) AS held").format(
            sql.SQL(" OR ").join(holds(name) for name in kept)),
        "held_verdict": sql.SQL("WHEN held AND xt IS NULL THEN 'unavailable'"),
        "held_names": sql.SQL("array_remove(ARRAY[{}], NULL)").format(sql.SQL(", ").join(
            sql.SQL("CASE WHEN {} THEN {} END").format(holds(name, "x"), sql.Literal(name))
            for name in kept)),
    }


def where(topic: Any, incarnation: Any, partition: Any, offset: Any) -> str:
    return f"topic {topic!r} partition {partition} (incarnation {incarnation}) offset {offset}"


def unorderable(key: Any, here: str, split: bool, stored: Sequence[Any],
                 marker: Sequence[Any]) -> Unorderable:
    """Why a record of ``key`` at ``here`` cannot be placed, naming what it met."""
    if split:
        met = "a record of the same key from another partition in the same chunk"
    elif stored and stored[0] is not None:
        met = f"its stored row, from {where(*stored)}"
    else:
        met = f"its deletion marker, from {where(*marker)}"
    return Unorderable(
        f"key {key!r} at {here}: log order cannot place it against {met} (offsets order "
        "a key's records only within one partition of one topic: were partitions added, "
        "or do producers hash keys differently?); to take it, delete the key's row (and "
        "marker) and replay this letter")



#: The marker parts of the log-order statements; none for a table without markers.
NO_MARKERS = {"marker_columns": "", "marker_join": "", "marker_unorderable": "",
              "marker_stale": "", "marker_details": "", "marker_excludes": "",
              "marker_holds": "", "truncate_stale": "", "truncate_excludes": "",
              "truncate_holds": "", "held_excludes": ""}


class Raced(Exception):
    """A chunk's statements decided from different tables: decide it again."""


class LatestWriter(TableWriter):
    """A latest table's writer (see the module doc)."""

    #: The marker fragments of the log-order statements.
    MARKERS: ClassVar[dict[str, str]] = NO_MARKERS

    def __init__(self, conn: psycopg.Connection[Any], pipeline: Pipeline, *,
                 shape: TargetShape | None = None, lock_timeout_s: float = 30.0) -> None:
        super().__init__(conn, pipeline, shape=shape, lock_timeout_s=lock_timeout_s)
        #: The key's columns (several: a source table's composite primary key).
        self.keys = pipeline.upsert.keys
        self._key_at = [self.columns.index(k) for k in self.keys]
        self.log_order = pipeline.upsert.order_by == LOG_ORDER
        staged = LOG_STAGED if self.log_order else TIME_STAGED
        self._verdicts = self.statement(staged + VERDICTS)
        self._unorderable = self.statement(staged + UNORDERABLE)
        self._insert = self.statement(LOG_INSERT if self.log_order else TIME_INSERT)
        self._held_rows = self.statement(staged + UNAVAILABLE_ROWS)
        self._insert_holding = self.statement(LOG_INSERT.replace("{held_excludes}",
                                                                 HELD_EXCLUDES))
        self._missing = self.statement(LOG_MISSING if self.log_order else TIME_MISSING)

    def statement(self, template: str) -> sql.Composed:
        """One of the named statements, formatted for this table."""
        keys = {name: "{" + name + "}" for name in _KEY_PLACES}
        text = template.format(**self._fragments(), t="{t}", s="{s}", m="{m}", o="{o}",
                               c="{c}", u="{u}", ids="{ids}", sids="{sids}", lids="{lids}",
                               xids="{xids}", stored="{stored}", same="{same}",
                               held="{held}", held_verdict="{held_verdict}",
                               held_names="{held_names}", **keys)
        kept = kept_columns(self.pipeline)
        updates = sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) if c not in kept
            else sql.SQL("{c} = CASE WHEN EXCLUDED.{c} = {p} THEN {t}.{c} ELSE EXCLUDED.{c} "
                         "END").format(c=sql.Identifier(c), p=kept[c], t=self.table)
            for c in self.columns if c not in self.keys)
        return sql.SQL(text).format(
            t=self.table, s=self.stage, m=self._marker,
            o=sql.Identifier(self.pipeline.upsert.order_by), c=self._column_list, u=updates,
            **key_places(self.pipeline), **same_record(self.pipeline),
            **left_out(self.pipeline))

    def _fragments(self) -> dict[str, str]:
        """The marker (and truncate) fragments of the statements."""
        return {**NO_MARKERS, **self.MARKERS} if self.log_order else NO_MARKERS

    @property
    def _marker(self) -> sql.Identifier:
        return sql.Identifier("no marker table")  # used by no statement of this writer

    def _upsert_once(self, rows: list[Row], source: Source | None,
                     encoded: CopyPayload | None) -> UpsertResult:
        if source is None:
            raise TypeError("a latest table's upsert needs the rows' source (topic and "
                            "incarnation)")
        self._stage(rows, encoded)
        params: dict[str, Any] = {"topic": source.topic, "inc": source.incarnation,
                                  "pipeline": self.pipeline.name}
        for attempt in range(1, RACE_ATTEMPTS + 1):
            try:
                with self.conn.transaction():  # a savepoint: a race rolls back to here
                    return self._write_staged(rows, source, params,
                                              last=attempt == RACE_ATTEMPTS)
            except Raced:
                log.info("%s: a version of a key of this chunk was committed from another "
                         "partition meanwhile; deciding the chunk again", self.pipeline.name)
        raise AssertionError("the last attempt reports what it found")  # pragma: no cover

    def _write_staged(self, rows: list[Row], source: Source, params: dict[str, Any], *,
                      last: bool) -> UpsertResult:
        """Classify the staged rows, write them, and check the outcome; raise
        :class:`Raced` (unless ``last``) when another transaction changed the table
        between these statements (see the module doc)."""
        verdicts: Counter[str] = Counter(dict.fromkeys(LATEST_VERDICTS, 0))
        for verdict, n in self.conn.execute(self._verdicts, params):
            verdicts[verdict] = int(n)
        rejected = self._unorderable_rows(rows, source, params) if verdicts["unorderable"] \
            else []
        held = self._unavailable_rows(rows, source, params) if verdicts["unavailable"] else []
        insert = self._insert
        skipped = [row_source(row) for row, _ in rejected]
        if held:
            places = [row_source(row) for row, _ in held]
            params = {**params, "held_p": [s.partition for s in places],
                      "held_o": [s.offset for s in places]}
            insert = self._insert_holding
            keys = {self._key(row) for row, _ in held}  # none of their rows is written
            skipped += [row_source(row) for row in rows if self._key(row) in keys]
        inserted = self.conn.execute(insert, params).rowcount
        self._after_insert(inserted)
        missing = self._scalar(self._missing, {**params,
                                               "skip_p": [s.partition for s in skipped],
                                               "skip_o": [s.offset for s in skipped]})
        if not last and (missing or len(rejected) != verdicts["unorderable"]
                         or len(held) != verdicts["unavailable"]):
            raise Raced
        rejected += held
        lost = verdicts["write"] - inserted  # see the module doc
        return UpsertResult(inserted, verdicts["copy"] + verdicts["stored"],
                            verdicts["stale"] + verdicts["superseded"] + lost, rejected,
                            missing)

    def _after_insert(self, inserted: int) -> None:
        """What follows the INSERT in the chunk's transaction (deleting tables: markers)."""

    def _key(self, row: Row) -> Any:
        """A row's key: its value, or a tuple of them (a composite key)."""
        return (row[self._key_at[0]] if len(self._key_at) == 1
                else tuple(row[i] for i in self._key_at))

    def _unavailable_rows(self, rows: list[Row], source: Source,
                          params: dict[str, Any]) -> list[tuple[Row, DataError]]:
        """The staged rows whose key the table holds no row of, that leave columns out."""
        return [(row, UnavailableValue(
            f"key {self._key(row)!r} at {here}: the change leaves {', '.join(names)} out "
            "(Debezium's placeholder for a TOASTed value it did not change) and the mirror "
            "has no row of this key to keep their values: the row's earlier change was "
            "dead-lettered, or is older than the offsets the mirror began at; replay that "
            "letter, then this one (a later change carrying the values writes the row too)"))
            for row, here, (names,) in self._staged(self._held_rows, rows, source, params)]

    def _unorderable_rows(self, rows: list[Row], source: Source,
                          params: dict[str, Any]) -> list[tuple[Row, DataError]]:
        """The staged rows log order cannot place, each with what it met."""
        return [(row, unorderable(self._key(row), here, split, stored[:4], stored[4:]))
                for row, here, (split, *stored) in self._staged(self._unorderable, rows,
                                                                 source, params)]

    def _staged(self, statement: sql.Composed, rows: list[Row], source: Source,
                params: dict[str, Any]) -> Iterator[tuple[Row, str, tuple[Any, ...]]]:
        """The chunk's rows at the places ``statement`` answers (partition and offset
        first), each with where it is and the rest of its answer."""
        by_place = {(row_source(r).partition, row_source(r).offset): r for r in rows}
        for p, o, *rest in self.conn.execute(statement, params):
            yield by_place[(p, o)], where(source.topic, source.incarnation, p, o), tuple(rest)


__all__ = ["LATEST_VERDICTS", "NO_MARKERS", "RACE_ATTEMPTS", "TRUNCATED_BEFORE",
           "TRUNCATE_POINTS", "LatestWriter", "Raced", "kept_columns", "key_places",
           "left_out", "same_record", "unorderable", "where"]
