"""The chunk counters' one definition (:class:`kafka_ingest.records.ChunkCounts`) and what
derives from it, without services: the migrations' columns and the totals' trigger, the
audit row's statement, the run and replay summaries, the Prometheus counters."""

from __future__ import annotations

import re
from dataclasses import fields
from importlib import resources
from pathlib import Path

from kafka_ingest.config import parse_pipelines
from kafka_ingest.db.repositories import ADD_RUN
from kafka_ingest.engine.ingest import summarize
from kafka_ingest.engine.replay import summarize_replay
from kafka_ingest.engine.slices import SliceReport
from kafka_ingest.ops.metrics import COUNTERS_BEGIN, COUNTERS_END, METRICS, counters_table, families
from kafka_ingest.ops.observe import PipelineView, Snapshot
from kafka_ingest.records import (
    ACCOUNTED,
    COUNTERS,
    EXPORTED,
    REPLAYED,
    ChunkCounts,
    counter,
)

#: Every counter a different power of two, so a counter summed under another's name shows.
DISTINCT = {c: 2 ** i for i, c in enumerate(COUNTERS)}


def _migrations() -> str:
    folder = resources.files("kafka_ingest.db").joinpath("migrations")
    return "\n".join(f.read_text(encoding="utf-8") for f in sorted(
        folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".sql"))


def _columns(sql: str, table: str) -> list[str]:
    """The columns ``CREATE TABLE table`` makes and later ``ALTER TABLE ... ADD COLUMN``s add."""
    body = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", sql, re.DOTALL)
    assert body is not None, table
    made = [m.group(1) for m in re.finditer(r"^\s+([a-z_]+)\s+[a-z]", body.group(1),
                                            re.MULTILINE)
            if m.group(1) not in ("primary", "unique", "check")]
    added = re.findall(rf"ALTER TABLE {table} ADD COLUMN ([a-z_]+)", sql)
    return made + added


def test_the_record_is_the_list_of_counters() -> None:
    assert tuple(f.name for f in fields(ChunkCounts)) == COUNTERS
    assert ACCOUNTED == ("inserted", "duplicates", "stale", "dead_lettered", "known_dead",
                         "tombstones")
    assert set(REPLAYED) <= set(COUNTERS) and set(EXPORTED) <= set(COUNTERS)
    counts = ChunkCounts(**DISTINCT)
    assert counts.accounted() == {c: DISTINCT[c] for c in ACCOUNTED}
    assert counts.as_dict() == DISTINCT


def test_the_migrations_have_a_column_for_every_counter_in_the_audit_and_the_totals() -> None:
    sql = _migrations()
    runs, totals = _columns(sql, "ingest_runs"), _columns(sql, "ingest_totals")
    assert set(COUNTERS) <= set(runs)
    # the totals: their key, the chunks, every counter and the seconds, the newest chunk
    assert totals == ["pipeline", "mode", "topic", "partition", "chunks", *COUNTERS,
                      "seconds", "last_id", "last_run_id", "last_start_offset",
                      "last_end_offset", "last_committed_at"]


def test_the_totals_trigger_and_its_first_fill_sum_every_counter() -> None:
    sql = _migrations()
    trigger = sql[sql.index("CREATE FUNCTION ingest_runs_totaled"):sql.index(
        "CREATE TRIGGER ingest_runs_totaled")]
    fill = sql[sql.index("INSERT INTO ingest_totals\nSELECT"):]
    for c in COUNTERS:
        assert f"sum({c}) OVER w" in trigger, c
        assert re.search(rf"\b{c} = t\.{c} \+ EXCLUDED\.{c}\b", trigger), c
        assert f"sum({c}) OVER w" in fill, c


def test_the_audit_row_names_every_counter_in_the_records_order() -> None:
    text = ADD_RUN.as_string(None)
    named = re.search(r"end_offset, (.*), seconds\)", text)
    assert named is not None
    assert [c.strip('"') for c in named.group(1).split(", ")] == list(COUNTERS)
    assert text.count("%s") == 8 + len(COUNTERS)


def _report(partition: int, **counts: int) -> dict[str, object]:
    return SliceReport("p", "t", partition, 0, 10, "live", **counts).to_dict()


def test_a_runs_summary_sums_every_counter_and_a_replays_its_own() -> None:
    reports = [_report(0, **DISTINCT), _report(1, **DISTINCT)]
    summary = summarize(reports)
    replay = summarize_replay(reports, dry_run=False)
    assert {c: summary[c] for c in COUNTERS} == {c: 2 * n for c, n in DISTINCT.items()}
    assert {c: replay[c] for c in COUNTERS if c in replay} == {
        c: 2 * DISTINCT[c] for c in REPLAYED}


def test_each_exported_counter_is_a_prometheus_counter_of_its_own_value() -> None:
    p = parse_pipelines({"pipelines": {"p1": {
        "topic": "t-in", "contract": {"event_type": "metric_event", "version": 2},
        "table": "t_rows", "dlq_topic": "t-in-dlq"}}})["p1"]
    view = PipelineView(pipeline=p, totals={"live": ChunkCounts(**DISTINCT)})
    found = {m.name: m for m in families(Snapshot((view,), {}, 0.0, 0.0), now=0.0)}
    for c in EXPORTED:
        metric = counter(c).metric
        assert METRICS[metric][0] == "counter"
        (sample,) = [s for s in found[f"kafka_ingest_{metric}"].samples
                     if s.name.endswith("_total")]
        assert (sample.labels, sample.value) == ({"pipeline": "p1", "mode": "live"},
                                                 DISTINCT[c])


def test_the_docs_hold_the_counters_block_as_generated() -> None:
    root = Path(__file__).resolve().parents[2]
    holders = [p for p in sorted((root / "docs").rglob("*.md"))
               if COUNTERS_BEGIN in p.read_text()]
    assert len(holders) == 1, holders
    text = holders[0].read_text()
    start = text.index(COUNTERS_BEGIN)
    block = text[start:text.index(COUNTERS_END, start) + len(COUNTERS_END)] + "\n"
    assert block == counters_table(), (
        f"{holders[0]} is stale: replace its block with the output of python -c 'from "
        "kafka_ingest.ops.metrics import counters_table; print(counters_table(), end=\"\")'")
