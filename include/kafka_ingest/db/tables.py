"""Target tables from contracts: their columns, the DDL that makes and evolves them, and
the drift check that runs before any data moves.

A pipeline's table is the contract's columns, the record-key and header columns, then the
provenance columns every table has; its primary key is the pipeline's identity
(``append``: ``event_id`` unless it says otherwise, see
:class:`~kafka_ingest.config.Identity`), the entity key (``latest``), or the identity and
the partitioning column (a partitioned table). ``latest`` tables, and the tables of
pipelines identified by the source position, also say which incarnation of the topic each
row came from (``source_incarnation``, see :class:`~kafka_ingest.records.Source`): a topic
created again starts its offsets at 0 again. Pipelines that delete
on tombstones get a marker table beside theirs. Names made from the table's (the marker
table's, the staging table's) fit Postgres' 63 bytes: past it, a hash of the whole name
keeps them apart (:func:`derived_name`); a marker table kept under the name Postgres cut
before is renamed, so its markers stay in force.

The planner only ever adds: ``CREATE TABLE`` for a missing table, ``ADD COLUMN`` for a
column the contract gained (nullable: a new field is optional). It never drops a column,
never changes a type and never sets NOT NULL: those are :class:`Drift` the user resolves,
and the message says how. :func:`check_table` compares the table with the contract when a
run is planned, so a mismatch fails the run naming the column, instead of a COPY failing
mid-slice. The check also refuses what the write path cannot write correctly: a
generated or identity column under a column the pipeline fills, ``ingested_at`` that
``COPY`` cannot leave to its default, a unique key ``ON CONFLICT`` cannot use (deferrable,
invalid), and ``INSERT``/``UPDATE`` rules (``COPY`` skips rules; ``ON CONFLICT`` refuses
them). :func:`target_shape` reads, when a slice starts, what the table takes now: a
column widened since (``integer`` to ``bigint``) gets values of its own width.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from kafka_ingest.config import IdentitySource, Pipeline, UpsertMode
from kafka_ingest.contracts.columns import Column, ddl_type, millis_to_pg
from kafka_ingest.contracts.declared import IMPLICIT_ID
from kafka_ingest.db.schema import MIGRATION_LOCK
from kafka_ingest.errors import SchemaDrift
from kafka_ingest.records import INGESTED_AT, PROVENANCE_COLUMNS

#: The suffix of the marker table of a pipeline that deletes on tombstones.
MARKER_SUFFIX = "_tombstones"
#: The prefix of a slice's temporary staging table.
STAGE_PREFIX = "stage_"
#: The longest identifier Postgres keeps (NAMEDATALEN - 1 bytes); longer ones are cut.
MAX_IDENTIFIER = 63
#: A ``latest`` table's column naming the incarnation of the topic a row came from. Rows
#: stored before incarnations were kept belong to the first (the column's default).
INCARNATION_COLUMN = "source_incarnation"
INCARNATION_DDL = f'"{INCARNATION_COLUMN}" integer NOT NULL DEFAULT 1'
#: A marker table's columns besides the key and the source topic, as ``format_type()``
#: prints them, and their DDL (the ones added later have defaults, for markers stored
#: before them): where its tombstone was, as the provenance columns say it.
_MARKER_COLUMNS = {
    **{c.name: (ddl_type(c.type, None), f'"{c.name}" {ddl_type(c.type, None)} NOT NULL')
       for c in PROVENANCE_COLUMNS if c.name in ("source_partition", "source_offset")},
    "deleted_at": ("timestamp with time zone",
                   '"deleted_at" timestamp with time zone NOT NULL DEFAULT now()'),
    INCARNATION_COLUMN: ("integer", INCARNATION_DDL),
}
#: How long a DDL statement waits for a table's lock (then the change fails, retriable).
DDL_LOCK_TIMEOUT_MS = "5000"


def provenance_columns() -> tuple[Column, ...]:
    """The provenance columns (:data:`~kafka_ingest.records.PROVENANCE_COLUMNS`), in row
    order (``ingested_at`` is the table's own). The Kafka timestamp (epoch milliseconds)
    is converted before it travels, as ``Contract.CONVERTED`` values are: into a binary
    timestamptz, inline in each row's making (:func:`kafka_ingest.decode.validate.row_builder`)."""
    return tuple(
        Column(name=c.name, ddl=ddl_type(c.type, None),
               value_type="int8" if c.epoch_ms else c.type, nullable=c.nullable,
               convert=millis_to_pg if c.epoch_ms else None)
        for c in PROVENANCE_COLUMNS)


def row_columns(pipeline: Pipeline) -> tuple[Column, ...]:
    """Every column a row fills, in row order: what the staging table holds."""
    return (*pipeline.sink_columns, *provenance_columns())


def derived_name(table: str, *, prefix: str = "", suffix: str = "") -> str:
    """``prefix + table + suffix``, or, when that is longer than Postgres keeps (it would
    cut it, and two tables sharing a long prefix would share the name, or the marker
    table of a 63-character table would be the table itself), the table's name cut to
    fit with 8 hex digits of a hash of the whole name before the suffix."""
    name = f"{prefix}{table}{suffix}"
    if len(name.encode()) <= MAX_IDENTIFIER:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    room = MAX_IDENTIFIER - len(prefix) - len(suffix) - len(digest) - 1
    return f"{prefix}{table.encode()[:room].decode(errors='ignore')}_{digest}{suffix}"


def marker_table(pipeline: Pipeline) -> str | None:
    """The table of a deleting pipeline's deletion markers (see
    :mod:`kafka_ingest.db.writers.deleting`)."""
    if not pipeline.deletes:
        return None
    return derived_name(pipeline.table, suffix=MARKER_SUFFIX)


def stage_table(pipeline: Pipeline) -> str:
    """The temporary table a slice stages a chunk's rows in."""
    return derived_name(pipeline.table, prefix=STAGE_PREFIX)


def orders_versions(pipeline: Pipeline) -> bool:
    """Whether the table keeps one version per key, ordered (``latest``): its rows carry
    their topic's incarnation."""
    return pipeline.upsert.mode is UpsertMode.LATEST


def carries_incarnation(pipeline: Pipeline) -> bool:
    """Whether the table's rows say which incarnation of the topic they came from: those
    of a table that orders versions, and of one identified by the source position (whose
    key it is part of)."""
    return orders_versions(pipeline) \
        or pipeline.identity_source is IdentitySource.SOURCE_POSITION


def runtime_tables(pipelines: Iterable[Pipeline]) -> tuple[list[str], list[str]]:
    """The target tables the runtime role writes, and those it also deletes from (the
    tables of pipelines that delete on tombstones, and their marker tables)."""
    tables, deleting = [], []
    for pipeline in pipelines:
        tables.append(pipeline.table)
        if (marker := marker_table(pipeline)) is not None:
            deleting += [pipeline.table, marker]
    return tables, deleting


@dataclass(frozen=True)
class Change:
    """One DDL statement of a plan, and why it is needed."""

    table: str
    why: str
    statement: str


@dataclass
class TablePlan:
    """What one pipeline's tables need: changes to apply, and drift no change may fix."""

    pipeline: str
    changes: list[Change] = field(default_factory=list)
    #: What the planner will not change and the pipeline cannot run with.
    drift: list[str] = field(default_factory=list)
    #: What a user should know about a change (it does not block it).
    notes: list[str] = field(default_factory=list)


def _column_sql(column: Column, *, for_create: bool) -> str:
    null = "" if column.nullable or not for_create else " NOT NULL"
    return f"{_quote(column.name)} {column.ddl}{null}"


def _quote(name: str) -> str:
    return sql.Identifier(name).as_string(None)


#: ``ingested_at``: every target table's, filled by its default (``COPY`` leaves it out).
INGESTED_AT_DDL = f'"{INGESTED_AT}" timestamp with time zone NOT NULL DEFAULT now()'


def create_statements(pipeline: Pipeline) -> list[Change]:
    """The DDL that makes a pipeline's tables from nothing."""
    table = pipeline.table
    columns = [_column_sql(c, for_create=True) for c in row_columns(pipeline)]
    if carries_incarnation(pipeline):
        columns.append(INCARNATION_DDL)
    columns.append(INGESTED_AT_DDL)
    key = ", ".join(map(_quote, pipeline.conflict_columns))
    body = ",\n    ".join([*columns, f"PRIMARY KEY ({key})"])
    tail = (f" PARTITION BY RANGE ({_quote(pipeline.partition_by.column)})"
            if pipeline.partition_by else "")
    return [Change(table, "the table is missing",
                   f"CREATE TABLE {_quote(table)} (\n    {body}\n){tail}")]


def _marker_key(pipeline: Pipeline) -> list[Column]:
    """The key's columns (several: a composite key), in key order."""
    by_name = {c.name: c for c in pipeline.sink_columns}
    return [by_name[k] for k in pipeline.upsert.keys]


def marker_statement(pipeline: Pipeline) -> Change | None:
    marker = marker_table(pipeline)
    if marker is None:
        return None
    keys = _marker_key(pipeline)
    one = len(keys) == 1  # a composite key: its columns, then the PRIMARY KEY clause
    columns = [*(f"{_quote(k.name)} {k.ddl} {'PRIMARY KEY' if one else 'NOT NULL'}"
                 for k in keys),
               '"source_topic" text NOT NULL',
               *(ddl for _, ddl in _MARKER_COLUMNS.values()),
               *([] if one else [f"PRIMARY KEY ({', '.join(_quote(k.name) for k in keys)})"])]
    return Change(marker, "tombstones delete rows: their markers keep a deleted key deleted",
                  f"CREATE TABLE {_quote(marker)} (\n    " + ",\n    ".join(columns) + "\n)")


@dataclass(frozen=True)
class ActualColumn:
    name: str
    ddl: str
    nullable: bool
    has_default: bool
    #: ``GENERATED ALWAYS AS (...) STORED`` (nobody may write it).
    generated: bool = False
    #: ``GENERATED ALWAYS AS IDENTITY`` (``COPY`` and ``INSERT`` may not write it).
    identity_always: bool = False


def actual_columns(conn: psycopg.Connection[Any], table: str) -> dict[str, ActualColumn] | None:
    """The table's columns as the catalog has them, or None when there is no such table
    (in the connection's ``search_path``)."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_quote(table),)).fetchone()
    if not exists or not exists[0]:
        return None
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,"
        " a.atthasdef, a.attgenerated <> '', a.attidentity = 'a' FROM pg_attribute a"
        " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped"
        " ORDER BY a.attnum",
        (_quote(table),)).fetchall()
    return {r[0]: ActualColumn(*r) for r in rows}


def _rules(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """The table's ``INSERT`` and ``UPDATE`` rules, by name."""
    rows = conn.execute(
        "SELECT rulename FROM pg_rewrite WHERE ev_class = to_regclass(%s)"
        " AND ev_type IN ('2', '3') ORDER BY rulename", (_quote(table),)).fetchall()
    return [r[0] for r in rows]


_VARCHAR = re.compile(r"^character varying\((\d+)\)(\[\])?$")
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_INT_WIDTH = {"smallint": 2, "integer": 4, "bigint": 8}


def fits(wanted: str, actual: str) -> bool:
    """Whether a column of type ``actual`` holds every value the contract lets through
    for a column of type ``wanted`` (a wider column is fine; a narrower one is drift)."""
    if wanted == actual:
        return True
    if (m := _VARCHAR.match(wanted)) is not None:
        array = m.group(2) or ""
        if actual == "text" + array:
            return True
        n = _VARCHAR.match(actual)
        return n is not None and (n.group(2) or "") == array and int(n.group(1)) >= int(m.group(1))
    if (m := _NUMERIC.match(wanted)) is not None:
        if actual == "numeric":
            return True
        n = _NUMERIC.match(actual)
        return (n is not None and int(n.group(2)) == int(m.group(2))
                and int(n.group(1)) >= int(m.group(1)))
    if wanted.endswith("[]") and actual.endswith("[]") and wanted[:-2] in _INT_WIDTH:
        return fits(wanted[:-2], actual[:-2])
    if wanted in _INT_WIDTH and actual in _INT_WIDTH:
        return _INT_WIDTH[actual] >= _INT_WIDTH[wanted]
    return False


def _drift(table: str, wanted: Column, actual: ActualColumn) -> str | None:
    if actual.generated or actual.identity_always:
        kind = "a generated column" if actual.generated else "an identity column (ALWAYS)"
        return (f"{table}.{wanted.name} is {kind}, but the pipeline writes it: drop the "
                f"expression (ALTER TABLE {table} ALTER COLUMN {wanted.name} DROP "
                f"{'EXPRESSION' if actual.generated else 'IDENTITY'}) or rename the field's "
                "column")
    if not fits(wanted.ddl, actual.ddl):
        return (f"{table}.{wanted.name} is {actual.ddl}, but the contract needs {wanted.ddl}: "
                f"the planner never changes a type; alter it yourself (ALTER TABLE {table} "
                f"ALTER COLUMN {wanted.name} TYPE {wanted.ddl}) or fix the contract")
    if wanted.nullable and not actual.nullable:
        return (f"{table}.{wanted.name} is NOT NULL, but the contract may leave it empty: "
                f"ALTER TABLE {table} ALTER COLUMN {wanted.name} DROP NOT NULL, or make the "
                "field required")
    return None


def plan_tables(conn: psycopg.Connection[Any], pipeline: Pipeline) -> TablePlan:
    """What the pipeline's tables need, compared with the database as it is now."""
    plan = TablePlan(pipeline.name)
    actual = actual_columns(conn, pipeline.table)
    if actual is None:
        plan.changes += create_statements(pipeline)
    else:
        _compare(plan, pipeline, actual)
        plan.drift += _key_drift(conn, pipeline)
        plan.drift += _rule_drift(pipeline.table, _rules(conn, pipeline.table))
    marker = marker_statement(pipeline)
    if marker is not None:
        _plan_markers(conn, plan, pipeline, marker)
    return plan


def _plan_markers(conn: psycopg.Connection[Any], plan: TablePlan, pipeline: Pipeline,
                  marker: Change) -> None:
    """The marker table: made, or checked; one kept under the name Postgres cut (before
    names were derived) is renamed, and checked as it will be, so its markers stay in
    force."""
    legacy = _legacy_markers(conn, pipeline, marker.table)
    markers = actual_columns(conn, marker.table)
    if markers is not None and legacy is not None:
        plan.drift.append(
            f"{legacy} holds deletion markers of {pipeline.table} under the name Postgres "
            f"cut to 63 bytes, which are not in force beside {marker.table}: move its rows "
            f"into {marker.table} (of a key in both, keep the later tombstone's), then DROP "
            f"TABLE {legacy}")
    if markers is None and legacy is not None:
        plan.changes.append(Change(
            marker.table, f"the marker table is {legacy}, the name Postgres cut to 63 bytes",
            f"ALTER TABLE {_quote(legacy)} RENAME TO {_quote(marker.table)}"))
        markers = actual_columns(conn, legacy)
    if markers is None:
        plan.changes.append(marker)
        return
    _compare_markers(plan, pipeline, marker.table, markers)
    plan.drift += _key_drift(conn, pipeline, table=legacy or marker.table,
                             key=pipeline.upsert.keys)


def _legacy_markers(conn: psycopg.Connection[Any], pipeline: Pipeline,
                    derived: str) -> str | None:
    """The marker table under the name it had before names were derived (``<table>_
    tombstones`` as Postgres cut it to 63 bytes), when that is another name and a table
    has it."""
    cut = f"{pipeline.table}{MARKER_SUFFIX}".encode()[:MAX_IDENTIFIER].decode(errors="ignore")
    if cut in (pipeline.table, derived):
        return None
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_quote(cut),)).fetchone()
    return cut if found and found[0] else None


