"""A key's versions are ordered by where they sit in the source, not by bare offsets.

A ``latest`` table keeps one row per key, the newest by log order (``order_by:
source_offset``), and a tombstone deletes its key. Offsets order a key's records only
within one partition of one topic as it exists now. Three ways the log breaks that:

- the topic is deleted and re-created: its offsets start at 0 again and collide with the
  rows the old topic left. The run says so (the stored offsets are the old topic's) and
  the reset it advises starts a new *incarnation* of the topic, whose records are newer
  than every record of the old one;
- a key reaches a second partition (partitions added, producers hashing keys
  differently): offsets of two partitions cannot order the key's records, so the record
  is dead-lettered (``unorderable``), never applied in a guessed order nor counted stale;
- two pipelines of different topics writing one latest table: refused when the pipelines
  load (a unit test, ``tests/unit/test_config.py``).

Everything here runs as a user runs it: the CLI in a subprocess, the real broker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.kafka.topics import ensure_topics
from tests.support.cli import cli
from tests.support.ingest import read_topic
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

KEYS = 200
UPDATES = 50
DELETES = 30



_EVENTS = iter(range(10**9))


def balance(account: int, amount: str) -> bytes:
    return (f'{{"event_id": "e-{next(_EVENTS)}", "balance": {amount}, "currency": "EUR",'
            f' "updatedAt": {1_767_225_600_000 + account}}}').encode()


def produce(clients: Any, topic: str, records: list[tuple[bytes, bytes | None]],
            partition: int | None = None) -> None:
    producer = clients.producer()
    failed: list[Any] = []
    for key, value in records:
        kwargs = {} if partition is None else {"partition": partition}
        producer.produce(topic, key=key, value=value,
                         on_delivery=lambda err, _msg: failed.append(err) if err else None,
                         **kwargs)
    assert producer.flush(60) == 0
    assert not failed, failed


def delete_topic(clients: Any, topic: str) -> None:
    admin = clients.admin()
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    # The broker removes a topic in the background: wait until its name is free again.
    deadline = time.monotonic() + 60
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} still listed 60 s after its deletion"
        time.sleep(0.2)


def rows(dsn: str, table: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT account_id, balance::text, source_partition,"
                             f" source_offset FROM {table}").fetchall()
    return {r[0]: tuple(r[1:]) for r in found}


def cli_env(pipeline: Any, pg_dsn: str, stack_env: dict[str, str],
            tmp_path: Path) -> dict[str, str]:
    """The CLI's environment for ``pipeline`` alone, on the test's database."""
    return {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
            "KAFKA_INGEST_PG_DSN": pg_dsn,
            "KAFKA_BOOTSTRAP_SERVERS": stack_env["KAFKA_BOOTSTRAP_SERVERS"]}


@pytest.fixture
def balances(stack_env: dict[str, str], pg_dsn: str, make_pipeline: Any,
             tmp_path: Path) -> Iterator[dict[str, Any]]:
    pipeline = make_pipeline("account_balances", partitions=1, chunk_size=64,
                             auto_create=True)
    env = cli_env(pipeline, pg_dsn, stack_env, tmp_path)
    yield {"env": env, "pipeline": pipeline}


def run_ok(env: dict[str, str], name: str) -> dict[str, Any]:
    done = cli(env, "run", name)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_recreated_topic_reset_as_advised_applies_every_update_and_delete(
        balances: dict[str, Any], clients: Any, pg_dsn: str) -> None:
    env, pipeline = balances["env"], balances["pipeline"]
    keys = [f"acct-{i:04d}".encode() for i in range(KEYS)]
    poison = (b"acct-poison", b"not json")  # at offset 0 of each incarnation
    produce(clients, pipeline.topic,
            [poison, *((k, balance(i, "100.00")) for i, k in enumerate(keys))])
    first = run_ok(env, pipeline.name)
    assert (first["inserted"], first["dead_lettered"]) == (KEYS, 1), json.dumps(first)

    # The topic is deleted and made again; its producers write updates and deletes.
    delete_topic(clients, pipeline.topic)
    ensure_topics(clients, {pipeline.topic: 1})
    updates = [(keys[i], balance(i, "200.00")) for i in range(UPDATES)]
    deletes = [(keys[i], None) for i in range(UPDATES, UPDATES + DELETES)]
    produce(clients, pipeline.topic, [poison, *updates, *deletes])

    # The run refuses, naming the re-created topic and the reset to run.
    refused = cli(env, "run", pipeline.name)
    assert refused.returncode != 0
    assert "re-created" in refused.stderr, refused.stderr
    assert "reset-offsets" in refused.stderr, refused.stderr

    reset = cli(env, "reset-offsets", pipeline.name, "--partition", "0", "--to", "earliest",
                "--yes")
    assert reset.returncode == 0, reset.stderr
    second = run_ok(env, pipeline.name)

    assert second["read"] == 1 + UPDATES + DELETES
    assert second["inserted"] == UPDATES, second  # each update a new version of its key
    assert second["deleted"] == DELETES, second
    assert second["dead_lettered"] == 1, second
    assert second["duplicates"] == second["stale"] == 0, second
    # The poison pill at offset 0 of each incarnation: two letters, not one overwritten,
    # each naming the topic id it came from.
    with psycopg.connect(pg_dsn) as conn:
        letters = conn.execute("SELECT source_incarnation, source_offset, attempts"
                               " FROM dead_letters ORDER BY 1").fetchall()
    assert letters == [(1, 0, 1), (2, 0, 1)]
    ids = [r.headers["kafka-ingest.topic_id"] for r in
           read_topic(clients, pipeline.dlq_topic).values()]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert ids[1] == clients.topic_id(pipeline.topic).encode()
    table = rows(pg_dsn, pipeline.table)
    assert len(table) == KEYS - DELETES
    assert {table[k.decode()][0] for k in keys[:UPDATES]} == {"200.00"}
    assert not {k.decode() for k in keys[UPDATES:UPDATES + DELETES]} & set(table)
    assert {table[k.decode()][0] for k in keys[UPDATES + DELETES:]} == {"100.00"}

    # A replay of the whole new topic changes nothing: its records are the stored ones.
    third = cli(env, "reset-offsets", pipeline.name, "--partition", "0", "--to", "earliest",
                "--yes")
    assert third.returncode == 0, third.stderr
    again = run_ok(env, pipeline.name)
    assert again["inserted"] == again["deleted"] == 0, again
    assert again["duplicates"] + again["stale"] + again["tombstones"] + again[
        "dead_lettered"] == again["read"], again
    assert rows(pg_dsn, pipeline.table) == table


def test_a_key_in_a_second_partition_is_dead_lettered_not_guessed(
        make_pipeline: Any, clients: Any, pg_dsn: str, stack_env: dict[str, str],
        tmp_path: Path) -> None:
    pipeline = make_pipeline("account_balances", partitions=2, chunk_size=64,
                             auto_create=True)
    env = cli_env(pipeline, pg_dsn, stack_env, tmp_path)
    # Partition 0 holds acct-0 at offsets 0..9; then a producer hashing differently writes
    # a newer-looking update and a tombstone of it to partition 1 (offsets 0 and 1).
    produce(clients, pipeline.topic, [(b"acct-0", balance(0, f"{i}.00")) for i in range(10)],
            partition=0)
    assert run_ok(env, pipeline.name)["inserted"] == 1
    produce(clients, pipeline.topic, [(b"acct-0", balance(0, "999.00")), (b"acct-0", None)],
            partition=1)
    second = run_ok(env, pipeline.name)

    assert second["read"] == 2
    assert second["dead_lettered"] == 2, second
    assert second["inserted"] == second["stale"] == second["deleted"] == 0, second
    assert rows(pg_dsn, pipeline.table) == {"acct-0": ("9.00", 0, 9)}
    with psycopg.connect(pg_dsn) as conn:
        letters = conn.execute(
            "SELECT source_partition, source_offset, error_class, error_detail"
            " FROM dead_letters ORDER BY source_offset").fetchall()
    assert [(p, o, c) for p, o, c, _ in letters] == [(1, 0, "unorderable"),
                                                      (1, 1, "unorderable")]
    assert "partition 0" in letters[0][3], letters[0][3]


def test_a_topic_recreated_with_fewer_partitions_runs_again_after_the_advised_reset(
        make_pipeline: Any, clients: Any, pg_dsn: str, stack_env: dict[str, str],
        tmp_path: Path) -> None:
    # The old topic had two partitions, the new one has one: the cursor of partition 1
    # belongs to a partition that no longer exists. The reset the refusal advises must be
    # enough to run again (partition 1 cannot be named: the topic has no such partition).
    pipeline = make_pipeline("account_balances", partitions=2, chunk_size=64,
                             auto_create=True)
    env = cli_env(pipeline, pg_dsn, stack_env, tmp_path)
    produce(clients, pipeline.topic, [(b"acct-0", balance(0, "1.00"))], partition=0)
    produce(clients, pipeline.topic, [(b"acct-1", balance(1, "1.00"))], partition=1)
    assert run_ok(env, pipeline.name)["inserted"] == 2

    delete_topic(clients, pipeline.topic)
    ensure_topics(clients, {pipeline.topic: 1})
    produce(clients, pipeline.topic, [(b"acct-0", balance(0, "2.00"))])
    refused = cli(env, "run", pipeline.name)
    assert refused.returncode != 0 and "re-created" in refused.stderr, refused.stderr
    advised = refused.stderr.split("`kafka-ingest ")[1].split("`")[0].split()
    assert advised[:2] == ["reset-offsets", pipeline.name], refused.stderr

    reset = cli(env, *advised)
    assert reset.returncode == 0, reset.stderr
    again = cli(env, "run", pipeline.name)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["inserted"] == 1
    assert rows(pg_dsn, pipeline.table)["acct-0"] == ("2.00", 0, 0)
