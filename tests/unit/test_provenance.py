"""The provenance columns' one definition (:data:`kafka_ingest.records.PROVENANCE_COLUMNS`)
and what is made from it, without services: the target tables' columns and staging
columns, the rows' tail (:class:`~kafka_ingest.records.Provenance`), and the names no
declared contract, key or header column may take."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.config import parse_pipelines
from kafka_ingest.contracts.declared import RESERVED_COLUMNS
from kafka_ingest.db.tables import (
    INGESTED_AT_DDL,
    create_statements,
    provenance_columns,
    row_columns,
)
from kafka_ingest.records import INGESTED_AT, PROVENANCE_COLUMNS, Provenance, row_source

BODY: dict[str, Any] = {"topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
                        "table": "t_rows", "dlq_topic": "t-in-dlq"}


def test_one_column_per_field_of_provenance_in_its_order() -> None:
    assert len(PROVENANCE_COLUMNS) == len(Provenance._fields)
    row = ("payload", *(f"v{i}" for i in range(len(PROVENANCE_COLUMNS))))
    assert tuple(row_source(row)) == row[1:]


def test_every_table_ends_with_the_provenance_columns_as_defined() -> None:
    p = parse_pipelines({"pipelines": {"p": BODY}})["p"]
    made = provenance_columns()
    assert [(c.name, c.nullable) for c in made] == [(c.name, c.nullable)
                                                    for c in PROVENANCE_COLUMNS]
    assert row_columns(p)[-len(made):] == made
    # the Kafka timestamp travels as epoch milliseconds made into a binary timestamptz
    assert [c.name for c in made if c.convert is not None] == [
        c.name for c in PROVENANCE_COLUMNS if c.epoch_ms]
    (ddl,) = [c.statement for c in create_statements(p) if c.table == "t_rows"]
    for c, column in zip(PROVENANCE_COLUMNS, made, strict=True):
        assert f'"{c.name}" {column.ddl}{"" if c.nullable else " NOT NULL"},' in ddl, c.name
    assert INGESTED_AT_DDL in ddl


@pytest.mark.parametrize("column", [*(c.name for c in PROVENANCE_COLUMNS), INGESTED_AT])
def test_no_declared_contract_or_header_column_takes_a_provenance_name(column: str) -> None:
    assert column in RESERVED_COLUMNS
    with pytest.raises(ValueError, match="already a column of the contract or of every table"):
        parse_pipelines({"pipelines": {"p": {**BODY, "headers": {"h": column}}}})
