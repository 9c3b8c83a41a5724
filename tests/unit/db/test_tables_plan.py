"""Tables planned from pipelines: which column types hold a contract's values, the DDL of a
new table (append, latest, partitioned, with a marker table for deletes), and the
pipeline settings that cannot make a table at all (refused when the file loads).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.contracts import REGISTRY, EventContract
from kafka_ingest.db.tables import (
    create_statements,
    derived_name,
    fits,
    marker_statement,
    marker_table,
    row_columns,
    stage_table,
)
from tests.support import ROOT

MIGRATION = (ROOT / "include" / "kafka_ingest" / "db"
             / "migrations" / "0002_example_tables.sql")

BASE: dict[str, Any] = {
    "topic": "readings",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "readings",
    "dlq_topic": "readings-dlq",
}
# A small declared contract, so a whole CREATE TABLE fits in a test.
CONTRACTS: dict[str, Any] = {"shipment": {"fields": {
    "weight": {"type": "numeric", "precision": 8, "scale": 3},
    "shipped_at": {"type": "timestamptz"},
    "arrived_at": {"type": "timestamptz", "required": False},
    "tags": {"type": "array", "items": {"type": "text", "max_length": 16}, "default": []},
}}}
SHIPMENT = {**BASE, "contract": {"event_type": "shipment", "version": 1},
            "table": "shipments"}


def pipeline(**body: Any) -> Pipeline:
    document = {"contracts": CONTRACTS, "pipelines": {"p": {**BASE, **body}}}
    return parse_pipelines(document, source="test.yaml")["p"]


def load_error(**body: Any) -> str:
    with pytest.raises(ValueError, match=r"^test\.yaml: pipelines\.p") as info:
        pipeline(**body)
    return str(info.value)


# --------------------------------------------------------------------------- fits

FITS = [
    # the same type
    ("character varying(32)", "character varying(32)", True),
    # a wider varchar holds every value of a narrower one
    ("character varying(32)", "character varying(64)", True),
    # a narrower one does not: drift
    ("character varying(32)", "character varying(31)", False),
    # text holds any varchar
    ("character varying(32)", "text", True),
    # but a varchar is no home for text
    ("text", "character varying(10485760)", False),
    # numeric without a typmod holds any numeric(p,s)
    ("numeric(14,2)", "numeric", True),
    # more integer digits, the same scale: holds it
    ("numeric(14,2)", "numeric(16,2)", True),
    ("numeric(14,2)", "numeric(13,2)", False),
    # a different scale rounds (more places) or refuses (fewer): the scale must match
    ("numeric(14,2)", "numeric(16,3)", False),
    ("numeric(14,2)", "numeric(14,1)", False),
    # an unbounded numeric from the contract fits no bounded column
    ("numeric", "numeric(14,2)", False),
    # integers widen...
    ("smallint", "integer", True),
    ("integer", "bigint", True),
    ("smallint", "bigint", True),
    # ...but never narrow
    ("bigint", "integer", False),
    ("integer", "smallint", False),
    # an integer is not a float, nor the other way round
    ("integer", "double precision", False),
    ("double precision", "bigint", False),
    # a time zone is not optional
    ("timestamp with time zone", "timestamp without time zone", False),
    ("jsonb", "json", False),
    # arrays: element types as above, and an array is never a scalar
    ("text[]", "text[]", True),
    ("character varying(16)[]", "character varying(32)[]", True),
    ("character varying(16)[]", "character varying(8)[]", False),
    ("character varying(16)[]", "text[]", True),
    ("character varying(16)[]", "character varying(16)", False),
    ("character varying(16)", "character varying(16)[]", False),
    ("text[]", "text", False),
    ("bigint[]", "integer[]", False),
]


@pytest.mark.parametrize(("wanted", "actual", "expected"), FITS)
def test_fits(wanted: str, actual: str, expected: bool) -> None:
    assert fits(wanted, actual) is expected


@pytest.mark.parametrize(
    ("wanted", "actual"),
    [("smallint[]", "integer[]"),  # a declared array of smallint, in an integer[] column
     ("integer[]", "bigint[]")],
)
def test_fits_widens_integer_arrays_like_integers(wanted: str, actual: str) -> None:
    # Declared arrays of integers make exactly these column types (an array's DDL is its
    # element's base type plus []), so a wider column must be no drift here either.
    assert fits(wanted, actual), (
        f"fits({wanted!r}, {actual!r}) is False: a wider integer array is reported as "
        f"drift, and the fix it prints narrows the column to {wanted}")


# --------------------------------------------------------------------------- CREATE TABLE


def test_create_an_append_table() -> None:
    shipments = pipeline(**SHIPMENT)

    [change] = create_statements(shipments)

    assert (change.table, change.why) == ("shipments", "the table is missing")
    assert change.statement == (
        'CREATE TABLE "shipments" (\n'
        '    "event_id" character varying(128) NOT NULL,\n'
        '    "weight" numeric(8,3) NOT NULL,\n'
        '    "shipped_at" timestamp with time zone NOT NULL,\n'
        '    "arrived_at" timestamp with time zone,\n'
        '    "tags" text[] NOT NULL,\n'
        '    "source_topic" text NOT NULL,\n'
        '    "source_partition" integer NOT NULL,\n'
        '    "source_offset" bigint NOT NULL,\n'
        '    "kafka_key" bytea,\n'
        '    "kafka_timestamp" timestamp with time zone,\n'
        '    "ingested_at" timestamp with time zone NOT NULL DEFAULT now(),\n'
        '    PRIMARY KEY ("event_id")\n'
        ")")
    assert marker_statement(shipments) is None


def test_create_a_latest_table_keyed_by_the_entity_with_the_incarnation_of_its_rows() -> None:
    # A key's stored version is found by the primary key alone (no index on event_id);
    # each row says which incarnation of its topic it came from.
    state = pipeline(table="device_state", upsert={"mode": "latest", "key": "device_id"})

    [create] = create_statements(state)

    assert create.statement.endswith(
        '    "source_incarnation" integer NOT NULL DEFAULT 1,\n'
        '    "ingested_at" timestamp with time zone NOT NULL DEFAULT now(),\n'
        '    PRIMARY KEY ("device_id")\n)')
    assert '"event_id" character varying(128) NOT NULL,' in create.statement
    assert marker_statement(state) is None


def test_create_a_partitioned_table() -> None:
    # the partitioning column is part of every unique index of a partitioned table
    shipments = pipeline(**SHIPMENT, partition_by={"column": "shipped_at"})

    [change] = create_statements(shipments)

    assert change.statement.endswith(
        '    PRIMARY KEY ("event_id", "shipped_at")\n) PARTITION BY RANGE ("shipped_at")')
    assert shipments.conflict_columns == ("event_id", "shipped_at")


def test_key_and_header_columns_come_between_the_contract_and_the_provenance() -> None:
    accounts = pipeline(
        **SHIPMENT,
        record_key={"column": "account_id", "format": "json", "type": "bigint"},
        headers={"trace-id": "trace_id",
                 "tenant": {"column": "tenant", "required": True, "max_length": 16}},
        upsert={"mode": "latest", "key": "account_id", "order_by": "source_offset"},
        on_tombstone="delete")

    [create] = create_statements(accounts)

    lines = create.statement.splitlines()
    assert lines[5:10] == ['    "tags" text[] NOT NULL,',
                           '    "account_id" bigint NOT NULL,',
                           '    "trace_id" character varying(256),',
                           '    "tenant" character varying(16) NOT NULL,',
                           '    "source_topic" text NOT NULL,']
    assert lines[-2:] == ['    PRIMARY KEY ("account_id")', ")"]


def test_a_deleting_pipeline_gets_a_marker_table_keyed_like_its_table() -> None:
    accounts = pipeline(record_key={"column": "account_id", "max_length": 40},
                        upsert={"mode": "latest", "key": "account_id",
                                "order_by": "source_offset"},
                        on_tombstone="delete", table="accounts")

    marker = marker_statement(accounts)

    assert marker is not None
    assert marker.table == "accounts_tombstones"
    assert marker.statement == (
        'CREATE TABLE "accounts_tombstones" (\n'
        '    "account_id" character varying(40) PRIMARY KEY,\n'
        '    "source_topic" text NOT NULL,\n'
        '    "source_partition" integer NOT NULL,\n'
        '    "source_offset" bigint NOT NULL,\n'
        '    "deleted_at" timestamp with time zone NOT NULL DEFAULT now(),\n'
        '    "source_incarnation" integer NOT NULL DEFAULT 1\n'
        ")")


@pytest.mark.parametrize("table", ["a" * 63, "b" * 52, "c" * 58])
def test_names_made_from_a_long_table_name_fit_and_stay_apart(table: str) -> None:
    # Postgres cuts identifiers at 63 bytes: "<63 chars>_tombstones" would be the table
    # itself, and two tables sharing their first 52 characters would share one marker table.
    accounts = pipeline(record_key={"column": "account_id"}, table=table,
                        upsert={"mode": "latest", "key": "account_id",
                                "order_by": "source_offset"}, on_tombstone="delete")
    other = accounts.model_copy(update={"table": table[:-1] + "z"})

    for made in (marker_table(accounts), stage_table(accounts)):
        assert made is not None and len(made.encode()) <= 63
        assert made != table
    assert marker_table(accounts) != marker_table(other)
    assert stage_table(accounts) != stage_table(other)
    assert str(marker_table(accounts)).endswith("_tombstones")


def test_a_short_table_keeps_its_plain_derived_names() -> None:
    # names that fit are what they always were: existing marker tables are found
    assert derived_name("accounts", suffix="_tombstones") == "accounts_tombstones"
    assert derived_name("x" * 52, suffix="_tombstones") == "x" * 52 + "_tombstones"
    assert derived_name("accounts", prefix="stage_") == "stage_accounts"


# Migration 0002 made the example tables by hand; the planner must find them as it would
# make them (else every existing deployment would report drift). Its spellings -> format_type's.
_SPELLING = {"varchar": "character varying", "timestamptz": "timestamp with time zone"}


def _migration_tables() -> dict[str, dict[str, tuple[str, bool]]]:
    """table -> column -> (type as format_type() prints it, nullable), from 0002."""
    tables: dict[str, dict[str, tuple[str, bool]]] = {}
    for name, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", MIGRATION.read_text(),
                                 re.DOTALL):
        columns = tables[name] = {}
        for line in body.strip().splitlines():
            column, rest = line.strip().rstrip(",").split(None, 1)
            kind = re.split(r"\s+(?:NOT NULL|PRIMARY KEY|DEFAULT)\b", rest)[0].strip()
            kind = re.sub(r"^(\w+)", lambda m: _SPELLING.get(m[1], m[1]), kind)
            nullable = "NOT NULL" not in rest and "PRIMARY KEY" not in rest
            columns[column.strip('"')] = (kind.replace(", ", ","), nullable)
    return tables


@pytest.mark.parametrize("name", ["telemetry_metrics", "orders_created", "device_state"])
def test_the_planner_makes_the_example_tables_as_migration_0002_did(
        name: str, shipped: dict[str, Pipeline]) -> None:
    planned = {c.name: (c.ddl, c.nullable) for c in row_columns(shipped[name])}
    planned["ingested_at"] = ("timestamp with time zone", False)
    assert planned == _migration_tables()[name]


# --------------------------------------------------------------------------- refused


REFUSED = [
    # a tombstone carries only its key: deleting needs a latest table keyed by it
    ("delete_on_append", {"on_tombstone": "delete", "record_key": {"column": "entity"}},
     "on_tombstone 'delete' needs upsert.mode 'latest' keyed by the record key"),
    ("delete_without_record_key",
     {"on_tombstone": "delete",
      "upsert": {"mode": "latest", "key": "device_id", "order_by": "source_offset"}},
     "on_tombstone 'delete' needs upsert.mode 'latest' keyed by the record key"),
    ("delete_keyed_by_a_field",
     {"on_tombstone": "delete", "record_key": {"column": "entity"},
      "upsert": {"mode": "latest", "key": "device_id", "order_by": "source_offset"}},
     "record_key.column = upsert.key"),
    # a tombstone has no event time: only the log orders it against an update
    ("delete_by_event_time",
     {"on_tombstone": "delete", "record_key": {"column": "entity"},
      "upsert": {"mode": "latest", "key": "entity", "order_by": "timestamp"}},
     "on_tombstone 'delete' needs upsert.order_by 'source_offset'"),
    # a key's row would have to move between partitions
    ("partitioned_latest",
     {"partition_by": {"column": "timestamp"}, "upsert": {"mode": "latest", "key": "device_id"}},
     "partition_by is for append pipelines"),
    ("partition_by_text", {"partition_by": {"column": "device_id"}},
     "partition_by.column 'device_id' must be a required timestamptz field"),
    ("partition_by_unknown", {"partition_by": {"column": "taken_at"}},
     "partition_by.column 'taken_at' must be a required timestamptz field"),
    # a row without a value for the partitioning column has no partition
    ("partition_by_optional", {**SHIPMENT, "partition_by": {"column": "arrived_at"}},
     "partition_by.column 'arrived_at' must be a required timestamptz field"),
    # the record key or a header may not take a contract's column...
    ("key_is_a_contract_column", {"record_key": {"column": "device_id"}},
     "column 'device_id' (from the record key or a header) is already a column"),
    ("header_is_a_contract_column", {"headers": {"status": "status"}},
     "column 'status' (from the record key or a header) is already a column"),
    # ...nor a provenance column...
    ("header_is_provenance", {"headers": {"key": "kafka_key"}},
     "column 'kafka_key' (from the record key or a header) is already a column"),
    # ...nor one another's
    ("header_is_the_key_column",
     {"record_key": {"column": "entity"}, "headers": {"entity": "entity"}},
     "column 'entity' (from the record key or a header) is already a column"),
    ("two_headers_one_column", {"headers": {"trace-id": "trace", "traceId": "trace"}},
     "column 'trace' (from the record key or a header) is already a column"),
    # ...nor a Postgres system column's name: CREATE TABLE would fail with 42701
    ("key_is_xmin", {"record_key": {"column": "xmin"}},
     "the record key or a header: column 'xmin' is the name of a Postgres system column"),
    ("header_is_ctid", {"headers": {"row-id": "ctid"}},
     "the record key or a header: column 'ctid' is the name of a Postgres system column"),
    ("header_is_tableoid", {"headers": {"table": {"column": "tableoid"}}},
     "column 'tableoid' is the name of a Postgres system column"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_settings_that_make_no_table_are_refused_at_load(body: dict[str, Any],
                                                          reason: str) -> None:
    assert reason in load_error(**body)


class _RowVersionV1(EventContract):
    """A hand-written contract whose field takes a system column's name."""

    EVENT_TYPE: ClassVar[str] = "row_version"
    VERSION: ClassVar[int] = 1
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (("event_id", "text"),
                                                          ("xmax", "int8"))
    xmax: int


def test_a_python_contract_with_a_system_column_is_refused_at_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, _RowVersionV1.key(), _RowVersionV1)
    assert "contract row_version.v1: column 'xmax' is the name of a Postgres system column" \
        in load_error(contract={"event_type": "row_version", "version": 1})


def test_a_deleting_pipeline_with_all_it_needs_is_accepted() -> None:
    # the counterpart of the refusals: what a deleting pipeline needs, all given
    accounts = pipeline(record_key={"column": "entity"}, on_tombstone="delete",
                        upsert={"mode": "latest", "key": "entity",
                                "order_by": "source_offset"})
    assert accounts.conflict_columns == ("entity",)
    assert accounts.column_names[-1] == "entity"
