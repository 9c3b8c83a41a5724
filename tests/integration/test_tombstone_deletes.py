"""Deletes from tombstones: a compacted "current state" topic mirrored into a latest table.

The pipeline under test keeps one row per account (the record key), the newest record in
the log wins (``order_by: source_offset``) and a tombstone deletes its account
(``on_tombstone: delete``). Whatever way the log is read, the table must end up holding
exactly what the topic means: for each account its last record, and no row for an account
whose last record is a tombstone. Each deleted account keeps a deletion marker in
``balances_tombstones``; an account inserted again after its deletion keeps none.

The log is seeded, so the same every run: accounts updated, deleted, inserted again and
deleted again across 3 partitions (the key picks the partition), tombstones of accounts
that never existed, poison pills, and a tail of updates each followed at once by its
tombstone. The expected state is computed from the delivery reports alone: the last record
of each account by offset.

The topic is compacted with tiny segments, so the broker's cleaner may drop superseded
records at any moment of the test, and every expectation holds whether it ran or not. The
final state, the markers and the dead letters depend only on each key's last record, which
compaction keeps (each poison pill has a key of its own). The figures compaction can change
(records read, rows deleted) are bounded between the log as produced and the log as the
broker holds it after the case: a record it still holds was there for every read before.

Backfills take no lock and may run beside the live slices (DESIGN 6), so the last test
holds a live chunk's transaction open after its writes and backfills an older record of
the same account beside it: the version guard must hold then too.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from itertools import pairwise
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import KafkaError

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.db import Database
from kafka_ingest.db.connection import DEFAULT_REPLY_TIMEOUT_S
from kafka_ingest.db.tables import apply_tables, marker_table
from kafka_ingest.engine import slices
from kafka_ingest.engine.backfill import run_backfill
from kafka_ingest.engine.ingest import summarize
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import ensure_topics
from kafka_ingest.requests import OffsetWindow
from tests.support.ingest import (
    Position,
    dead_letter_rows,
    dlq_positions,
    query,
    read_topic,
    run,
    stored_offsets,
)
from tests.support.topics import delete_topics

pytestmark = pytest.mark.integration

SEED = 20_261_201
PARTITIONS = 3
ACCOUNTS = 150
#: Accounts whose only records are tombstones: deleted before they ever existed.
GHOSTS = 6
#: Records of the accounts before the tail, produced in ROUNDS flushes (with segment.ms
#: tiny, each round rolls a new segment: the older ones are the cleaner's to compact).
RECORDS = 2_950
ROUNDS = 6
#: Live accounts given an update and its tombstone last: the last batch of a partition
#: stays in its active segment, which the cleaner never touches.
TAIL = 12
#: The chance that an account's next record is a tombstone, by the kind of its last one.
TOMBSTONE_CHANCE: dict[str | None, float] = {None: 0.05, "update": 0.25, "tombstone": 0.35}
#: Contiguous pieces of each partition that the backfills read.
PIECES = 6

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "10",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    # Tombstones outlive the test (a cleaned tombstone goes after this long).
    "delete.retention.ms": str(7 * 24 * 3600 * 1000),
}
CONTRACTS = {"account_balance": {"version": 1, "fields": {
    "balance": {"type": "numeric", "precision": 14, "scale": 2}}}}

UPDATE, TOMBSTONE = "update", "tombstone"
FIGURES = ("read", "inserted", "duplicates", "stale", "dead_lettered", "known_dead",
           "tombstones", "deleted")


# --------------------------------------------------------------------------- the log


@dataclass(frozen=True)
class Rec:
    """A record as produced: an account's update or tombstone, or a poison pill (its kind
    is then the error class its dead letter must carry)."""

    key: bytes
    value: bytes | None
    kind: str
    event_id: str | None = None
    balance: Decimal | None = None
    #: Where to produce it; None: where its key hashes to.
    partition: int | None = None

    @property
    def account(self) -> str | None:
        return self.key.decode() if self.kind in (UPDATE, TOMBSTONE) else None


@dataclass(frozen=True)
class Placed:
    rec: Rec
    partition: int
    offset: int

    @property
    def pos(self) -> Position:
        return (self.partition, self.offset)


def account(i: int) -> bytes:
    return f"acct-{i:04d}".encode()


def update(key: bytes, event_id: str, rng: random.Random) -> Rec:
    balance = Decimal(rng.randint(-10**8, 10**11)).scaleb(-2)
    value = json.dumps({"event_id": event_id, "version": 1, "balance": str(balance)}).encode()
    return Rec(key, value, UPDATE, event_id, balance)


def tombstone(key: bytes) -> Rec:
    return Rec(key, None, TOMBSTONE)


def poison_pills(tag: str) -> list[Rec]:
    """One pill of each kind, each under a key of its own: never superseded, so compaction
    keeps it. A record without a key cannot be one: a compacted topic refuses it (the
    ``state_topic`` fixture checks); an empty key is the nearest the topic takes."""

    def event(**fields: Any) -> bytes:
        body = {"event_id": f"{tag}-pill", "version": 1, "balance": "1.00", **fields}
        return json.dumps(body).encode()

    return [
        Rec(b"pill-not-json", b'{"event_id": "x", "balance": ', "undecodable"),
        Rec(b"pill-not-utf8", b'\xff\xfe{"event_id": "x"}', "undecodable"),
        Rec(b"pill-array", b"[1, 2]", "not_an_object"),
        Rec(b"pill-scale", event(balance="1.005"), "contract_violation"),
        Rec(b"pill-precision", event(balance="1234567890123.45"), "contract_violation"),
        Rec(b"pill-null", event(balance=None), "contract_violation"),
        Rec(b"pill-version", event(version=2), "unknown_version"),
        Rec(b"", event(), "bad_key", partition=0),  # an empty key hashes nowhere: random
        Rec(b"\xff\xfe", event(), "bad_key"),
        Rec(b"k" * 129, event(), "bad_key"),  # the account_id column holds 128
        Rec(b"pill\x00nul", event(), "bad_key"),
        Rec(b"\xc3", None, "bad_key"),  # a tombstone whose key cannot be an account id
    ]


def account_log(rng: random.Random, tag: str) -> tuple[list[Rec], list[Rec]]:
    """(the main log, the tail), seeded."""
    keys = [account(i) for i in range(ACCOUNTS)]
    last: dict[bytes, str | None] = dict.fromkeys(keys)
    log: list[Rec] = []
    for serial in range(RECORDS):
        key = rng.choice(keys)
        deletes = rng.random() < TOMBSTONE_CHANCE[last[key]]
        log.append(tombstone(key) if deletes else update(key, f"{tag}-{serial}", rng))
        last[key] = log[-1].kind
    for i in range(GHOSTS):
        for _ in range(rng.randint(1, 2)):
            log.insert(rng.randrange(len(log) + 1), tombstone(account(ACCOUNTS + i)))
    for pill in poison_pills(tag):
        log.insert(rng.randrange(len(log) + 1), pill)
    tail: list[Rec] = []
    live = sorted(k for k, kind in last.items() if kind == UPDATE)
    for n, key in enumerate(rng.sample(live, TAIL)):
        tail += [update(key, f"{tag}-tail-{n}", rng), tombstone(key)]
    return log, tail


def produce_rounds(clients: KafkaClients, topic: str, rounds: Iterable[list[Rec]]
                   ) -> list[Placed]:
    """Produce each round and wait for its delivery reports (each one checked): where each
    record landed."""
    producer = clients.producer()
    wait_s = cast(Any, producer).delivery_timeout_s + clients.request_timeout_s
    placed: list[Placed] = []
    for batch in rounds:
        reports: dict[int, tuple[Any, Any]] = {}
        for i, rec in enumerate(batch):
            producer.produce(topic, key=rec.key, value=rec.value,
                             partition=-1 if rec.partition is None else rec.partition,
                             on_delivery=partial(_report, reports, i))  # -1: by its key
            producer.poll(0)
        assert producer.flush(wait_s) == 0
        assert len(reports) == len(batch)
        assert [err for err, _ in reports.values() if err is not None] == []
        placed += [Placed(rec, reports[i][1].partition(), reports[i][1].offset())
                   for i, rec in enumerate(batch)]
    return placed


def _report(reports: dict[int, tuple[Any, Any]], i: int, err: Any, msg: Any) -> None:
    reports[i] = (err, msg)


@dataclass
class Log:
    """The log as produced, and what it means."""

    placed: list[Placed]
    at: dict[Position, Placed] = field(init=False)

    def __post_init__(self) -> None:
        self.at = {p.pos: p for p in self.placed}
        assert len(self.at) == len(self.placed)

    @property
    def highs(self) -> dict[int, int]:
        ends = {p: 0 for p in range(PARTITIONS)}
        for p in self.placed:
            ends[p.partition] = max(ends[p.partition], p.offset + 1)
        return ends

    @property
    def pills(self) -> dict[Position, str]:
        return {p.pos: p.rec.kind for p in self.placed if p.rec.account is None}

    def history(self, held: Iterable[Position] | None = None) -> dict[str, list[Placed]]:
        """Each account's records in log order (of those ``held``, if given)."""
        chosen = self.placed if held is None else [self.at[pos] for pos in held]
        out: dict[str, list[Placed]] = {}
        for p in sorted(chosen, key=lambda p: p.offset):
            if p.rec.account is not None:
                out.setdefault(p.rec.account, []).append(p)
        return out

    def expected_rows(self) -> dict[str, tuple[Any, ...]]:
        last = {a: recs[-1] for a, recs in self.history().items()}
        return {a: stored_row(p) for a, p in last.items() if p.rec.kind == UPDATE}

    def expected_markers(self) -> dict[str, tuple[int, int]]:
        last = {a: recs[-1] for a, recs in self.history().items()}
        return {a: p.pos for a, p in last.items() if p.rec.kind == TOMBSTONE}

    def reinserted(self) -> set[str]:
        """Accounts deleted, then inserted again, and not deleted since."""
        return {a for a, recs in self.history().items() if recs[-1].rec.kind == UPDATE
                and any(r.rec.kind == TOMBSTONE for r in recs)}


