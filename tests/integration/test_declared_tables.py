"""Pipelines declared without Python: contracts from the pipelines file, tables planned and
applied from them, drift found at plan time, key and header columns, the Postgres types
users reach for, and time-partitioned tables, on the real stack."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.contracts.columns import SYSTEM_COLUMNS
from kafka_ingest.db.tables import apply_tables
from kafka_ingest.engine.ingest import run_ingest
from kafka_ingest.engine.replay import plan_replay, replay_range, summarize_replay
from kafka_ingest.errors import SchemaDrift
from kafka_ingest.requests import LiveRun, ReplayFilters, ReplayRequest
from kafka_ingest_dev import stack
from tests.support.cli import cli
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

#: Every type a declaration offers, one field each.
EVERY_TYPE = {
    "version": 1,
    "fields": {
        "account": {"type": "text", "max_length": 32},
        "small": {"type": "smallint"},
        "count": {"type": "integer", "ge": 0},
        "big": {"type": "bigint"},
        "ratio": {"type": "float"},
        "amount": {"type": "numeric", "precision": 12, "scale": 3},
        "active": {"type": "boolean"},
        "at_iso": {"type": "timestamptz"},
        "at_s": {"type": "timestamptz", "encoding": "epoch_seconds"},
        "at_ms": {"type": "timestamptz", "encoding": "epoch_millis"},
        "opened": {"type": "date"},
        "owner": {"type": "uuid"},
        "attrs": {"type": "jsonb"},
        "tags": {"type": "array", "items": {"type": "text", "max_length": 8},
                 "max_items": 4},
        "scores": {"type": "array", "items": {"type": "bigint"}, "required": False},
        "note": {"type": "text", "max_length": 64, "required": False},
        "region": {"type": "text", "max_length": 8, "default": "eu"},
        "camelName": {"type": "text", "max_length": 16, "column": "camel_name",
                      "required": False},
    },
}
GOOD = {
    "event_id": "e-1", "account": "acc-1", "small": 32767, "count": 7,
    "big": -9223372036854775808, "ratio": 0.25, "amount": "123456789.125", "active": True,
    "at_iso": "2026-03-04T05:06:07.5+02:00", "at_s": 1767225600.25, "at_ms": 1767225600123,
    "opened": "2024-02-29", "owner": "7f0e3b2c-1111-4c4c-9a9a-0123456789ab",
    "attrs": {"limits": {"daily": 500}, "flags": [1, "two", None]},
    "tags": ["a", "b"], "scores": [1, -2], "camelName": "Ada",
}


def produce(clients: Any, topic: str,
            records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]],
            *, partition: int = 0) -> None:
    producer = clients.producer()
    failures: list[Any] = []
    for key, value, headers in records:
        producer.produce(topic, key=key, value=value, headers=headers, partition=partition,
                         on_delivery=lambda err, _m: failures.extend([err] if err else []))
    assert producer.flush(30) == 0 and not failures


def declared(topics: Any, contracts: dict[str, Any], **body: Any) -> Pipeline:
    """One pipeline named ``p`` on fresh random topics (one partition), over ``contracts``."""
    body = {"topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "p_rows",
            "partitions": 1, **body}
    return parse_pipelines({"contracts": contracts, "pipelines": {"p": body}})["p"]


def run(pipeline: Pipeline, clients: Any, db: Any) -> dict[str, Any]:
    return run_ingest(pipeline, clients, db, run_id=f"test__{uuid.uuid4().hex[:8]}")


def replay(pipeline: Pipeline, clients: Any, db: Any) -> dict[str, Any]:
    run_id = f"replay__{uuid.uuid4().hex[:8]}"
    asked = ReplayRequest(LiveRun(), False, ReplayFilters())
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=asked)
    return summarize_replay(replay_range(pipeline, r, clients, db, run_id=run_id,
                                         dry_run=False, filters=None).to_dict()
                            for r in ranges)


def apply(pg_dsn: str, pipeline: Pipeline) -> list[str]:
    with psycopg.connect(pg_dsn) as conn:
        return [c.statement for c in apply_tables(conn, pipeline).changes]


def letters(pg_dsn: str) -> dict[int, str]:
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT source_offset, error_class FROM dead_letters"
                            " WHERE status = 'parked'").fetchall()
    return {int(o): c for o, c in rows}



# --------------------------------------------------------------------------- types


def test_every_declared_type_lands_exactly_and_each_kind_of_poison_is_dead_lettered(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    pipeline = declared(topics, {"every_type": EVERY_TYPE},
                        contract={"event_type": "every_type", "version": 1},
                        headers={"trace-id": "trace_id"})
    apply(pg_dsn, pipeline)
    poison = {
        # the contract refuses it (each a rule of the hand-written contracts too)
        1: {**GOOD, "event_id": "e-2", "small": 32768},
        2: {**GOOD, "event_id": "e-3", "amount": "1.0005"},
        3: {**GOOD, "event_id": "e-4", "at_iso": "2026-03-04T05:06:07"},
        4: {**GOOD, "event_id": "e-5", "tags": ["toolongtag"]},
        5: {**GOOD, "event_id": "e-6", "owner": "not-a-uuid"},
        6: {**GOOD, "event_id": "e-7", "attrs": "a string"},
        7: {**GOOD, "event_id": "e-8", "active": 1},
        # jsonb cannot hold \u0000: the contract looks inside, before Postgres would refuse
        8: {**GOOD, "event_id": "e-9", "attrs": {"s": "nul\u0000"}},
    }
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]] = [
        (b"k", json.dumps(GOOD).encode(), [("trace-id", b"t-1")])]
    records += [(b"k", json.dumps(v).encode(), None) for _, v in sorted(poison.items())]
    records.append((b"k", json.dumps({**GOOD, "event_id": "e-10"}).encode(),
                    [("trace-id", b"\xff")]))  # offset 9: the header is not UTF-8
    produce(clients, pipeline.topic, records)

    summary = run(pipeline, clients, db)

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (10, 1, 9)
    assert letters(pg_dsn) == {**dict.fromkeys(range(1, 9), "contract_violation"),
                               9: "bad_header"}
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT account, small, count, big, ratio, amount, active, at_iso, at_s, at_ms,"
            " opened, owner, attrs, tags, scores, note, region, camel_name, trace_id"
            " FROM p_rows").fetchall()
    assert row == [(
        "acc-1", 32767, 7, -9223372036854775808, 0.25, Decimal("123456789.125"), True,
        datetime(2026, 3, 4, 3, 6, 7, 500000, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC),
        datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=UTC),
        date(2024, 2, 29), UUID("7f0e3b2c-1111-4c4c-9a9a-0123456789ab"),
        {"limits": {"daily": 500}, "flags": [1, "two", None]}, ["a", "b"], [1, -2], None,
        "eu", "Ada", "t-1")]


EPOCHS = {"version": 1, "fields": {
    "at_s": {"type": "timestamptz", "encoding": "epoch_seconds"},
    "at_ms": {"type": "timestamptz", "encoding": "epoch_millis"},
}}


def test_the_last_second_of_year_9999_lands_exactly_and_year_10000_is_dead_lettered(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    """Both epoch encodings over the write path (validation, the conversion in the row
    builder, binary COPY, the upsert) at the end of the range: every instant of
    9999-12-31T23:59:59Z's second lands as the timestamptz Postgres' own ``to_timestamp``
    makes of it, 10000-01-01T00:00:00Z is a dead letter."""
    pipeline = declared(topics, {"epochs": EPOCHS},
                        contract={"event_type": "epochs", "version": 1})
    apply(pg_dsn, pipeline)
    events = [
        # the last second's start, and the case the fix is about: its last millisecond
        {"event_id": "e-0", "at_s": 253402300799, "at_ms": 253402300799999},
        # half-way through it; .001 of it
        {"event_id": "e-1", "at_s": 253402300799.5, "at_ms": 253402300799001},
        # the last double below 253402300800 (a 2**-15 s step)
        {"event_id": "e-2", "at_s": 253402300799.99997, "at_ms": 253402300799000},
        # 10000-01-01T00:00:00Z, in each encoding
        {"event_id": "x-3", "at_s": 253402300800, "at_ms": 253402300799999},
        {"event_id": "x-4", "at_s": 253402300799, "at_ms": 253402300800000},
    ]
    produce(clients, pipeline.topic, [(b"k", json.dumps(e).encode(), None) for e in events])

    summary = run(pipeline, clients, db)

    assert (summary["read"], summary["inserted"], summary["dead_lettered"]) == (5, 3, 2)
    assert letters(pg_dsn) == {3: "contract_violation", 4: "contract_violation"}
    last = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT event_id, at_s, at_ms FROM p_rows ORDER BY 1").fetchall()
        # what the server itself makes of the seconds (to_timestamp rounds to the µs)
        server = conn.execute("SELECT to_timestamp(253402300799.99997::float8)").fetchone()
    assert rows == [
        ("e-0", last, last.replace(microsecond=999_000)),
        ("e-1", last.replace(microsecond=500_000), last.replace(microsecond=1_000)),
        ("e-2", last.replace(microsecond=999_968), last)]
    assert server == (last.replace(microsecond=999_968),)


def test_the_names_refused_at_load_are_the_system_columns_postgres_has(pg_dsn: str) -> None:
    """The load-time refusal (``SYSTEM_COLUMNS``) against the server: its system columns
    are exactly those (``oid`` no longer one), and a table with one fails as it would."""
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE probe (oid bigint)")  # allowed since Postgres 12
        found = {name for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'probe'::regclass"
            " AND attnum < 0").fetchall()}
        with pytest.raises(psycopg.errors.DuplicateColumn, match="system column"):
            conn.execute("CREATE TABLE probe_2 (xmin bigint)")
    assert found == SYSTEM_COLUMNS


# --------------------------------------------------------------------------- plan, apply, drift

SHIPMENT = {"version": 2, "fields": {
    "status": {"type": "text", "max_length": 16},
    "weight_kg": {"type": "numeric", "precision": 8, "scale": 2},
    "carrier": {"type": "text", "max_length": 32, "since": 2, "required": False},
}}


def shipment(topics: Any, version: int, **body: Any) -> Pipeline:
    return declared(topics, {"shipment": SHIPMENT},
                    contract={"event_type": "shipment", "version": version}, **body)


def with_contract_version(pipeline: Pipeline, version: int) -> Pipeline:
    body = pipeline.model_dump(mode="json", exclude={"name"})
    body["contract"]["version"] = version
    return parse_pipelines({"contracts": {"shipment": SHIPMENT},
                            "pipelines": {pipeline.name: body}})[pipeline.name]


def test_the_cli_plans_applies_once_and_records_the_tables_of_a_declared_pipeline(
        topics: Any, pg_dsn: str, tmp_path: Path) -> None:
    pipeline = shipment(topics, 1)
    env = {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "KAFKA_INGEST_PG_ADMIN_DSN": pg_dsn, "KAFKA_INGEST_PG_GRANT_TO": ""}

    plan = cli(env, "schema", "plan")
    assert plan.returncode == 0, plan.stderr
    assert 'CREATE TABLE "p_rows"' in plan.stdout and '"weight_kg" numeric(8,2) NOT NULL' \
        in plan.stdout and "carrier" not in plan.stdout  # v1 has no carrier

    first = cli(env, "schema", "apply")
    assert first.returncode == 0, first.stderr
    assert "applied (p): the table is missing" in first.stdout
    again = cli(env, "schema", "apply", "p")
    assert again.returncode == 0 and "p: up to date" in again.stdout, again.stdout
    assert "up to date" in cli(env, "schema", "plan").stdout
    with psycopg.connect(pg_dsn) as conn:
        recorded = conn.execute("SELECT pipeline, table_name, why FROM schema_changes"
                                " WHERE pipeline = 'p'").fetchall()
    assert recorded == [("p", "p_rows", "the table is missing")]

    shown = cli(env, "schema", "show", "shipment", "2")
    assert shown.returncode == 0, shown.stderr
    assert set(json.loads(shown.stdout)["properties"]) == {
        "event_id", "version", "status", "weight_kg", "carrier"}


def test_a_new_optional_field_is_drift_until_applied_then_a_replay_fills_it(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    v1 = shipment(topics, 1, headers={"trace-id": "trace_id"})
    apply(pg_dsn, v1)
    produce(clients, v1.topic, [
        (b"s1", b'{"event_id": "s-1", "status": "sent", "weight_kg": 1.5}', None),
        # a producer already on v2: v1 refuses it, its header travels in the dead letter
        (b"s2", b'{"event_id": "s-2", "status": "sent", "weight_kg": "2.25", "version": 2,'
                b' "carrier": "acme"}', [("trace-id", b"t-2")]),
    ])
    first = run(v1, clients, db)
    assert (first["inserted"], first["dead_lettered"]) == (1, 1)
    assert letters(pg_dsn) == {1: "unknown_version"}

    v2 = with_contract_version(v1, 2)
    with pytest.raises(SchemaDrift, match=r"column carrier is missing.*schema apply p"):
        run(v2, clients, db)
    assert apply(pg_dsn, v2) == ['ALTER TABLE "p_rows" ADD COLUMN "carrier" character varying(32)']

    replayed = replay(v2, clients, db)
    assert replayed["outcomes"]["recovered"] == 1, replayed
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT event_id, carrier, trace_id, weight_kg FROM p_rows"
                            " ORDER BY 1").fetchall()
    assert rows == [("s-1", None, None, Decimal("1.50")), ("s-2", "acme", "t-2", Decimal("2.25"))]


def test_a_replay_leaves_a_letter_whose_headers_were_dropped_for_size(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    """A record whose own headers do not fit in the DLQ beside ours is dead-lettered
    without them (``kafka-ingest.headers.dropped``). Its header columns cannot be filled
    from that letter: the replay leaves it parked (``headers_dropped``: backfill the source
    offset instead) rather than loading it with a NULL ``trace_id``."""
    v1 = shipment(topics, 1, headers={"trace-id": "trace_id"})
    apply(pg_dsn, v1)
    v2_event = b'{"event_id": "s-%d", "status": "sent", "weight_kg": 2, "version": 2}'
    produce(clients, v1.topic, [
        (b"s1", b'{"event_id": "s-1", "status": "sent", "weight_kg": 1}', [("trace-id", b"t-1")]),
        # v1 refuses both v2 events; this one's headers pass the DLQ's 900,000 bytes
        (b"s2", v2_event % 2, [("trace-id", b"t-2"), ("blob", b"x" * 905_000)]),
        (b"s3", v2_event % 3, [("trace-id", b"t-3")]),
    ])
    first = run(v1, clients, db)
    assert (first["inserted"], first["dead_lettered"]) == (1, 2)
    v2 = with_contract_version(v1, 2)
    apply(pg_dsn, v2)

    replayed = replay(v2, clients, db)

    assert (replayed["outcomes"]["recovered"], replayed["outcomes"].get("headers_dropped")) \
        == (1, 1), replayed
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT event_id, trace_id FROM p_rows ORDER BY 1").fetchall()
        status = conn.execute("SELECT source_offset, status FROM dead_letters"
                              " ORDER BY 1").fetchall()
    assert rows == [("s-1", "t-1"), ("s-3", "t-3")]
    assert status == [(1, "parked"), (2, "recovered")]


@pytest.mark.parametrize(("alter", "named"), [
    # a type narrower than the contract's bound: rows would fail the COPY mid-slice
    ("ALTER TABLE p_rows ALTER COLUMN status TYPE varchar(8)",
     "p_rows.status is character varying(8), but the contract needs character varying(16)"),
    # a NOT NULL on a field the contract may leave empty
    ("ALTER TABLE p_rows ADD COLUMN carrier varchar(32) NOT NULL",
     "p_rows.carrier is NOT NULL, but the contract may leave it empty"),
    # a column the pipeline never fills, NOT NULL without a default
    ("ALTER TABLE p_rows ADD COLUMN region text NOT NULL",
     "p_rows.region is NOT NULL without a default"),
    # the key ON CONFLICT names is gone
    ("ALTER TABLE p_rows DROP CONSTRAINT p_rows_pkey",
     "p_rows has no unique index on (event_id)"),
    # another numeric scale: values would be rounded by Postgres
    ("ALTER TABLE p_rows ALTER COLUMN weight_kg TYPE numeric(8,1)",
     "p_rows.weight_kg is numeric(8,1), but the contract needs numeric(8,2)"),
])
def test_drift_fails_the_run_at_plan_time_naming_the_column_before_any_data_moves(
        topics: Any, clients: Any, db: Any, pg_dsn: str, alter: str, named: str) -> None:
    v2 = shipment(topics, 2)
    apply(pg_dsn, shipment(topics, 1))
    with psycopg.connect(pg_dsn) as conn:
        conn.execute(alter.encode())
    produce(clients, v2.topic, [(b"s", b'{"event_id": "s-1", "status": "sent",'
                                       b' "weight_kg": 1}', None)])

    with pytest.raises(SchemaDrift) as caught:
        run(v2, clients, db)

    assert named in str(caught.value)
    with psycopg.connect(pg_dsn) as conn:  # nothing moved: no plan, no offset, no row
        assert conn.execute("SELECT count(*) FROM run_plans").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM ingest_offsets").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM p_rows").fetchone() == (0,)


def test_auto_create_and_auto_evolve_make_the_table_at_plan_time(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    v1 = shipment(topics, 1, auto_create=True)
    produce(clients, v1.topic, [(b"s", b'{"event_id": "s-1", "status": "sent",'
                                       b' "weight_kg": 1}', None)])
    assert run(v1, clients, db)["inserted"] == 1
    v2 = with_contract_version(v1, 2)
    with pytest.raises(SchemaDrift):  # auto_create alone never evolves a table
        run(v2, clients, db)
    evolving = v2.model_copy(update={"auto_evolve": True})
    produce(clients, v1.topic, [(b"s", b'{"event_id": "s-2", "status": "sent",'
                                       b' "weight_kg": 1, "version": 2, "carrier": "x"}', None)])
    assert run(evolving, clients, db)["inserted"] == 1
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT event_id, carrier FROM p_rows ORDER BY 1").fetchall() == [
            ("s-1", None), ("s-2", "x")]
        assert [r[0] for r in conn.execute("SELECT why FROM schema_changes WHERE pipeline = 'p'"
                                           " ORDER BY id")] == [
            "the table is missing", "column carrier is missing"]


# --------------------------------------------------------------------------- keys, partitions

def test_the_record_key_is_the_upsert_key_and_a_json_key_field_can_be_it(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    pipeline = declared(
        topics, {"reading": {"fields": {"celsius": {"type": "float"}}}},
        contract={"event_type": "reading", "version": 1},
        record_key={"column": "sensor", "format": "json", "field": "id", "type": "bigint"},
        upsert={"mode": "latest", "key": "sensor", "order_by": "source_offset"})
    apply(pg_dsn, pipeline)
    produce(clients, pipeline.topic, [
        (b'{"id": 7}', b'{"event_id": "r1", "celsius": 20.5}', None),
        (b'{"id": 8}', b'{"event_id": "r2", "celsius": 19.0}', None),
        (b'{"id": 7}', b'{"event_id": "r3", "celsius": 21.0}', None),
        (b'{"id": "7"}', b'{"event_id": "r4", "celsius": 1.0}', None),  # not a bigint
        (b'{"id": 7}', b'{"event_id": "r5", "celsius": "hot"}', None),  # the contract
    ])
    summary = run(pipeline, clients, db)
    assert (summary["inserted"], summary["stale"], summary["dead_lettered"]) == (2, 1, 2)
    assert letters(pg_dsn) == {3: "bad_key", 4: "contract_violation"}
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT sensor, event_id, celsius FROM p_rows ORDER BY 1").fetchall()
    assert rows == [(7, "r3", 21.0), (8, "r2", 19.0)]


def test_a_time_partitioned_table_takes_rows_exactly_and_a_missing_partition_dead_letters(
        topics: Any, clients: Any, db: Any, pg_dsn: str) -> None:
    pipeline = declared(
        topics, {"visit": {"fields": {"page": {"type": "text", "max_length": 64},
                                      "at": {"type": "timestamptz"}}}},
        contract={"event_type": "visit", "version": 1}, partition_by={"column": "at"})
    statements = apply(pg_dsn, pipeline)
    assert 'PRIMARY KEY ("event_id", "at")\n) PARTITION BY RANGE ("at")' in statements[0]
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("CREATE TABLE p_rows_2026_01 PARTITION OF p_rows"
                     " FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')")
    jan = [json.dumps({"event_id": f"v{i}", "page": "/", "at": f"2026-01-{i:02d}T00:00:00Z"})
           for i in range(1, 6)]
    march = json.dumps({"event_id": "v-march", "page": "/", "at": "2026-03-01T00:00:00Z"})
    produce(clients, pipeline.topic, [(None, v.encode(), None)
                                      for v in (*jan, march, jan[0])])

    first = run(pipeline, clients, db)
    assert (first["inserted"], first["duplicates"], first["dead_lettered"]) == (5, 1, 1)
    assert letters(pg_dsn) == {5: "rejected_by_database"}

    with psycopg.connect(pg_dsn) as conn:  # the operator adds the partition; replay loads
        conn.execute("CREATE TABLE p_rows_2026_03 PARTITION OF p_rows"
                     " FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')")
    assert replay(pipeline, clients, db)["outcomes"]["recovered"] == 1
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT tableoid::regclass::text, count(*) FROM p_rows"
                            " GROUP BY 1 ORDER BY 1").fetchall()
    assert rows == [("p_rows_2026_01", 5), ("p_rows_2026_03", 1)]


# --------------------------------------------------------------------------- least privilege


@pytest.fixture
def secure_env(stack_env: dict[str, str]) -> dict[str, str]:
    stack.up(secure=True)  # a no-op when the test command started the stack secure
    return stack.env(secure=True)


def test_schema_apply_grants_the_runtime_role_the_deletes_its_pipeline_needs_and_no_more(
        secure_env: dict[str, str], topics: Any, clients: Any, pg_dsn: str,
        tmp_path: Path) -> None:
    deleting = declared(
        topics, {"balance": {"fields": {"amount": {"type": "numeric", "precision": 10,
                                                   "scale": 2}}}},
        contract={"event_type": "balance", "version": 1}, record_key={"column": "account"},
        upsert={"mode": "latest", "key": "account", "order_by": "source_offset"},
        on_tombstone="delete")
    env = {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", deleting)),
           "KAFKA_INGEST_PG_ADMIN_DSN": pg_dsn}
    applied = cli(env, "schema", "apply", "--grant-to", stack.PG_APP_ROLE)
    assert applied.returncode == 0, applied.stderr
    assert "SELECT, INSERT, UPDATE, DELETE on table p_rows_tombstones" in applied.stdout
    assert "SELECT, INSERT, UPDATE, DELETE on table p_rows" in applied.stdout

    produce(clients, deleting.topic, [(b"a", b'{"event_id": "b1", "amount": 1}', None),
                                      (b"b", b'{"event_id": "b2", "amount": 2}', None),
                                      (b"a", None, None)])
    app_dsn = make_conninfo(secure_env["KAFKA_INGEST_PG_DSN"],
                            dbname=conninfo_to_dict(pg_dsn)["dbname"])
    done = cli({**env, "KAFKA_INGEST_PG_DSN": app_dsn}, "run", "p")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["deleted"] == 1
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT account FROM p_rows").fetchall() == [("b",)]
        assert conn.execute("SELECT account FROM p_rows_tombstones").fetchall() == [("a",)]
    with psycopg.connect(app_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("DELETE FROM dead_letters")  # still none on the bookkeeping


def deleting(topics: Any, **body: Any) -> Pipeline:
    return declared(
        topics, {"balance": {"fields": {"amount": {"type": "numeric", "precision": 10,
                                                   "scale": 2}}}},
        contract={"event_type": "balance", "version": 1}, record_key={"column": "account"},
        upsert={"mode": "latest", "key": "account", "order_by": "source_offset"},
        on_tombstone="delete", **body)


@pytest.mark.parametrize("first", [
    1,  # [e1] then [tombstone, e1 again]: the stored e1 must not make the new one a duplicate
    2,  # [e1, tombstone] then [e1 again]
    3,  # all three in one chunk
])
def test_in_log_order_a_record_sent_again_after_its_delete_wins_whatever_the_chunks(
        topics: Any, clients: Any, db: Any, pg_dsn: str, first: int) -> None:
    """The same event_id sent again after a tombstone is the key's newest record in the
    log (what compaction keeps): the row must be back, however runs and chunks cut the log."""
    pipeline = deleting(topics)
    apply(pg_dsn, pipeline)
    produce(clients, pipeline.topic, [(b"a", b'{"event_id": "e1", "amount": 1}', None),
                                      (b"a", None, None),
                                      (b"a", b'{"event_id": "e1", "amount": 1}', None)])
    run(pipeline.model_copy(update={"max_records_per_partition": first}), clients, db)
    run(pipeline, clients, db)  # the rest, in one chunk
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT account, event_id, source_offset FROM p_rows").fetchall() \
            == [("a", "e1", 2)]
        assert conn.execute("SELECT count(*) FROM p_rows_tombstones").fetchone() == (0,)


def test_a_marker_table_too_narrow_for_the_key_is_drift(topics: Any, clients: Any, db: Any,
                                                         pg_dsn: str) -> None:
    pipeline = deleting(topics)
    apply(pg_dsn, pipeline)
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("ALTER TABLE p_rows_tombstones ALTER COLUMN account TYPE varchar(8)")
    with pytest.raises(SchemaDrift, match=r"p_rows_tombstones\.account is character varying"
                                          r"\(8\), but the key needs character varying\(128\)"):
        run(pipeline, clients, db)


def test_two_pipelines_sharing_a_table_each_add_their_columns(topics: Any,
                                                               pg_dsn: str) -> None:
    one = shipment(topics, 1)
    two = declared(topics, {"shipment": SHIPMENT},
                   contract={"event_type": "shipment", "version": 1},
                   headers={"trace-id": "trace_id"})
    from kafka_ingest.db.tables import apply_pipelines

    with psycopg.connect(pg_dsn) as conn:
        apply_pipelines(conn, [one, two])
        columns = {r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'p_rows'")}
    assert {"status", "weight_kg", "trace_id"} <= columns
