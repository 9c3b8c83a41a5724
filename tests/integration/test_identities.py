"""Identity where the topic has it (#33), on the real stack: a pipeline whose records
carry no ``event_id`` says what identifies them (a field by another name, a nested path,
several fields, the record key, the source position), and a live run, a backfill over the
same offsets, a DLQ replay and a replay again write each record once.

The append story (one per identity): contract version 1 reads the topic while some
producers already send version 2, which is dead-lettered as ``unknown_version``. Some
records come twice (a producer's retry: the same identity at another offset), among them
version 2 copies of version 1 records. Then the pipeline moves to version 2 and the DLQ
is replayed, first one letter by the ``identity`` filter, then the rest. The table must
hold one row per identity (per position, for the source position) throughout.

The latest story: a state topic keyed by account whose values carry no id at all, read by
a pipeline keyed by its record key that declares nothing else; updates, tombstones that
delete (log order) or are skipped (event-time order), the same replay and backfills.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import psycopg
import pytest
from pydantic import AliasPath, Field

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.contracts import Contract
from kafka_ingest.contracts.base import short_text
from kafka_ingest.db.tables import apply_tables, check_table
from kafka_ingest.engine.replay import plan_replay, replay_range, summarize_replay
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest.requests import LiveRun, OffsetWindow, ReplayFilters, ReplayRequest
from tests.support.ingest import highs, query, run, total
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

PARTITIONS = 2
#: Distinct version-1 orders, version-1 copies of the first COPIES of them, distinct
#: version-2 orders after them, and version-2 copies of orders COPIES..COPIES + V2_COPIES.
ORDERS, COPIES, V2_ORDERS, V2_COPIES = 90, 30, 20, 5
REGIONS = ("eu", "us", "ap")

DECLARED = {"shop_order": {"version": 2, "fields": {
    "orderid": {"type": "text", "max_length": 48},
    "region": {"type": "text", "max_length": 8},
    "order_no": {"type": "bigint"},
    "total": {"type": "numeric", "precision": 10, "scale": 2},
    "channel": {"type": "text", "max_length": 8, "since": 2, "required": False},
}}}


class _NestedOrderV1(Contract):
    """Orders whose id sits inside an object: ``{"order": {"id": ...}, ...}``."""

    EVENT_TYPE: ClassVar[str] = "nested_shop_order"
    VERSION: ClassVar[int] = 1
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("order_id", "text"), ("region", "text"), ("order_no", "int8"))
    version: int = Field(default=1, ge=1, le=1)
    order_id: short_text(48) = Field(  # type: ignore[valid-type]
        validation_alias=AliasPath("order", "id"))
    region: short_text(8)  # type: ignore[valid-type]
    order_no: int


class _NestedOrderV2(_NestedOrderV1):
    VERSION: ClassVar[int] = 2
    SINK_COLUMNS: ClassVar[tuple[tuple[str, str], ...]] = (
        *_NestedOrderV1.SINK_COLUMNS, ("channel", "text"))
    version: int = Field(default=1, ge=1, le=2)
    channel: short_text(8) | None = None  # type: ignore[valid-type]


NESTED = {m.key(): m for m in (_NestedOrderV1, _NestedOrderV2)}


def order(tag: str, j: int, *, version: int, nested: bool) -> bytes:
    """Order ``j``: the same identity (id, region and number) whatever its version."""
    doc: dict[str, Any] = {"region": REGIONS[j % 3], "order_no": j // 3, "version": version}
    if nested:
        doc["order"] = {"id": f"{tag}-o-{j}"}
    else:
        doc.update(orderid=f"{tag}-o-{j}", total="9.50")
    if version == 2:
        doc["channel"] = "web"
    return json.dumps(doc).encode()


def produce(clients: KafkaClients, topic: str,
            records: list[tuple[bytes | None, bytes | None, int]]) -> list[tuple[int, int]]:
    """Produce (key, value, partition); every delivery report checked; their positions."""
    producer = clients.producer()
    reports: dict[int, Any] = {}

    def report(i: int) -> Callable[[Any, Any], None]:
        return lambda err, msg: reports.__setitem__(i, (err, msg))

    for i, (key, value, partition) in enumerate(records):
        producer.produce(topic, key=key, value=value, partition=partition,
                         on_delivery=report(i))
    assert producer.flush(30) == 0
    assert sorted(reports) == list(range(len(records)))
    assert all(err is None for err, _ in reports.values())
    return [(reports[i][1].partition(), reports[i][1].offset()) for i in range(len(records))]


def whole(clients: KafkaClients, topic: str) -> OffsetWindow:
    return OffsetWindow(partitions={p: (0, h) for p, h in highs(clients, topic).items() if h})


def replay(pipeline: Pipeline, clients: KafkaClients, db: Any, *,
           request: Any = None, filters: ReplayFilters | None = None) -> dict[str, Any]:
    run_id = f"replay__{uuid.uuid4().hex[:8]}"
    asked = ReplayRequest(request or LiveRun(), False, filters or ReplayFilters())
    ranges = plan_replay(pipeline, clients, db, run_id=run_id, request=asked)
    return summarize_replay(replay_range(pipeline, r, clients, db, run_id=run_id,
                                         filters=filters).to_dict() for r in ranges)


def build(body: dict[str, Any], version: int) -> Pipeline:
    """The pipeline of ``body`` reading contract ``version`` (same topics, same table)."""
    contract = {**body["contract"], "version": version}
    if contract["event_type"] == _NestedOrderV1.EVENT_TYPE:
        return Pipeline.model_validate({"name": "orders", **body, "contract": contract},
                                       context={"contracts": NESTED})
    return parse_pipelines({"contracts": DECLARED, "pipelines": {
        "orders": {**body, "contract": contract}}})["orders"]


#: identity, nested contract, the identity filter's value of order ORDERS (the first
#: version-2 order: region "eu", number 30), and whether copies are the same record.
APPEND = {
    # a field by another name than event_id
    "field": ("orderid", False, "{tag}-o-90", True),
    # a nested path: the field read from inside an object
    "nested": ("order.id", True, "{tag}-o-90", True),
    # several fields together
    "composite": (["region", "order_no"], False, '["eu", 30]', True),
    # no id at all: the record's place in the log (a copy is another record)
    "position": ("source_position", False, "{position}", False),
}


@pytest.mark.parametrize("case", list(APPEND))
def test_an_append_identity_writes_each_record_once_through_runs_backfills_and_replays(
        case: str, topics: Callable[..., str], clients: KafkaClients, db: Any,
        pg_dsn: str) -> None:
    identity, nested, wanted, copies_are_same = APPEND[case]
    tag = uuid.uuid4().hex[:6]
    body = {"topic": topics(PARTITIONS, "src"), "dlq_topic": topics(PARTITIONS, "dlq"),
            "table": f"orders_{case}",
            "contract": {"event_type": "nested_shop_order" if nested else "shop_order",
                         "version": 1},
            "identity": identity, "auto_create": True, "auto_evolve": True, "chunk_size": 40}
    v1, v2 = build(body, 1), build(body, 2)
    plan = [(j, 1) for j in range(ORDERS)] + [(j, 1) for j in range(COPIES)] \
        + [(j, 2) for j in range(ORDERS, ORDERS + V2_ORDERS)] \
        + [(j, 2) for j in range(COPIES, COPIES + V2_COPIES)]
    positions = produce(clients, v1.topic, [
        (b"k", order(tag, j, version=version, nested=nested), i % PARTITIONS)
        for i, (j, version) in enumerate(plan)])
    v1_records = len(plan) - V2_ORDERS - V2_COPIES
    # what the table holds: one row per identity (per record, by position)
    after_v1 = ORDERS if copies_are_same else v1_records
    after_v2 = ORDERS + V2_ORDERS if copies_are_same else len(plan)

    key = ", ".join(v1.conflict_columns)

    def rows() -> int:
        [(n, distinct)] = query(pg_dsn, f"SELECT count(*), count(DISTINCT ({key})) FROM "
                                        f"{v1.table}")
        assert n == distinct  # the primary key says so; checked all the same
        return int(n)

    live = run(v1, clients, db)
    assert (total(live, "inserted"), total(live, "dead_lettered")) == (
        after_v1, V2_ORDERS + V2_COPIES)
    assert rows() == after_v1
    backfill = run(v1, clients, db, request=whole(clients, v1.topic))
    assert total(backfill, "inserted") == 0 and rows() == after_v1

    first = positions[plan.index((ORDERS, 2))]
    one = replay(v2, clients, db, filters=ReplayFilters(identity=wanted.format(
        tag=tag, position=f"{first[0]}:{first[1]}")))
    assert one["outcomes"]["recovered"] == 1 and one["inserted"] == 1
    assert one["outcomes"]["filtered_out"] == V2_ORDERS + V2_COPIES - 1
    assert rows() == after_v1 + 1
    rest = replay(v2, clients, db)
    assert rest["outcomes"]["recovered"] == V2_ORDERS + V2_COPIES - 1
    assert rows() == after_v2
    again = replay(v2, clients, db, request=whole(clients, v2.dlq_topic))
    assert again["inserted"] == 0 and rows() == after_v2
    backfill = run(v2, clients, db, request=whole(clients, v2.topic))
    assert total(backfill, "inserted") == 0 and total(backfill, "dead_lettered") == 0
    assert rows() == after_v2


# --------------------------------------------------------------------------- latest

BALANCES = {"balance": {"version": 2, "fields": {
    "balance": {"type": "numeric", "precision": 14, "scale": 2},
    "updatedAt": {"type": "timestamptz", "encoding": "epoch_millis", "column": "updated_at"},
    "note": {"type": "text", "max_length": 16, "since": 2, "required": False},
}}}
ACCOUNTS, UPDATES = 30, 3
#: Accounts whose last record is a tombstone, and those whose last update is version 2.
DELETED, LAST_V2 = range(0, 8), range(8, 13)

LATEST = {
    # a compacted state topic: the log's order, tombstones delete
    "log order": {"upsert": {"mode": "latest", "key": "account_id",
                             "order_by": "source_offset"}, "on_tombstone": "delete"},
    # the newest by event time, tombstones skipped
    "event time": {"upsert": {"mode": "latest", "key": "account_id",
                              "order_by": "updated_at"}, "on_tombstone": "skip"},
}


@pytest.mark.parametrize("case", list(LATEST))
def test_a_latest_table_keyed_by_its_record_key_needs_no_id_in_its_values(
        case: str, topics: Callable[..., str], clients: KafkaClients, db: Any,
        pg_dsn: str) -> None:
    body = {"topic": topics(PARTITIONS, "src"), "dlq_topic": topics(PARTITIONS, "dlq"),
            "table": "balances", "contract": {"event_type": "balance", "version": 1},
            "record_key": {"column": "account_id", "max_length": 32},
            "auto_create": True, "auto_evolve": True, "chunk_size": 25, **LATEST[case]}

    def build_balances(version: int) -> Pipeline:
        entry = {**body, "contract": {"event_type": "balance", "version": version}}
        return parse_pipelines({"contracts": BALANCES,
                                "pipelines": {"balances": entry}})["balances"]

    v1, v2 = build_balances(1), build_balances(2)
    records: list[tuple[bytes | None, bytes | None, int]] = []
    final: dict[str, Decimal] = {}
    before_v2: dict[str, Decimal] = {}
    for u in range(UPDATES):  # round by round, so a key's records interleave with others'
        for a in range(ACCOUNTS):
            last = u == UPDATES - 1
            key, balance = f"acc-{a}", Decimal(f"{a}.{u}0")
            if last and a in DELETED:
                records.append((key.encode(), None, a % PARTITIONS))
                final.pop(key, None)
                continue
            version = 2 if last and a in LAST_V2 else 1
            doc = {"balance": str(balance), "updatedAt": 1_767_225_600_000 + u * 1000,
                   "version": version}
            records.append((key.encode(), json.dumps(doc).encode(), a % PARTITIONS))
            final[key] = balance
            if version == 1:
                before_v2[key] = balance
    if case == "event time":  # a tombstone is skipped: the last update stays
        final.update({f"acc-{a}": Decimal(f"{a}.{UPDATES - 2}0") for a in DELETED})
    else:
        for a in DELETED:
            before_v2.pop(f"acc-{a}", None)
    produce(clients, v1.topic, records)

    def state() -> dict[str, Decimal]:
        return dict(query(pg_dsn, "SELECT account_id, balance FROM balances"))

    live = run(v1, clients, db)
    assert total(live, "dead_lettered") == len(LAST_V2)  # the version-2 values only
    assert state() == before_v2
    backfill = run(v1, clients, db, request=whole(clients, v1.topic))
    assert total(backfill, "inserted") == 0 and state() == before_v2

    replayed = replay(v2, clients, db)
    assert replayed["outcomes"]["recovered"] == len(LAST_V2)
    assert state() == final
    again = replay(v2, clients, db, request=whole(clients, v2.dlq_topic))
    assert again["inserted"] == 0 and state() == final
    backfill = run(v2, clients, db, request=whole(clients, v2.topic))
    assert total(backfill, "inserted") == 0 and total(backfill, "dead_lettered") == 0
    assert state() == final


def test_a_record_keyed_table_made_when_event_id_identified_it_runs_on(
        topics: Callable[..., str], clients: KafkaClients, db: Any, pg_dsn: str) -> None:
    # the table as the shipped account_balances made it before: event_id NOT NULL
    body = {"topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "balances",
            "contract": {"event_type": "balance", "version": 1},
            "record_key": {"column": "account_id", "max_length": 32}, **LATEST["log order"]}
    then = parse_pipelines({"contracts": BALANCES, "pipelines": {"balances": {
        **body, "identity": "event_id"}}})["balances"]
    now = parse_pipelines({"contracts": BALANCES, "pipelines": {"balances": body}})["balances"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_tables(conn, then)
        plan = check_table(conn, now)  # no SchemaDrift: the pipeline runs on
    assert [n for n in plan.notes if "balances.event_id is NOT NULL" in n]

    def balance(account: int, event_id: str | None) -> bytes:
        doc = {"balance": "1.00", "updatedAt": 1_767_225_600_000 + account}
        return json.dumps(doc if event_id is None else {**doc, "event_id": event_id}).encode()

    produce(clients, now.topic, [(f"acc-{a}".encode(), balance(a, f"e-{a}" if a % 2 else None),
                                 0) for a in range(10)])
    live = run(now, clients, db)

    # with an event_id, stored as before; without, refused by the old column alone
    assert sorted(r[0] for r in query(pg_dsn, "SELECT event_id FROM balances")) == [
        f"e-{a}" for a in (1, 3, 5, 7, 9)]
    assert total(live, "dead_lettered") == 5
    assert dict(query(pg_dsn, "SELECT error_class, count(*) FROM dead_letters GROUP BY 1")) \
        == {"rejected_by_database": 5}


def test_a_source_position_identity_keeps_the_records_of_a_topic_created_again(
        topics: Callable[..., str], clients: KafkaClients, db: Any, pg_dsn: str,
        stack_env: dict[str, str], tmp_path: Path) -> None:
    # offsets start at 0 again in a re-created topic: without its incarnation in the key,
    # the new topic's records would be taken for the old one's, and dropped
    body = {"topic": topics(1, "src"), "dlq_topic": topics(1, "dlq"), "table": "by_place",
            "contract": {"event_type": "shop_order", "version": 1},
            "identity": "source_position", "auto_create": True}
    pipeline = build(body, 1)
    tag = uuid.uuid4().hex[:6]
    records = [(b"k", order(tag, j, version=1, nested=False), 0) for j in range(12)]
    produce(clients, pipeline.topic, records)
    assert total(run(pipeline, clients, db), "inserted") == len(records)

    admin = clients.admin()
    admin.delete_topics([pipeline.topic], operation_timeout=30)[pipeline.topic].result(60)
    deadline = time.monotonic() + 60  # the broker frees the name in the background
    while pipeline.topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, "the topic is still listed 60 s after deletion"
        time.sleep(0.2)
    ensure_topics(clients, {pipeline.topic: 1})
    produce(clients, pipeline.topic, records)  # the same values at the same offsets
    env = {**os.environ, "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_BOOTSTRAP_SERVERS": stack_env["KAFKA_BOOTSTRAP_SERVERS"],
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline))}
    reset = subprocess.run([sys.executable, "-m", "kafka_ingest.cli", "reset-offsets",
                            pipeline.name, "--all", "--to", "earliest", "--yes"], env=env,
                           capture_output=True, text=True, check=False, timeout=300)
    assert reset.returncode == 0, reset.stderr

    assert total(run(pipeline, clients, db), "inserted") == len(records)
    assert total(run(pipeline, clients, db, request=whole(clients, pipeline.topic)),
                 "inserted") == 0
    assert query(pg_dsn, "SELECT source_incarnation, count(*) FROM by_place GROUP BY 1"
                         " ORDER BY 1") == [(1, len(records)), (2, len(records))]
