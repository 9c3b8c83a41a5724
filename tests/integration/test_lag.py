"""Honest lag against the real stack: the consumer group never stays behind the stored
offset, and ``kafka-ingest lag`` shows both lags so a difference is visible.

A kill after a chunk's database commit and before its Kafka commit leaves the group's
offset behind the stored offset. The next run may plan nothing for that partition (the
stored offset is at the high watermark), so no slice would ever commit it again: the
planner re-syncs the group to the stored offset for every partition where they differ,
planned or not. Postgres is the source of truth: only stored offsets are ever committed.
Here the kill is played by committing the group's offset backwards by hand, with a plain
consumer of the pipeline's group, which is exactly the state such a kill leaves.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_ingest.cli import main
from kafka_ingest.config import Pipeline
from kafka_ingest.engine.ingest import plan_run
from kafka_ingest.engine.replay import replay_group, run_replay
from kafka_ingest.ops.lag import LagRow, lag
from kafka_ingest.requests import LiveRun, ReplayFilters, ReplayRequest
from kafka_ingest_dev.samples import produce_sample
from tests.support.ingest import (
    group_offsets,
    highs,
    metric,
    produce,
    query,
    run,
    stored_offsets,
)
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 10
PLANNING = "kafka_ingest.engine.planning"


def set_group_offset(kafka_config: dict[str, Any], group_id: str, topic: str,
                     offsets: dict[int, int]) -> None:
    """Commit offsets for a group by hand, as a plain consumer of that group."""
    consumer = Consumer({**kafka_config, "group.id": group_id, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                        asynchronous=False)
    finally:
        consumer.close()


def committed(kafka_config: dict[str, Any], group_id: str, topic: str) -> dict[int, int | None]:
    """A group's committed offsets on every partition of ``topic`` (None: none)."""
    consumer = Consumer({**kafka_config, "group.id": group_id, "enable.auto.commit": False})
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        tps = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}
    finally:
        consumer.close()


def by_partition(rows: list[LagRow]) -> dict[int, dict[str, Any]]:
    return {r.partition: r.to_dict() for r in rows}


def resyncs(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    """The planner's re-sync warnings about ``topic``."""
    return [r.getMessage() for r in caplog.records
            if r.name == PLANNING and r.levelno == logging.WARNING
            and f"{topic}[" in r.getMessage() and "re-syncing" in r.getMessage()]


def produce_events(clients: Any, pipeline: Pipeline, partitions: list[int]) -> None:
    tag = uuid.uuid4().hex[:6]
    for p in partitions:
        produce(clients, pipeline.topic,
                [(b"k", metric(f"{tag}-{p}-{i}", f"dev-{p}", 1_767_225_600.0 + i))
                 for i in range(PER_PARTITION)], partition=p)


@pytest.fixture
def pipeline(make_pipeline: Callable[..., Pipeline]) -> Pipeline:
    return make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=4)


def test_a_run_with_nothing_to_plan_re_syncs_a_group_left_behind(
        pipeline: Pipeline, clients: Any, db: Any, pg_dsn: str,
        kafka_config: dict[str, Any], caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    produce_events(clients, pipeline, [0, 1])  # partition 2 stays empty
    assert sum(r.read for r in run(pipeline, clients, db)) == 2 * PER_PARTITION
    end = highs(clients, pipeline.topic)
    assert stored_offsets(pg_dsn, pipeline) == end == {0: PER_PARTITION, 1: PER_PARTITION,
                                                       2: 0}
    # Partition 2 had no stored offset when the run was planned: nothing committed it.
    assert group_offsets(clients, pipeline) == {0: PER_PARTITION, 1: PER_PARTITION, 2: None}

    # The state a kill between the database commit and the Kafka commit leaves.
    set_group_offset(kafka_config, pipeline.group_id, pipeline.topic, {0: 3})
    rows = by_partition(lag(pipeline, clients, db))
    assert (rows[0]["stored_offset"], rows[0]["group_offset"]) == (PER_PARTITION, 3)
    assert (rows[0]["lag"], rows[0]["group_lag"]) == (0, PER_PARTITION - 3)
    assert (rows[1]["lag"], rows[1]["group_lag"]) == (0, 0)
    assert (rows[2]["lag"], rows[2]["group_lag"]) == (0, None)

    # ...and the operator's table shows both columns, and says which partition differs.
    monkeypatch.setenv("KAFKA_INGEST_PG_DSN", pg_dsn)
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES",
                       str(write_pipelines_file(tmp_path / "p.yaml", pipeline)))
    capsys.readouterr()
    assert main(["lag", pipeline.name]) == 0
    out, err = capsys.readouterr()
    header, *table = [line.split() for line in out.splitlines()]
    assert header[-2:] == ["lag", "group_lag"]
    assert [(r[2], r[-2], r[-1]) for r in table] == [
        ("0", "0", str(PER_PARTITION - 3)), ("1", "0", "0"), ("2", "0", "None")]
    assert f"{pipeline.topic}[0]: the group offset 3 differs from the stored offset " \
           f"{PER_PARTITION}" in err
    assert f"{pipeline.topic}[1]" not in err

    # No new data: nothing is planned, yet the group is re-synced on every partition.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=PLANNING):
        assert run(pipeline, clients, db) == []
    assert group_offsets(clients, pipeline) == stored_offsets(pg_dsn, pipeline) == end
    rows = by_partition(lag(pipeline, clients, db))
    assert all((r["lag"], r["group_lag"]) == (0, 0) for r in rows.values()), rows
    warned = resyncs(caplog, pipeline.topic)
    assert len(warned) == 2, warned  # partitions 0 (behind) and 2 (no group offset)
    assert f"{pipeline.topic}[0]: committed offset 3 differs from the stored offset " \
           f"{PER_PARTITION}" in warned[0]
    assert f"{pipeline.topic}[2]: committed offset None differs from the stored offset 0" \
           in warned[1]

    # In sync: the next run commits nothing and says nothing.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=PLANNING):
        assert run(pipeline, clients, db) == []
    assert resyncs(caplog, pipeline.topic) == []
    assert group_offsets(clients, pipeline) == end


