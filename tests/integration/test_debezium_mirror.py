"""A table mirrored through real Debezium (#34): Debezium's Postgres connector on the
stack's Kafka Connect worker captures a source table; ``schema from-topic`` writes the
mirror's declaration from the change events; ``kafka-ingest run`` mirrors it; after every
step the mirror equals its source, column for column: the snapshot, inserts, an update that
leaves a TOASTed value out, a delete, a backfill of every offset (nothing comes back), a
truncate, and a column added at the source (the run stops, naming it, and goes on once the
contract follows)."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from kafka_ingest.kafka.clients import KafkaClients
from tests.support.cli import cli
from tests.support.debezium import UNAVAILABLE, DebeziumSource
from tests.support.ingest import highs, query

pytestmark = pytest.mark.integration

COLUMNS = "id, name, balance, born, seen_at, changed_at, profile, ref, photo, notes"
SOURCE = {"customers": (
    "id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), born date, "
    "seen_at timestamp, changed_at timestamptz, profile jsonb, ref uuid, photo bytea, "
    "notes text")}
#: Stored out of line (TOAST) even compressed: random hex does not shrink below half.
LONG = secrets.token_hex(10_000)
LONG_JSON = json.dumps({"blob": secrets.token_hex(10_000)})
LONG_BYTES = secrets.token_bytes(20_000)


def row(i: int, notes: str = "short") -> str:
    return (f"({i}, 'name {i}', {i}.25, DATE '2026-01-0{i % 9 + 1}', "
            f"TIMESTAMP '2026-02-03 04:05:06.{i:06d}', "
            f"TIMESTAMPTZ '2026-02-03 04:05:06.5+02', '{{\"tier\": {i}}}', "
            f"'0b7e1bd0-8d3f-4a3c-9d1e-{i:012d}', '\\x00ff{i:02x}', '{notes}')")


def mirror_env(stack_env: dict[str, str], pg_dsn: str) -> dict[str, str]:
    """The CLI's environment for a mirror into the test's database ``pg_dsn``."""
    return {**os.environ, **stack_env, "KAFKA_INGEST_PG_DSN": pg_dsn,
            "KAFKA_INGEST_PG_ADMIN_DSN": pg_dsn, "KAFKA_INGEST_PG_GRANT_TO": ""}


@pytest.fixture
def env(stack_env: dict[str, str], pg_dsn: str) -> dict[str, str]:
    return mirror_env(stack_env, pg_dsn)


def same(src: DebeziumSource, pg_dsn: str) -> None:
    source = src.query(f"SELECT {COLUMNS} FROM customers ORDER BY id")
    mirror = query(pg_dsn, f"SELECT {COLUMNS} FROM customers ORDER BY id")
    assert [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in mirror] \
        == [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in source]


def ran(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = cli(env, *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def installed(env: dict[str, str], document: dict[str, Any], tmp_path: Path,
              *names: str) -> None:
    """``document`` as the pipelines file of ``env``, the tables and topics of the
    pipelines ``names`` made."""
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    env["KAFKA_INGEST_PIPELINES"] = str(path)
    for name in names:
        for command in (("schema", "apply", name), ("topics", "create", name)):
            done = cli(env, *command)
            assert done.returncode == 0, done.stderr


def test_a_table_mirrored_through_debezium_equals_its_source_at_every_step(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        clients: KafkaClients, dlq_topics: list[str], tmp_path: Path) -> None:
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i)}"
                                         for i in (1, 2, 3)]
                          + [f"UPDATE customers SET notes = '{LONG}', profile = '{LONG_JSON}', "
                             f"photo = '\\x{LONG_BYTES.hex()}' WHERE id = 2"])
    topic = src.topics["customers"]
    shown = cli(env, "schema", "from-topic", topic, "--event-type", "customer",
                "--pipeline", "customers")
    assert shown.returncode == 0, shown.stderr
    assert "Debezium change events" in shown.stdout
    document = yaml.safe_load(shown.stdout)
    entry = document["pipelines"]["customers"]
    assert entry["envelope"] == "debezium" and entry["record_key"]["column"] == "id"
    assert {n: f["type"] for n, f in document["contracts"]["customer"]["fields"].items()} == {
        "id": "integer", "name": "text", "balance": "numeric", "born": "date",
        "seen_at": "timestamp", "changed_at": "timestamptz", "profile": "jsonb",
        "ref": "uuid", "photo": "bytea", "notes": "text"}
    entry.update(on_truncate="truncate", table="customers")
    dlq_topics.append(entry["dlq_topic"])
    installed(env, document, tmp_path, "customers")
    every_step(src, env, pg_dsn, clients, document)


#: Debezium's placeholder for a left-out value as a change event carries it: in text (a
#: ``text`` or ``jsonb`` column), as bytes (``bytea`` in Avro), or as those bytes in base64
#: (``bytea`` in JSON).
PLACEHOLDERS = (UNAVAILABLE, UNAVAILABLE.encode(), base64.b64encode(UNAVAILABLE.encode()).decode())


def every_step(src: DebeziumSource, env: dict[str, str], pg_dsn: str, clients: KafkaClients,
               document: dict[str, Any]) -> None:
    """The mirror of ``SOURCE`` declared by ``document`` (installed; rows 1-3 in the
    snapshot, row 2's notes, profile and photo stored out of line) equals its source after
    each step: the snapshot, an insert, an update that leaves those three out, a delete
    (and its tombstone), a backfill of every offset, a truncate, a column added (the run
    stops, naming it, and goes on once a contract version declares it)."""
    topic = src.topics["customers"]
    first = ran(env, "run", "customers")  # the snapshot
    assert (first["inserted"], first["dead_lettered"]) == (3, 0), first
    same(src, pg_dsn)

    src.execute(f"INSERT INTO customers VALUES {row(4)}")
    src.execute("UPDATE customers SET name = 'renamed', balance = 99.99 WHERE id = 2")
    src.execute("DELETE FROM customers WHERE id = 1")
    src.caught_up()
    update = [e for e in src.events("customers") if e.op == "u"][-1]
    assert update.after is not None
    left_out = {k for k, v in update.after.items() if v in PLACEHOLDERS}
    assert left_out == {"notes", "profile", "photo"}, update.after
    second = ran(env, "run", "customers")
    assert (second["dead_lettered"], second["deleted"]) == (0, 1), second
    same(src, pg_dsn)
    assert query(pg_dsn, "SELECT notes, profile, photo FROM customers WHERE id = 2") == [
        (LONG, json.loads(LONG_JSON), LONG_BYTES)]

    # every offset again: nothing deleted comes back, nothing newer is overwritten
    backfill = cli(env, "backfill", "customers", "--partition", "0", "--from-offset", "0",
                   "--to-offset", str(highs(clients, topic)[0]))
    assert backfill.returncode == 0, backfill.stderr
    same(src, pg_dsn)

    # a truncate, then a row: only the row after it stays
    src.execute("TRUNCATE customers")
    src.execute(f"INSERT INTO customers VALUES {row(5)}")
    src.caught_up()
    ran(env, "run", "customers")
    same(src, pg_dsn)

    # a column added at the source (a new schema) stops the run, naming it; declared, it
    # goes on
    src.execute("ALTER TABLE customers ADD COLUMN score int")
    src.execute(f"INSERT INTO customers ({COLUMNS}, score) VALUES {row(6)[:-1]}, 7)")
    src.caught_up()
    stopped = cli(env, "run", "customers")
    assert stopped.returncode != 0
    assert "column 'score' added" in stopped.stderr, stopped.stderr
    assert query(pg_dsn, "SELECT count(*) FROM customers WHERE id = 6") == [(0,)]
    contract = document["contracts"]["customer"]
    contract["version"] = 2
    contract["fields"]["score"] = {"type": "integer", "required": False, "since": 2}
    document["pipelines"]["customers"]["contract"]["version"] = 2
    Path(env["KAFKA_INGEST_PIPELINES"]).write_text(yaml.safe_dump(document), encoding="utf-8")
    done = cli(env, "schema", "apply", "customers")
    assert done.returncode == 0, done.stderr
    ran(env, "run", "customers")
    same(src, pg_dsn)
    assert query(pg_dsn, "SELECT score FROM customers WHERE id = 6") == [(7,)]


def declared(env: dict[str, str], topic: str, tmp_path: Path, *named: str,
             registry: bool = False, **entry: Any) -> dict[str, Any]:
    """The mirror of ``topic`` as ``schema from-topic`` declares it (contract
    ``customer``), or with ``registry``, ``schema from-registry <topic>-value --format
    avro`` (``named``: more arguments to either), as the pipelines file (``entry``:
    settings over the printed ones), its table and topics made."""
    shown = cli(env, "schema", *(("from-registry", f"{topic}-value", "--format", "avro")
                                 if registry else ("from-topic", topic, "--event-type",
                                                   "customer")),
                "--pipeline", "customers", *named)
    assert shown.returncode == 0, shown.stderr
    assert "Debezium change events" in shown.stdout, shown.stdout
    document = yaml.safe_load(shown.stdout)
    document["pipelines"]["customers"].update(table="customers", **entry)
    installed(env, document, tmp_path, "customers")
    return document


#: The source table keyed by two columns (a composite primary key: ``identity: [name, id]``).
COMPOSITE = {"customers": SOURCE["customers"].replace("id int PRIMARY KEY", "id int NOT NULL")
             + ", PRIMARY KEY (name, id)"}


@pytest.mark.chaos
@pytest.mark.parametrize(("stage", "source", "avro"), [
    ("upserted", SOURCE, False), ("db_committed", SOURCE, False),
    ("db_committed", COMPOSITE, False), ("db_committed", COMPOSITE, True)],
    ids=["upserted", "db_committed", "db_committed-composite-key",
         "db_committed-composite-key-avro"])
def test_a_mirror_run_killed_mid_chunk_then_retried_equals_its_source(
        stage: str, source: dict[str, str], avro: bool,
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        clients: KafkaClients, dlq_topics: list[str], tmp_path: Path,
        stack_env: dict[str, str]) -> None:
    """Updates, deletes, re-inserts and a truncate streamed through Debezium (JSON, or Avro
    through the registry), mirrored in chunks of 50 (``on_truncate: truncate``), the table
    keyed by one column or two: a SIGKILL after a chunk's writes (before its commit, or
    between the database's commit and Kafka's), then the retry: the mirror equals its
    source and its stored offsets are the topic's end."""
    src = debezium_source(source, setup=[
        "INSERT INTO customers SELECT i, 'name ' || i, i, DATE '2026-01-01', NULL, NULL, "
        "NULL, NULL, NULL, 'n' FROM generate_series(1, 200) i"],
        registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"] if avro else None)
    for step in range(4):  # in transactions of their own: Debezium streams each
        src.execute(f"UPDATE customers SET balance = balance + {step + 1}, "
                    f"notes = 'step {step}' WHERE id % 3 = {step % 3}")
        src.execute(f"DELETE FROM customers WHERE id % 17 = {step}")
        src.execute(f"INSERT INTO customers (id, name) SELECT i, 'again' FROM "
                    f"generate_series(1, 200) i WHERE i % 17 = {step} AND i % 2 = 0")
        if step == 1:  # about offset 400: in the 8th chunk, where the kill lands
            src.execute("TRUNCATE customers")
            src.execute("INSERT INTO customers (id, name) SELECT i, 'after the truncate' "
                        "FROM generate_series(1, 150) i")
    src.caught_up()
    topic = src.topics["customers"]
    document = declared(env, topic, tmp_path, registry=avro, chunk_size=50,
                        on_truncate="truncate")
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    if source is COMPOSITE:  # keyed as from-topic declares a key of two columns
        assert document["pipelines"]["customers"]["identity"] == ["name", "id"]
    truncated_at = next(e.offset for e in src.events("customers") if e.op == "t")
    assert truncated_at // 50 == 7, truncated_at  # the killed chunk holds the truncate
    worker = Path(__file__).resolve().parents[1] / "chaos" / "ingest_worker.py"
    killed = subprocess.run([sys.executable, str(worker), "customers", "chaos-run"],
                            env={**env, "CHAOS_KILL_STAGE": stage, "CHAOS_KILL_NTH": "8",
                                 "CHAOS_KILL_WITH_DEAD": "0"},
                            capture_output=True, text=True, timeout=300, check=False)
    assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
    end = highs(clients, topic)
    assert stored(pg_dsn) != end  # killed part way
    retry = cli(env, "run", "customers")  # a new run reads on from the stored offsets
    assert retry.returncode == 0, retry.stderr
    same(src, pg_dsn)
    assert stored(pg_dsn) == end


def stored(pg_dsn: str) -> dict[int, int]:
    return dict(query(pg_dsn, "SELECT partition, next_offset FROM ingest_offsets "
                              "WHERE pipeline = 'customers'"))


def test_a_pattern_of_topics_is_mirrored_a_pipeline_per_table(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    src = debezium_source({**SOURCE, "orders": "no bigint PRIMARY KEY, customer int, "
                           "total numeric(10,2) NOT NULL"},
                          setup=[f"INSERT INTO customers VALUES {row(1)}",
                                 "INSERT INTO orders VALUES (10, 1, 5.5), (11, 1, 6)"])
    prefix = src.topics["customers"].rsplit(".", 1)[0]
    shown = cli(env, "schema", "from-topic", f"{prefix}.*")
    assert shown.returncode == 0, shown.stderr
    both_tables_mirrored(src, env, pg_dsn, yaml.safe_load(shown.stdout), "json", tmp_path,
                         dlq_topics)


def both_tables_mirrored(src: DebeziumSource, env: dict[str, str], pg_dsn: str,
                         document: dict[str, Any], key_format: str, tmp_path: Path,
                         dlq_topics: list[str]) -> None:
    """The pattern's ``document`` declares ``customers`` and ``orders`` (keyed by its
    record key in ``key_format``), each of which, installed and run, equals its source."""
    by_table = {p["table"]: (name, p) for name, p in document["pipelines"].items()}
    assert {"customers", "orders"} <= set(by_table)
    assert by_table["orders"][1]["record_key"] == {"column": "no", "format": key_format,
                                                  "type": "bigint"}
    names = [by_table[table][0] for table in ("customers", "orders")]
    dlq_topics.extend(document["pipelines"][name]["dlq_topic"] for name in names)
    installed(env, document, tmp_path, *names)
    for name in names:
        ran(env, "run", name)
    same(src, pg_dsn)
    assert query(pg_dsn, "SELECT no, customer, total FROM orders ORDER BY no") == \
        src.query("SELECT no, customer, total FROM orders ORDER BY no")


def test_a_toasted_value_changed_then_left_out_in_one_chunk_is_mirrored(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """Two changes of a row read in one run: the first writes a TOASTed value, the second
    leaves it out (Debezium's placeholder). The mirror holds the first's value, not the
    value stored before the run (row 1) nor the placeholder (row 2, inserted in the run)."""
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(1, LONG)}"])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    ran(env, "run", "customers")
    same(src, pg_dsn)

    changed = secrets.token_hex(10_000)
    src.execute(f"UPDATE customers SET notes = '{changed}', profile = '{LONG_JSON}', "
                f"photo = '\\x{LONG_BYTES.hex()}' WHERE id = 1")
    src.execute("UPDATE customers SET name = 'renamed' WHERE id = 1")
    src.execute(f"INSERT INTO customers VALUES {row(2, LONG)}")
    src.execute("UPDATE customers SET name = 'renamed' WHERE id = 2")
    src.caught_up()
    left_out = [e for e in src.events("customers") if e.op == "u"
                and e.after is not None and e.after["notes"] == "__debezium_unavailable_value"]
    assert len(left_out) == 2  # both second updates carry the placeholder
    ran(env, "run", "customers")
    same(src, pg_dsn)


def test_an_update_that_leaves_toasted_arrays_out_keeps_them(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """A ``text[]`` and an ``integer[]`` stored out of line, then an update of another
    column: Debezium writes its array placeholders for them (``[placeholder]``, and the
    placeholder's bytes as integers); the mirror keeps the arrays it holds."""
    tags = [secrets.token_hex(40) for _ in range(200)]
    nums = [secrets.randbelow(2**31) for _ in range(3000)]
    src = debezium_source(
        {"customers": "id int PRIMARY KEY, name text NOT NULL, tags text[], nums int[]"},
        setup=[f"INSERT INTO customers VALUES (1, 'a', ARRAY{tags}::text[], "
               f"ARRAY{nums}::int[])"])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    ran(env, "run", "customers")
    src.execute("UPDATE customers SET name = 'b' WHERE id = 1")
    src.caught_up()
    update = [e for e in src.events("customers") if e.op == "u"][-1]
    assert update.after is not None and update.after["tags"] == [
        "__debezium_unavailable_value"], update.after
    ran(env, "run", "customers")
    columns = "id, name, tags, nums"
    assert query(pg_dsn, f"SELECT {columns} FROM customers") == src.query(
        f"SELECT {columns} FROM customers") == [(1, "b", tags, nums)]


def test_arrays_of_any_type_are_mirrored_from_a_replica_identity_full_source(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """A ``boolean[]`` and a ``numeric[]`` stored out of line, whose left-out nulls a
    mirror cannot tell from NULL: ``schema from-topic`` leaves them out, naming
    ``replica_identity: full``. Declared with it on a source table with REPLICA IDENTITY
    FULL, an update of another column keeps them; the same pipeline on a table that is
    not FULL stops at its first update rather than write a null."""
    flags = [secrets.randbelow(2) == 1 for _ in range(4000)]
    shares = [f"{secrets.randbelow(10**6)}.{secrets.randbelow(100):02d}" for _ in range(2000)]
    columns = {"customers": "id int PRIMARY KEY, name text NOT NULL, flags boolean[], "
                            "shares numeric(8,2)[]"}
    src = debezium_source(columns, setup=[
        "ALTER TABLE customers REPLICA IDENTITY FULL",
        f"INSERT INTO customers VALUES (1, 'a', ARRAY{flags}::boolean[], "
        f"ARRAY{shares}::numeric(8,2)[])"])
    shown = cli(env, "schema", "from-topic", src.topics["customers"], "--event-type",
                "customer", "--pipeline", "customers")
    assert shown.returncode == 0, shown.stderr
    assert "replica_identity: full" in shown.stdout.replace("\n#   ", " "), shown.stdout
    arrays = {"flags": {"type": "array", "items": {"type": "boolean"}, "required": False},
              "shares": {"type": "array", "items": {"type": "numeric", "precision": 8,
                                                    "scale": 2}, "required": False}}

    def declared(source: DebeziumSource) -> None:
        document = yaml.safe_load(cli(env, "schema", "from-topic", source.topics["customers"],
                                      "--event-type", "customer", "--pipeline",
                                      "customers").stdout)
        document["contracts"]["customer"]["fields"].update(arrays)
        entry = document["pipelines"]["customers"]
        entry.update(table="customers", replica_identity="full")
        dlq_topics.append(entry["dlq_topic"])
        installed(env, document, tmp_path, "customers")

    declared(src)
    ran(env, "run", "customers")
    src.execute("UPDATE customers SET name = 'b' WHERE id = 1")
    src.caught_up()
    update = [e for e in src.events("customers") if e.op == "u"][-1]
    assert update.before is not None and update.after is not None
    assert update.after["flags"] == flags
    done = ran(env, "run", "customers")
    assert done["dead_lettered"] == 0, query(pg_dsn, "SELECT error_class, error_detail "
                                                     "FROM dead_letters")
    statement = "SELECT id, name, flags, shares::text[] FROM customers"
    assert query(pg_dsn, statement) == src.query(statement)
    assert query(pg_dsn, "SELECT name, flags FROM customers") == [("b", flags)]

    # a source that is not FULL: its update carries no old row, and the run stops there
    default = debezium_source(columns, setup=[
        f"INSERT INTO customers VALUES (1, 'a', ARRAY{flags}::boolean[], NULL)"])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE customers")
        conn.execute("DELETE FROM ingest_offsets")
    declared(default)
    ran(env, "run", "customers")
    default.execute("UPDATE customers SET name = 'b' WHERE id = 1")
    default.caught_up()
    stopped = cli(env, "run", "customers")
    assert stopped.returncode != 0
    assert "carries no old row ('before' is null): its source table is not REPLICA " \
        "IDENTITY FULL" in stopped.stderr, stopped.stderr
    assert query(pg_dsn, "SELECT name, flags FROM customers") == [("a", flags)]


def test_an_update_that_leaves_toasted_date_uuid_and_char_arrays_out_keeps_them(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """A ``date[]``, a ``uuid[]`` and a ``char(3)[]`` stored out of line, then updates of
    another column (row 1 mirrored before; row 2 inserted and updated in one run):
    Debezium writes its placeholders for them (the placeholder's bytes as days, the
    name-based UUID of those bytes, ``[placeholder]``); the mirror keeps the arrays."""
    columns = "id, name, days, refs, codes"
    made = ("(SELECT array_agg(DATE '2000-01-01' + (random() * 9000)::int) "
            "FROM generate_series(1, 3000)), "
            "(SELECT array_agg(gen_random_uuid()) FROM generate_series(1, 500)), "
            "(SELECT array_agg(substr(md5(random()::text), 1, 3)::char(3)) "
            "FROM generate_series(1, 3000))")
    src = debezium_source(
        {"customers": "id int PRIMARY KEY, name text NOT NULL, days date[], refs uuid[], "
                      "codes char(3)[]"},
        setup=[f"INSERT INTO customers VALUES (1, 'a', {made})"])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    assert {"days", "refs", "codes"} <= set(document["contracts"]["customer"]["fields"])
    ran(env, "run", "customers")
    src.execute("UPDATE customers SET name = 'b' WHERE id = 1")
    src.execute(f"INSERT INTO customers VALUES (2, 'c', {made})")
    src.execute("UPDATE customers SET name = 'd' WHERE id = 2")
    src.caught_up()
    updates = [e.after for e in src.events("customers") if e.op == "u" and e.after]
    assert [(u["days"], u["refs"], u["codes"]) for u in updates] == [(
        list(UNAVAILABLE.encode()), ["b68a35a7-17ad-35b3-af2a-ae46edb4545a"],
        [UNAVAILABLE])] * 2
    done = ran(env, "run", "customers")
    assert done["dead_lettered"] == 0, done
    assert query(pg_dsn, f"SELECT {columns} FROM customers ORDER BY id") == src.query(
        f"SELECT {columns} FROM customers ORDER BY id")


def test_from_topic_leaves_out_arrays_debezium_sends_as_null_when_left_out(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """Arrays of smallint, boolean, numeric, double precision, timestamp, timestamptz and
    time stored out of line arrive as null in an update that leaves them out: a NULL the
    mirror would store. ``schema from-topic`` leaves them out, saying why; the mirror of
    the other columns equals its source."""
    refused = {"small": "smallint[]", "flags": "boolean[]", "amounts": "numeric(12,2)[]",
               "ratios": "double precision[]", "at": "timestamp[]", "ats": "timestamptz[]",
               "times": "time[]"}
    src = debezium_source(
        {"customers": "id int PRIMARY KEY, name text NOT NULL, nums int[], "
                      + ", ".join(f"{c} {t}" for c, t in refused.items())},
        setup=["INSERT INTO customers (id, name, nums, small, flags) VALUES (1, 'a', "
               "(SELECT array_agg(g) FROM generate_series(1, 3000) g), "
               "(SELECT array_agg((random() * 30000)::int2) FROM generate_series(1, 15000)), "
               "(SELECT array_agg(random() < 0.5) FROM generate_series(1, 15000)))"])
    src.execute("UPDATE customers SET name = 'b' WHERE id = 1")
    src.caught_up()
    update = [e for e in src.events("customers") if e.op == "u"][-1]
    assert update.after is not None and (update.after["small"], update.after["flags"]) == (
        None, None), update.after  # what the mirror would have stored
    shown = cli(env, "schema", "from-topic", src.topics["customers"], "--event-type",
                "customer", "--pipeline", "customers")
    assert shown.returncode == 0, shown.stderr
    notes = [line for line in shown.stdout.splitlines() if "left out:" in line]
    assert sorted(line.split("left out: ")[1].split(":")[0] for line in notes) == sorted(
        refused), shown.stdout
    assert "an array Debezium sends as null when an update leaves it" in shown.stdout
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    assert set(document["contracts"]["customer"]["fields"]) == {"id", "name", "nums"}
    ran(env, "run", "customers")
    assert query(pg_dsn, "SELECT id, name, nums FROM customers") == src.query(
        "SELECT id, name, nums FROM customers")


def test_a_table_with_a_version_column_is_mirrored(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """An ORM's optimistic-lock ``version`` and a column named like one every table here
    has: ``schema from-topic`` declares them renamed (``version_``, ``ingested_at_``), and
    the rows (version 5 too) are mirrored, none dead-lettered."""
    src = debezium_source({"customers": "id int PRIMARY KEY, version int NOT NULL, "
                                        "ingested_at timestamp"},
                          setup=["INSERT INTO customers VALUES (1, 1, NULL), "
                                 "(2, 5, TIMESTAMP '2026-01-02 03:04:05')"])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    done = ran(env, "run", "customers")
    assert (done["inserted"], done["dead_lettered"]) == (2, 0), done
    assert query(pg_dsn, "SELECT id, version_, ingested_at_ FROM customers ORDER BY id") == \
        src.query("SELECT id, version, ingested_at FROM customers ORDER BY id")


def test_real_and_double_precision_columns_are_mirrored(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """JsonConverter names the schema types of ``real`` and ``double precision`` ``float``
    and ``double``: ``schema from-topic`` declares them (``double precision`` both), and
    the values are mirrored (a ``real``'s as a ``real`` holds it)."""
    src = debezium_source({"customers": "id int PRIMARY KEY, f4 real, f8 double precision"},
                          setup=["INSERT INTO customers VALUES (1, 1.1, 2.2), (2, NULL, -3e300)"])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    assert {n: f["type"] for n, f in document["contracts"]["customer"]["fields"].items()} == {
        "id": "integer", "f4": "float", "f8": "float"}
    ran(env, "run", "customers")
    assert query(pg_dsn, "SELECT id, f4::real, f8 FROM customers ORDER BY id") == \
        src.query("SELECT id, f4, f8 FROM customers ORDER BY id")


def test_key_updates_reinserts_and_a_truncate_amid_rows_in_one_chunk_are_mirrored(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        clients: KafkaClients, dlq_topics: list[str], tmp_path: Path) -> None:
    """In one run: an update of a primary key (Debezium: a delete of the old key, its
    tombstone, a create of the new one), a delete then a re-insert of a key, a truncate
    with rows before and after it, a key updated after the truncate; then a backfill of
    every offset. The mirror equals its source after each."""
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i)}"
                                         for i in (1, 2, 3)])
    topic = src.topics["customers"]
    document = declared(env, topic, tmp_path, on_truncate="truncate")
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    ran(env, "run", "customers")
    src.execute(f"INSERT INTO customers VALUES {row(4)}")
    src.execute("UPDATE customers SET id = 20 WHERE id = 2")
    src.execute("DELETE FROM customers WHERE id = 3")
    src.execute(f"INSERT INTO customers VALUES {row(3, 'again')}")
    src.execute("UPDATE customers SET id = 2 WHERE id = 20")
    src.execute("TRUNCATE customers")
    src.execute(f"INSERT INTO customers VALUES {row(5)}")
    src.execute(f"INSERT INTO customers VALUES {row(1, 'after')}")
    src.execute("UPDATE customers SET id = 50 WHERE id = 5")
    src.caught_up()
    done = ran(env, "run", "customers")
    assert done["dead_lettered"] == 0, done
    same(src, pg_dsn)
    high = highs(clients, topic)[0]
    backfill = cli(env, "backfill", "customers", "--partition", "0", "--from-offset", "0",
                   "--to-offset", str(high))
    assert backfill.returncode == 0, backfill.stderr
    same(src, pg_dsn)


def _dead_lettered_then(env: dict[str, str], src: DebeziumSource, tmp_path: Path,
                        dlq_topics: list[str], *changes: str) -> dict[str, Any]:
    """Rows 1 and 2 (too large for the mirror's limit) dead-lettered and row 3 mirrored;
    then ``changes`` at the source, mirrored; then the limit raised and the DLQ replayed:
    the replay's report."""
    document = declared(env, src.topics["customers"], tmp_path, max_message_bytes=15_000,
                         on_truncate="truncate")
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    first = ran(env, "run", "customers")
    assert (first["inserted"], first["dead_lettered"]) == (1, 2), first
    for change in changes:
        src.execute(change)
    src.caught_up()
    ran(env, "run", "customers")
    document["pipelines"]["customers"]["max_message_bytes"] = 1_000_000
    Path(env["KAFKA_INGEST_PIPELINES"]).write_text(yaml.safe_dump(document), encoding="utf-8")
    return ran(env, "replay-dlq", "customers")


def test_a_replayed_dead_letter_of_a_row_deleted_since_stays_deleted(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i, n)}"
                                         for i, n in ((1, LONG), (2, LONG), (3, "s"))])
    _dead_lettered_then(env, src, tmp_path, dlq_topics, "DELETE FROM customers WHERE id = 1")
    same(src, pg_dsn)  # 2 replayed, 1 not back


def test_a_replayed_dead_letter_of_a_row_truncated_since_stays_truncated(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i, n)}"
                                         for i, n in ((1, LONG), (2, LONG), (3, "s"))])
    _dead_lettered_then(env, src, tmp_path, dlq_topics, "TRUNCATE customers",
                        f"INSERT INTO customers VALUES {row(4)}")
    same(src, pg_dsn)  # only 4


