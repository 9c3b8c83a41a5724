"""The retention of the bookkeeping on the real Postgres (:func:`kafka_ingest.ops.retention.
prune`, as the monitor DAG runs it): rows older than the pipeline's setting go, in batches;
what the guarantees and the rules read stays however old (plans a retry still needs, the
checks of the lag-growth and freshness rules and the last alert, parked letters); nothing
younger than a day goes whatever is asked; and the counters and figures the page, the
metrics, ``kafka-ingest status`` and the monitor show are the same after a prune."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.db import Database
from kafka_ingest.ops import page
from kafka_ingest.ops.metrics import families
from kafka_ingest.ops.monitor import check
from kafka_ingest.ops.observe import Sources, snapshot
from kafka_ingest.ops.retention import prune
from kafka_ingest.ops.status import status_rows

pytestmark = pytest.mark.integration

DAYS = 10
OLD, YOUNG = "20 days", "2 hours"


def _pipeline(name: str = "p", **retention: Any) -> Pipeline:
    return parse_pipelines({"pipelines": {name: {
        "topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
        "table": "telemetry_metrics", "dlq_topic": "t-in-dlq",
        "alerts": {"lag_growth_checks": 3},
        "retention": retention or {"ingest_runs_days": DAYS, "run_plans_days": DAYS,
                                   "monitor_checks_days": DAYS,
                                   "recovered_letters_days": DAYS}}}})[name]


def _runs(conn: Any, name: str, age: str, count: int, *, start: int = 0) -> None:
    conn.execute(
        "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
        " seconds, committed_at)"
        " SELECT %s, 'run' || i, CASE WHEN i %% 5 = 0 THEN 'backfill' ELSE 'live' END, 't-in',"
        " i %% 3, %s + i * 10, %s + i * 10 + 10, 10, 9, 0, 0, 1, 0, 100, 0.1,"
        " now() - %s::interval - i * interval '1 minute' FROM generate_series(1, %s) AS i",
        (name, start, start, age, count))


def _plan(conn: Any, name: str, run_id: str, age: str,
          ranges: list[tuple[str, int, int, int]]) -> None:
    for topic, partition, start, end in ranges:
        conn.execute(
            "INSERT INTO run_plans (pipeline, run_id, request_key, mode, topic, partition,"
            " start_offset, end_offset, planned_at) VALUES (%s, %s, 'live', 'live', %s, %s,"
            " %s, %s, now() - %s::interval)", (name, run_id, topic, partition, start, end, age))


def _checks(conn: Any, name: str, age: str, count: int, breach_at: int | None) -> None:
    conn.execute(
        "INSERT INTO monitor_checks (pipeline, checked_at, total_lag, parked, breaches)"
        " SELECT %s, now() - %s::interval - (%s - i) * interval '5 minutes', i, 0,"
        " CASE WHEN i = %s THEN '{max_lag}'::text[] ELSE '{}' END"
        " FROM generate_series(1, %s) AS i", (name, age, count, breach_at, count))


def _letters(conn: Any, name: str, status: str, age: str, offsets: range,
             reason: str = "not_json") -> None:
    conn.execute(
        "INSERT INTO dead_letters (pipeline, source_topic, source_partition, source_offset,"
        " contract, error_class, error_detail, status, recovered_at, dlq_topic,"
        " first_failed_at, last_failed_at)"
        " SELECT %s, 't-in', 0, i, 'metric_event.v2', %s, 'x', %s,"
        " CASE WHEN %s = 'recovered' THEN now() - %s::interval END, 't-in-dlq',"
        " now() - %s::interval - interval '1 day', now() - %s::interval - interval '1 day'"
        " FROM generate_series(%s::int, %s::int) AS i",
        (name, reason, status, status, age, age, age, offsets.start, offsets.stop - 1))


def _history(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        _runs(conn, "p", OLD, 25)
        _runs(conn, "p", YOUNG, 5, start=1000)
        _runs(conn, "q", OLD, 3)  # a pipeline not pruned here
        for partition, offset in ((0, 500), (1, 100)):
            conn.execute("INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
                         " VALUES ('p', 't-in', %s, %s)", (partition, offset))
        conn.execute("INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
                     " VALUES ('p', 't-in-dlq', 0, 50)")  # the replay cursor
        _plan(conn, "p", "done", OLD, [("t-in", 0, 0, 100), ("t-in", 1, 0, 100)])
        _plan(conn, "p", "unfinished", OLD, [("t-in", 0, 400, 600), ("t-in", 1, 0, 100)])
        _plan(conn, "p", "no-cursor", OLD, [("t-in", 2, 0, 10)])
        _plan(conn, "p", "empty", OLD, [("t-in", 2, 7, 7)])
        _plan(conn, "p", "young", YOUNG, [("t-in", 0, 0, 100)])
        _plan(conn, "p:replay", "done", OLD, [("t-in-dlq", 0, 0, 50)])
        _plan(conn, "p:replay", "unfinished", OLD, [("t-in-dlq", 0, 50, 80)])
        _plan(conn, "q", "done", OLD, [("t-in", 0, 0, 1)])
        _checks(conn, "p", OLD, 40, breach_at=5)  # no check younger than the setting
        _checks(conn, "r", OLD, 10, breach_at=None)
        _checks(conn, "r", YOUNG, 10, breach_at=None)
        _letters(conn, "p", "recovered", OLD, range(0, 6))
        _letters(conn, "p", "recovered", YOUNG, range(6, 8))
        _letters(conn, "p", "parked", OLD, range(8, 12), reason="contract_violation")
        _letters(conn, "p", "parked", YOUNG, range(12, 14))


def _left(dsn: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(query).fetchall()]


def _no_kafka(_pipeline: Pipeline) -> Any:
    raise ConnectionError("no Kafka in this test: the figures come from the database")


def _shown(p: Pipeline, db: Database) -> dict[str, Any]:
    """What the metrics, the page, the status and the monitor show of ``p``."""
    snap = snapshot([p], Sources(clients=_no_kafka, database=lambda _p: db))
    view = snap.view(p.name)
    assert view is not None and view.result is not None
    metrics = {(m.name, tuple(s.labels.items()), s.value) for m in families(snap, now=0.0)
               for s in m.samples if not m.name.startswith("kafka_ingest_snapshot")}
    with db.session() as conn:
        figures = check(p, None, conn, record_check=False).figures
        return {"totals": view.totals, "parked": view.parked_by_reason, "metrics": metrics,
                "letters": page.letters(conn, p.name),
                "status_letters": status_rows(conn, p.name)[1],
                "figures": {k: v for k, v in figures.to_dict().items()
                            if k not in {"checked_at", "minutes_since_live_chunk"}},
                "watched_since": figures.watched_since}


def test_a_prune_deletes_what_is_older_than_the_setting_and_nothing_the_guarantees_need(
        pg_dsn: str) -> None:
    p, r = _pipeline("p"), _pipeline("r")
    db = Database(pg_dsn)
    _history(pg_dsn)
    before = _shown(p, db)

    pruned = prune([p, r], db, batch=4)  # several batches each

    by = {(x.pipeline, x.table): (x.rows, x.done) for x in pruned}
    assert by == {("p", "ingest_runs"): (25, True), ("p", "run_plans"): (4, True),
                  ("p", "monitor_checks"): (35, True), ("p", "recovered_letters"): (6, True),
                  ("r", "ingest_runs"): (0, True), ("r", "run_plans"): (0, True),
                  ("r", "monitor_checks"): (9, True), ("r", "recovered_letters"): (0, True)}
    # the ledger: only the young chunks of p; q's are not p's to prune
    assert _left(pg_dsn, "SELECT pipeline, count(*) FROM ingest_runs GROUP BY 1 ORDER BY 1") \
        == [("p", 5), ("q", 3)]
    # plans: those with a range ahead of its cursor (or with no cursor) stay, however old
    assert _left(pg_dsn, "SELECT DISTINCT pipeline, run_id FROM run_plans ORDER BY 1, 2") == [
        ("p", "no-cursor"), ("p", "unfinished"), ("p", "young"), ("p:replay", "unfinished"),
        ("q", "done")]
    # checks: p's first, its last alert and its newest lag_growth_checks (3), all old; r's
    # young ones and its first
    assert _left(pg_dsn, "SELECT total_lag FROM monitor_checks WHERE pipeline = 'p'"
                         " ORDER BY id") == [(1,), (5,), (38,), (39,), (40,)]
    assert _left(pg_dsn, "SELECT count(*), min(total_lag) FROM monitor_checks"
                         " WHERE pipeline = 'r'") == [(11, 1)]
    # letters: never a parked one; recovered ones once older than the setting
    assert _left(pg_dsn, "SELECT status, source_offset FROM dead_letters ORDER BY 2") == [
        *(("recovered", o) for o in (6, 7)), *(("parked", o) for o in range(8, 14))]

    # what the looks show is unchanged, counters and figures alike
    after = _shown(p, db)
    for key in before:
        assert after[key] == before[key], key
    assert before["totals"]["live"].read == 10 * 24  # the pruned chunks still count


def test_a_prune_stops_at_its_budget_and_the_next_one_goes_on(pg_dsn: str) -> None:
    p = _pipeline("p")
    db = Database(pg_dsn)
    _history(pg_dsn)

    stopped = prune([p], db, batch=4, budget_s=0.0)
    assert all(x.rows == 0 and not x.done for x in stopped)
    assert _left(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE pipeline = 'p'") == [(30,)]

    assert all(x.done for x in prune([p], db, batch=4))
    assert _left(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE pipeline = 'p'") == [(5,)]


def test_a_table_without_a_retention_is_left_alone(pg_dsn: str) -> None:
    p = _pipeline("p", ingest_runs_days=None, run_plans_days=None, monitor_checks_days=None,
                  recovered_letters_days=None)
    _history(pg_dsn)
    assert prune([p], Database(pg_dsn)) == []
    assert _left(pg_dsn, "SELECT count(*) FROM ingest_runs WHERE pipeline = 'p'") == [(30,)]


@pytest.mark.parametrize("function", [
    "prune_ingest_runs('p', now(), 1000)",
    "prune_run_plans('p', now(), 1000)",
    "prune_monitor_checks('p', now(), 1, 1000)",
    "prune_recovered_letters('p', now(), 1000)",
])
def test_nothing_younger_than_a_day_goes_whatever_is_asked(pg_dsn: str, function: str) -> None:
    """The retention's functions are what the runtime role may delete through: asked for
    everything up to now, they still keep the last day."""
    with psycopg.connect(pg_dsn) as conn:
        _runs(conn, "p", YOUNG, 5)
        conn.execute("INSERT INTO ingest_offsets (pipeline, topic, partition, next_offset)"
                     " VALUES ('p', 't-in', 0, 500)")
        _plan(conn, "p", "young", YOUNG, [("t-in", 0, 0, 100)])
        _checks(conn, "p", YOUNG, 5, breach_at=None)
        _letters(conn, "p", "recovered", YOUNG, range(0, 5))
        conn.commit()
        assert conn.execute(f"SELECT {function}").fetchone() == (0,)
