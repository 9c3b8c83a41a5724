# ruff: noqa: S101  (pytest asserts; the per-file ignore in pyproject.toml covers tests/ only)
"""Unit tests of the Avro rows' pure parts: ``pytest benchmarks/test_avro_rows.py``.

No stack needed, and no timings asserted: the figures are measured, never tested.
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import Any

import avro_rows
import fastavro
import harness
import pytest

from kafka_ingest.config import load_pipelines
from kafka_ingest.contracts.telemetry import MetricEventV2
from kafka_ingest_dev.samples import poison_pills, sample_stream


@pytest.fixture(scope="module")
def pipeline() -> Any:
    return load_pipelines()[harness.BASE_PIPELINE]


def _fake_serializer(event: dict[str, Any]) -> bytes:
    return b"\x00avro:" + json.dumps(event, allow_nan=True).encode()


def test_the_schema_has_the_contracts_fields() -> None:
    names = [f["name"] for f in avro_rows.SCHEMA["fields"]]
    assert sorted(names) == sorted(MetricEventV2.model_fields)
    types = {f["name"]: f["type"] for f in avro_rows.SCHEMA["fields"]}
    assert types["timestamp"] == types["metric_value"] == "double"
    assert types["unit"] == ["null", "string"]  # optional in v2


def test_every_named_kind_is_one_the_sample_makes(pipeline: Any) -> None:
    kinds = {s.kind for s in poison_pills(pipeline, "t", pipeline.max_message_bytes)}
    assert set(avro_rows.AVRO_EXPECT) - {"valid", "duplicate"} <= kinds


def test_pills_are_encoded_or_keep_their_bytes(pipeline: Any) -> None:
    for s in poison_pills(pipeline, "t", pipeline.max_message_bytes):
        got = avro_rows.avro_value(s, _fake_serializer)
        if s.value is None:  # the tombstone stays null
            assert got is None
        elif s.kind in {"nan", "infinity", "nul_in_text", "event_id_empty", "event_id_too_long",
                        "bad_timestamp", "unknown_version", "extra_fields"}:
            # values the record schema carries: the same field values, through the serializer
            assert got == _fake_serializer(json.loads(s.value)), s.kind
        else:  # no magic byte, or over the size limit: as a bypassing producer sends it
            assert got == s.value, s.kind
            assert avro_rows.AVRO_EXPECT.get(s.kind, "not_wire_format") in {
                "not_wire_format", "too_large"}


def test_an_event_reads_back_with_the_same_values(pipeline: Any) -> None:
    parsed = fastavro.parse_schema(avro_rows.SCHEMA)
    sample = next(iter(sample_stream(pipeline, 1, 0, tag="t", partitions=1)))
    assert sample.value is not None
    event = json.loads(sample.value)
    out = io.BytesIO()
    fastavro.schemaless_writer(out, parsed, event)
    assert fastavro.schemaless_reader(io.BytesIO(out.getvalue()), parsed) == event


def _measure(path: str, seconds: list[float], cpu: float) -> harness.Measure:
    mid = sorted(seconds)[(len(seconds) - 1) // 2]
    return harness.Measure(path, 1000, mid, 100.0, 50.0, {"all_seconds": seconds}, cpu)


def test_the_comparison_pairs_runs_by_repeat() -> None:
    # Avro slower by 1.2x in run 1 and 1.5x in runs 2 and 3 (run 2 the slow one for both)
    cmp = avro_rows.compare([_measure(harness.PROJECT_PATH, [1.0, 2.0, 1.2], 0.01),
                              _measure(avro_rows.AVRO_PATH, [1.2, 3.0, 1.8], 0.015)])
    assert cmp["time_ratio_paired"] == [1.2, 1.5, 1.5]
    assert cmp["time_ratio_paired_median"] == 1.5
    assert cmp["time_ratio_of_medians"] == 1.5  # 1.8 s against 1.2 s
    assert cmp["cpu_ratio"] == 1.5
    assert cmp["json_cpu_us_per_event"] == 10.0
    assert cmp["within_target"] is False


class _Message:
    """What validate_chunk reads of a consumed message."""

    def __init__(self, offset: int, value: bytes | None, key: bytes | None) -> None:
        self._offset, self._value, self._key = offset, value, key

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_767_225_600_000

    def headers(self) -> None:
        return None


def test_the_stages_time_validate_chunk_with_the_values_decoded_beforehand(
        pipeline: Any) -> None:
    # The "decoded beforehand" pass hands validate_chunk a stand-in for the decoder: it
    # must answer whatever validate_chunk asks of one (read, checking, python, explained).
    samples = list(sample_stream(pipeline, 20, 0, tag="t", partitions=1))  # no pills
    chunk = SimpleNamespace(messages=[_Message(i, s.value, s.key)
                                      for i, s in enumerate(samples)])
    decoder = SimpleNamespace(read=json.loads, python=True,
                              checking=lambda check: lambda value: check(json.loads(value)),
                              explained=lambda value, error: error)
    spent = dict.fromkeys(("avro_decode_alone", "avro_validate", "avro_predecoded",
                           "avro_total"), 0.0)
    timed = avro_rows._avro_stages(chunk, pipeline, decoder, spent)
    assert timed == sum(s.expect in {"row", "duplicate"} for s in samples) > 0
    assert all(seconds > 0 for seconds in spent.values()), spent