def test_a_group_ahead_of_the_stored_offset_is_moved_back_to_it(
        pipeline: Pipeline, clients: Any, db: Any, pg_dsn: str,
        kafka_config: dict[str, Any]) -> None:
    # The stored offset moved back by hand (reset-offsets): the group follows Postgres,
    # then the slice re-reads and commits its way back to the end.
    produce_events(clients, pipeline, [0, 1, 2])
    run(pipeline, clients, db)
    end = highs(clients, pipeline.topic)
    with db.session() as conn:
        conn.execute("UPDATE ingest_offsets SET next_offset = 2 WHERE pipeline = %s"
                     " AND topic = %s AND partition = 1", (pipeline.name, pipeline.topic))
        conn.commit()
    rows = by_partition(lag(pipeline, clients, db))
    assert (rows[1]["lag"], rows[1]["group_lag"]) == (PER_PARTITION - 2, 0)

    ranges = plan_run(pipeline, clients, db, run_id=f"test__{uuid.uuid4().hex[:8]}")
    assert [(r.partition, r.start, r.end) for r in ranges] == [(1, 2, PER_PARTITION)]
    assert committed(kafka_config, pipeline.group_id, pipeline.topic) == {**end, 1: 2}
    run(pipeline, clients, db)
    assert group_offsets(clients, pipeline) == stored_offsets(pg_dsn, pipeline) == end


def test_a_partition_with_no_stored_offset_is_never_committed(
        pipeline: Pipeline, clients: Any, db: Any, pg_dsn: str,
        kafka_config: dict[str, Any]) -> None:
    produce_events(clients, pipeline, [0, 1, 2])
    run(pipeline, clients, db)
    end = highs(clients, pipeline.topic)
    set_group_offset(kafka_config, pipeline.group_id, pipeline.topic, {0: 1, 1: 4})
    with db.session() as conn:  # partition 1 forgets its stored offset
        conn.execute("DELETE FROM ingest_offsets WHERE pipeline = %s AND topic = %s"
                     " AND partition = 1", (pipeline.name, pipeline.topic))
        conn.commit()
    assert (by_partition(lag(pipeline, clients, db))[1]["lag"]) == PER_PARTITION  # from low

    # Planning alone (no slice runs yet): partition 0 is re-synced; partition 1 is only
    # initialised by the start policy in the plan's own transaction, so its group offset
    # is left alone (it is the slice's to commit, after its chunks are stored).
    ranges = plan_run(pipeline, clients, db, run_id=f"test__{uuid.uuid4().hex[:8]}")
    assert [(r.partition, r.start, r.end) for r in ranges] == [(1, 0, PER_PARTITION)]
    assert committed(kafka_config, pipeline.group_id, pipeline.topic) == {**end, 1: 4}
    assert stored_offsets(pg_dsn, pipeline) == {**end, 1: 0}


def test_replays_re_sync_their_group_from_the_cursor_but_never_in_a_dry_run_or_filtered(
        make_pipeline: Callable[..., Pipeline], clients: Any, db: Any, pg_dsn: str,
        kafka_config: dict[str, Any]) -> None:
    pipeline = make_pipeline("telemetry_metrics", partitions=PARTITIONS, chunk_size=200)
    produce_sample(clients, pipeline, count=300, poison=1)
    run(pipeline, clients, db)
    group = replay_group(pipeline)

    def replay(**kwargs: Any) -> dict[str, Any]:
        return run_replay(pipeline, ReplayRequest(LiveRun(), **kwargs), clients, db,
                          run_id=f"replay__{uuid.uuid4().hex[:8]}")

    def cursors() -> dict[int, int]:
        rows = query(pg_dsn, "SELECT partition, next_offset FROM ingest_offsets"
                             " WHERE pipeline = %s AND topic = %s",
                     (pipeline.name, pipeline.dlq_topic))
        return {int(p): int(o) for p, o in rows}

    assert replay()["read"] > 0
    dlq_end = highs(clients, pipeline.dlq_topic)
    assert cursors() == dlq_end
    assert committed(kafka_config, group, pipeline.dlq_topic) == {
        p: (o if o else None) for p, o in dlq_end.items()}  # empty partitions: no slice
    busy = max(dlq_end, key=lambda p: dlq_end[p])
    set_group_offset(kafka_config, group, pipeline.dlq_topic, {busy: 0})
    behind = committed(kafka_config, group, pipeline.dlq_topic)
    assert behind[busy] == 0

    # A dry run writes nothing, a filtered replay moves no cursor: neither re-syncs.
    assert replay(dry_run=True)["dry_run"] is True
    assert committed(kafka_config, group, pipeline.dlq_topic) == behind
    replay(filters=ReplayFilters(error_classes=frozenset({"undecodable"})))
    assert committed(kafka_config, group, pipeline.dlq_topic) == behind

    # A replay from its cursor does, on every partition (planned or not).
    assert replay()["partitions"] == 0  # nothing new in the DLQ: nothing planned
    assert committed(kafka_config, group, pipeline.dlq_topic) == cursors() == dlq_end
    # The ingest group was never touched by any of it.
    assert group_offsets(clients, pipeline) == highs(clients, pipeline.topic)
