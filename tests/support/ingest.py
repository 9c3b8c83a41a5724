"""Shared by the ingest, unit-of-work and chaos tests: run the real code path, read the
real topics back, and check the invariants of DESIGN §3 against what was produced.

Nothing here reimplements the pipeline: runs go through ``plan_run`` / ``ingest_range``
(the DAG's and ``kafka-ingest run``'s path); verification reads Kafka with a plain
assign/consume loop and Postgres with plain SQL, independent of the code under test.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from kafka_ingest.config import Pipeline
from kafka_ingest.db import Database
from kafka_ingest.engine.ingest import ingest_range, plan_run
from kafka_ingest.engine.slices import SliceReport
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.requests import RangeRequest
from kafka_ingest_dev.samples import sample_stream

#: (partition, offset) -> the record as the broker holds it
Position = tuple[int, int]

NON_POISON = {"row", "duplicate", "tombstone"}


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]


@dataclass(frozen=True)
class Expected:
    """What a produced sample must turn into: valid ids and poison value -> error class."""

    ids: frozenset[str]
    poison: dict[bytes, str]
    duplicates: int
    tombstones: int


def expected_from_sample(pipeline: Pipeline, sample: Mapping[str, Any], *, count: int,
                         poison: int, partitions: int = 3) -> Expected:
    """Regenerate the sample stream ``produce_sample`` produced (same tag, same seed)."""
    ids: set[str] = set()
    pills: dict[bytes, str] = {}
    kinds: Counter[str] = Counter()
    for s in sample_stream(pipeline, count, poison, tag=sample["tag"], partitions=partitions):
        kinds[s.expect] += 1
        if s.expect == "row":
            assert s.value is not None
            ids.add(json.loads(s.value)["event_id"])
        elif s.expect not in NON_POISON:
            assert s.value is not None and s.value not in pills
            pills[s.value] = s.expect
    assert dict(kinds) == sample["expect"], "the regenerated stream differs from the produced"
    return Expected(frozenset(ids), pills, kinds["duplicate"], kinds["tombstone"])


# --------------------------------------------------------------------------- running


def run(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str | None = None,
        request: RangeRequest | None = None) -> list[SliceReport]:
    """One run exactly as ``kafka_ingest.engine.ingest.run_ingest`` chains it: plan, then
    each range."""
    run_id = run_id or f"test__{uuid.uuid4().hex[:8]}"
    ranges = plan_run(pipeline, clients, db, run_id=run_id, request=request)
    return [ingest_range(pipeline, r, clients, db, run_id=run_id) for r in ranges]


def total(reports: Iterable[SliceReport], field: str) -> int:
    return sum(int(getattr(r, field)) for r in reports)


def produce(clients: KafkaClients, topic: str, records: Iterable[tuple[bytes | None, bytes | None]],
            *, partition: int | None = None) -> None:
    """Produce (key, value) pairs and check every delivery report."""
    producer: Producer = clients.producer()
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    extra = {} if partition is None else {"partition": partition}
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery, **extra)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors


def versioned_metric(event_id: str, *, version: int, value: Any = 21.5) -> bytes:
    """A ``metric_event`` of contract ``version`` (v2 adds ``unit``): the replay stories'
    events, where a v2 event is parked under v1 and recovered once the pipeline moves on."""
    event: dict[str, Any] = {"event_id": event_id, "device_id": "dev-1",
                             "timestamp": 1_767_225_600.0, "metric_value": value,
                             "version": version}
    if version == 2:
        event["unit"] = "celsius"
    return json.dumps(event, allow_nan=True).encode()


def with_version(pipeline: Pipeline, version: int) -> Pipeline:
    """The same pipeline (name, topics, table) with another ``metric_event`` version."""
    body = pipeline.model_dump(mode="json")
    body["contract"] = {"event_type": "metric_event", "version": version}
    return Pipeline.model_validate(body)


def metric(event_id: str, device: str, ts: float, value: float = 1.0) -> bytes:
    return json.dumps({"event_id": event_id, "device_id": device, "timestamp": ts,
                       "metric_value": value, "version": 2}).encode()


# --------------------------------------------------------------------------- reading back


def _consumer(clients: KafkaClients) -> Consumer:
    return clients.consumer(f"test-reader-{uuid.uuid4().hex[:8]}")


def watermarks(clients: KafkaClients, topic: str) -> dict[int, tuple[int, int]]:
    consumer = _consumer(clients)
    try:
        parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10,
                                                  cached=False) for p in parts}
    finally:
        consumer.close()


def highs(clients: KafkaClients, topic: str) -> dict[int, int]:
    return {p: hi for p, (_, hi) in watermarks(clients, topic).items()}


def read_topic(clients: KafkaClients, topic: str, *, deadline_s: float = 60.0
               ) -> dict[Position, Record]:
    """Every record between the low and high watermarks, by assign + consume."""
    marks = watermarks(clients, topic)
    wanted = {p: (lo, hi) for p, (lo, hi) in marks.items() if hi > lo}
    out: dict[Position, Record] = {}
    if not wanted:
        return out
    consumer = _consumer(clients)
    try:
        consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in wanted.items()])
        left = set(wanted)
        deadline = time.monotonic() + deadline_s
        while left:
            assert time.monotonic() < deadline, f"could not read {topic} back: {left} left"
            for m in consumer.consume(10_000, timeout=0.5):
                assert m.error() is None, m.error()
                p, o = m.partition(), m.offset()
                out[(p, o)] = Record(m.key(), m.value(), dict(m.headers() or []))
                if o >= wanted[p][1] - 1:
                    left.discard(p)
    finally:
        consumer.close()
    return out


def group_offsets(clients: KafkaClients, pipeline: Pipeline) -> dict[int, int | None]:
    """The consumer group's committed offsets, as lag tools see them."""
    consumer = clients.consumer(pipeline.group_id)
    try:
        parts = sorted(highs(clients, pipeline.topic))
        tps = consumer.committed([TopicPartition(pipeline.topic, p) for p in parts], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}
    finally:
        consumer.close()


