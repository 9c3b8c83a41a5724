"""A mirror's table writes on real Postgres (``envelope: debezium``, #34): an update whose
TOASTed columns Debezium left out keeps their stored values, and a truncate deletes every
row placed before it, moving its partition's truncate point, so a replay of older offsets
brings none back.
(The change events themselves come from Debezium's real connector in
``test_debezium_mirror.py``; here the rows are given as the envelope makes them.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kafka_ingest.config import UNAVAILABLE, UNAVAILABLE_JSON, Pipeline, parse_pipelines
from kafka_ingest.db import Database, UnitOfWork
from kafka_ingest.db.tables import apply_tables, marker_table, row_columns
from kafka_ingest.records import EVERY_KEY, Row, Source, Tombstone

pytestmark = pytest.mark.integration

CUSTOMER: dict[str, Any] = {"fields": {
    "id": {"type": "bigint"},
    "name": {"type": "text", "max_length": 64},
    "notes": {"type": "text", "max_length": 100_000, "required": False},
    "profile": {"type": "jsonb", "required": False},
    "photo": {"type": "bytea", "required": False},
}}


@pytest.fixture
def mirror(topics: Any) -> Pipeline:
    return parse_pipelines({"contracts": {"customer": CUSTOMER}, "pipelines": {"customers": {
        "topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "customers",
        "contract": {"event_type": "customer", "version": 1}, "envelope": "debezium",
        "on_truncate": "truncate",
        "record_key": {"column": "id", "format": "json", "type": "bigint"}}}},
        source="t.yaml")["customers"]


@pytest.fixture
def conn(db: Database, mirror: Pipeline) -> Iterator[psycopg.Connection[Any]]:
    c = db.connect()
    apply_tables(c, mirror)
    try:
        yield c
    finally:
        c.close()


def row(pipeline: Pipeline, offset: int, **given: Any) -> Row:
    values = {"event_id": None, "name": "n", "notes": None, "profile": None, "photo": None,
              "source_topic": pipeline.topic, "source_partition": 0, "source_offset": offset,
              "kafka_key": b"k", "kafka_timestamp": None, **given}
    return tuple(values[c.name] for c in row_columns(pipeline))


def write(db: Database, pipeline: Pipeline, rows: list[Row],
          deletes: list[Tombstone] = (), *,  # type: ignore[assignment]
          incarnation: int = 1) -> Any:
    source = Source(pipeline.topic, None, incarnation)
    with UnitOfWork(db.connect(), pipeline) as uow:
        uow.rows.serialize([0, 1])
        up = uow.rows.upsert(rows, source=source)
        gone = uow.rows.delete(list(deletes), source=source) if deletes else None
        uow.commit()
    return up, gone


def table(conn: Any, pipeline: Pipeline) -> dict[int, tuple[Any, ...]]:
    return {r[0]: r[1:] for r in conn.execute(sql.SQL(
        "SELECT id, name, notes, profile, photo, source_offset FROM {} ORDER BY id").format(
            sql.Identifier(pipeline.table)))}


def markers(conn: Any, pipeline: Pipeline) -> dict[int, int]:
    return dict(conn.execute(sql.SQL("SELECT id, source_offset FROM {}").format(
        sql.Identifier(str(marker_table(pipeline))))).fetchall())


def truncate_points(conn: Any) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT pipeline, source_topic, source_partition, source_incarnation,"
                        " source_offset FROM truncate_points ORDER BY 1, 2, 3").fetchall()


def test_an_update_keeps_the_columns_debezium_left_out(db: Database, mirror: Pipeline,
                                                        conn: Any) -> None:
    long = "x" * 20_000
    write(db, mirror, [row(mirror, 0, id=1, name="Ada", notes=long, profile={"tier": "gold"},
                           photo=b"\x00\x01")])
    up, _ = write(db, mirror, [row(mirror, 1, id=1, name="Ada L.", notes=UNAVAILABLE,
                                   profile=list(UNAVAILABLE_JSON),
                                   photo=UNAVAILABLE.encode())])
    assert up.inserted == 1 and not up.missing
    conn.rollback()
    assert table(conn, mirror) == {1: ("Ada L.", long, {"tier": "gold"}, b"\x00\x01", 1)}
    # a later update that does carry them replaces them
    write(db, mirror, [row(mirror, 2, id=1, name="Ada", notes="short", profile={"t": 1},
                           photo=None)])
    conn.rollback()
    assert table(conn, mirror) == {1: ("Ada", "short", {"t": 1}, None, 2)}


def test_a_truncate_deletes_every_row_before_it_and_a_replay_brings_none_back(
        db: Database, mirror: Pipeline, conn: Any) -> None:
    write(db, mirror, [row(mirror, 0, id=1), row(mirror, 1, id=2)])
    # one chunk: a row before the truncate, the truncate, a row after it
    up, gone = write(db, mirror, [row(mirror, 3, id=3), row(mirror, 7, id=4)],
                     [Tombstone(EVERY_KEY, mirror.topic, 0, 5)])
    assert (up.inserted, gone.deleted, gone.missing, gone.rejected) == (2, 3, 0, [])
    conn.rollback()
    assert list(table(conn, mirror)) == [4]
    # no marker per row: the partition's truncate point says it all
    assert markers(conn, mirror) == {}
    assert truncate_points(conn) == [(mirror.name, mirror.topic, 0, 1, 5)]
    # a backfill of the offsets before the truncate: every row stays deleted
    again, _ = write(db, mirror, [row(mirror, 0, id=1), row(mirror, 1, id=2),
                                  row(mirror, 3, id=3)])
    assert (again.inserted, again.stale, again.missing) == (0, 3, 0)
    conn.rollback()
    assert list(table(conn, mirror)) == [4]
    assert markers(conn, mirror) == {}


def test_a_row_placed_before_a_truncate_that_the_table_never_held_stays_truncated(
        db: Database, mirror: Pipeline, conn: Any) -> None:
    """Key 9's insert at offset 2 was dead-lettered (too large, say), then the source was
    truncated at offset 5: the DLQ replay (or a backfill) of offset 2 is older than the
    truncate and must not bring the row back."""
    write(db, mirror, [row(mirror, 0, id=1)], [Tombstone(EVERY_KEY, mirror.topic, 0, 5)])
    replayed, _ = write(db, mirror, [row(mirror, 2, id=9)])
    conn.rollback()
    assert (replayed.inserted, replayed.stale) == (0, 1)
    assert table(conn, mirror) == {}


def test_a_truncate_orders_against_its_own_partition_and_older_incarnations(
        db: Database, mirror: Pipeline, conn: Any) -> None:
    """Debezium's truncate event has no key: on a topic of several partitions it lands in
    one. It deletes the rows placed before it in that partition, and every row of an older
    incarnation of the topic; another partition's rows are not ordered against it and
    stay, and so do its records replayed later."""
    write(db, mirror, [row(mirror, 0, id=1), row(mirror, 4, id=2, source_partition=1)],
          incarnation=1)
    write(db, mirror, [row(mirror, 0, id=3), row(mirror, 9, id=4, source_partition=1)],
          [Tombstone(EVERY_KEY, mirror.topic, 0, 5)], incarnation=2)
    conn.rollback()
    assert list(table(conn, mirror)) == [4]  # 1, 2: incarnation 1; 3: before it
    # replays: partition 0 before the truncate, and incarnation 1 anywhere, stay out;
    # partition 1 of incarnation 2 is written, before the truncate's offset or not
    old, _ = write(db, mirror, [row(mirror, 3, id=5, source_partition=1)], incarnation=1)
    before, _ = write(db, mirror, [row(mirror, 4, id=6)], incarnation=2)
    beside, _ = write(db, mirror, [row(mirror, 2, id=7, source_partition=1)], incarnation=2)
    after, _ = write(db, mirror, [row(mirror, 6, id=8)], incarnation=2)
    assert [(r.inserted, r.stale, r.missing) for r in (old, before, beside, after)] == [
        (0, 1, 0), (0, 1, 0), (1, 0, 0), (1, 0, 0)]
    conn.rollback()
    assert list(table(conn, mirror)) == [4, 7, 8]


def test_a_truncate_read_again_leaves_the_newer_truncate_point(
        db: Database, mirror: Pipeline, conn: Any) -> None:
    """A backfill re-reads a truncate older than the partition's newest: the point stays
    at the newest, and a row between the two stays out."""
    write(db, mirror, [], [Tombstone(EVERY_KEY, mirror.topic, 0, 3)])
    write(db, mirror, [], [Tombstone(EVERY_KEY, mirror.topic, 0, 8)])
    write(db, mirror, [row(mirror, 2, id=1)], [Tombstone(EVERY_KEY, mirror.topic, 0, 3)])
    between, _ = write(db, mirror, [row(mirror, 5, id=2)])
    conn.rollback()
    assert truncate_points(conn) == [(mirror.name, mirror.topic, 0, 1, 8)]
    assert (between.inserted, between.stale, between.missing) == (0, 1, 0)
    assert table(conn, mirror) == {}
