"""The order an append chunk's rows travel in: one copy of each event, in key order."""

from __future__ import annotations

import random

from kafka_ingest.config import Pipeline
from kafka_ingest.db.copy import write_order
from kafka_ingest.records import Row


def _row(event_id: str, topic: str, partition: int, offset: int) -> Row:
    return (event_id, "d", 0, 1.0, "OK", None, topic, partition, offset, b"k", None)


def _expected(rows: list[Row]) -> list[Row]:
    """What ON CONFLICT's DISTINCT ON keeps, written the plain way: of each event_id the
    lowest (topic, partition, offset), in event_id order."""
    best: dict[str, Row] = {}
    for row in rows:
        if row[0] not in best or row[6:9] < best[row[0]][6:9]:
            best[row[0]] = row
    return [best[k] for k in sorted(best)]


def test_a_chunk_without_copies_is_sorted_by_key_and_keeps_every_row(
        shipped: dict[str, Pipeline]) -> None:
    order = write_order(shipped["telemetry_metrics"])
    rows = [_row(f"e-{i}", "t", 0, i) for i in (5, 1, 10, 2)]
    assert order(rows) == [rows[1], rows[2], rows[3], rows[0]]  # "e-10" < "e-2": bytes


def test_of_each_event_the_lowest_place_in_the_log_stays_whatever_the_chunks_order(
        shipped: dict[str, Pipeline]) -> None:
    order = write_order(shipped["telemetry_metrics"])
    rnd = random.Random(11)
    for _ in range(300):
        # a replay's chunk: several topics and partitions, events up to four times, a
        # letter twice (the same place), keys with non-ASCII characters
        rows = [_row(rnd.choice(["a", "b", "é", "z", "ab", "ü-1"]) + str(rnd.randrange(8)),
                     rnd.choice(["t", "T", "tü"]), rnd.randrange(3), rnd.randrange(20))
                for _ in range(rnd.randrange(0, 40))]
        rows += rnd.sample(rows, min(len(rows), 3))
        got = order(list(rows))
        assert got == _expected(rows)
        ids = [r[0].encode() for r in got]
        assert ids == sorted(ids)  # Postgres' COLLATE "C" order


def test_latest_pipelines_keep_their_rows_as_they_are(shipped: dict[str, Pipeline]) -> None:
    rows = [_row("b", "t", 0, 1), _row("a", "t", 0, 2), _row("b", "t", 0, 3)]
    assert write_order(shipped["device_state"])(rows) == rows
