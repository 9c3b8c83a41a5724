"""The monitor's queries on the real Postgres (and, for the status view, real Kafka): the
figures read from ``ingest_runs``, ``dead_letters``, ``offset_gaps`` and ``monitor_checks``,
lag growth across recorded checks, and ``kafka-ingest status`` as a user runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from kafka_ingest.config import Pipeline, parse_pipelines
from kafka_ingest.ops.lag import LagRow
from kafka_ingest.ops.monitor import check
from kafka_ingest.ops.status import pipeline_status
from kafka_ingest_dev.samples import produce_sample
from tests.support.cli import cli
from tests.support.ingest import run
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

BODY: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "telemetry_metrics",
    "dlq_topic": "t-in-dlq",
}


def pipeline(name: str = "p1", **alerts: Any) -> Pipeline:
    return parse_pipelines({"pipelines": {name: {**BODY, "alerts": alerts}}})[name]


def lag_rows(*lags: int, group: tuple[int | None, ...] | None = None) -> list[LagRow]:
    """One row per lag (and group lag: None, the group has no offset), high watermarks 100."""
    groups = group if group is not None else lags
    return [LagRow(pipeline="p1", topic="t-in", partition=p, stored_offset=100 - lag,
                   group_offset=None if g is None else 100 - g, low=0, high=100)
            for p, (lag, g) in enumerate(zip(lags, groups, strict=True))]


def add_run(conn: Any, name: str, *, mode: str = "live", read: int, dead: int,
            minutes_ago: float) -> None:
    conn.execute(
        "INSERT INTO ingest_runs (pipeline, run_id, mode, topic, partition, start_offset,"
        " end_offset, read, inserted, duplicates, stale, dead_lettered, tombstones, bytes,"
        " seconds, committed_at) VALUES (%s, %s, %s, 't-in', 0, 0, %s, %s, %s, 0, 0, %s, 0,"
        " 0, 0.1, now() - %s * interval '1 minute')",
        (name, f"run-{minutes_ago}", mode, read, read, read - dead, dead, minutes_ago))


def add_letters(conn: Any, name: str, status: str, offsets: range) -> None:
    for offset in offsets:
        conn.execute(
            "INSERT INTO dead_letters (pipeline, source_topic, source_partition, source_offset,"
            " contract, error_class, error_detail, status, dlq_topic)"
            " VALUES (%s, 't-in', 0, %s, 'metric_event.v2', 'undecodable', 'x', %s, 't-in-dlq')",
            (name, offset, status))


def checks(conn: Any, name: str) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT total_lag, group_lag, dlq_rate, parked, breaches"
                        " FROM monitor_checks WHERE pipeline = %s ORDER BY id",
                        (name,)).fetchall()


def test_figures_come_from_live_chunks_in_the_window_and_parked_letters(pg_dsn: str) -> None:
    p1 = pipeline(max_lag=10, max_dlq_rate=0.02, freshness_minutes=5, max_parked=2)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        add_run(conn, "p1", read=100, dead=3, minutes_ago=10)    # counted
        add_run(conn, "p1", read=300, dead=9, minutes_ago=50)    # counted
        add_run(conn, "p1", read=1000, dead=900, minutes_ago=90)  # before the 60-min window
        add_run(conn, "p1", mode="backfill", read=500, dead=400, minutes_ago=5)  # not live
        add_run(conn, "other", read=10, dead=10, minutes_ago=1)  # another pipeline
        add_letters(conn, "p1", "parked", range(3))
        add_letters(conn, "p1", "recovered", range(3, 5))
        add_letters(conn, "other", "parked", range(4))

    with psycopg.connect(pg_dsn) as conn:
        # a partition whose stored offset is past the high watermark counts as 0
        result = check(p1, lag_rows(7, 5, -2, group=(9, 5, 0)), conn)
        conn.commit()
        recorded = checks(conn, "p1")

    f = result.figures
    assert (f.total_lag, f.group_lag, f.partitions, f.lag_history) == (12, 14, 3, (12,))
    assert (f.read, f.dead_lettered, f.dlq_rate, f.parked) == (400, 12, 0.03, 3)
    assert f.stale_minutes is not None and 10 <= f.stale_minutes < 10.5  # the backfill is not live
    assert f.watched_since == f.now  # the first check
    assert [b.rule for b in result.breaches] == ["max_lag", "max_dlq_rate",
                                                 "freshness_minutes", "max_parked"]
    assert recorded == [(12, 14, 0.03, 3, ["max_lag", "max_dlq_rate", "freshness_minutes",
                                           "max_parked"])]


def test_group_lag_is_not_known_unless_every_partition_has_one(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        f = check(pipeline(), lag_rows(4, 6, group=(4, None)), conn).figures
        g = check(pipeline(), lag_rows(3, group=(None,)), conn).figures  # no group offset
    assert (f.total_lag, f.group_lag) == (10, None)
    assert (g.total_lag, g.group_lag) == (3, None)


def test_lag_growth_is_judged_over_the_recorded_checks(pg_dsn: str) -> None:
    p1 = pipeline(lag_growth_checks=2)
    seen = []
    with psycopg.connect(pg_dsn) as conn:
        for total, record in [(5, True), (8, True), (12, True),  # grew twice: breach
                              (12, True),                        # flat: no breach
                              (20, False),                       # status: 12, 12, 20: no
                              (15, True), (30, True),            # 12, 15, 30: breach
                              (40, False)]:                      # status: 15, 30, 40: breach
            result = check(p1, lag_rows(total), conn, record_check=record)
            seen.append([b.rule for b in result.breaches])
            conn.commit()
        recorded = [(lag, breaches) for lag, _, _, _, breaches in checks(conn, "p1")]
    growth = ["lag_growth_checks"]
    assert seen == [[], [], growth, [], [], [], growth, growth]
    # what status judged was not recorded
    assert recorded == [(5, []), (8, []), (12, growth), (12, []), (15, []), (30, growth)]


def test_freshness_counts_from_the_first_check_when_nothing_was_committed(pg_dsn: str) -> None:
    watched, new = pipeline("watched"), pipeline("new")
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO monitor_checks (pipeline, checked_at, total_lag, parked)"
                     " VALUES ('watched', now() - interval '45 minutes', 3, 0)")
        stale = check(watched, lag_rows(3), conn)
        fresh = check(new, lag_rows(3), conn)
    [breach] = stale.breaches
    assert breach.rule == "freshness_minutes"
    assert "none ever; counted from the monitor's first check" in breach.message
    assert breach.figures["last_live_commit"] is None
    assert 45 <= breach.figures["minutes_since_live_chunk"] < 45.5
    assert fresh.breaches == ()


def test_a_check_without_a_lag_is_judged_but_never_recorded(pg_dsn: str) -> None:
    p1 = pipeline(max_parked=0)
    with psycopg.connect(pg_dsn) as conn:
        add_letters(conn, "p1", "parked", range(1))
        result = check(p1, None, conn, record_check=False)
        assert [b.rule for b in result.breaches] == ["max_parked"]
        assert result.figures.total_lag is None
        with pytest.raises(ValueError, match="a check without a lag is not recorded"):
            check(p1, None, conn)


# --------------------------------------------------------------------------- status view



def test_status_shows_the_on_call_view_then_chunks_and_dead_letters(
        stack_env: dict[str, str], clients: Any, db: Any, pg_dsn: str, make_pipeline: Any,
        tmp_path: Path) -> None:
    p = make_pipeline("telemetry_metrics", alerts={"max_lag": 10})
    sample = produce_sample(clients, p, count=200, poison=1)
    poison = sum(n for kind, n in sample["expect"].items()
                 if kind not in {"row", "duplicate", "tombstone"})
    run(p, clients, db)
    behind = produce_sample(clients, p, count=30, poison=0)["produced"]
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("INSERT INTO offset_gaps (pipeline, topic, partition, from_offset,"
                     " to_offset, run_id) VALUES (%s, %s, 1, 0, 40, 'scheduled__x')",
                     (p.name, p.topic))

    lines = pipeline_status(p, clients, db)
    text = "\n".join(lines)
    assert lines[0] == f"{p.name}: {p.topic} -> telemetry_metrics"
    assert "run test__" in text and f"chunk {p.topic}[" in text  # the newest live chunk
    assert (f"  lag                  {behind} messages over 3 partitions (group lag {behind}); "
            "limit 10") in lines
    assert f"  parked letters       {poison}; limit 1000" in lines
    assert f"offset gap {p.topic}[1] [0, 40) skipped" in text
    assert "run scheduled__x: retention deleted unread messages" in text
    assert "  last alert           none recorded by the monitor DAG" in lines
    # behind, and one of each poison-pill kind in a small sample is a DLQ spike too
    assert lines[-3:-1] == [
        "  breaches now         2",
        f"    ! {p.name}: max_lag: lag {behind} messages over 3 partitions is above max_lag 10"]
    assert lines[-1].startswith(f"    ! {p.name}: max_dlq_rate: {poison} of "
                                f"{sample['produced']} messages read by live chunks in the "
                                "last 60 min were dead-lettered (")

    env = {"KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", p)),
           "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_BOOTSTRAP_SERVERS": stack_env["KAFKA_BOOTSTRAP_SERVERS"]}
    out = cli(env, "status")
    assert out.returncode == 0, out.stderr
    print(out.stdout)  # the sample in docs/operations.md comes from here
    view, tables = out.stdout.split("recent chunks:")
    assert view.strip() == text
    assert "dead letters:" in tables and "parked" in tables

    # Only the database is needed: without Kafka settings the lag is not known.
    no_kafka = {**env, "KAFKA_BOOTSTRAP_SERVERS": "", "KAFKA_INGEST_KAFKA_CONFIG": ""}
    out = cli(no_kafka, "status", p.name)
    assert out.returncode == 0, out.stderr
    assert "lag not shown: set KAFKA_INGEST_KAFKA_CONFIG or KAFKA_BOOTSTRAP_SERVERS" in out.stderr
    assert "  lag                  not known: no Kafka settings" in out.stdout
    assert f"    ! {p.name}: max_dlq_rate: {poison} of " in out.stdout
    assert "max_lag" not in out.stdout  # not judged without the lag