def _compare(plan: TablePlan, pipeline: Pipeline, actual: dict[str, ActualColumn]) -> None:
    """The columns to add, and the drift, of a table that exists."""
    table = pipeline.table
    wanted = {c.name: c for c in row_columns(pipeline)}
    for name, column in wanted.items():
        have = actual.get(name)
        if have is None:
            plan.changes.append(Change(table, f"column {name} is missing",
                                       f"ALTER TABLE {_quote(table)} ADD COLUMN "
                                       f"{_column_sql(column, for_create=False)}"))
            if not column.nullable:
                plan.notes.append(
                    f"{table}.{name} is missing and the contract requires it: it is "
                    "added as a nullable column (rows already stored have no value); "
                    f"once they do, ALTER TABLE {table} ALTER COLUMN {name} SET NOT NULL")
        elif (problem := _drift(table, column, have)) is not None:
            if _optional_since(pipeline, column, have):
                plan.notes.append(
                    f"{table}.{name} is NOT NULL, from when it identified the records: a "
                    f"record without one is dead-lettered as rejected_by_database until "
                    f"ALTER TABLE {table} ALTER COLUMN {name} DROP NOT NULL")
            else:
                plan.drift.append(problem)
    own = {INGESTED_AT}
    if carries_incarnation(pipeline):
        own.add(INCARNATION_COLUMN)
        _incarnation(plan, table, actual.get(INCARNATION_COLUMN))
    plan.drift += _ingested_at_drift(table, actual.get(INGESTED_AT))
    for name, have in actual.items():
        if name not in wanted and name not in own and not have.nullable \
                and not have.has_default and not have.generated:
            plan.drift.append(f"{table}.{name} is NOT NULL without a default and the "
                              "pipeline never fills it: give it a default or drop NOT NULL")


