"""Target tables as operators change them, on the real Postgres: what the write path takes
(a widened integer column), and what the plan step refuses before any data moves (rules,
generated columns, an ``ingested_at`` without its default, unique keys ON CONFLICT cannot
use, a marker table that lost its key), and names made from 63-character tables."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline
from kafka_ingest.db.tables import marker_table, plan_tables
from kafka_ingest.engine.backfill import run_backfill
from kafka_ingest.errors import SchemaDrift
from kafka_ingest.requests import OffsetWindow
from tests.integration.test_declared_tables import apply, declared, deleting, produce, run

pytestmark = pytest.mark.integration

ITEM = {"version": 1, "fields": {
    "qty": {"type": "integer"},
    "sizes": {"type": "array", "items": {"type": "integer"}},
}}


def items(topics: Any, **body: Any) -> Pipeline:
    return declared(topics, {"item": ITEM}, contract={"event_type": "item", "version": 1},
                    **body)


def item(i: int) -> bytes:
    return json.dumps({"event_id": f"i-{i}", "qty": 2_000_000_000 + i,
                       "sizes": [i, -2_147_483_648, 2_147_483_647]}).encode()


def nothing_moved(pg_dsn: str, table: str = "p_rows") -> None:
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM run_plans").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM ingest_offsets").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,)
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)


@pytest.mark.parametrize("latest", [False, True], ids=["append", "latest"])
def test_integer_columns_widened_by_hand_take_every_row_exactly(
        topics: Any, clients: Any, db: Any, pg_dsn: str, latest: bool) -> None:
    # The drift check accepts integer -> bigint (and integer[] -> bigint[], and the
    # provenance's source_partition): a binary COPY must then send 8-byte values, or
    # Postgres reads past each row ("insufficient data left in message").
    body: dict[str, Any] = {"record_key": {"column": "item_key"},
                            "upsert": {"mode": "latest", "key": "item_key",
                                       "order_by": "source_offset"}} if latest else {}
    pipeline = items(topics, **body)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("ALTER TABLE p_rows ALTER COLUMN qty TYPE bigint,"
                     " ALTER COLUMN sizes TYPE bigint[],"
                     " ALTER COLUMN source_partition TYPE bigint")
    with psycopg.connect(pg_dsn) as conn:
        assert not plan_tables(conn, pipeline).drift  # wider than the contract is fine
    produce(clients, pipeline.topic, [(f"k-{i}".encode(), item(i), None) for i in range(300)])

    done = run(pipeline, clients, db)

    assert (done["inserted"], done["dead_lettered"]) == (300, 0), done
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT event_id, qty, sizes, source_partition FROM p_rows"
                            " ORDER BY source_offset").fetchall()
    assert rows == [(f"i-{i}", 2_000_000_000 + i, [i, -2_147_483_648, 2_147_483_647], 0)
                    for i in range(300)]


def test_a_table_with_insert_rules_is_drift_at_plan_time(topics: Any, clients: Any, db: Any,
                                                         pg_dsn: str) -> None:
    # COPY applies no rule (the rule would be skipped silently) and INSERT ... ON CONFLICT
    # refuses a table that has one: the run stops before any data moves, naming the rule.
    pipeline = items(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE audit_log (event_id text)")
        conn.execute("CREATE RULE log_items AS ON INSERT TO p_rows"
                     " DO ALSO INSERT INTO audit_log VALUES (NEW.event_id)")
    produce(clients, pipeline.topic, [(b"k", item(1), None)])

    with pytest.raises(SchemaDrift, match=r"INSERT or UPDATE rules \(log_items\).*trigger"):
        run(pipeline, clients, db)
    nothing_moved(pg_dsn)


@pytest.mark.parametrize(("alter", "named"), [
    # COPY leaves ingested_at to its default: without one, every row would be refused and
    # bisected into a dead letter
    ("ALTER TABLE p_rows ALTER COLUMN ingested_at DROP DEFAULT",
     r"ingested_at is NOT NULL without a default"),
    ("ALTER TABLE p_rows ALTER COLUMN ingested_at TYPE text",
     r"ingested_at is text, but it must be a plain timestamp with time zone"),
    # a generated column under a column the pipeline writes (a raw 42P10 at the COPY)
    ("ALTER TABLE p_rows DROP COLUMN qty, ADD COLUMN qty integer GENERATED ALWAYS AS (1)"
     " STORED", r"p_rows\.qty is a generated column, but the pipeline writes it"),
    ("ALTER TABLE p_rows DROP COLUMN qty, ADD COLUMN qty integer GENERATED ALWAYS AS"
     " IDENTITY", r"p_rows\.qty is an identity column \(ALWAYS\)"),
    # ON CONFLICT cannot use a deferrable unique key
    ("ALTER TABLE p_rows DROP CONSTRAINT p_rows_pkey,"
     " ADD PRIMARY KEY (event_id) DEFERRABLE INITIALLY IMMEDIATE",
     r"unique index on \(event_id\) is DEFERRABLE"),
])
def test_a_table_the_write_path_cannot_write_is_drift_at_plan_time(
        topics: Any, clients: Any, db: Any, pg_dsn: str, alter: str, named: str) -> None:
    pipeline = items(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(alter.encode())
    produce(clients, pipeline.topic, [(b"k", item(1), None)])

    with pytest.raises(SchemaDrift, match=named):
        run(pipeline, clients, db)
    nothing_moved(pg_dsn)


def test_an_invalid_unique_index_is_drift(topics: Any, clients: Any, db: Any,
                                          pg_dsn: str) -> None:
    # A CREATE UNIQUE INDEX CONCURRENTLY that failed leaves an index ON CONFLICT cannot use
    pipeline = items(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE p_rows DROP CONSTRAINT p_rows_pkey")
        for _ in range(2):
            conn.execute("INSERT INTO p_rows (event_id, qty, sizes, source_topic,"
                         " source_partition, source_offset) VALUES ('dup', 1, '{}', 't', 0, 0)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY p_rows_key ON p_rows (event_id)")
        conn.execute("DELETE FROM p_rows")
    with pytest.raises(SchemaDrift, match=r"is not valid .*REINDEX INDEX p_rows_key"):
        run(pipeline, clients, db)


@pytest.mark.parametrize(("alter", "named"), [
    ("ALTER TABLE p_rows_tombstones DROP CONSTRAINT p_rows_tombstones_pkey",
     r"p_rows_tombstones has no unique index on \(account\)"),
    ("ALTER TABLE p_rows_tombstones ALTER COLUMN deleted_at DROP DEFAULT",
     r"p_rows_tombstones\.deleted_at .* without a default"),
    ("ALTER TABLE p_rows_tombstones DROP COLUMN source_offset",
     r"column source_offset is missing"),
])
def test_a_marker_table_that_lost_what_deletes_need_is_refused_before_the_first_tombstone(
        topics: Any, clients: Any, db: Any, pg_dsn: str, alter: str, named: str) -> None:
    pipeline = deleting(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(alter.encode())
    produce(clients, pipeline.topic, [(b"a", b'{"event_id": "e1", "amount": 1}', None),
                                      (b"a", None, None)])
    with pytest.raises(SchemaDrift, match=named):
        run(pipeline, clients, db)
    nothing_moved(pg_dsn)


def test_an_old_latest_table_and_marker_table_gain_the_incarnation_columns(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    # Tables made before incarnations were kept: the plan adds the columns (their rows and
    # markers belong to the first incarnation), and deletes go on as before.
    pipeline = deleting(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("ALTER TABLE p_rows DROP COLUMN source_incarnation")
        conn.execute("ALTER TABLE p_rows_tombstones DROP COLUMN source_incarnation,"
                     " DROP COLUMN source_topic")
        conn.execute("INSERT INTO p_rows_tombstones (account, source_partition, source_offset)"
                     " VALUES ('gone', 0, 5)")
    with pytest.raises(SchemaDrift, match="source_incarnation is missing"):
        run(pipeline, clients, db)
    changes = apply(pg_dsn, pipeline)
    assert len(changes) == 3, changes
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT source_topic, source_incarnation FROM p_rows_tombstones"
                            ).fetchall() == [(pipeline.topic, 1)]
    produce(clients, pipeline.topic, [(b"a", b'{"event_id": "e1", "amount": 1}', None),
                                      (b"a", None, None)])
    done = run(pipeline, clients, db)
    assert (done["inserted"], done["deleted"], done["dead_lettered"]) == (1, 1, 0), done


def test_a_deleting_pipeline_on_a_63_character_table_gets_a_marker_table_of_its_own(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    # "<63 characters>_tombstones" cut to 63 is the table itself (schema apply ended in
    # DuplicateTable); two tables sharing their first 52 characters shared one.
    name = "account_balances_of_every_customer_in_every_region_we_serve_aaa"
    assert len(name) == 63
    one = deleting(topics, table=name)
    two = deleting(topics, table=name[:-1] + "b")
    apply(pg_dsn, one)
    apply(pg_dsn, two)
    assert marker_table(one) != marker_table(two)
    produce(clients, one.topic, [(b"a", b'{"event_id": "e1", "amount": 1}', None),
                                 (b"b", b'{"event_id": "e2", "amount": 2}', None),
                                 (b"a", None, None)])
    done = run(one, clients, db)
    assert (done["inserted"], done["deleted"], done["dead_lettered"]) == (2, 1, 0), done
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute(f'SELECT account FROM "{name}"').fetchall() == [("b",)]
        assert conn.execute(f'SELECT account FROM "{marker_table(one)}"').fetchall() == [
            ("a",)]
        assert conn.execute(f'SELECT count(*) FROM "{marker_table(two)}"').fetchone() == (0,)


def test_markers_kept_under_the_name_postgres_cut_stay_in_force_after_the_upgrade(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    # Before derived names, the marker table of a table of 53 to 62 characters was
    # "<table>_tombstones" as Postgres cut it to 63 bytes. Its markers must keep their
    # keys deleted under the new name: a backfill of a deleted key's older record must
    # not bring the row back.
    name = "account_balances_of_every_customer_in_every_region_ab"
    legacy = f"{name}_tombstones".encode()[:63].decode()
    pipeline = deleting(topics, table=name)
    assert marker_table(pipeline) != legacy
    apply(pg_dsn, pipeline)
    produce(clients, pipeline.topic, [(b"a", b'{"event_id": "e1", "amount": 1}', None),
                                      (b"a", None, None)])
    done = run(pipeline, clients, db)
    assert (done["inserted"], done["deleted"]) == (1, 1), done
    with psycopg.connect(pg_dsn) as conn:  # the database as the version before left it
        conn.execute(f'ALTER TABLE "{marker_table(pipeline)}" RENAME TO "{legacy}"')
    assert apply(pg_dsn, pipeline) == [  # the upgrade: `kafka-ingest schema apply`
        f'ALTER TABLE "{legacy}" RENAME TO "{marker_table(pipeline)}"']
    again = run_backfill(pipeline, OffsetWindow(partitions={0: (0, 1)}), clients, db,
                         run_id=f"backfill__{uuid.uuid4().hex[:8]}")
    with psycopg.connect(pg_dsn) as conn:
        resurrected = conn.execute(f'SELECT account FROM "{name}"').fetchall()
    assert resurrected == [], again

    # A marker table made beside the old one (a schema apply before this was known):
    # the old one's markers are not in force, which the plan refuses, naming both.
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(f'CREATE TABLE "{legacy}" (LIKE "{marker_table(pipeline)}")')
    with pytest.raises(SchemaDrift, match=f"{legacy} holds deletion markers"):
        run(pipeline, clients, db)
