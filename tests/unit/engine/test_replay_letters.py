"""Which DLQ records a replay re-validates, and which it leaves (no services)."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.config import DlqHeaderStyle, Pipeline, parse_pipelines
from kafka_ingest.engine.replay import _letter_of
from kafka_ingest.kafka.dlq import PREFIX, DeadLetter, headers_for


def _record(message: Any, pipeline: Pipeline, *, dropped: bool = False,
            **header_args: Any) -> Any:
    letter = DeadLetter(source_topic=pipeline.topic, source_partition=0, source_offset=5,
                        key=b"k", value=b"{}", timestamp_ms=None,
                        error_class="too_large", error_detail="big",
                        contract="metric_event.v2", dlq_topic=pipeline.dlq_topic)
    headers = headers_for(letter, pipeline.name, DlqHeaderStyle.BOTH, **header_args)
    if dropped:  # as the producer of dead letters marks a record whose own headers went
        headers.append((PREFIX + "headers.dropped", b"2"))
    return message(b"{}", topic_=pipeline.dlq_topic, offset_=9, key_=b"k",
                   headers_=tuple(headers))


@pytest.mark.parametrize(("header_args", "outcome"), [
    ({}, ""),  # a whole record: replayed
    ({"truncated_from": 2_000_000}, "truncated"),  # the value was cut: not the original
    ({"key_truncated_from": 300_000}, "truncated"),  # the key was cut: not the original
])
def test_only_whole_records_are_replayed(shipped: dict[str, Pipeline], message: Any,
                                         header_args: dict[str, int], outcome: str) -> None:
    pipeline = shipped["telemetry_metrics"]
    letter, why = _letter_of(pipeline, _record(message, pipeline, **header_args))
    assert why == outcome
    assert (letter is None) is bool(outcome)


def test_another_pipelines_letters_are_left_alone(shipped: dict[str, Pipeline],
                                                  message: Any) -> None:
    record = _record(message, shipped["orders_created"])
    assert _letter_of(shipped["telemetry_metrics"], record) == (None, "other_pipeline")
    assert PREFIX + "pipeline" in dict(record.headers())


def test_a_letter_whose_headers_were_dropped_is_left_when_the_pipeline_reads_headers(
        shipped: dict[str, Pipeline], message: Any) -> None:
    telemetry = shipped["telemetry_metrics"]
    with_trace = parse_pipelines({"pipelines": {telemetry.name: {
        **telemetry.model_dump(mode="json", exclude={"name"}),
        "headers": {"trace-id": "trace_id"}}}})[telemetry.name]
    # its header columns would load NULL (or park it as a missing required header)
    assert _letter_of(with_trace, _record(message, with_trace, dropped=True)) == \
        (None, "headers_dropped")
    # a pipeline without header columns loads nothing from them: the letter is whole to it
    letter, why = _letter_of(telemetry, _record(message, telemetry, dropped=True))
    assert (letter is not None, why) == (True, "")