def test_an_update_leaving_out_a_toasted_value_of_a_dead_lettered_row_writes_no_placeholder(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """Rows 1 and 2 with TOASTed notes, too long for the contract's ``max_length``: their
    snapshot reads are dead-lettered. Updates of their names leave the notes out
    (Debezium's placeholder): the mirror holds no row to keep them from, so the updates are
    dead-lettered ``unavailable_value`` and the mirror holds no placeholder. Row 2's later
    update carries its notes: the row is written. With the contract fixed, the DLQ replay
    writes row 1's read then its update: the mirror equals its source."""
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i, n)}"
                                         for i, n in ((1, LONG), (2, LONG), (3, "s"))])
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    notes = document["contracts"]["customer"]["fields"]["notes"]
    pipelines, wide = Path(env["KAFKA_INGEST_PIPELINES"]), notes["max_length"]
    notes["max_length"] = 1_000  # the table's column stays as wide as it was made
    pipelines.write_text(yaml.safe_dump(document), encoding="utf-8")
    first = ran(env, "run", "customers")
    assert (first["inserted"], first["dead_lettered"]) == (1, 2), first

    src.execute("UPDATE customers SET name = 'renamed 1' WHERE id = 1")
    src.execute("UPDATE customers SET name = 'renamed 2' WHERE id = 2")
    src.caught_up()
    updates = [e for e in src.events("customers") if e.op == "u"]
    assert [e.after["notes"] for e in updates if e.after] == [UNAVAILABLE] * 2
    second = ran(env, "run", "customers")
    assert (second["inserted"], second["dead_lettered"]) == (0, 2), second
    placeholders = ("SELECT count(*) FROM customers WHERE notes = %s OR name = %s")
    assert query(pg_dsn, placeholders, (UNAVAILABLE, UNAVAILABLE)) == [(0,)]
    assert query(pg_dsn, "SELECT error_class, count(*) FROM dead_letters GROUP BY 1 "
                 "ORDER BY 1") == [("contract_violation", 2), ("unavailable_value", 2)]

    src.execute("UPDATE customers SET notes = 'short now' WHERE id = 2")
    src.caught_up()
    ran(env, "run", "customers")
    assert query(pg_dsn, "SELECT id, name, notes FROM customers ORDER BY id") == [
        (2, "renamed 2", "short now"), (3, "name 3", "s")]

    notes["max_length"] = wide
    pipelines.write_text(yaml.safe_dump(document), encoding="utf-8")
    ran(env, "replay-dlq", "customers")
    same(src, pg_dsn)
    assert query(pg_dsn, "SELECT notes FROM customers WHERE id = 1") == [(LONG,)]