def _optional_since(pipeline: Pipeline, column: Column, have: ActualColumn) -> bool:
    """Whether the only drift of ``column`` is that a table made before holds the declared
    contract's implicit ``event_id`` NOT NULL, which the pipeline no longer identifies by
    (it is optional then): the table takes every record with one, as it did, and refuses
    one without (isolated and dead-lettered), which is a note, not drift."""
    return (column.name == IMPLICIT_ID and pipeline.model.DECLARATION is not None
            and IMPLICIT_ID not in pipeline.identity_columns and not have.nullable
            and fits(column.ddl, have.ddl) and not have.generated
            and not have.identity_always)


def _incarnation(plan: TablePlan, table: str, have: ActualColumn | None) -> None:
    """A latest table's ``source_incarnation``: added (its rows so far are of the first
    incarnation), or checked."""
    if have is None:
        plan.changes.append(Change(
            table, f"column {INCARNATION_COLUMN} is missing (latest tables order a key's "
            "versions by the incarnation of their topic too)",
            f"ALTER TABLE {_quote(table)} ADD COLUMN {INCARNATION_DDL}"))
    elif have.ddl not in ("integer", "bigint") or have.nullable or have.generated:
        plan.drift.append(f"{table}.{INCARNATION_COLUMN} is {have.ddl}"
                          f"{' NULL' if have.nullable else ''}, but the pipeline needs "
                          f"{INCARNATION_DDL}")


