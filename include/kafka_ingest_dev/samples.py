"""Realistic sample events and every kind of poison pill, for the demo and the tests.

``poison_pills()`` is the catalogue of data errors the pipeline must dead-letter (or, for
tombstones and extra fields, handle by rule) without failing the batch.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kafka_ingest.config import Pipeline
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import create_pipeline_topics, ensure_topics


@dataclass(frozen=True)
class Sample:
    kind: str  # "valid", "duplicate", or the poison kind
    key: bytes | None
    value: bytes | None
    expect: str  # "row", "duplicate", "tombstone", or the error class it must get
    partition: int | None = None


def _metric(i: int, tag: str, rng: random.Random) -> dict[str, Any]:
    return {
        "event_id": f"{tag}-m-{i:08d}",
        "device_id": f"device-{rng.randrange(500):04d}",
        "timestamp": 1_767_225_600.0 + i * 0.5 + rng.random(),
        "metric_value": round(rng.uniform(-40.0, 120.0), 3),
        "status": rng.choice(["OK", "OK", "OK", "WARN", "ERROR"]),
        "version": 2,
        "unit": "celsius",
    }


def _order(i: int, tag: str, rng: random.Random) -> dict[str, Any]:
    ts = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i * 3)
    return {
        "event_id": f"{tag}-o-{i:08d}",
        "order_id": 1_000_000 + i,
        "customer_id": f"customer-{rng.randrange(2000):05d}",
        "total": f"{rng.randrange(100, 5_000_000) / 100:.2f}",
        "timestamp": ts.isoformat().replace("+00:00", "Z"),
    }


def make_event(pipeline: Pipeline, i: int, tag: str, rng: random.Random) -> dict[str, Any]:
    if pipeline.contract.event_type == "order_created":
        return _order(i, tag, rng)
    event = _metric(i, tag, rng)
    if pipeline.contract.version < 2:
        event.pop("unit")
        event["version"] = 1
    return event


def _key_of(pipeline: Pipeline, event: dict[str, Any]) -> bytes:
    field = "customer_id" if pipeline.contract.event_type == "order_created" else "device_id"
    return str(event[field]).encode()


def poison_pills(pipeline: Pipeline, tag: str, max_bytes: int) -> list[Sample]:
    """One sample of every kind of poison pill for this pipeline's contract."""
    rng = random.Random(tag)
    base = make_event(pipeline, 0, f"{tag}-poison", rng)
    key = _key_of(pipeline, base)
    is_order = pipeline.contract.event_type == "order_created"
    num_field = "order_id" if is_order else "metric_value"
    text_field = "customer_id" if is_order else "device_id"

    def mutate(kind: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        event = dict(base, event_id=f"{tag}-poison-{kind}")
        change(event)
        return event

    def js(event: dict[str, Any]) -> bytes:
        return json.dumps(event, allow_nan=True).encode()

    def raw(kind: str, field: str, literal: str) -> bytes:
        text = js(mutate(kind, lambda e: e.__setitem__(field, "@@")))
        return text.replace(b'"@@"', literal.encode())

    nested = b'{"event_id": "' + f"{tag}-poison-nested".encode() + b'", "x": ' \
        + b"[" * 300 + b"]" * 300 + b"}"
    big = js(mutate("too_large", lambda e: e.__setitem__("padding", "x" * (max_bytes + 1))))
    bad_ts = "not-a-date" if is_order else 1e20
    pills = [
        ("not_utf8", b"\xff\xfe\xfa not text at all", "undecodable"),
        ("not_json", b'{"event_id": "broken", ', "undecodable"),
        ("json_array", b"[1, 2, 3]", "not_an_object"),
        ("json_number", b"42", "not_an_object"),
        ("json_string", b'"just a string"', "not_an_object"),
        ("json_null", b"null", "not_an_object"),
        ("empty", b"", "undecodable"),
        ("missing_field", js(mutate("missing_field", lambda e: e.pop(num_field))),
         "contract_violation"),
        ("wrong_type", js(mutate("wrong_type", lambda e: e.__setitem__(num_field, "12"))),
         "contract_violation"),
        ("nan", raw("nan", num_field, "NaN"), "contract_violation"),
        ("infinity", raw("infinity", num_field, "Infinity"), "contract_violation"),
        ("out_of_range", raw("out_of_range", num_field, "1" + "0" * 400), "contract_violation"),
        ("nul_in_text", js(mutate("nul_in_text", lambda e: e.__setitem__(text_field, "a\x00b"))),
         "contract_violation"),
        ("event_id_empty", js(dict(base, event_id="")), "contract_violation"),
        ("event_id_too_long", js(dict(base, event_id="e" * 129)), "contract_violation"),
        ("unknown_version", js(mutate("unknown_version", lambda e: e.__setitem__("version", 99))),
         "unknown_version"),
        ("deeply_nested", nested, "undecodable"),
        ("too_large", big, "too_large"),
        ("bad_timestamp", js(mutate("bad_timestamp", lambda e: e.__setitem__("timestamp", bad_ts))),
         "contract_violation"),
    ]
    samples = [Sample(kind, key, value, expect) for kind, value, expect in pills]
    samples.append(Sample("tombstone", key, None, "tombstone"))
    extra = mutate("extra_fields", lambda e: e.update(unexpected_field=1, another={"a": 1}))
    samples.append(Sample("extra_fields", key, js(extra), "row"))
    return samples


def sample_stream(pipeline: Pipeline, count: int, poison_rounds: int, *, tag: str,
                  partitions: int, seed: int = 7) -> Iterator[Sample]:
    """``count`` valid events, duplicates of some (same partition and across partitions),
    and ``poison_rounds`` copies of every poison pill, interleaved: the pills go to the
    partitions in turn (not by their shared key), so every partition gets its share,
    spread over its whole range."""
    rng = random.Random(seed)
    pills = [
        Sample(s.kind, s.key, s.value, s.expect, partition=i % partitions)
        for i, s in enumerate(
            s for r in range(poison_rounds)
            for s in poison_pills(pipeline, f"{tag}-r{r}", pipeline.max_message_bytes))
    ]
    every = max(1, count // (len(pills) + 1)) if pills else count + 1
    for i in range(count):
        event = make_event(pipeline, i, tag, rng)
        value = json.dumps(event).encode()
        yield Sample("valid", _key_of(pipeline, event), value, "row")
        if i % 1000 == 1:  # the same event again: same partition, then another partition
            yield Sample("duplicate", _key_of(pipeline, event), value, "duplicate")
            yield Sample("duplicate", b"elsewhere-" + _key_of(pipeline, event), value,
                         "duplicate", partition=(i + 1) % partitions)
        if pills and i % every == 0:
            yield pills.pop()
    yield from pills


#: One record to produce: key, value, partition (None: the partitioner's, by key), headers.
Outgoing = tuple[bytes | None, bytes | None, int | None, list[tuple[str, bytes]] | None]


def produce_records(producer: Any, topic: str, records: Iterable[Outgoing], *,
                    flush_s: float = 120.0) -> None:
    """Produce ``records`` to ``topic``, waiting out a full local queue, then check every
    delivery report: one undelivered record raises."""
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value, partition, headers in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers,
                                 partition=-1 if partition is None else partition,
                                 on_delivery=on_delivery)
                break
            except BufferError:  # the local queue is full: serve delivery reports
                producer.poll(0.5)
        producer.poll(0)
    producer.flush(flush_s)
    if errors:
        raise RuntimeError(f"{len(errors)} messages to {topic} were not delivered: "
                           f"{errors[:3]}")


def produce_sample(clients: KafkaClients, pipeline: Pipeline, *, count: int, poison: int,
                   partitions: int = 3, tag: str | None = None) -> dict[str, Any]:
    """Create the topics if missing and produce a sample; return what to expect."""
    tag = tag or uuid.uuid4().hex[:8]
    ensure_topics(clients, {pipeline.topic: partitions, pipeline.dlq_topic: partitions})
    expect: Counter[str] = Counter()
    kinds: Counter[str] = Counter()

    def records() -> Iterator[Outgoing]:
        for s in sample_stream(pipeline, count, poison, tag=tag, partitions=partitions):
            expect[s.expect] += 1
            kinds[s.kind] += 1
            yield s.key, s.value, s.partition, None

    produce_records(clients.producer(), pipeline.topic, records(), flush_s=60)
    return {"tag": tag, "topic": pipeline.topic, "produced": sum(kinds.values()),
            "expect": dict(expect), "kinds": dict(kinds)}


@dataclass(frozen=True)
class StateSample:
    """What a produced state stream must leave: each live account's last event, the
    accounts whose last record is a tombstone, and the poison pills by error class."""

    final: dict[str, str]  # account -> event_id of its last record
    deleted: frozenset[str]
    poison: dict[str, int]
    produced: int
    tombstones: int


def produce_state_sample(clients: KafkaClients, pipeline: Pipeline, *, accounts: int,
                         updates: int, seed: int = 11, tag: str | None = None) -> StateSample:
    """Balances of ``accounts`` accounts on a state topic: ``updates`` records keyed by
    account (updates, tombstones, re-inserts after a delete), three poison pills (a key not UTF-8,
    a currency of the wrong length, not JSON), each with a ``trace-id`` header; the
    expected final state computed from what was produced, in log order per key."""
    tag = tag or uuid.uuid4().hex[:8]
    create_pipeline_topics(clients, [pipeline])  # the state topic compacted, if it says so
    rng = random.Random(seed)
    last: dict[str, str | None] = {}
    records: list[tuple[bytes | None, bytes | None]] = []
    for i in range(updates):
        account = f"acct-{rng.randrange(accounts):04d}"
        if account in last and last[account] is not None and rng.random() < 0.15:
            records.append((account.encode(), None))
            last[account] = None
            continue
        event_id = f"{tag}-b-{i:07d}"
        event = {"event_id": event_id, "balance": f"{rng.randrange(-10**6, 10**8) / 100:.2f}",
                 "currency": rng.choice(["EUR", "USD", "BRL"]),
                 "updatedAt": 1_767_225_600_000 + i}
        if rng.random() < 0.1:
            event["limits"] = {"daily": rng.randrange(100, 10_000), "flags": ["vip"]}
        records.append((account.encode(), json.dumps(event).encode()))
        last[account] = event_id
    # (A compacted topic refuses a record without a key, with the whole batch it is in:
    # the bad key is one that is not UTF-8.)
    poison = [(b"\xff\xfe", json.dumps({"event_id": f"{tag}-p-1", "balance": "1.00",
                                        "currency": "EUR", "updatedAt": 1}).encode()),
              (b"acct-poison", json.dumps({"event_id": f"{tag}-p-2", "balance": "1.00",
                                           "currency": "EURO", "updatedAt": 1}).encode()),
              (b"acct-poison", b"{not json")]
    produce_records(clients.producer(), pipeline.topic,
                    ((key, value, None, [("trace-id", f"{tag}-{n}".encode())])
                     for n, (key, value) in enumerate([*records, *poison])), flush_s=60)
    return StateSample(
        final={a: e for a, e in last.items() if e is not None},
        deleted=frozenset(a for a, e in last.items() if e is None),
        poison={"bad_key": 1, "contract_violation": 1, "undecodable": 1},
        produced=len(records) + len(poison),
        tombstones=sum(1 for _, v in records if v is None))