def stored_row(p: Placed) -> tuple[Any, ...]:
    """What the table must hold for the update ``p``."""
    return (p.rec.event_id, p.rec.balance, p.partition, p.offset, p.rec.key)


# --------------------------------------------------------------------------- bounds on `deleted`


def deletable(history: Mapping[str, list[Placed]]) -> int:
    """Accounts whose last record is a tombstone with an update before it. Read in log
    order, each is deleted at least once; read in one chunk, exactly once."""
    return sum(1 for recs in history.values() if recs[-1].rec.kind == TOMBSTONE
               and any(r.rec.kind == UPDATE for r in recs))


def following_tombstones(history: Mapping[str, list[Placed]]) -> int:
    """Tombstones directly after an update of their account. Read in log order, no more
    rows can be deleted: a chunk deletes an account's row once, and only a row some
    tombstone follows."""
    return sum(1 for recs in history.values() for a, b in pairwise(recs)
               if (a.rec.kind, b.rec.kind) == (UPDATE, TOMBSTONE))


def surely_deleted(history: Mapping[str, list[Placed]], first_read: Mapping[Position, int]
                   ) -> int:
    """Accounts whose last record is a tombstone directly after an update, the update read
    no later than the tombstone: in any order of reading, the update was stored (nothing
    newer of its account had been read) and the tombstone then deleted it."""
    return sum(1 for recs in history.values()
               if len(recs) > 1 and (recs[-2].rec.kind, recs[-1].rec.kind) == (UPDATE, TOMBSTONE)
               and first_read[recs[-2].pos] <= first_read[recs[-1].pos])