def _ingested_at_drift(table: str, have: ActualColumn | None) -> list[str]:
    """``ingested_at`` is filled by its default: ``COPY`` names every other column."""
    if have is None:
        return [f"{table}.ingested_at is missing: every target table has it; ALTER TABLE "
                f"{table} ADD COLUMN {INGESTED_AT_DDL}"]
    if have.ddl != "timestamp with time zone" or have.generated:
        return [f"{table}.ingested_at is {have.ddl}{' (generated)' if have.generated else ''}"
                f", but it must be a plain timestamp with time zone: the pipeline sets it to "
                "now()"]
    if not have.has_default and not have.nullable:
        return [f"{table}.ingested_at is NOT NULL without a default: every row the pipeline "
                f"writes would be refused; ALTER TABLE {table} ALTER COLUMN ingested_at SET "
                "DEFAULT now()"]
    return []


def _rule_drift(table: str, rules: list[str]) -> list[str]:
    if not rules:
        return []
    return [f"{table} has INSERT or UPDATE rules ({', '.join(rules)}): COPY applies no rule "
            "and INSERT ... ON CONFLICT refuses tables that have them, so the pipeline "
            f"cannot honour them; do the same in a trigger (COPY and ON CONFLICT fire "
            f"triggers) and DROP RULE {rules[0]} ON {table}"]


