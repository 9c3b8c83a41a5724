"""The mirror's source, on real Debezium: what Debezium's Postgres connector (pgoutput, on the
stack's Kafka Connect worker) writes to Kafka for each kind of change at the source, read
back raw from the table's topic (JsonConverter keys and values with their schemas).

These pin down the events the ``envelope: debezium`` pipelines are built and tested on:
the snapshot (``r``), inserts (``c``), updates (``u``) with the TOAST placeholder for a large
value the update did not touch, deletes (``d``, then a tombstone), truncates (``t``) and a
column added upstream (a new schema in the next event).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.debezium import UNAVAILABLE, ChangeEvent, DebeziumSource

pytestmark = pytest.mark.integration

CUSTOMERS = {"customers": "id int PRIMARY KEY, name text NOT NULL, notes text"}
#: Past Postgres' TOAST threshold (2 kB) even compressed: random hex does not shrink below
#: half, so 20 000 characters are stored out of line.
LONG_NOTES = secrets.token_hex(10_000)


def _source(make: Callable[..., DebeziumSource], *rows: str) -> DebeziumSource:
    return make(CUSTOMERS, setup=[f"INSERT INTO customers VALUES {row}" for row in rows])


def _field_types(schema: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {f["field"]: (f["type"], f["optional"]) for f in schema["fields"]}


def test_the_snapshot_reads_each_row_as_op_r_keyed_by_its_primary_key(
        debezium_source: Callable[..., DebeziumSource]) -> None:
    src = _source(debezium_source, "(1, 'ada', 'first')", "(2, 'bob', NULL)")
    events = src.next_events("customers", 2, wait=False)  # the fixture waited for them
    assert [e.op for e in events] == ["r", "r"]
    assert [e.key_payload for e in events] == [{"id": 1}, {"id": 2}]
    assert [e.after for e in events] == [{"id": 1, "name": "ada", "notes": "first"},
                                        {"id": 2, "name": "bob", "notes": None}]
    assert all(e.before is None for e in events)
    first = events[0]
    # The key is the primary-key struct, with its Connect schema (schemas.enable=true).
    assert first.key is not None
    assert first.key["schema"]["type"] == "struct"
    assert _field_types(first.key["schema"]) == {"id": ("int32", False)}
    # The value is Debezium's envelope: before, after, source, op, ts_ms (and transaction).
    assert {"before", "after", "source", "op", "ts_ms"} <= set(first.payload)
    assert first.payload["source"]["connector"] == "postgresql"
    assert first.payload["source"]["table"] == "customers"
    assert first.payload["source"]["snapshot"] in {"first", "true", "last"}
    assert first.row_fields() == ["id", "name", "notes"]


def test_inserts_updates_and_deletes_stream_as_c_u_d_then_a_tombstone(
        debezium_source: Callable[..., DebeziumSource]) -> None:
    src = _source(debezium_source, "(1, 'ada', 'first')")
    src.skip_to_end("customers")
    src.execute("INSERT INTO customers VALUES (2, 'bob', 'second'), (3, 'cy', NULL)")
    src.execute("UPDATE customers SET name = 'ada lovelace' WHERE id = 1")
    src.execute("DELETE FROM customers WHERE id = 2")
    src.caught_up()
    events = src.next_events("customers", 5, wait=False)
    inserted_2, inserted_3, updated, deleted, tombstone = events
    assert (inserted_2.op, inserted_2.before, inserted_2.after) == (
        "c", None, {"id": 2, "name": "bob", "notes": "second"})
    assert (inserted_3.op, inserted_3.after) == ("c", {"id": 3, "name": "cy", "notes": None})
    assert updated.op == "u" and updated.key_payload == {"id": 1}
    assert updated.after == {"id": 1, "name": "ada lovelace", "notes": "first"}
    # REPLICA IDENTITY DEFAULT: the old row is not in the WAL, so there is no "before".
    assert updated.before is None
    assert deleted.op == "d" and deleted.after is None and deleted.key_payload == {"id": 2}
    # The old row of a delete carries its key only (REPLICA IDENTITY DEFAULT): Debezium fills
    # the other columns with their type's empty value ("" for a NOT NULL text, else null).
    assert deleted.before == {"id": 2, "name": "", "notes": None}
    assert tombstone.tombstone and tombstone.key_payload == {"id": 2}
    # Each change in commit order, each source position after the one before.
    lsns = [int(e.payload["source"]["lsn"]) for e in (inserted_2, inserted_3, updated, deleted)]
    assert lsns == sorted(lsns)


def test_an_update_leaving_a_toasted_value_alone_carries_the_placeholder(
        debezium_source: Callable[..., DebeziumSource]) -> None:
    src = _source(debezium_source, f"(1, 'ada', '{LONG_NOTES}')", f"(2, 'bob', '{LONG_NOTES}')")
    snapshot = src.next_events("customers", 2, wait=False)
    assert [e.after["notes"] for e in snapshot if e.after] == [LONG_NOTES, LONG_NOTES]
    assert src.query("SELECT relreplident FROM pg_class WHERE relname = 'customers'") == [("d",)]
    src.execute("UPDATE customers SET name = 'ada lovelace' WHERE id = 1")
    new_notes = secrets.token_hex(10_000)
    src.execute("UPDATE customers SET notes = %s WHERE id = 2", (new_notes,))
    src.caught_up()
    untouched, rewritten = src.next_events("customers", 2, wait=False)
    # The TOASTed column the update did not change: Debezium cannot read it from the WAL.
    assert untouched.op == "u"
    assert untouched.after == {"id": 1, "name": "ada lovelace", "notes": UNAVAILABLE}
    assert src.query("SELECT notes FROM customers WHERE id = 1") == [(LONG_NOTES,)]
    # One the update did write arrives whole.
    assert rewritten.op == "u" and rewritten.after == {"id": 2, "name": "bob",
                                                       "notes": new_notes}


def test_a_truncate_is_emitted_as_op_t(debezium_source: Callable[..., DebeziumSource]) -> None:
    src = _source(debezium_source, "(1, 'ada', NULL)", "(2, 'bob', NULL)")
    src.skip_to_end("customers")
    src.execute("TRUNCATE customers")
    src.caught_up()
    (truncated,) = src.next_events("customers", 1, wait=False)
    assert truncated.op == "t"
    assert truncated.key is None
    assert truncated.before is None and truncated.after is None
    assert truncated.payload["source"]["table"] == "customers"


def test_a_column_added_at_the_source_is_in_the_next_events_schema(
        debezium_source: Callable[..., DebeziumSource]) -> None:
    src = _source(debezium_source, "(1, 'ada', NULL)")
    (snapshotted,) = src.next_events("customers", 1, wait=False)
    src.execute("ALTER TABLE customers ADD COLUMN email varchar(200)")
    src.execute("INSERT INTO customers VALUES (2, 'bob', NULL, 'bob@example.org')")
    src.caught_up()
    (inserted,) = src.next_events("customers", 1, wait=False)
    assert snapshotted.row_fields() == ["id", "name", "notes"]
    assert inserted.row_fields() == ["id", "name", "notes", "email"]
    assert inserted.after == {"id": 2, "name": "bob", "notes": None,
                              "email": "bob@example.org"}
    after_schema = _after_schema(inserted)
    assert _field_types(after_schema)["email"] == ("string", True)


def _after_schema(event: ChangeEvent) -> dict[str, Any]:
    assert event.value is not None
    (after,) = [f for f in event.value["schema"]["fields"] if f["field"] == "after"]
    return after