# --------------------------------------------------------------------------- the table


def table_rows(dsn: str) -> dict[str, tuple[Any, ...]]:
    rows = query(dsn, "SELECT account_id, event_id, balance, source_partition, source_offset,"
                      " kafka_key FROM balances")
    return {a: (e, b, int(p), int(o), bytes(k)) for a, e, b, p, o, k in rows}


def markers(dsn: str) -> dict[str, tuple[int, int]]:
    rows = query(dsn, "SELECT account_id, source_partition, source_offset"
                      " FROM balances_tombstones")
    return {a: (int(p), int(o)) for a, p, o in rows}


def snapshot(dsn: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every column of both tables, ``ingested_at`` and ``deleted_at`` too: a row or marker
    written again, even with the same values, shows."""
    return (query(dsn, "SELECT * FROM balances ORDER BY account_id"),
            query(dsn, "SELECT * FROM balances_tombstones ORDER BY account_id"))


# --------------------------------------------------------------------------- driving a case


@dataclass(frozen=True)
class Step:
    kind: str
    summary: dict[str, Any]
    #: partition -> [start, end) read
    ranges: dict[int, tuple[int, int]]
    #: Live steps: chunks per partition.
    chunks: dict[int, int] = field(default_factory=dict)

    def covers(self, pos: Position) -> bool:
        bounds = self.ranges.get(pos[0])
        return bounds is not None and bounds[0] <= pos[1] < bounds[1]


@dataclass
class Mirror:
    """One case: runs the steps and checks the table after each one."""

    pipeline: Pipeline
    clients: KafkaClients
    db: Database
    dsn: str
    log: Log
    steps: list[Step] = field(default_factory=list)
    #: account -> source_offset of its row or of its marker, after the last step.
    versions: dict[str, int] = field(default_factory=dict)

    def live(self) -> Step:
        reports = run(self.pipeline, self.clients, self.db)
        return self._done(Step("live", summarize(r.to_dict() for r in reports),
                               {r.partition: (r.start, r.end) for r in reports},
                               {r.partition: r.chunks for r in reports}))

    def backfill(self, window: OffsetWindow) -> Step:
        summary = run_backfill(self.pipeline, window, self.clients, self.db,
                               run_id=f"backfill__{uuid.uuid4().hex[:8]}")
        return self._done(Step("backfill", summary, dict(window.partitions)))

    def _done(self, step: Step) -> Step:
        assert step.summary["deleted"] <= step.summary["tombstones"], step.summary
        self.steps.append(step)
        rows, marks = table_rows(self.dsn), markers(self.dsn)
        assert set(rows).isdisjoint(marks), "an account holds a row and a marker"
        for account_id, row in rows.items():  # each row is an update of its account
            placed = self.log.at[(row[2], row[3])]
            assert placed.rec.account == account_id and stored_row(placed) == row
        for account_id, pos in marks.items():  # each marker is a tombstone of its account
            placed = self.log.at[pos]
            assert (placed.rec.account, placed.rec.kind) == (account_id, TOMBSTONE)
        versions = {a: r[3] for a, r in rows.items()} | {a: o for a, (_, o) in marks.items()}
        rolled_back = {a: (v, versions.get(a)) for a, v in self.versions.items()
                       if versions.get(a, -1) < v}
        assert rolled_back == {}, f"accounts set back to an older version: {rolled_back}"
        self.versions = versions
        return step

    def total(self, figure: str) -> int:
        return sum(int(s.summary[figure]) for s in self.steps)

    def coverage(self, positions: Iterable[Position]) -> int:
        """How many times the steps read these positions."""
        return sum(s.covers(pos) for pos in positions for s in self.steps)

    def first_read(self) -> dict[Position, int]:
        first: dict[Position, int] = {}
        for i, step in enumerate(self.steps):
            for pos in self.log.at:
                if pos not in first and step.covers(pos):
                    first[pos] = i
        assert len(first) == len(self.log.at), "the steps left records unread"
        return first


def pieces(high: int, rng: random.Random) -> list[tuple[int, int]]:
    """[0, high) cut at PIECES - 1 random offsets."""
    return list(pairwise([0, *sorted(rng.sample(range(1, high), PIECES - 1)), high]))


def pack(ranges: Iterable[tuple[int, int, int]]) -> list[OffsetWindow]:
    """(partition, start, end) in this order, as windows of distinct partitions."""
    windows: list[dict[int, tuple[int, int]]] = [{}]
    for partition, start, end in ranges:
        if partition in windows[-1]:
            windows.append({})
        windows[-1][partition] = (start, end)
    return [OffsetWindow(partitions=w) for w in windows]


def shuffled_windows(highs: Mapping[int, int], rng: random.Random) -> list[OffsetWindow]:
    """Every partition in pieces, some reaching back into the piece before (an overlap),
    plus one random range over more, all in random order."""
    ranges: list[tuple[int, int, int]] = []
    for partition, high in highs.items():
        for start, end in pieces(high, rng):
            overlap = rng.randint(1, 60) if rng.random() < 0.5 else 0
            ranges.append((partition, max(0, start - overlap), end))
        start, end = sorted(rng.sample(range(high + 1), 2))
        ranges.append((partition, start, end))
    rng.shuffle(ranges)
    return pack(ranges)


def backwards_windows(highs: Mapping[int, int], rng: random.Random) -> list[OffsetWindow]:
    """Every partition in pieces; the i-th window reads each partition's i-th piece from
    the end."""
    cut = {p: pieces(high, rng) for p, high in highs.items()}
    return [OffsetWindow(partitions={p: ps[-1 - i] for p, ps in cut.items()})
            for i in range(PIECES)]


def whole_live(mirror: Mirror, _rng: random.Random) -> None:
    step = mirror.live()
    assert step.summary["lag_after"] == 0
    assert set(step.chunks.values()) == {1}, step.chunks  # one chunk per partition


def live_in_pieces(mirror: Mirror, _rng: random.Random) -> None:
    runs = math.ceil(max(mirror.log.highs.values()) / mirror.pipeline.max_records_per_partition)
    for _ in range(runs):
        step = mirror.live()
        if step.summary["lag_after"] == 0:
            break
    assert len(mirror.steps) == runs and step.summary["lag_after"] == 0
    assert sum(c for s in mirror.steps for c in s.chunks.values()) > len(mirror.steps)


def backfill_shuffled(mirror: Mirror, rng: random.Random) -> None:
    for window in shuffled_windows(mirror.log.highs, rng):
        mirror.backfill(window)


def backfill_after_live(mirror: Mirror, rng: random.Random) -> None:
    whole_live(mirror, rng)
    final = snapshot(mirror.dsn)
    for window in shuffled_windows(mirror.log.highs, rng):
        step = mirror.backfill(window)
        # re-read under the final state: every event stored or older, every letter known
        assert (step.summary["inserted"], step.summary["deleted"],
                step.summary["dead_lettered"]) == (0, 0, 0), step.summary
        assert snapshot(mirror.dsn) == final


def backfill_backwards(mirror: Mirror, rng: random.Random) -> None:
    for window in backwards_windows(mirror.log.highs, rng):
        mirror.backfill(window)


# --------------------------------------------------------------------------- checks


def check_state(mirror: Mirror) -> None:
    log, dsn = mirror.log, mirror.dsn
    assert table_rows(dsn) == log.expected_rows()
    marks = markers(dsn)
    assert marks == log.expected_markers()
    assert log.reinserted() and not log.reinserted() & set(marks)
    ends = log.highs if any(s.kind == "live" for s in mirror.steps) else {}
    assert stored_offsets(dsn, mirror.pipeline) == ends  # backfills never move the cursor


def check_dead_letters(mirror: Mirror, source: Mapping[Position, Any]) -> None:
    """Each pill dead-lettered once (in the table and on the DLQ topic), whichever step
    read it first; every later read knew it."""
    pills, pipeline = mirror.log.pills, mirror.pipeline
    assert dead_letter_rows(mirror.dsn, pipeline) == {pos: (cls, 1) for pos, cls in pills.items()}
    dlq = read_topic(mirror.clients, pipeline.dlq_topic)
    assert dlq_positions(dlq, pipeline, source) == Counter(pills.items())
    assert mirror.total("dead_lettered") == len(pills)
    assert mirror.total("dead_lettered") + mirror.total("known_dead") == mirror.coverage(pills)


def check_figures(mirror: Mirror, held: set[Position], *, in_log_order: bool) -> None:
    """The reports' figures, between the log as produced and the log as held now."""
    log = mirror.log
    assert mirror.coverage(held) <= mirror.total("read") <= mirror.coverage(log.at)
    tombstones = [p.pos for p in log.placed if p.rec.kind == TOMBSTONE]
    assert (mirror.coverage(set(tombstones) & held) <= mirror.total("tombstones")
            <= mirror.coverage(tombstones))
    deleted = mirror.total("deleted")
    now, produced = log.history(held), log.history()
    if in_log_order:
        assert deletable(now) <= deleted <= following_tombstones(produced)
    lower = surely_deleted(now, mirror.first_read())
    assert 0 < lower <= deleted <= len(tombstones)
    ledger = query(mirror.dsn, "SELECT coalesce(sum(deleted), 0), count(*) FILTER"
                               " (WHERE deleted > tombstones) FROM ingest_runs")
    assert ledger == [(deleted, 0)]


def one_chunk_deletes(mirror: Mirror, held: set[Position]) -> None:
    """A first live run of one chunk per partition deletes each deletable account once."""
    first = mirror.steps[0]
    if first.kind == "live" and set(first.chunks.values()) == {1}:
        log = mirror.log
        assert (deletable(log.history(held)) <= first.summary["deleted"]
                <= deletable(log.history()))


# --------------------------------------------------------------------------- the test


@pytest.fixture
def state_topic(clients: KafkaClients) -> Iterator[str]:
    """A compacted topic with tiny segments, deleted after the test (as ``topics`` does).
    It refuses a record without a key, as only a compacted topic does."""
    name = f"state-{uuid.uuid4().hex[:10]}"
    ensure_topics(clients, {name: PARTITIONS}, config=COMPACTED)
    try:
        producer = clients.producer()
        refused: list[Any] = []
        producer.produce(name, value=b"{}", on_delivery=lambda err, _msg: refused.append(err))
        assert producer.flush(cast(Any, producer).delivery_timeout_s
                              + clients.request_timeout_s) == 0
        assert [e.code() if e else None for e in refused] == [KafkaError.INVALID_RECORD]
        yield name
    finally:
        delete_topics(clients, [name])


def balances(topic: str, dlq_topic: str, **overrides: Any) -> Pipeline:
    body = {"topic": topic, "dlq_topic": dlq_topic, "table": "balances",
            "contract": {"event_type": "account_balance", "version": 1},
            "record_key": {"column": "account_id"},
            "upsert": {"mode": "latest", "key": "account_id", "order_by": "source_offset"},
            "on_tombstone": "delete", "consumer_group": f"test-{topic}", **overrides}
    return parse_pipelines({"contracts": CONTRACTS, "pipelines": {"balances": body}})["balances"]


Drive = Callable[[Mirror, random.Random], None]


@pytest.mark.parametrize(("drive", "overrides", "in_log_order"), [
    # the whole log in one live run, one chunk per partition: each deletable account
    # deleted exactly once
    pytest.param(whole_live, {}, True, id="live-whole"),
    # live runs of 97 offsets per partition in chunks of 31, until the lag is 0: an update
    # and its tombstone in different chunks and runs
    pytest.param(live_in_pieces, {"max_records_per_partition": 97, "chunk_size": 31}, True,
                 id="live-in-pieces"),
    # backfills only, into the empty table: shuffled ranges covering every partition, some
    # overlapping; a tombstone read before its account's older updates must keep them out
    pytest.param(backfill_shuffled, {"chunk_size": 50}, False, id="backfill-shuffled"),
    # the same backfills after a live run reached the final state: no row or marker
    # written again, no deleted account back, nothing dead-lettered twice
    pytest.param(backfill_after_live, {}, True, id="backfill-after-live"),
    # backwards: each partition's last piece first, its first piece last
    pytest.param(backfill_backwards, {"chunk_size": 50}, False, id="backfill-backwards"),
])
def test_the_table_mirrors_the_compacted_topic(
        drive: Drive, overrides: dict[str, Any], in_log_order: bool, state_topic: str,
        topics: Callable[..., str], clients: KafkaClients, db: Database, pg_dsn: str,
        request: pytest.FixtureRequest) -> None:
    pipeline = balances(state_topic, topics(PARTITIONS, "dlq"), **overrides)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_tables(conn, pipeline)
    assert marker_table(pipeline) == "balances_tombstones"
    rng = random.Random(SEED)
    main, tail = account_log(rng, tag=state_topic)
    size = math.ceil(len(main) / ROUNDS)
    log = Log(produce_rounds(clients, state_topic,
                             [*(main[i:i + size] for i in range(0, len(main), size)), tail]))

    mirror = Mirror(pipeline, clients, db, pg_dsn, log)
    started = time.monotonic()
    drive(mirror, rng)
    seconds = time.monotonic() - started

    source = read_topic(clients, pipeline.topic)  # what the broker holds now
    assert all((r.key, r.value) == (log.at[pos].rec.key, log.at[pos].rec.value)
               for pos, r in source.items())
    held = set(source)
    check_state(mirror)
    check_dead_letters(mirror, source)
    check_figures(mirror, held, in_log_order=in_log_order)
    one_chunk_deletes(mirror, held)
    history = log.history()
    print(f"\n[{request.node.callspec.id}] records {len(log.placed)}, keys {len(history)}, "
          f"tombstones {sum(p.rec.kind == TOMBSTONE for p in log.placed)}, "
          f"pills {len(log.pills)}, final rows {len(log.expected_rows())}, "
          f"markers {len(log.expected_markers())} (re-inserted after a delete: "
          f"{len(log.reinserted())}), steps {len(mirror.steps)}, "
          + ", ".join(f"{f} {mirror.total(f)}" for f in FIGURES)
          + f", compacted away {len(log.placed) - len(held)}, {seconds:.2f} s", flush=True)


# --------------------------------------------------------------------------- beside a live run


def step_wait_s(clients: KafkaClients, db: Database) -> float:
    """The longest one step of a run may wait: a Kafka request or a Postgres reply (a
    blocked statement included), whichever is longer, and the other on top."""
    return clients.request_timeout_s + (db.reply_timeout_s or DEFAULT_REPLY_TIMEOUT_S)


def waits_for_a_lock(dsn: str) -> bool:
    """Whether a session of the test's database is waiting for a lock."""
    found = query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                       " current_database() AND wait_event_type = 'Lock'")
    return bool(found[0][0])