# --------------------------------------------------------------------------- Postgres


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()  # type: ignore[arg-type]


def execute(dsn: str, sql: str) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


def table_ids(dsn: str, table: str) -> list[str]:
    return [r[0] for r in query(dsn, f"SELECT event_id FROM {table}")]


def stored_offsets(dsn: str, pipeline: Pipeline) -> dict[int, int]:
    rows = query(dsn, "SELECT partition, next_offset FROM ingest_offsets"
                      " WHERE pipeline = %s AND topic = %s", (pipeline.name, pipeline.topic))
    return {int(p): int(o) for p, o in rows}


def dead_letter_rows(dsn: str, pipeline: Pipeline) -> dict[Position, tuple[str, int]]:
    """(source partition, offset) -> (error_class, attempts) from ``dead_letters``."""
    rows = query(dsn, "SELECT source_partition, source_offset, error_class, attempts"
                      " FROM dead_letters WHERE pipeline = %s AND source_topic = %s",
                 (pipeline.name, pipeline.topic))
    return {(int(p), int(o)): (c, int(a)) for p, o, c, a in rows}


# --------------------------------------------------------------------------- invariants


def poison_positions(source: Mapping[Position, Record], expected: Expected) -> dict[Position, str]:
    """Where each poison pill landed in the source topic -> the error class it must get."""
    found = {pos: expected.poison[r.value] for pos, r in source.items()
             if r.value is not None and r.value in expected.poison}
    assert len(found) == len(expected.poison), "a produced poison pill is missing in the topic"
    return found


