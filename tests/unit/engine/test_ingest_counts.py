"""Ingest's pure parts: reconciliation of a chunk's counts and the run summary."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.engine.ingest import reconcile, rows_changed, summarize
from kafka_ingest.engine.replay import summarize_replay
from kafka_ingest.engine.slices import SliceReport
from kafka_ingest.errors import IngestError, ReconciliationError
from kafka_ingest.records import ChunkCounts

COUNTS = {"inserted": 6, "duplicates": 2, "stale": 1, "dead_lettered": 3, "known_dead": 0,
          "tombstones": 1}


def test_reconcile_passes_when_every_message_is_accounted_for() -> None:
    reconcile(4, ChunkCounts(read=13, **COUNTS))
    reconcile(0, ChunkCounts())


@pytest.mark.parametrize(
    "read",
    [
        12,  # one message counted twice
        14,  # one message lost
    ],
)
def test_reconcile_raises_naming_the_counts(read: int) -> None:
    with pytest.raises(ReconciliationError) as info:
        reconcile(4, ChunkCounts(read=read, **COUNTS))
    err = info.value
    assert isinstance(err, IngestError)
    assert (err.partition, err.read, err.accounted) == (4, read, COUNTS)
    assert str(err) == (f"partition 4: read {read} but inserted 6 + duplicates 2 + stale 1 + "
                        "dead_lettered 3 + known_dead 0 + tombstones 1 = 13")


def report(partition: int, **counts: Any) -> dict[str, Any]:
    return SliceReport("p", "t", partition, 0, 10, "live", **counts).to_dict()


def test_summarize_sums_the_mapped_results() -> None:
    summary = summarize([
        report(0, read=100, inserted=90, duplicates=4, dead_lettered=5, tombstones=1,
               bytes=12_000, seconds=1.5, lag_after=7),
        report(1, read=300, inserted=278, stale=5, dead_lettered=15, known_dead=2,
               bytes=36_000, seconds=2.25, lag_after=0),
        report(2, lag_after=None),  # a slice whose lag could not be read
    ])
    assert summary == {
        "read": 400, "inserted": 368, "duplicates": 4, "stale": 5, "dead_lettered": 20,
        "known_dead": 2, "tombstones": 1, "deleted": 0, "bytes": 48_000, "seconds": 3.75,
        "partitions": 3,
        "lag_after": 7, "dlq_rate": 0.05,
    }


def test_summarize_rounds_the_dlq_rate() -> None:
    assert summarize([report(0, read=3, dead_lettered=1)])["dlq_rate"] == 0.333333


def test_summarize_nothing_read() -> None:
    summary = summarize([])
    assert (summary["partitions"], summary["dlq_rate"], summary["lag_after"]) == (0, 0.0, 0)
    assert summarize([report(0)])["dlq_rate"] == 0.0  # no division by zero


def test_summarize_accepts_partial_dicts() -> None:
    # XCom may carry reports from an older version without every key.
    assert summarize([{"read": 2, "dead_lettered": 2}])["dlq_rate"] == 1.0


def test_a_dry_run_replay_with_nothing_to_read_still_says_dry_run() -> None:
    from kafka_ingest.engine.replay import summarize_replay

    assert summarize_replay([], dry_run=True)["dry_run"] is True
    assert summarize_replay([{"dry_run": True, "read": 1}])["dry_run"] is True
    assert summarize_replay([], dry_run=False)["dry_run"] is False


@pytest.mark.parametrize(("summary", "changed"), [
    ({"inserted": 3, "deleted": 0}, 3),
    # a run that only deleted rows changed the table: its Asset must be updated
    ({"inserted": 0, "deleted": 2, "tombstones": 2}, 2),
    ({"inserted": 0, "duplicates": 5}, 0),
    ({}, 0),
])
def test_rows_changed_counts_inserts_updates_and_deletes(summary: dict[str, Any],
                                                         changed: int) -> None:
    assert rows_changed(summary) == changed


def test_a_replay_summary_carries_the_rows_its_tombstones_deleted() -> None:
    reports = [{"read": 2, "deleted": 1, "outcomes": {"recovered": 1}}, {"read": 1}]
    assert summarize_replay(reports, dry_run=False)["deleted"] == 1
