"""Trigger forms and CLI arguments: every bad form fails with a message saying what to fix.

These are the functions the first task of each DAG calls (``ingest_request`` for the
ingest DAG, ``replay_request`` for the replay DAG) and the CLI calls before connecting to
anything, so no service is needed. A partition the topic lacks needs the broker to be
found: that case is in tests/integration/test_backfill.py and tests/dags.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kafka_ingest.cli import main
from kafka_ingest.errors import KNOWN_ERROR_CLASSES, TriggerParamsError
from kafka_ingest.kafka.dlq import DeadLetter
from kafka_ingest.requests import (
    LiveRun,
    OffsetWindow,
    RangeRequest,
    ReplayFilters,
    TimeWindow,
    ingest_request,
    replay_request,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T0, T1 = "2026-05-01T00:00:00Z", "2026-05-02T00:00:00Z"
MS0, MS1 = 1_777_593_600_000, 1_777_680_000_000


def manual(params: dict[str, Any]) -> RangeRequest:
    return ingest_request(params, run_type="manual", interval=None, now=NOW)


@pytest.mark.parametrize(("params", "expected"), [
    # no range: a live run
    ({}, LiveRun()),
    ({"partitions": {}, "from": None, "to": None}, LiveRun()),
    # a cleared form field arrives as null: still a live run
    ({"partitions": None, "from": None, "to": None}, LiveRun()),
    # offsets; keys arrive as strings from JSON
    ({"partitions": {"0": [0, 10], "2": [5, 5]}},
     OffsetWindow(partitions={0: (0, 10), 2: (5, 5)})),
    # time, ISO-8601 with Z or an explicit offset
    ({"from": T0, "to": T1}, TimeWindow(from_ms=MS0, to_ms=MS1)),
    ({"from": "2026-05-01T02:00:00+02:00", "to": T1}, TimeWindow(from_ms=MS0, to_ms=MS1)),
])
def test_good_forms(params: dict[str, Any], expected: RangeRequest) -> None:
    assert manual(params) == expected


@pytest.mark.parametrize(("params", "message"), [
    # end before start
    ({"partitions": {"0": [10, 5]}}, "partition 0: end 5 is before start 10"),
    # both offsets and time
    ({"partitions": {"0": [0, 1]}, "from": T0, "to": T1}, "either 'partitions'"),
    # window in the future
    ({"from": T0, "to": "2026-06-01T12:00:01Z"}, "is in the future"),
    # window backwards or empty
    ({"from": T1, "to": T0}, "must be after 'from'"),
    ({"from": T0, "to": T0}, "must be after 'from'"),
    # half a window
    ({"from": T0}, "needs both 'from' and 'to'"),
    ({"to": T1}, "needs both 'from' and 'to'"),
    # no UTC offset: ambiguous
    ({"from": "2026-05-01T00:00:00", "to": T1}, "need a UTC offset"),
    # not a time at all
    ({"from": "yesterday", "to": T1}, "not an ISO-8601 time"),
    # offsets in the wrong shape
    ({"partitions": [[0, 1]]}, "must be an object"),
    ({"partitions": {"0": 5}}, "must be [start, end] offsets"),
    ({"partitions": {"zero": [0, 1]}}, "must be [start, end] offsets"),
    # a string is not a pair of offsets, even one that unpacks into two digits
    ({"partitions": {"0": "59"}}, "must be [start, end] offsets"),
    # booleans and fractions are not offsets
    ({"partitions": {"0": [True, 2]}}, "must be [start, end] offsets"),
    ({"partitions": {"0": [0, 2.9]}}, "must be [start, end] offsets"),
    # three numbers are not a range
    ({"partitions": {"0": [0, 1, 2]}}, "must be [start, end] offsets"),
    # a negative partition does not exist
    ({"partitions": {"-1": [0, 1]}}, "partition -1 does not exist: partitions are numbered "
                                      "from 0"),
    # a digit to str.isdigit() that int() refuses
    ({"partitions": {"\u00b2": [0, 1]}}, "must be [start, end] offsets"),
])
def test_bad_forms_say_what_to_fix(params: dict[str, Any], message: str) -> None:
    with pytest.raises(TriggerParamsError, match=_escaped(message)):
        manual(params)
    with pytest.raises(TriggerParamsError, match=_escaped(message)):
        replay_request(params, now=NOW)  # the replay DAG checks ranges the same way


def _escaped(text: str) -> str:
    return re.escape(text)


def test_airflow_backfill_runs_map_their_data_interval_by_time() -> None:
    start, end = datetime(2026, 5, 1, tzinfo=UTC), datetime(2026, 5, 2, tzinfo=UTC)
    request = ingest_request({}, run_type="backfill", interval=(start, end), now=NOW)
    assert request == TimeWindow(from_ms=MS0, to_ms=MS1)
    # A manual run's interval is a point: it never turns into a backfill by itself.
    assert ingest_request({}, run_type="manual", interval=(start, start), now=NOW) == LiveRun()
    with pytest.raises(TriggerParamsError, match="is in the future"):
        ingest_request({}, run_type="backfill", interval=(NOW, NOW + timedelta(hours=1)),
                       now=NOW)


@pytest.mark.parametrize(("params", "message"), [
    # not a class a dead letter can have
    ({"error_classes": ["timeout"]}, "unknown error class(es) timeout"),
    # a negative partition, a string, a boolean
    ({"source_partition": -1}, "source_partition must be an integer >= 0"),
    ({"source_partition": "1"}, "source_partition must be an integer >= 0"),
    ({"source_partition": True}, "source_partition must be an integer >= 0"),
    # an empty event id would match nothing
    ({"event_id": ""}, "event_id must be a non-empty string"),
])
def test_bad_replay_filters_say_what_to_fix(params: dict[str, Any], message: str) -> None:
    with pytest.raises(TriggerParamsError, match=_escaped(message)):
        replay_request(params, now=NOW)


def letter(value: bytes | None, *, error_class: str = "unknown_version",
           partition: int = 0) -> DeadLetter:
    return DeadLetter("src", partition, 7, b"k", value, None, error_class, "detail",
                      "metric_event.v1", "dlq")


EVENT = json.dumps({"event_id": "e-1", "version": 2}).encode()


@pytest.mark.parametrize(("filters", "candidate", "matches"), [
    # no filter matches everything, even undecodable bytes
    (ReplayFilters(), letter(b"\xff"), True),
    (ReplayFilters(error_classes=frozenset({"unknown_version"})), letter(EVENT), True),
    (ReplayFilters(error_classes=frozenset({"too_large"})), letter(EVENT), False),
    (ReplayFilters(source_partition=2), letter(EVENT, partition=2), True),
    (ReplayFilters(source_partition=2), letter(EVENT, partition=0), False),
    (ReplayFilters(event_id="e-1"), letter(EVENT), True),
    (ReplayFilters(event_id="e-2"), letter(EVENT), False),
    # unparseable values, non-objects and null never match an event_id filter
    (ReplayFilters(event_id="e-1"), letter(b'{"event_id": "e-1"'), False),
    (ReplayFilters(event_id="e-1"), letter(b'["e-1"]'), False),
    (ReplayFilters(event_id="e-1"), letter(None), False),
    # every filter must hold
    (ReplayFilters(frozenset({"unknown_version"}), 0, "e-1"), letter(EVENT), True),
    (ReplayFilters(frozenset({"unknown_version"}), 1, "e-1"), letter(EVENT), False),
])
def test_filters_match(filters: ReplayFilters, candidate: DeadLetter, matches: bool) -> None:
    assert filters.matches(candidate) is matches


def test_filters_from_params() -> None:
    params = {"error_classes": ["too_large", "undecodable"], "source_partition": 3,
              "event_id": "e-1", "dry_run": True}
    filters = replay_request(params, now=NOW).filters
    assert filters == ReplayFilters(frozenset({"too_large", "undecodable"}), 3, "e-1")
    assert filters.active and not replay_request({}, now=NOW).filters.active
    assert set(KNOWN_ERROR_CLASSES) >= {"unknown_version", "contract_violation", "data_error"}


@pytest.mark.parametrize(("argv", "message"), [
    # unpaired offsets
    (["backfill", "telemetry_metrics", "--partition", "0", "--from-offset", "1"],
     "give --partition, --from-offset and --to-offset together"),
    # the same partition twice
    (["backfill", "telemetry_metrics", "--partition", "0", "--from-offset", "1",
      "--to-offset", "2", "--partition", "0", "--from-offset", "3", "--to-offset", "4"],
     "each --partition may be given once"),
    # no range at all
    (["backfill", "telemetry_metrics"], "a backfill needs"),
    # end before start
    (["backfill", "telemetry_metrics", "--partition", "1", "--from-offset", "9",
      "--to-offset", "3"], "partition 1: end 3 is before start 9"),
    # both offsets and time
    (["replay-dlq", "telemetry_metrics", "--partition", "0", "--from-offset", "0",
      "--to-offset", "1", "--from", T0, "--to", T1], "not both"),
    # a window in the future
    (["backfill", "telemetry_metrics", "--from", T0, "--to", "2999-01-01T00:00:00Z"],
     "is in the future"),
    # an unknown class
    (["replay-dlq", "telemetry_metrics", "--error-class", "nope"], "unknown error class"),
    # an unknown pipeline
    (["replay-dlq", "no_such_pipeline"], "unknown pipeline 'no_such_pipeline'"),
    # a negative partition is named as such, not blamed on the offsets
    (["backfill", "telemetry_metrics", "--partition", "-1", "--from-offset", "0",
      "--to-offset", "5"], "partition -1 does not exist: partitions are numbered from 0"),
])
def test_cli_rejects_bad_arguments_with_exit_2(argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_INGEST_PIPELINES", raising=False)  # the shipped pipelines
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("kafka-ingest: ") and message in err
