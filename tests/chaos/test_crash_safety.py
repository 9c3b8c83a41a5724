"""Crash safety (DESIGN §3): kill a real ingest process at each step of a chunk, or restart
Postgres under it, then check that the next run restores the invariants exactly.

"A kill at any point leaves either the old offset (the chunk is read again, the upsert
absorbs it) or the new one with the rows committed. Nothing is lost, nothing duplicated."
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from kafka_ingest.engine import slices
from kafka_ingest.engine.ingest import ingest_range, plan_run
from kafka_ingest.errors import TransientError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest_dev import stack
from kafka_ingest_dev.samples import produce_sample
from tests.support.ingest import (
    Expected,
    assert_invariants,
    dead_letter_rows,
    expected_from_sample,
    group_offsets,
    highs,
    poison_positions,
    read_topic,
    run,
    stored_offsets,
    table_ids,
)

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

WORKER = Path(__file__).resolve().parent / "ingest_worker.py"
COUNT = 6_000
CHUNK = 500


def _write_pipelines(path: Path, pipeline: Any) -> Path:
    body = pipeline.model_dump(mode="json", exclude={"name"})
    path.write_text(yaml.safe_dump({"pipelines": {pipeline.name: body}}), encoding="utf-8")
    return path


def _produce(clients: KafkaClients, pipeline: Any) -> Expected:
    sample = produce_sample(clients, pipeline, count=COUNT, poison=1)
    return expected_from_sample(pipeline, sample, count=COUNT, poison=1)


def _kill_worker(pipeline: Any, pg_dsn: str, clients: KafkaClients, tmp_path: Path, *,
                 stage: str, nth: int, with_dead: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_INGEST_KAFKA_CONFIG"}
    env.update(
        KAFKA_INGEST_PIPELINES=str(_write_pipelines(tmp_path / "pipelines.yaml", pipeline)),
        KAFKA_INGEST_PG_DSN=pg_dsn,
        KAFKA_BOOTSTRAP_SERVERS=clients.config["bootstrap.servers"],
        CHAOS_KILL_STAGE=stage, CHAOS_KILL_NTH=str(nth),
        CHAOS_KILL_WITH_DEAD="1" if with_dead else "0",
    )
    done = subprocess.run([sys.executable, str(WORKER), pipeline.name, "chaos-run"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr[-3000:])


# (stage, nth occurrence, count only chunks with dead letters)
KILLS = [
    pytest.param("upserted", 2, False, id="upserted-2nd-chunk"),
    # The DLQ has the records, Postgres does not: the retry produces them again.
    pytest.param("dlq_produced", 2, True, id="dlq-produced-2nd-chunk-with-dead-letters"),
    # Postgres committed, the Kafka group commit never happened.
    pytest.param("db_committed", 2, False, id="db-committed-before-kafka-commit"),
    # The group has a chunk while the next chunk's transaction is under way (every chunk
    # holds poison pills: the sample spreads them over every partition), so its dead
    # letters may be in the DLQ already: the retry produces them again, same letter id.
    pytest.param("kafka_committed", 3, False, id="kafka-committed-3rd-chunk"),
    pytest.param("copy", 2, False, id="in-the-middle-of-copy"),
]


@pytest.mark.parametrize(("stage", "nth", "with_dead"), KILLS)
def test_a_killed_run_is_completed_exactly_by_the_next(
        stage: str, nth: int, with_dead: bool, make_pipeline: Callable[..., Any],
        clients: KafkaClients, db: Any, pg_dsn: str, tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK)
    expected = _produce(clients, pipeline)
    end = highs(clients, pipeline.topic)

    _kill_worker(pipeline, pg_dsn, clients, tmp_path, stage=stage, nth=nth, with_dead=with_dead)

    stored = stored_offsets(pg_dsn, pipeline)
    assert set(stored) == set(end) and stored != end  # killed part way
    assert len(table_ids(pg_dsn, pipeline.table)) < len(expected.ids)
    if stage == "db_committed":  # the window between the two commits
        group = group_offsets(clients, pipeline)
        assert any((group[p] or 0) < stored[p] for p in stored), (group, stored)
    dlq_before = len(read_topic(clients, pipeline.dlq_topic))
    if stage == "dlq_produced":
        assert dlq_before > len(dead_letter_rows(pg_dsn, pipeline))
    # every whole chunk of every partition holds poison pills (none can pass without one)
    chunks = {(p, o // CHUNK) for p, o in poison_positions(
        read_topic(clients, pipeline.topic), expected)}
    assert chunks >= {(p, o // CHUNK) for p, hi in end.items()
                      for o in range(0, hi - CHUNK + 1, CHUNK)}

    reports = run(pipeline, clients, db, run_id="chaos-run")  # the retry: the pinned slices
    assert sum(r.read for r in reports) > 0

    assert_invariants(pipeline, clients, pg_dsn, expected,
                      dlq_exactly_once=stage not in ("dlq_produced", "kafka_committed"))
    if stage == "dlq_produced":
        assert len(read_topic(clients, pipeline.dlq_topic)) > len(expected.poison)
    assert run(pipeline, clients, db) == []  # and nothing is left for a new run


@pytest.mark.exclusive  # restarts the shared Postgres
def test_postgres_restarted_mid_run_is_transient_and_the_rerun_is_exact(
        make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any, pg_dsn: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=200)
    expected = _produce(clients, pipeline)
    upserts = {"n": 0}
    restarted: list[BaseException | None] = []

    def restart() -> None:
        try:
            stack.restart_postgres()
            restarted.append(None)
        except BaseException as exc:
            restarted.append(exc)

    def restart_during_third_chunk(stage: str) -> None:
        if stage != "upserted":
            return
        upserts["n"] += 1
        if upserts["n"] == 3:  # inside the chunk's open transaction
            worker = threading.Thread(target=restart, name="restart-postgres")
            worker.start()
            worker.join(120)

    ranges = plan_run(pipeline, clients, db, run_id="pg-restart")
    monkeypatch.setattr(slices, "CHUNK_HOOK", restart_during_third_chunk)
    with pytest.raises(TransientError):
        for rng in ranges:
            ingest_range(pipeline, rng, clients, db, run_id="pg-restart")
    assert restarted == [None]
    monkeypatch.setattr(slices, "CHUNK_HOOK", None)
    stored = stored_offsets(pg_dsn, pipeline)
    assert stored[ranges[0].partition] == ranges[0].start + 2 * 200  # two chunks committed

    run(pipeline, clients, db, run_id="pg-restart")

    # The failed chunk's dead letters reached the DLQ before its transaction died, so the
    # topic may hold them twice; the dead_letters table holds each once.
    assert_invariants(pipeline, clients, pg_dsn, expected, dlq_exactly_once=False)


# (stage, nth occurrence): where a deleting pipeline's run is killed
DELETE_KILLS = [
    # the chunk's upsert and its tombstones' deletes and markers written, not committed
    pytest.param("upserted", 2, id="deletes-written-not-committed"),
    # committed: rows deleted and markers written, the group commit never happened
    pytest.param("db_committed", 2, id="deletes-committed-before-kafka-commit"),
    # half the COPY of a chunk whose tombstones had not run yet
    pytest.param("copy", 3, id="in-the-middle-of-copy"),
]


@pytest.mark.parametrize(("stage", "nth"), DELETE_KILLS)
def test_a_killed_deleting_run_leaves_the_table_mirroring_the_log_after_the_next(
        stage: str, nth: int, make_pipeline: Callable[..., Any], clients: KafkaClients,
        db: Any, pg_dsn: str, tmp_path: Path) -> None:
    """A state topic with updates, deletes and re-inserts (``account_balances``: the record
    key as the upsert key, tombstones delete in log order): a SIGKILL at a step of a chunk,
    then the retry, leaves each account's last record, no row for an account whose last
    record is a tombstone, a marker for exactly those, and the pills dead-lettered once."""
    from kafka_ingest_dev.samples import produce_state_sample
    from tests.support.pipelines import write_pipelines_file

    pipeline = make_pipeline("account_balances", chunk_size=100,
                             source_topic_config={"cleanup.policy": "compact"})
    sample = produce_state_sample(clients, pipeline, accounts=120, updates=2_400)
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_INGEST_KAFKA_CONFIG"}
    env.update(KAFKA_INGEST_PIPELINES=str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
               KAFKA_INGEST_PG_DSN=pg_dsn,
               KAFKA_BOOTSTRAP_SERVERS=clients.config["bootstrap.servers"],
               CHAOS_KILL_STAGE=stage, CHAOS_KILL_NTH=str(nth), CHAOS_KILL_WITH_DEAD="0")
    done = subprocess.run([sys.executable, str(WORKER), pipeline.name, "chaos-run"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout,
                                                done.stderr[-3000:])
    end = highs(clients, pipeline.topic)
    assert stored_offsets(pg_dsn, pipeline) != end  # killed part way

    run(pipeline, clients, db, run_id="chaos-run")  # the retry: the pinned slices
    assert run(pipeline, clients, db) == []  # and nothing left for a new run

    import psycopg

    with psycopg.connect(pg_dsn) as conn:
        stored = dict(conn.execute("SELECT account_id, event_id FROM account_balances"))
        markers = {r[0] for r in conn.execute(
            "SELECT account_id FROM account_balances_tombstones")}
        dead = dict(conn.execute("SELECT error_class, count(*) FROM dead_letters"
                                 " WHERE pipeline = %s GROUP BY 1", (pipeline.name,)))
    assert stored == sample.final
    assert markers == set(sample.deleted) and sample.deleted
    assert dead == sample.poison
    assert stored_offsets(pg_dsn, pipeline) == end


@pytest.mark.parametrize("stage", ["in-the-middle-of-copy", "db_committed"])
def test_a_killed_run_keyed_by_source_position_is_completed_exactly_by_the_next(
        stage: str, make_pipeline: Callable[..., Any], clients: KafkaClients, db: Any,
        pg_dsn: str, tmp_path: Path) -> None:
    # With no id in the payload, each record's place in the log is its identity (#33): a
    # run SIGKILLed mid-COPY or between its two commits, then the retry, must leave every
    # record of the log once, as a row or as a dead letter, never twice.
    pipeline = make_pipeline("telemetry_metrics", chunk_size=CHUNK, identity="source_position",
                             table="metrics_by_position", auto_create=True)
    _produce(clients, pipeline)
    end = highs(clients, pipeline.topic)
    _kill_worker(pipeline, pg_dsn, clients, tmp_path, nth=2, with_dead=False,
                 stage="copy" if stage == "in-the-middle-of-copy" else stage)
    assert stored_offsets(pg_dsn, pipeline) != end  # killed part way

    run(pipeline, clients, db, run_id="chaos-run")  # the retry: the pinned slices
    assert run(pipeline, clients, db) == []
    assert stored_offsets(pg_dsn, pipeline) == end
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(f"SELECT source_partition, source_offset FROM {pipeline.table}"
                            ).fetchall()
        dead = conn.execute("SELECT source_partition, source_offset FROM dead_letters"
                            " WHERE pipeline = %s", (pipeline.name,)).fetchall()
    assert len(rows) == len(set(rows)), "a record landed twice"
    assert not set(rows) & set(dead), "a record both landed and was dead-lettered"
    # every record but the tombstones (skipped: the pipeline does not delete)
    log = {at for at, record in read_topic(clients, pipeline.topic).items()
           if record.value is not None}
    assert len(log) > COUNT
    assert set(rows) | set(dead) == log, "a record of the log is neither a row nor a letter"