def _compare_markers(plan: TablePlan, pipeline: Pipeline, table: str,
                     actual: dict[str, ActualColumn]) -> None:
    """The marker table holds each deleted key and where its tombstone was: its key
    columns must fit the key; the columns it gained since are added."""
    for key in _marker_key(pipeline):
        have = actual.get(key.name)
        if have is None:
            plan.drift.append(f"{table} has no column {key.name}: it holds the deleted keys; "
                              "drop it and run `kafka-ingest schema apply` (it holds markers "
                              "only)")
        elif not fits(key.ddl, have.ddl):
            plan.drift.append(f"{table}.{key.name} is {have.ddl}, but the key needs "
                              f"{key.ddl}: ALTER TABLE {table} ALTER COLUMN {key.name} TYPE "
                              f"{key.ddl}")
    topic = sql.Literal(pipeline.topic).as_string(None)
    wanted = {"source_topic": ("text", f'"source_topic" text NOT NULL DEFAULT {topic}'),
              **_MARKER_COLUMNS}
    for name, (ddl, column) in wanted.items():
        found = actual.get(name)
        if found is None:
            plan.changes.append(Change(table, f"column {name} is missing (markers stored "
                                       "before it get the default)",
                                       f"ALTER TABLE {_quote(table)} ADD COLUMN {column}"))
        elif not fits(ddl, found.ddl) or found.nullable or found.generated \
                or (name == "deleted_at" and not found.has_default):
            plan.drift.append(f"{table}.{name} is {found.ddl}"
                              f"{' NULL' if found.nullable else ''}"
                              f"{' without a default' if not found.has_default else ''}, but "
                              f"markers need {column}: drop the table and run `kafka-ingest "
                              "schema apply` (it holds markers only)")