def dlq_positions(dlq: Mapping[Position, Record], pipeline: Pipeline,
                  source: Mapping[Position, Record]) -> Counter[tuple[Position, str]]:
    """(source position, error class) of each DLQ record, checked against its source."""
    seen: Counter[tuple[Position, str]] = Counter()
    for record in dlq.values():
        h = record.headers
        pos = (int(h["kafka-ingest.partition"]), int(h["kafka-ingest.offset"]))
        original = source[pos]
        assert h["kafka-ingest.topic"] == pipeline.topic.encode()
        assert h["kafka-ingest.pipeline"] == pipeline.name.encode()
        assert h["__connect.errors.topic"] == pipeline.topic.encode()
        assert h["__connect.errors.partition"] == str(pos[0]).encode()
        assert h["__connect.errors.offset"] == str(pos[1]).encode()
        assert (h["__connect.errors.exception.class.name"]
                == h["kafka-ingest.error_class"])
        assert record.value == original.value and record.key == original.key
        # every copy of a dead letter carries the id a DLQ consumer drops copies by, and
        # the id of the topic it came from (a re-created topic's offsets are other records)
        topic_id = h["kafka-ingest.topic_id"].decode()
        assert topic_id
        assert h["kafka-ingest.letter_id"] == (
            f"{pipeline.name}/{pipeline.topic}/{pos[0]}/{pos[1]}/{topic_id}".encode())
        seen[(pos, h["kafka-ingest.error_class"].decode())] += 1
    return seen


def row_provenance(dsn: str, table: str) -> list[tuple[str, int, int]]:
    """(event_id, source partition, source offset) of every row of ``table``."""
    return [(e, int(p), int(o)) for e, p, o in
            query(dsn, f"SELECT event_id, source_partition, source_offset FROM {table}")]


def assert_invariants(pipeline: Pipeline, clients: KafkaClients, dsn: str,
                      expected: Expected, *, dlq_exactly_once: bool = True) -> None:
    """DESIGN §3 after a complete run: nothing lost, nothing duplicated, offsets at the end.

    The DLQ topic may hold a pill twice after a crash between its produce and the commit
    (``dlq_exactly_once=False``), every copy with the same letter id; the ``dead_letters``
    table never does. Each row must come from a source message of its event id (the
    earliest copy, where the topic holds the event more than once), so a row loaded from
    the wrong message, or twice, cannot pass.
    """
    source = read_topic(clients, pipeline.topic)
    first_at: dict[str, Position] = {}
    for pos, r in sorted(source.items(), key=lambda item: (item[0][1], item[0][0])):
        if r.value is not None and r.value not in expected.poison:
            first_at.setdefault(json.loads(r.value)["event_id"], pos)
    rows = row_provenance(dsn, pipeline.table)
    assert {e for e, _, _ in rows} == expected.ids
    assert len(rows) == len(expected.ids)
    for event_id, partition, offset in rows:
        loaded = source[(partition, offset)]
        assert loaded.value is not None and json.loads(loaded.value)["event_id"] == event_id
        if first_at[event_id][0] == partition:  # within a partition, the first copy wins
            assert offset == first_at[event_id][1], (event_id, partition, offset)
    end = highs(clients, pipeline.topic)
    assert stored_offsets(dsn, pipeline) == end
    assert group_offsets(clients, pipeline) == end
    poison = poison_positions(source, expected)
    letters = dead_letter_rows(dsn, pipeline)
    assert {pos: cls for pos, (cls, _) in letters.items()} == poison
    dlq = read_topic(clients, pipeline.dlq_topic)
    seen = dlq_positions(dlq, pipeline, source)
    assert set(seen) == set(poison.items())
    assert {r.headers["kafka-ingest.topic_id"] for r in dlq.values()} <= {
        clients.topic_id(pipeline.topic).encode()}
    if dlq_exactly_once:
        assert all(n == 1 for n in seen.values()), seen


class DeadProducerClients(KafkaClients):
    """Real clients whose producer points at a closed port: every DLQ delivery times out.

    The consumer still reads the real broker, so the run gets as far as dead-lettering.
    """

    def producer(self) -> Producer:
        return Producer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500,
                         "acks": "all", "enable.idempotence": True})