def test_a_pattern_leaves_out_a_table_it_cannot_mirror_and_mirrors_the_others(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str]) -> None:
    """A table without a primary key (its change events have no key) among the pattern's
    topics: left out, with the reason; the other tables' pipelines are printed, a join
    table's (a primary key of two columns) keyed by both."""
    src = debezium_source({**SOURCE, "links": "a int, b int, PRIMARY KEY (a, b)",
                           "log": "at timestamp, line text"},
                          setup=[f"INSERT INTO customers VALUES {row(1)}",
                                 "INSERT INTO links VALUES (1, 2)",
                                 "INSERT INTO log VALUES (TIMESTAMP '2026-01-02', 'x')"])
    prefix = src.topics["customers"].rsplit(".", 1)[0]
    shown = cli(env, "schema", "from-topic", f"{prefix}.*")
    assert shown.returncode == 0, shown.stderr
    pipelines = {p["table"]: p for p in yaml.safe_load(shown.stdout)["pipelines"].values()}
    assert "customers" in pipelines and "log" not in pipelines
    assert pipelines["links"]["identity"] == ["a", "b"]
    said = " ".join(line.removeprefix("# ").strip() for line in shown.stdout.splitlines()
                    if line.startswith("#"))
    assert f"left out: {src.topics['log']}: the primary key has 0 columns" in said


