"""Target tables from contracts: their columns, the DDL that makes and evolves them, and
the drift check that runs before any data moves.

A pipeline's table is the contract's columns, the record-key and header columns, then the
provenance columns every table has; its primary key is ``event_id`` (``append``), the
entity key (``latest``), or ``event_id`` and the partitioning column (a partitioned
table). ``latest`` tables get an index on ``event_id`` (the upsert looks a replayed event up
by it); pipelines that delete on tombstones get a marker table beside theirs.

The planner only ever adds: ``CREATE TABLE`` for a missing table, ``ADD COLUMN`` for a
column the contract gained (nullable: a new field is optional). It never drops a column,
never changes a type and never sets NOT NULL: those are :class:`Drift` the user resolves,
and the message says how. :func:`check_table` compares the table with the contract when a
run is planned, so a mismatch fails the run naming the column, instead of a COPY failing
mid-slice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from kafka_ingest.config import OnTombstone, Pipeline, UpsertMode
from kafka_ingest.contracts.columns import Column, ddl_type, millis_to_pg
from kafka_ingest.db.schema import MIGRATION_LOCK
from kafka_ingest.errors import SchemaDrift
from kafka_ingest.records import PROVENANCE_COLUMNS

#: Provenance columns that may be NULL (a record without a key or a usable timestamp).
_NULLABLE_PROVENANCE = frozenset({"kafka_key", "kafka_timestamp"})
#: The suffix of the marker table of a pipeline that deletes on tombstones.
MARKER_SUFFIX = "_tombstones"
#: Provenance columns whose value is converted before it travels (see ``Contract.STAGED``):
#: the Kafka timestamp (epoch milliseconds) becomes a binary timestamptz, inline in each
#: row's making (:func:`kafka_ingest.decode.validate.row_builder`).
PROVENANCE_STAGED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "kafka_timestamp": ("int8", millis_to_pg),
}
#: How long a DDL statement waits for a table's lock (then the change fails, retriable).
DDL_LOCK_TIMEOUT_MS = "5000"


def provenance_columns() -> tuple[Column, ...]:
    """The provenance columns, in row order (``ingested_at`` is the table's own)."""
    return tuple(
        Column(name=name, ddl=ddl_type(final, None),
               copy_type=PROVENANCE_STAGED.get(name, (final, None))[0],
               nullable=name in _NULLABLE_PROVENANCE,
               convert=PROVENANCE_STAGED.get(name, (final, None))[1])
        for name, final in PROVENANCE_COLUMNS)


def row_columns(pipeline: Pipeline) -> tuple[Column, ...]:
    """Every column a row fills, in row order: what the staging table holds."""
    return (*pipeline.sink_columns, *provenance_columns())


def marker_table(pipeline: Pipeline) -> str | None:
    """The table of a deleting pipeline's deletion markers (see :mod:`kafka_ingest.db.upsert`)."""
    if pipeline.on_tombstone is not OnTombstone.DELETE:
        return None
    return f"{pipeline.table}{MARKER_SUFFIX}"


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


def create_statements(pipeline: Pipeline) -> list[Change]:
    """The DDL that makes a pipeline's tables from nothing."""
    table = pipeline.table
    columns = [_column_sql(c, for_create=True) for c in row_columns(pipeline)]
    columns.append('"ingested_at" timestamp with time zone NOT NULL DEFAULT now()')
    key = ", ".join(map(_quote, pipeline.conflict_columns))
    body = ",\n    ".join([*columns, f"PRIMARY KEY ({key})"])
    tail = (f" PARTITION BY RANGE ({_quote(pipeline.partition_by.column)})"
            if pipeline.partition_by else "")
    changes = [Change(table, "the table is missing",
                      f"CREATE TABLE {_quote(table)} (\n    {body}\n){tail}")]
    if pipeline.upsert.mode is UpsertMode.LATEST:
        changes.append(Change(table, "latest mode looks replayed events up by event_id",
                              f"CREATE INDEX {_quote(table + '_event_id_idx')} ON "
                              f"{_quote(table)} (event_id)"))
    return changes


def marker_statement(pipeline: Pipeline) -> Change | None:
    marker = marker_table(pipeline)
    if marker is None:
        return None
    key = next(c for c in pipeline.sink_columns if c.name == pipeline.upsert.key)
    return Change(marker, "tombstones delete rows: their markers keep a deleted key deleted",
                  f"CREATE TABLE {_quote(marker)} (\n"
                  f"    {_quote(key.name)} {key.ddl} PRIMARY KEY,\n"
                  '    "source_partition" integer NOT NULL,\n'
                  '    "source_offset" bigint NOT NULL,\n'
                  '    "deleted_at" timestamp with time zone NOT NULL DEFAULT now()\n)')


@dataclass(frozen=True)
class ActualColumn:
    name: str
    ddl: str
    nullable: bool
    has_default: bool


def actual_columns(conn: psycopg.Connection[Any], table: str) -> dict[str, ActualColumn] | None:
    """The table's columns as the catalog has them, or None when there is no such table
    (in the connection's ``search_path``)."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_quote(table),)).fetchone()
    if not exists or not exists[0]:
        return None
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,"
        " a.atthasdef FROM pg_attribute a WHERE a.attrelid = to_regclass(%s)"
        " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (_quote(table),)).fetchall()
    return {r[0]: ActualColumn(r[0], r[1], r[2], r[3]) for r in rows}


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
    marker = marker_statement(pipeline)
    if marker is not None:
        markers = actual_columns(conn, marker.table)
        if markers is None:
            plan.changes.append(marker)
        else:
            plan.drift += _marker_drift(pipeline, marker.table, markers)
    return plan


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
            plan.drift.append(problem)
    if "ingested_at" not in actual:
        plan.drift.append(f"{table}.ingested_at is missing: every target table has it "
                          "(timestamp with time zone NOT NULL DEFAULT now())")
    for name, have in actual.items():
        if name not in wanted and name != "ingested_at" and not have.nullable \
                and not have.has_default:
            plan.drift.append(f"{table}.{name} is NOT NULL without a default and the "
                              "pipeline never fills it: give it a default or drop NOT NULL")


def _marker_drift(pipeline: Pipeline, table: str, actual: dict[str, ActualColumn]) -> list[str]:
    """The marker table holds each deleted key: its key column must fit the key."""
    key = next(c for c in pipeline.sink_columns if c.name == pipeline.upsert.key)
    have = actual.get(key.name)
    if have is None:
        return [f"{table} has no column {key.name}: it holds the deleted keys; drop it and run "
                "`kafka-ingest schema apply` (it holds markers only)"]
    if not fits(key.ddl, have.ddl):
        return [f"{table}.{key.name} is {have.ddl}, but the key needs {key.ddl}: ALTER TABLE "
                f"{table} ALTER COLUMN {key.name} TYPE {key.ddl}"]
    return []


def _key_drift(conn: psycopg.Connection[Any], pipeline: Pipeline) -> list[str]:
    """``ON CONFLICT`` needs a unique index on exactly the conflict columns."""
    wanted = list(pipeline.conflict_columns)
    rows = conn.execute(
        # the key columns only (not INCLUDE ones), of unique indexes on plain columns
        "SELECT array_agg(a.attname ORDER BY k.i) FROM pg_index x"
        " CROSS JOIN LATERAL unnest((x.indkey::int2[])[0:x.indnkeyatts - 1])"
        " WITH ORDINALITY AS k(attnum, i)"
        " JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum"
        " WHERE x.indrelid = to_regclass(%s) AND x.indisunique AND x.indpred IS NULL"
        " AND x.indexprs IS NULL GROUP BY x.indexrelid", (_quote(pipeline.table),)).fetchall()
    if any(sorted(r[0]) == sorted(wanted) for r in rows):
        return []
    return [f"{pipeline.table} has no unique index on ({', '.join(wanted)}), which the upsert's "
            f"ON CONFLICT names: CREATE UNIQUE INDEX ON {pipeline.table} ({', '.join(wanted)})"]


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
    "MARKER_SUFFIX",
    "ActualColumn",
    "Change",
    "TablePlan",
    "actual_columns",
    "apply_pipelines",
    "apply_tables",
    "check_table",
    "create_statements",
    "fits",
    "marker_table",
    "plan_tables",
    "provenance_columns",
    "row_columns",
    "runtime_tables",
]