def _key_drift(conn: psycopg.Connection[Any], pipeline: Pipeline, *, table: str | None = None,
               key: tuple[str, ...] | None = None) -> list[str]:
    """``ON CONFLICT`` needs a unique index on exactly the conflict columns, one it can
    use: immediate (not ``DEFERRABLE``) and valid (not a failed ``CREATE INDEX
    CONCURRENTLY``)."""
    table = table or pipeline.table
    wanted = sorted(key or pipeline.conflict_columns)
    rows = conn.execute(
        # the key columns only (not INCLUDE ones), of unique indexes on plain columns
        "SELECT array_agg(a.attname ORDER BY k.i), bool_and(x.indimmediate),"
        " bool_and(x.indisvalid AND x.indisready), min(c.relname)"
        " FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
        " CROSS JOIN LATERAL unnest((x.indkey::int2[])[0:x.indnkeyatts - 1])"
        " WITH ORDINALITY AS k(attnum, i)"
        " JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum"
        " WHERE x.indrelid = to_regclass(%s) AND x.indisunique AND x.indpred IS NULL"
        " AND x.indexprs IS NULL GROUP BY x.indexrelid", (_quote(table),)).fetchall()
    matching = [r for r in rows if sorted(r[0]) == wanted]
    if any(immediate and valid for _, immediate, valid, _ in matching):
        return []
    listed = ", ".join(wanted)
    if matching:
        _, immediate, _, index = matching[0]
        why = "DEFERRABLE" if not immediate else "not valid (a failed CREATE INDEX CONCURRENTLY?)"
        fix = (f"ALTER TABLE {table} ALTER CONSTRAINT {index} NOT DEFERRABLE" if not immediate
               else f"REINDEX INDEX {index}")
        return [f"{table}'s unique index on ({listed}) is {why}, which ON CONFLICT cannot use: "
                f"{fix}"]
    return [f"{table} has no unique index on ({listed}), which the upsert's ON CONFLICT "
            f"names: CREATE UNIQUE INDEX ON {table} ({listed})"]


#: Integer column types, as ``format_type()`` prints them -> the type values travel as.
_INT_WIRE = {"smallint": "int2", "integer": "int4", "bigint": "int8"}


@dataclass(frozen=True)
class TargetShape:
    """How a slice's rows travel into the target table as it is when the slice starts:
    per row column (:func:`row_columns` order), the binary ``COPY`` type and the staging
    table's column type. A column widened since the contract's type (``integer`` to
    ``bigint``, ``integer[]`` to ``bigint[]``, which the drift check accepts) travels as
    the table's type: a binary ``COPY`` must send each value in its column's width."""

    copy_types: tuple[str, ...]
    stage_types: tuple[str, ...]


def contract_shape(pipeline: Pipeline) -> TargetShape:
    """The shape of a table made from the contract (nothing widened)."""
    columns = row_columns(pipeline)
    return TargetShape(tuple(c.copy_type for c in columns), tuple(c.ddl for c in columns))


