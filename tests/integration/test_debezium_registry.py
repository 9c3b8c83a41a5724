"""A table mirrored through real Debezium writing Avro to the registry (#34): Debezium's
Postgres connector on the stack's Kafka Connect worker, with Apicurio's ``AvroConverter``
for keys and values (the wire header in front of each, the schemas registered in the
stack's Apicurio under ``<topic>-key`` and ``<topic>-value``). ``schema from-registry``
declares the mirror from the value subject's schema (Debezium's semantic types read from
the Connect schema the converter kept in it), and ``kafka-ingest run`` mirrors it: the
snapshot, an update that leaves TOASTed values out, a delete, a backfill of every offset,
a truncate, and a column added at the source; after each, the mirror equals its source. A
composite primary key is read from the Avro record keys."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kafka_ingest.kafka.clients import KafkaClients
from tests.integration.test_debezium_mirror import (
    LONG,
    LONG_BYTES,
    LONG_JSON,
    SOURCE,
    both_tables_mirrored,
    declared,
    every_step,
    mirror_env,
    ran,
    row,
)
from tests.support.cli import cli
from tests.support.debezium import DebeziumSource
from tests.support.ingest import query

pytestmark = pytest.mark.integration


@pytest.fixture
def env(stack_env: dict[str, str], pg_dsn: str) -> dict[str, str]:
    return mirror_env(stack_env, pg_dsn)


def test_a_table_mirrored_through_debezium_in_avro_equals_its_source_at_every_step(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str],
        pg_dsn: str, clients: KafkaClients, dlq_topics: list[str], tmp_path: Path,
        stack_env: dict[str, str]) -> None:
    src = debezium_source(SOURCE, setup=[f"INSERT INTO customers VALUES {row(i)}"
                                         for i in (1, 2, 3)]
                          + [f"UPDATE customers SET notes = '{LONG}', profile = '{LONG_JSON}', "
                             f"photo = '\\x{LONG_BYTES.hex()}' WHERE id = 2"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    topic = src.topics["customers"]
    raw = next(iter(src.events("customers")))
    assert raw.value is not None and raw.value["schema"]["fields"]  # decoded from Avro
    document = declared(env, topic, tmp_path, "--event-type", "customer", registry=True,
                        on_truncate="truncate")
    entry = document["pipelines"]["customers"]
    assert (entry["envelope"], entry["format"]) == ("debezium", "avro"), entry
    assert entry["record_key"] == {"column": "id", "format": "registry", "type": "bigint"}
    assert {n: f["type"] for n, f in document["contracts"]["customer"]["fields"].items()} == {
        "id": "integer", "name": "text", "balance": "numeric", "born": "date",
        "seen_at": "timestamp", "changed_at": "timestamptz", "profile": "jsonb",
        "ref": "uuid", "photo": "bytea", "notes": "text"}
    dlq_topics.append(entry["dlq_topic"])
    every_step(src, env, pg_dsn, clients, document)


def test_a_composite_primary_key_is_read_from_avro_record_keys(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str],
        pg_dsn: str, dlq_topics: list[str], tmp_path: Path,
        stack_env: dict[str, str]) -> None:
    """A source table keyed by (region, id), in Avro: ``schema from-registry`` declares
    the key subject's fields as the identity; a delete names its row by the fields of its
    Avro record key."""
    columns = "region, id, name"
    src = debezium_source({"customers": "region text, id int, name text NOT NULL, "
                                        "PRIMARY KEY (region, id)"},
                          setup=["INSERT INTO customers VALUES ('eu', 1, 'a'), ('us', 1, 'b'), "
                                 "('eu', 2, 'c')"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    document = declared(env, src.topics["customers"], tmp_path, registry=True)  # no --event-type
    entry = document["pipelines"]["customers"]
    assert entry["identity"] == ["region", "id"] and "record_key" not in entry, entry
    assert entry["contract"]["event_type"] == "customers"  # the pipeline's name
    dlq_topics.append(entry["dlq_topic"])
    ran(env, "run", "customers")
    src.execute("DELETE FROM customers WHERE region = 'eu' AND id = 1")
    src.execute("UPDATE customers SET name = 'b2' WHERE region = 'us' AND id = 1")
    src.caught_up()
    done = ran(env, "run", "customers")
    assert (done["deleted"], done["dead_lettered"]) == (1, 0), done
    statement = f"SELECT {columns} FROM customers ORDER BY region, id"
    assert query(pg_dsn, statement) == src.query(statement) == [("eu", 2, "c"), ("us", 1, "b2")]


def test_a_pattern_of_subjects_is_mirrored_a_pipeline_per_table(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str], pg_dsn: str,
        dlq_topics: list[str], tmp_path: Path, stack_env: dict[str, str]) -> None:
    """``schema from-registry 'prefix.*-value'``: a mirror per table whose value subject
    holds Debezium's change events in Avro; a table without a primary key (no key to
    delete by) is left out, saying why."""
    src = debezium_source({**SOURCE, "orders": "no bigint PRIMARY KEY, customer int, "
                           "total numeric(10,2) NOT NULL", "notes": "line text"},
                          setup=[f"INSERT INTO customers VALUES {row(1)}",
                                 "INSERT INTO orders VALUES (10, 1, 5.5), (11, 1, 6)",
                                 "INSERT INTO notes VALUES ('n')",
                                 "ALTER TABLE notes REPLICA IDENTITY FULL"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    prefix = src.topics["customers"].rsplit(".", 1)[0]
    shown = cli(env, "schema", "from-registry", f"{prefix}.*-value", "--format", "avro")
    assert shown.returncode == 0, shown.stderr
    assert f"left out: {prefix}.notes: no avro key subject {prefix}.notes-key: a mirror " \
        "deletes and orders rows by the primary key" in shown.stdout.replace("\n#   ", " "), \
        shown.stdout
    document = yaml.safe_load(shown.stdout)
    assert "notes" not in {p["table"] for p in document["pipelines"].values()}
    both_tables_mirrored(src, env, pg_dsn, document, "registry", tmp_path, dlq_topics)


def test_a_column_of_an_array_of_decimals_in_avro_does_not_dead_letter_its_rows(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str],
        pg_dsn: str, dlq_topics: list[str], tmp_path: Path,
        stack_env: dict[str, str]) -> None:
    """A ``numeric(10,2)[]`` column: the converter writes an array of Avro decimals, which
    fastavro decodes to ``Decimal`` items; the column is left out of the declaration (an
    array Debezium cannot mark unchanged), and its rows load like any other."""
    src = debezium_source({"customers": "id int PRIMARY KEY, name text NOT NULL, "
                                        "amounts numeric(10,2)[]"},
                          setup=["INSERT INTO customers VALUES (1, 'a', '{1.50,NULL,-0.07}'), "
                                 "(2, 'b', NULL)"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    raw = next(iter(src.events("customers")))
    assert raw.value is not None
    after = next(f for f in raw.value["schema"]["fields"] if f["field"] == "after")
    amounts = next(f for f in after["fields"] if f["field"] == "amounts")
    assert amounts["items"].get("typed"), amounts  # the converter's decimal items
    document = declared(env, src.topics["customers"], tmp_path, registry=True)
    assert "amounts" not in document["contracts"]["customers"]["fields"]
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    done = ran(env, "run", "customers")
    assert (done["inserted"], done["dead_lettered"]) == (2, 0), done
    assert query(pg_dsn, "SELECT id, name FROM customers ORDER BY id") == [(1, "a"), (2, "b")]


def test_from_registry_declares_a_mirror_that_reads_the_older_schema_versions_too(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str],
        pg_dsn: str, dlq_topics: list[str], tmp_path: Path,
        stack_env: dict[str, str]) -> None:
    """The subject's latest version is not the only one the topic holds: the snapshot was
    written before a column was added NOT NULL (required in the latest version) and one
    dropped (in the older version only). The declaration reads every version's records,
    as ``schema from-topic``'s reads every sampled one: the first run does not stop."""
    src = debezium_source({"customers": "id int PRIMARY KEY, name text NOT NULL, notes text"},
                          setup=["INSERT INTO customers VALUES (1, 'a', 'x'), (2, 'b', 'y')"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    src.execute("ALTER TABLE customers ADD COLUMN score int NOT NULL DEFAULT 0")
    src.execute("ALTER TABLE customers DROP COLUMN notes")
    src.execute("INSERT INTO customers VALUES (3, 'c', 7)")
    src.caught_up()
    document = declared(env, src.topics["customers"], tmp_path, registry=True)
    fields = document["contracts"]["customers"]["fields"]
    dlq_topics.append(document["pipelines"]["customers"]["dlq_topic"])
    run = cli(env, "run", "customers")
    assert run.returncode == 0, run.stderr  # no "the source table changed" at the snapshot
    assert (fields["score"].get("required"), fields["notes"].get("required")) == (
        False, False), fields
    done = json.loads(run.stdout)
    assert (done["inserted"], done["dead_lettered"]) == (3, 0), done
    assert query(pg_dsn, "SELECT id, name, notes, score FROM customers ORDER BY id") == [
        (1, "a", "x", None), (2, "b", "y", None), (3, "c", None, 7)]


def test_from_registry_refuses_a_mirror_whose_run_would_stop_at_an_older_version(
        debezium_source: Callable[..., DebeziumSource], env: dict[str, str],
        stack_env: dict[str, str]) -> None:
    """A column retyped at the source: the records of the older version carry it as the
    older type, which the drift check stops at; nothing is printed, the version is named."""
    src = debezium_source({"customers": "id int PRIMARY KEY, n int"},
                          setup=["INSERT INTO customers VALUES (1, 1)"],
                          registry_url=stack_env["KAFKA_INGEST_SCHEMA_REGISTRY_URL"])
    src.execute("ALTER TABLE customers ALTER COLUMN n TYPE bigint")
    src.execute("INSERT INTO customers VALUES (2, 2)")
    src.caught_up()
    shown = cli(env, "schema", "from-registry", f"{src.topics['customers']}-value",
                "--format", "avro")
    assert shown.returncode != 0 and shown.stdout == "", shown.stdout
    assert "would stop at the records of subject" in shown.stderr, shown.stderr
    assert "version 1: column 'n' is integer now, the contract's bigint" in shown.stderr