def test_a_table_with_a_composite_primary_key_is_mirrored(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        clients: KafkaClients, dlq_topics: list[str], tmp_path: Path) -> None:
    """A source table keyed by (region, id), two of its rows sharing an id: ``schema
    from-topic`` declares the key's fields as the identity; inserts, an update that leaves
    a TOASTed value out, a delete by the composite key, a backfill of every offset, a
    truncate: the mirror equals its source after each run."""
    columns = "region, id, name, notes"
    src = debezium_source({"customers": "region text, id int, name text NOT NULL, notes text, "
                                        "PRIMARY KEY (region, id)"},
                          setup=["INSERT INTO customers VALUES ('eu', 1, 'a', 's'), "
                                 "('us', 1, 'b', 's'), ('eu', 2, 'c', NULL)"])
    topic = src.topics["customers"]
    document = declared(env, topic, tmp_path, on_truncate="truncate")
    entry = document["pipelines"]["customers"]
    assert entry["identity"] == ["region", "id"] and "record_key" not in entry, entry
    dlq_topics.append(entry["dlq_topic"])

    def equal() -> None:
        query_ = f"SELECT {columns} FROM customers ORDER BY region, id"
        assert query(pg_dsn, query_) == src.query(query_)

    first = ran(env, "run", "customers")
    assert (first["inserted"], first["dead_lettered"]) == (3, 0), first
    equal()
    src.execute(f"UPDATE customers SET notes = '{LONG}' WHERE region = 'eu' AND id = 1")
    src.caught_up()
    ran(env, "run", "customers")
    # an update that leaves the TOASTed notes out, a delete, an insert
    src.execute("UPDATE customers SET name = 'a2' WHERE region = 'eu' AND id = 1")
    src.execute("UPDATE customers SET name = 'b2' WHERE region = 'us' AND id = 1")
    src.execute("DELETE FROM customers WHERE region = 'eu' AND id = 2")
    src.execute("INSERT INTO customers VALUES ('eu', 3, 'd', NULL)")
    src.caught_up()
    update = [e for e in src.events("customers") if e.op == "u"][-2]
    assert update.after["notes"] == "__debezium_unavailable_value", update.after
    second = ran(env, "run", "customers")
    assert (second["dead_lettered"], second["deleted"]) == (0, 1), second
    equal()
    assert query(pg_dsn, "SELECT notes FROM customers WHERE region = 'eu' AND id = 1") == [
        (LONG,)]
    # every offset again: the deleted row stays deleted, nothing newer is overwritten
    backfill = cli(env, "backfill", "customers", "--partition", "0", "--from-offset", "0",
                   "--to-offset", str(highs(clients, topic)[0]))
    assert backfill.returncode == 0, backfill.stderr
    equal()
    # a truncate, then a row
    src.execute("TRUNCATE customers")
    src.execute("INSERT INTO customers VALUES ('us', 9, 'e', NULL)")
    src.caught_up()
    ran(env, "run", "customers")
    equal()
    assert query(pg_dsn, "SELECT count(*) FROM customers") == [(1,)]


def test_from_topic_reads_a_history_with_a_column_added_and_one_dropped(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path) -> None:
    """Change events of two schemas: a NOT NULL column added at the source, another
    dropped. ``schema from-topic`` declares both optional, and every event is mirrored."""
    src = debezium_source({"customers": "id int PRIMARY KEY, name text NOT NULL, notes text"},
                          setup=["INSERT INTO customers VALUES (1, 'a', 'n')"])
    src.execute("ALTER TABLE customers ADD COLUMN score int NOT NULL DEFAULT 0, "
                "DROP COLUMN notes")
    src.execute("INSERT INTO customers VALUES (2, 'b', 7)")
    src.caught_up()
    document = declared(env, src.topics["customers"], tmp_path)
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    fields = document["contracts"]["customer"]["fields"]
    assert fields["score"]["required"] is False and fields["notes"]["required"] is False
    done = ran(env, "run", "customers")
    assert (done["inserted"], done["dead_lettered"]) == (2, 0), done
    assert query(pg_dsn, "SELECT id, name, score, notes FROM customers ORDER BY id") == [
        (1, "a", None, "n"), (2, "b", 7, None)]