def until_done_or_blocked(future: Future[Any], dsn: str, deadline_s: float) -> str:
    """Poll until the backfill has finished or waits for a lock; say which."""
    deadline = time.monotonic() + deadline_s
    while True:
        if future.done():
            return "finished"
        if waits_for_a_lock(dsn):
            return "waiting for a lock"
        assert time.monotonic() < deadline, "the backfill neither finished nor waited"
        wait([future], timeout=0.05)  # the poll's pace: the future ends it early


@pytest.mark.parametrize(("kinds", "window", "row_at", "marker_at"), [
    # an older update backfilled while the live chunk deleting its account commits (the
    # account's row u1 is deleted, marker 2): it must stay out, the account stay deleted
    pytest.param((UPDATE, UPDATE, TOMBSTONE), (0, 1), None, 2,
                 id="older-update-beside-the-delete"),
    # the account's old tombstone backfilled while the live chunk inserting it again
    # commits (row u2, marker 1 removed): no marker beside the row
    pytest.param((UPDATE, TOMBSTONE, UPDATE), (1, 2), 2, None,
                 id="old-tombstone-beside-the-insert-again"),
])
def test_a_backfill_beside_the_live_chunk_of_the_same_account(
        kinds: tuple[str, ...], window: tuple[int, int], row_at: int | None,
        marker_at: int | None, topics: Callable[..., str], clients: KafkaClients,
        db: Database, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Backfills take no lock: they run beside the live slices (DESIGN 6), and a deleting
    # pipeline's version guard must hold then too. The live chunk is held open after its
    # writes (the engine's CHUNK_HOOK, at "upserted") until the backfill's chunk has
    # written or waits for it; then both commit.
    pipeline = balances(topics(1, "src"), topics(1, "dlq"), max_records_per_partition=2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        apply_tables(conn, pipeline)
    rng, key = random.Random(SEED), account(1)
    records = [update(key, f"{pipeline.topic}-{i}", rng) if kind == UPDATE else tombstone(key)
               for i, kind in enumerate(kinds)]
    log = Log(produce_rounds(clients, pipeline.topic, [records]))
    assert [(r.start, r.end) for r in run(pipeline, clients, db)] == [(0, 2)]

    held, release = threading.Event(), threading.Event()
    wait_s = step_wait_s(clients, db)

    def hold_the_first_chunk(stage: str) -> None:
        if stage == "upserted" and not held.is_set():
            held.set()
            if not release.wait(wait_s):
                raise TimeoutError("the test never let the live chunk commit")

    monkeypatch.setattr(slices, "CHUNK_HOOK", hold_the_first_chunk)
    with ThreadPoolExecutor(2, thread_name_prefix="beside") as pool:
        live = pool.submit(run, pipeline, clients, db)  # [2, 3)
        assert held.wait(wait_s), "the live chunk never wrote"
        backfill = pool.submit(run_backfill, pipeline, OffsetWindow(partitions={0: window}),
                               clients, db, run_id=f"backfill__{uuid.uuid4().hex[:8]}")
        backfill_was = until_done_or_blocked(backfill, pg_dsn, wait_s)
        release.set()
        assert [(r.start, r.end) for r in live.result(wait_s)] == [(2, 3)]
        backfill.result(wait_s)

    rows, marks = table_rows(pg_dsn), markers(pg_dsn)
    print(f"\n[beside a live chunk] the backfill was {backfill_was} when the live chunk "
          f"committed; rows {rows}, markers {marks}", flush=True)
    assert rows == ({} if row_at is None else {"acct-0001": stored_row(log.at[(0, row_at)])})
    assert marks == ({} if marker_at is None else {"acct-0001": (0, marker_at)})