def _widened(column: Column, actual: ActualColumn | None) -> tuple[str, str]:
    """(wire type, stage type) of one column, the table's own where it widened an integer."""
    wire, ddl = column.copy_type, column.ddl
    if actual is None or column.convert is not None:
        return wire, ddl
    array = "[]" if wire.endswith("[]") else ""
    have = actual.ddl.removesuffix("[]") if actual.ddl.endswith("[]") == bool(array) else ""
    if wire.removesuffix(array) in ("int2", "int4") and have in _INT_WIRE:
        return _INT_WIRE[have] + array, actual.ddl
    return wire, ddl


def target_shape(conn: psycopg.Connection[Any], pipeline: Pipeline) -> TargetShape:
    """The table's :class:`TargetShape`, read from the catalog (in the caller's
    transaction); :class:`SchemaDrift` if it gained ``INSERT`` or ``UPDATE`` rules since
    the run was planned (see :func:`_rule_drift`)."""
    rules = _rule_drift(pipeline.table, _rules(conn, pipeline.table))
    if rules:
        raise SchemaDrift(pipeline.name, rules, [])
    actual = actual_columns(conn, pipeline.table) or {}
    pairs = [_widened(c, actual.get(c.name)) for c in row_columns(pipeline)]
    return TargetShape(tuple(w for w, _ in pairs), tuple(d for _, d in pairs))


def check_table(conn: psycopg.Connection[Any], pipeline: Pipeline) -> TablePlan:
    """The plan step's check: raise :class:`SchemaDrift` when the table cannot take the
    pipeline's rows as they are. Returns the plan (empty when all is well); a pipeline with
    ``auto_create``/``auto_evolve`` gets its changes applied by the caller."""
    plan = plan_tables(conn, pipeline)
    allowed = _allowed(pipeline, plan)
    blocking = [c for c in plan.changes if c not in allowed]
    if plan.drift or blocking:
        raise SchemaDrift(pipeline.name, plan.drift, [c.why + f" ({c.table})" for c in blocking])
    return plan


def _allowed(pipeline: Pipeline, plan: TablePlan) -> list[Change]:
    creating = any(c.statement.startswith("CREATE TABLE") and c.table == pipeline.table
                   for c in plan.changes)
    if creating:
        return plan.changes if pipeline.auto_create else []
    return plan.changes if pipeline.auto_evolve else []


def apply_tables(conn: psycopg.Connection[Any], pipeline: Pipeline) -> TablePlan:
    """Plan and apply the pipeline's changes in one transaction, under the migrations'
    lock (a second migrator waits, then finds nothing left to do), each change recorded
    in ``schema_changes``. Drift is applied nothing for: :class:`SchemaDrift`."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        plan = plan_tables(conn, pipeline)
        if plan.drift:
            raise SchemaDrift(pipeline.name, plan.drift, [])
        # An ALTER waits for every reader of the table, and every query behind it waits for
        # the ALTER: give up soon (transient) rather than stall the pipeline's writers.
        conn.execute("SELECT set_config('lock_timeout', %s, true)", (DDL_LOCK_TIMEOUT_MS,))
        for change in plan.changes:
            conn.execute(change.statement.encode())
            conn.execute(
                "INSERT INTO schema_changes (pipeline, table_name, why, statement)"
                " VALUES (%s, %s, %s, %s)",
                (plan.pipeline, change.table, change.why, change.statement))
    return plan


def apply_pipelines(conn: psycopg.Connection[Any],
                    pipelines: Iterable[Pipeline]) -> list[TablePlan]:
    """:func:`apply_tables` for each pipeline (pipelines sharing a table each add what
    theirs needs: every plan is made against the catalog as the previous one left it)."""
    return [apply_tables(conn, pipeline) for pipeline in pipelines]


__all__ = [
    "INCARNATION_COLUMN",
    "MARKER_SUFFIX",
    "ActualColumn",
    "Change",
    "TablePlan",
    "TargetShape",
    "actual_columns",
    "apply_pipelines",
    "apply_tables",
    "carries_incarnation",
    "check_table",
    "contract_shape",
    "create_statements",
    "derived_name",
    "fits",
    "marker_table",
    "orders_versions",
    "plan_tables",
    "provenance_columns",
    "row_columns",
    "runtime_tables",
    "stage_table",
    "target_shape",
]
