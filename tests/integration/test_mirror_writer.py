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


def test_a_change_that_leaves_columns_out_of_a_row_the_table_lacks_is_dead_lettered(
        db: Database, mirror: Pipeline, conn: Any) -> None:
    """Updates carrying Debezium's placeholders (text, jsonb, bytea) of keys the table holds
    no row of (their inserts were dead-lettered, or came before the mirror began; key 3's
    row deleted): each is returned for the DLQ as ``unavailable_value``, never written with
    the placeholder, while the rest of the chunk (key 2, key 5's update of a held row) is
    written. Replaying key 1's insert, then its letter, or a later change carrying the
    values (key 4), leaves the rows the source holds."""
    long = "x" * 20_000
    write(db, mirror, [row(mirror, 0, id=5, notes=long), row(mirror, 1, id=3)],
          [Tombstone(3, mirror.topic, 0, 2)])
    left_out = {"notes": UNAVAILABLE, "profile": list(UNAVAILABLE_JSON),
                "photo": UNAVAILABLE.encode()}
    chunk = [row(mirror, 11, id=1, name="Ada", **left_out),
             row(mirror, 12, id=2, name="Bob", notes="b"),
             row(mirror, 13, id=3, name="Cy", notes=UNAVAILABLE),
             row(mirror, 14, id=4, name="Di", photo=UNAVAILABLE.encode()),
             row(mirror, 15, id=5, name="Ed", **left_out)]
    up, _ = write(db, mirror, chunk)
    assert (up.inserted, up.missing) == (2, 0)
    assert [(r, e.error_class) for r, e in up.rejected] == [
        (chunk[0], "unavailable_value"), (chunk[2], "unavailable_value"),
        (chunk[3], "unavailable_value")]
    detail = up.rejected[0][1].detail
    assert "key 1 at" in detail and "notes, profile, photo" in detail, detail
    conn.rollback()
    assert table(conn, mirror) == {2: ("Bob", "b", None, None, 12),
                                   5: ("Ed", long, None, None, 15)}
    # key 1's insert replayed (its contract fixed), then its update's letter; key 4 changed
    # again at the source, carrying the value this time
    write(db, mirror, [row(mirror, 10, id=1, name="A", notes=long, profile={"t": 1},
                           photo=b"\x01")])
    again, _ = write(db, mirror, [up.rejected[0][0],
                                  row(mirror, 16, id=4, name="Di", photo=b"\x02")])
    assert (again.inserted, again.rejected, again.missing) == (2, [], 0)
    conn.rollback()
    assert table(conn, mirror) == {1: ("Ada", long, {"t": 1}, b"\x01", 11),
                                   2: ("Bob", "b", None, None, 12),
                                   4: ("Di", None, None, b"\x02", 16),
                                   5: ("Ed", long, None, None, 15)}


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


ORDER_LINE: dict[str, Any] = {"fields": {
    "region": {"type": "text", "max_length": 8},
    "order_no": {"type": "integer"},
    "name": {"type": "text", "max_length": 64},
    "notes": {"type": "text", "max_length": 100_000, "required": False},
}}


@pytest.fixture
def lines(topics: Any, db: Database) -> Pipeline:
    """A mirror of a source table whose primary key is (region, order_no)."""
    pipeline = parse_pipelines({"contracts": {"line": ORDER_LINE}, "pipelines": {"lines": {
        "topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "order_lines",
        "contract": {"event_type": "line", "version": 1}, "envelope": "debezium",
        "on_truncate": "truncate", "identity": ["region", "order_no"]}}},
        source="t.yaml")["lines"]
    with db.connect() as c:
        apply_tables(c, pipeline)
        c.commit()
    return pipeline


def line(pipeline: Pipeline, offset: int, region: str, order_no: int, name: str = "n",
         notes: str | None = None) -> Row:
    values = {"event_id": None, "region": region, "order_no": order_no, "name": name,
              "notes": notes, "source_topic": pipeline.topic, "source_partition": 0,
              "source_offset": offset, "kafka_key": b"k", "kafka_timestamp": None}
    return tuple(values[c.name] for c in row_columns(pipeline))


def lines_table(conn: Any, pipeline: Pipeline) -> dict[tuple[str, int], tuple[Any, ...]]:
    conn.rollback()
    return {(r[0], r[1]): r[2:] for r in conn.execute(sql.SQL(
        "SELECT region, order_no, name, notes, source_offset FROM {} ORDER BY 1, 2").format(
            sql.Identifier(pipeline.table)))}


def test_a_composite_primary_key_keys_the_mirror_its_deletes_markers_and_truncates(
        db: Database, lines: Pipeline) -> None:
    """Rows told apart by (region, order_no) only; an update keeps the TOASTed column it
    left out; a delete by the composite key leaves a marker of both columns, which a replay
    of the older insert meets; a truncate and a replay from before it."""
    conn = db.connect()
    assert conn.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
                        "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE "
                        "i.indisprimary AND i.indrelid = %s::regclass ORDER BY a.attnum",
                        (str(marker_table(lines)),)).fetchall() == [("region",), ("order_no",)]
    long = "x" * 20_000
    up, _ = write(db, lines, [line(lines, 0, "eu", 1, "a", long), line(lines, 1, "us", 1, "b"),
                              line(lines, 2, "eu", 2, "c")])
    assert (up.inserted, up.missing) == (3, 0)
    up, gone = write(db, lines, [line(lines, 3, "eu", 1, "a2", UNAVAILABLE)],
                     [Tombstone(("us", 1), lines.topic, 0, 4)])
    assert (up.inserted, gone.deleted, gone.missing, gone.rejected) == (1, 1, 0, [])
    assert lines_table(conn, lines) == {("eu", 1): ("a2", long, 3), ("eu", 2): ("c", None, 2)}
    assert conn.execute(sql.SQL("SELECT region, order_no, source_offset FROM {}").format(
        sql.Identifier(str(marker_table(lines))))).fetchall() == [("us", 1, 4)]
    # a replay of the deleted row's insert: stale against its marker; a new key is written
    again, _ = write(db, lines, [line(lines, 1, "us", 1, "b"), line(lines, 5, "us", 2, "d")])
    assert (again.inserted, again.stale, again.missing) == (1, 1, 0)
    # the truncate at 6, then a replay of offsets before it: nothing comes back
    _, gone = write(db, lines, [line(lines, 7, "eu", 9, "e")],
                    [Tombstone(EVERY_KEY, lines.topic, 0, 6)])
    assert gone.deleted == 3
    replayed, _ = write(db, lines, [line(lines, 0, "eu", 1, "a"), line(lines, 5, "us", 2, "d")])
    assert (replayed.inserted, replayed.stale, replayed.missing) == (0, 2, 0)
    assert lines_table(conn, lines) == {("eu", 9): ("e", None, 7)}
    conn.close()
