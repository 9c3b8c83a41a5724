"""Each look costs the same at a long history as at a short one, on the real Postgres.

A look is what the pipelines page, the Prometheus metrics (:func:`kafka_ingest.ops.observe.
snapshot`), ``kafka-ingest status`` and the monitor's check read. Every query they send is
run under ``EXPLAIN (ANALYZE, BUFFERS)`` twice: over a short history (a few chunks, letters
and checks), then after a long one was added before it (400,000 chunks, 200,000 recovered
letters, 100,000 checks, 50,000 offset gaps, written with ``generate_series``). Each query
must read about as many buffers the second time as the first (a few more for indexes one
or two levels deeper), and none may scan a bookkeeping table from end to end: so a look
costs the same at ten million chunks as at ten (times are not compared: buffers are what
a look reads, whatever else the machine does). What the looks show is checked too: the
totals count the long history, the windows and the parked letters are as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops import page
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.monitor import check
from kafka_ingest.ops.observe import Sources, snapshot
from kafka_ingest.ops.status import pipeline_status, status_rows

pytestmark = pytest.mark.integration

NAME = "p"
#: What the long history adds.
CHUNKS, RECOVERED, CHECKS, GAPS = 400_000, 200_000, 100_000, 50_000
#: Buffers a query may read beyond what it read over the short history: the indexes
#: deepen (a level or two per descent, a few descents per query).
SLACK = 12
#: Tables no look may read from end to end.
BOOKKEEPING = {"ingest_runs", "dead_letters", "monitor_checks", "offset_gaps", "run_plans"}


def _pipeline() -> Pipeline:
    return parse_pipelines({"pipelines": {NAME: {
        "topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
        "table": "telemetry_metrics", "dlq_topic": "t-in-dlq"}}})[NAME]


class Explaining:
    """A connection that first runs each query it is given under ``EXPLAIN (ANALYZE,
    BUFFERS)`` and keeps the plan, then runs it as asked."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.plans: list[tuple[str, dict[str, Any]]] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query.as_string(self.conn) if isinstance(query, sql.Composable) else query
        if text.lstrip().upper().startswith(("SELECT", "WITH")):
            found = self.conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text,
                                      params).fetchone()
            assert found is not None
            plan = found[0] if not isinstance(found[0], str) else json.loads(found[0])
            self.plans.append((text, plan[0]["Plan"]))
        return self.conn.execute(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _Database:
    """A :class:`kafka_ingest.db.Database` whose sessions are the explaining connection."""

    def __init__(self, conn: Explaining) -> None:
        self.conn = conn

    @contextmanager
    def session(self, *, autocommit: bool = False) -> Iterator[Any]:
        yield self.conn


def _no_kafka(_pipeline: Pipeline) -> Any:
    raise ConnectionError("no Kafka in this test: the look reads the database only")


def looks(conn: Explaining, pipeline: Pipeline) -> dict[str, Any]:
    """Every look of the page, the metrics, the status and the monitor; what they show."""
    db: Any = _Database(conn)
    snap = snapshot([pipeline], Sources(clients=_no_kafka, database=lambda _p: db))
    view = snap.view(NAME)
    assert view is not None and view.result is not None
    shown = {"totals": {m: c.as_dict() for m, c in view.totals.items()},
             "parked": view.parked_by_reason,
             "figures": view.result.figures.to_dict(),
             "history": len(page.history(conn, [NAME])[NAME]),
             "letters": page.letters(conn, NAME),
             "status": pipeline_status(pipeline, None, db),
             "recent": status_rows(conn, NAME, limit=10)[0],
             "recent_all": status_rows(conn, None, limit=10)[0]}
    check(pipeline, [LagRow(pipeline=NAME, topic="t-in", partition=0, stored_offset=5,
                            group_offset=5, low=0, high=10)], conn, record_check=True)
    conn.rollback()
    return shown


def _buffers(node: dict[str, Any]) -> int:
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def _scans(node: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if "Relation Name" in node:
        yield node["Node Type"], node["Relation Name"]
    for child in node.get("Plans", ()):
        yield from _scans(child)


def _recent(conn: psycopg.Connection[Any]) -> None:
    """The short history: what both looks see in their windows."""
    conn.execute(
        "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
        " seconds, committed_at)"
        " SELECT %s, 'r' || i, CASE WHEN i %% 4 = 0 THEN 'backfill' ELSE 'live' END, 't-in',"
        " i %% 3, i * 100, i * 100 + 100, 100, 98, 0, 0, 2, 0, 12000, 0.1,"
        " now() - i * interval '1 minute' FROM generate_series(1, 12) AS i", (NAME,))
    conn.execute(
        "INSERT INTO dead_letters (pipeline, source_topic, source_partition, source_offset,"
        " contract, error_class, error_detail, status, dlq_topic, last_failed_at)"
        " SELECT %s, 't-in', i %% 3, i, 'metric_event.v2',"
        " CASE WHEN i %% 2 = 0 THEN 'not_json' ELSE 'contract_violation' END, 'x',"
        " CASE WHEN i %% 5 = 0 THEN 'recovered' ELSE 'parked' END, 't-in-dlq',"
        " now() - i * interval '1 minute' FROM generate_series(1, 20) AS i", (NAME,))
    conn.execute(
        "INSERT INTO monitor_checks (pipeline, checked_at, total_lag, parked, breaches)"
        " SELECT %s, now() - (30 - i) * interval '5 minutes', i, 16,"
        " CASE WHEN i = 3 THEN '{max_lag}'::text[] ELSE '{}' END"
        " FROM generate_series(1, 30) AS i", (NAME,))
    conn.execute("INSERT INTO offset_gaps (pipeline, topic, partition, from_offset, to_offset)"
                 " VALUES (%s, 't-in', 0, 0, 5)", (NAME,))


def _long_history(conn: psycopg.Connection[Any]) -> None:
    """Before the short history, for this pipeline and another one (negative ids: written
    before it, too)."""
    conn.execute(
        "INSERT INTO ingest_runs (id, pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
        " seconds, committed_at)"
        " SELECT -i, CASE WHEN i %% 10 = 0 THEN 'other' ELSE %s END, 'old' || i / 100,"
        " CASE WHEN i %% 7 = 0 THEN 'backfill' ELSE 'live' END, 't-in', i %% 3,"
        " i * 1000, i * 1000 + 1000, 1000, 1000, 0, 0, 0, 0, 120000, 0.1,"
        " now() - interval '2 days' - i * interval '1 minute'"
        " FROM generate_series(1::bigint, %s) AS i", (NAME, CHUNKS))
    conn.execute(
        "INSERT INTO dead_letters (pipeline, source_topic, source_partition, source_offset,"
        " contract, error_class, error_detail, status, recovered_at, dlq_topic,"
        " last_failed_at)"
        " SELECT %s, 't-in', i %% 3, 1000 + i, 'metric_event.v2', 'not_json', 'x', 'recovered',"
        " now() - interval '2 days', 't-in-dlq', now() - interval '3 days' - i * interval '1 s'"
        " FROM generate_series(1::bigint, %s) AS i", (NAME, RECOVERED))
    conn.execute(
        "INSERT INTO monitor_checks (id, pipeline, checked_at, total_lag, parked, breaches)"
        " SELECT -i, %s, now() - interval '3 days' - i * interval '5 minutes', i, 0, '{}'"
        " FROM generate_series(1, %s) AS i", (NAME, CHECKS))
    conn.execute(
        "INSERT INTO offset_gaps (id, pipeline, topic, partition, from_offset, to_offset,"
        " detected_at) SELECT -i, CASE WHEN i %% 2 = 0 THEN 'other' ELSE %s END, 't-in', 0, i,"
        " i + 1, now() - interval '3 days' FROM generate_series(1, %s) AS i", (NAME, GAPS))


def _analyze(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def test_every_look_reads_as_much_over_a_long_history_as_over_a_short_one(
        pg_dsn: str) -> None:
    pipeline = _pipeline()
    with psycopg.connect(pg_dsn) as conn:
        _recent(conn)
        conn.commit()
    _analyze(pg_dsn)
    with psycopg.connect(pg_dsn) as raw:
        short = Explaining(raw)
        shown_short = looks(short, pipeline)
        with raw.transaction():
            _long_history(raw)
    _analyze(pg_dsn)
    with psycopg.connect(pg_dsn) as raw:
        long = Explaining(raw)
        shown_long = looks(long, pipeline)

    assert [q for q, _ in long.plans] == [q for q, _ in short.plans]  # the same looks
    assert len(long.plans) >= 15
    full = [(q, node, rel) for q, plan in long.plans for node, rel in _scans(plan)
            if node == "Seq Scan" and rel in BOOKKEEPING]
    assert full == [], full
    grew = [(q, _buffers(a), _buffers(b)) for (q, a), (_, b) in zip(short.plans, long.plans,
                                                                    strict=True)
            if _buffers(b) > _buffers(a) + SLACK]
    assert grew == [], grew

    # what they show: the totals count the long history; the windows, the letters and
    # the checks they show do not change
    old_live = sum(1 for i in range(1, CHUNKS + 1) if i % 10 and i % 7)
    old_backfill = sum(1 for i in range(1, CHUNKS + 1) if i % 10 and not i % 7)
    assert shown_long["totals"]["live"]["read"] == shown_short["totals"]["live"]["read"] \
        + 1000 * old_live
    assert shown_long["totals"]["backfill"]["read"] == (
        shown_short["totals"]["backfill"]["read"] + 1000 * old_backfill)
    assert shown_long["parked"] == shown_short["parked"] == {"not_json": 8,
                                                             "contract_violation": 8}
    recovered = {(d["reason"], d["count"]) for d in shown_long["letters"]
                 if d["status"] == "recovered"}
    assert recovered == {("not_json", 2 + RECOVERED), ("contract_violation", 2)}
    for same in ("figures", "history", "recent", "recent_all"):
        assert _without_now(shown_long[same]) == _without_now(shown_short[same]), same


def _without_now(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in ("checked_at",
                                                            "minutes_since_live_chunk")}
    return value
