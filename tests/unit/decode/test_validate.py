"""Validation: every poison pill gets its error class; good rows carry their provenance."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from kafka_ingest.config import OnTombstone, Pipeline
from kafka_ingest.contracts.columns import millis_to_pg
from kafka_ingest.decode.validate import (
    DETAIL_MAX,
    ValidationResult,
    latest_event_ms,
    validate_chunk,
)
from kafka_ingest.errors import DataError
from kafka_ingest.kafka.dlq import DeadLetter, ReplayedMessage
from kafka_ingest.records import MAX_TIMESTAMP_MS, kafka_timestamp_ms, row_source, row_values
from kafka_ingest_dev.samples import make_event, poison_pills, sample_stream
from tests.support import pg_to_datetime

PIPELINES = ["telemetry_metrics", "orders_created"]
MAX_BYTES = 4096


def small(pipeline: Pipeline, **changes: Any) -> Pipeline:
    """The pipeline with a small size limit, so the too_large pill stays small too."""
    return pipeline.model_copy(update={"max_message_bytes": MAX_BYTES, **changes})


@pytest.mark.parametrize("name", PIPELINES)
def test_every_poison_pill_gets_its_expected_error_class(
        name: str, shipped: dict[str, Pipeline], message: Any) -> None:
    pipeline = small(shipped[name])
    pills = poison_pills(pipeline, "unit", MAX_BYTES)
    msgs = [message(s.value, topic_=pipeline.topic, partition_=2, offset_=100 + i, key_=s.key)
            for i, s in enumerate(pills)]

    result = validate_chunk(msgs, pipeline)

    dead_by_offset = {d.source_offset: d for d in result.dead}
    row_offsets = {row_source(row).offset for row in result.rows}
    for i, sample in enumerate(pills):
        offset = 100 + i
        if sample.expect == "row":
            assert offset in row_offsets, sample.kind
        elif sample.expect == "tombstone":
            assert offset not in dead_by_offset and offset not in row_offsets, sample.kind
        else:
            assert offset in dead_by_offset, f"{sample.kind} was not dead-lettered"
            assert dead_by_offset[offset].error_class == sample.expect, (
                f"{sample.kind}: {dead_by_offset[offset].error_detail}")
    expects = [s.expect for s in pills]
    assert result.read == len(pills)
    assert result.tombstones == expects.count("tombstone")
    assert len(result.rows) == expects.count("row")
    assert len(result.dead) == len(pills) - expects.count("row") - expects.count("tombstone")
    assert result.bytes == sum(len(s.value) for s in pills if s.value is not None)


@pytest.mark.parametrize("name", PIPELINES)
def test_dead_letters_keep_bytes_provenance_and_a_bounded_reason(
        name: str, shipped: dict[str, Pipeline], message: Any) -> None:
    pipeline = small(shipped[name])
    pills = [s for s in poison_pills(pipeline, "unit", MAX_BYTES) if s.expect not in
             ("row", "tombstone")]
    msgs = [message(s.value, topic_=pipeline.topic, partition_=1, offset_=i, key_=s.key,
                    timestamp_=(1, 1_700_000_000_000 + i)) for i, s in enumerate(pills)]
    result = validate_chunk(msgs, pipeline)
    assert len(result.dead) == len(pills)
    for i, (sample, letter) in enumerate(zip(pills, result.dead, strict=True)):
        assert letter.source == (pipeline.topic, 1, i)
        assert (letter.key, letter.value) == (sample.key, sample.value)  # bytes unchanged
        assert letter.timestamp_ms == 1_700_000_000_000 + i
        assert letter.contract == pipeline.model.key()
        assert letter.dlq_topic == pipeline.dlq_topic
        assert 0 < len(letter.error_detail) <= DETAIL_MAX


@pytest.mark.parametrize(
    ("rule", "dead", "tombstones"),
    [
        (OnTombstone.SKIP, 0, 1),  # default: counted, not dead-lettered
        (OnTombstone.DEAD_LETTER, 1, 0),  # by rule: parked in the DLQ with the generic class
    ],
)
def test_tombstone_rule(rule: OnTombstone, dead: int, tombstones: int,
                        shipped: dict[str, Pipeline], message: Any) -> None:
    pipeline = small(shipped["telemetry_metrics"], on_tombstone=rule)
    result = validate_chunk([message(None, key_=b"k", offset_=5)], pipeline)
    assert (result.read, len(result.dead), result.tombstones, result.rows) == (
        1, dead, tombstones, [])
    assert result.bytes == 0
    if dead:
        letter = result.dead[0]
        assert (letter.error_class, letter.value, letter.key) == (
            DataError.error_class, None, b"k")
        assert "tombstone" in letter.error_detail


def test_rows_carry_provenance(shipped: dict[str, Pipeline], message: Any) -> None:
    pipeline = shipped["orders_created"]
    event = make_event(pipeline, 3, "prov", random.Random(1))
    value = json.dumps(event).encode()
    msg = message(value, topic_="pedidos-criados", partition_=4, offset_=987,
                  key_=b"customer-1", timestamp_=(1, 1_767_225_600_123))
    no_ts = message(json.dumps(dict(event, event_id="b")).encode(), offset_=988,
                    timestamp_=(0, -1))

    result = validate_chunk([msg, no_ts], pipeline)

    assert result.dead == []
    assert (result.read, result.bytes) == (2, len(value) + len(no_ts.value()))
    row = result.rows[0]  # the table row, flat in COPY order
    assert len(row) == len(pipeline.model.SINK_COLUMNS) + 5
    assert row_values(row) == pipeline.model.model_validate_json(value).sink_values()
    topic, partition, offset, key, kafka_ts = row[-5:]
    assert (topic, partition, offset, key) == ("pedidos-criados", 4, 987, b"customer-1")
    # the broker's milliseconds as the timestamptz they travel as: µs since 2000-01-01
    assert kafka_ts == 820_540_800_123_000 == row_source(row).kafka_timestamp
    assert pg_to_datetime(kafka_ts) == datetime(2026, 1, 1, 0, 0, 0, 123_000, tzinfo=UTC)
    assert row_source(result.rows[1]).kafka_timestamp is None  # no broker timestamp: NULL, not 0


def test_replayed_dead_letters_validate_like_the_source(shipped: dict[str, Pipeline]) -> None:
    pipeline = shipped["telemetry_metrics"]
    good = json.dumps({"event_id": "r1", "device_id": "d", "timestamp": 1.0,
                       "metric_value": 2.0}).encode()
    letters = [
        DeadLetter("telemetry-metrics", 1, 10, b"k", good, 1_000, "contract_violation", "was",
                   "metric_event.v2", pipeline.dlq_topic),
        DeadLetter("telemetry-metrics", 1, 11, None, b"[]", None, "not_an_object", "still",
                   "metric_event.v2", pipeline.dlq_topic),
    ]
    result = validate_chunk([ReplayedMessage(d) for d in letters], pipeline)
    assert [tuple(row_source(r)) for r in result.rows] == [
        ("telemetry-metrics", 1, 10, b"k", millis_to_pg(1_000))]
    assert [(d.source, d.error_class, d.timestamp_ms) for d in result.dead] == [
        (("telemetry-metrics", 1, 11), "not_an_object", None)]


@pytest.mark.parametrize("timestamp", [(1, 0), (1, 1_767_225_600_123), (1, MAX_TIMESTAMP_MS),
                                       (1, MAX_TIMESTAMP_MS + 1), (1, -1), (0, -1),
                                       (0, 1_767_225_600_123), (2, 5)])
def test_the_hot_loops_kafka_timestamp_is_kafka_timestamp_ms_as_it_travels(
        shipped: dict[str, Pipeline], message: Any, timestamp: tuple[int, int]) -> None:
    # validate_chunk inlines kafka_timestamp_ms and millis_to_pg (a frame a message less):
    # the same value, NULL included, whatever the broker sent.
    pipeline = shipped["telemetry_metrics"]
    msg = message(json.dumps(make_event(pipeline, 1, "ts", random.Random(3))).encode(),
                  timestamp_=timestamp)
    (row,) = validate_chunk([msg], pipeline).rows
    ms = kafka_timestamp_ms(msg)
    assert row_source(row).kafka_timestamp == (None if ms is None else millis_to_pg(ms))


def test_an_empty_chunk(shipped: dict[str, Pipeline]) -> None:
    result = validate_chunk([], shipped["orders_created"])
    assert (result.read, result.bytes, result.rows, result.dead, result.tombstones) == (
        0, 0, [], [], 0)


def test_a_timestamp_no_date_can_hold_is_null_not_a_failed_batch(
        shipped: dict[str, Pipeline], message: Any) -> None:
    # Brokers before Kafka 4 accept any long as a CreateTime; year 33658 has no datetime.
    pipeline = shipped["telemetry_metrics"]
    event = make_event(pipeline, 1, "ts", random.Random(2))
    good = message(json.dumps(event).encode(), timestamp_=(1, 10**15))
    bad = message(b"not json", offset_=1, timestamp_=(1, 10**15))

    result = validate_chunk([good, bad], pipeline)

    assert len(result.rows) == 1 and row_source(result.rows[0]).kafka_timestamp is None
    assert [d.timestamp_ms for d in result.dead] == [None]


@pytest.mark.parametrize("name", PIPELINES)
def test_the_fields_validator_gives_the_models_verdict_rows_and_reasons(
        name: str, shipped: dict[str, Pipeline], message: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain contract is validated by its fields' validator (no model instance built);
    # every pill and event must come out exactly as with the model's own validator.
    from kafka_ingest.contracts import base

    pipeline = small(shipped[name])
    assert base.hot_validation(pipeline.model).by_key
    samples = [*sample_stream(pipeline, 50, 0, tag="eq", partitions=1),
               *poison_pills(pipeline, "unit", MAX_BYTES)]
    msgs = [message(s.value, topic_=pipeline.topic, partition_=1, offset_=i, key_=s.key)
            for i, s in enumerate(samples)]
    fast = validate_chunk(msgs, pipeline)
    monkeypatch.setitem(base._VALIDATIONS, pipeline.model,
                        base.Validation(pipeline.model.__pydantic_validator__, by_key=False))
    slow = validate_chunk(msgs, pipeline)
    assert fast.rows == slow.rows and len(fast.rows) >= 50
    assert [(d.source_offset, d.error_class, d.error_detail) for d in fast.dead] == \
        [(d.source_offset, d.error_class, d.error_detail) for d in slow.dead]
    assert (fast.read, fast.bytes, fast.tombstones) == (slow.read, slow.bytes, slow.tombstones)


def test_a_contract_with_a_model_validator_keeps_the_models_validator(
        shipped: dict[str, Pipeline], message: Any) -> None:
    from pydantic import model_validator

    from kafka_ingest.contracts import base

    pipeline = shipped["telemetry_metrics"]

    class Capped(pipeline.model):  # type: ignore[name-defined]
        @model_validator(mode="after")
        def _cap(self) -> Any:
            if self.metric_value > 100:
                raise ValueError("metric_value over 100")
            return self

    capped = pipeline.model_copy()
    object.__setattr__(capped, "_model", Capped)  # the pipeline's contract, as if declared so
    assert not base.hot_validation(Capped).by_key
    event = make_event(pipeline, 1, "cap", random.Random(3))
    msgs = [message(json.dumps({**event, "metric_value": v}).encode(), offset_=i)
            for i, v in enumerate((5.0, 500.0))]
    result = validate_chunk(msgs, capped)
    assert [row_source(r).offset for r in result.rows] == [0]
    assert [d.error_detail for d in result.dead] == [
        "(root): Value error, metric_value over 100 [value_error]"]


@pytest.mark.parametrize("name", ["telemetry_metrics", "orders_created", "device_state",
                                  "account_balances"])
def test_each_row_is_the_contracts_values_converted_then_its_columns_and_provenance(
        name: str, shipped: dict[str, Pipeline], message: Any) -> None:
    # The hot loop builds each row with a function made for the pipeline
    # (row_builder): it must be what the contract, the key and header columns and the
    # message say, written the plain way here.
    from kafka_ingest.decode.message_columns import column_reader

    pipeline = shipped[name]
    stamps = [(1, 1_767_225_600_123), (0, -1), (1, 0), (2, 1_700_000_000_001)]
    values = ([json.dumps({"event_id": f"a-{i}", "balance": "12.50", "currency": "EUR",
                           "updatedAt": 1_767_225_600_123 + i,
                           "limits": {"daily": i} if i % 2 else None}).encode()
               for i in range(40)] if name == "account_balances" else
              [s.value for s in sample_stream(pipeline, 40, 0, tag="rb", partitions=1)])
    msgs = [message(v, topic_=pipeline.topic, partition_=i % 3, offset_=100 + i,
                    key_=b"k-%d" % i, headers_=(("trace-id", b"t-%d" % i),),
                    timestamp_=stamps[i % len(stamps)])
            for i, v in enumerate(values) if v is not None]
    result = validate_chunk(msgs, pipeline)
    assert result.dead == [] and len(result.rows) == len(msgs) >= 40
    model, extra = pipeline.model, column_reader(pipeline)
    for msg, row in zip(msgs, result.rows, strict=True):
        event = model.model_validate_json(msg.value())
        values = []
        for column, _ in model.SINK_COLUMNS:
            value = getattr(event, column)
            convert = model.CONVERTED.get(column, (None, None))[1]
            values.append(convert(value) if convert and value is not None else value)
        ms = kafka_timestamp_ms(msg)
        assert row == (*values, *(extra(msg) if extra else ()), msg.topic(), msg.partition(),
                       msg.offset(), msg.key(), None if ms is None else millis_to_pg(ms))


def test_a_declared_contract_gets_the_same_rows_and_reasons_from_its_fields_validator(
        shipped: dict[str, Pipeline], message: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # account_balance: a payload name that is not the column (updatedAt), an epoch
    # converted before it travels, a decimal, an optional jsonb, a bounded text
    from kafka_ingest.contracts import base

    pipeline = shipped["account_balances"]
    assert base.hot_validation(pipeline.model).by_key
    good = {"event_id": "a-1", "balance": "12.50", "currency": "EUR",
            "updatedAt": 1_767_225_600_123}
    values = [json.dumps(v).encode() for v in (
        good, {**good, "limits": {"daily": 5}}, {**good, "limits": None},
        {**good, "updated_at": 1}, {k: v for k, v in good.items() if k != "updatedAt"},
        {**good, "currency": "EURO"}, {**good, "balance": 12.5}, {**good, "version": 2},
        {**good, "updatedAt": -1}, {**good, "extra": [1]}, {"event_id": ""})] + [
        b"[]", b"null", b'"x"', b"{", b"\xff"]
    msgs = [message(v, offset_=i, key_=b"acct-%d" % i, headers_=(("trace-id", b"t"),))
            for i, v in enumerate(values)]
    fast = validate_chunk(msgs, pipeline)
    monkeypatch.setitem(base._VALIDATIONS, pipeline.model,
                        base.Validation(pipeline.model.__pydantic_validator__, by_key=False))
    slow = validate_chunk(msgs, pipeline)
    assert fast.rows == slow.rows
    # loaded: the event, with limits, limits null, an unknown key, the balance as a JSON
    # number (a numeric column takes it), another unknown key
    assert [row_source(r).offset for r in fast.rows] == [0, 1, 2, 3, 6, 9]
    assert [(d.source_offset, d.error_class, d.error_detail) for d in fast.dead] == \
        [(d.source_offset, d.error_class, d.error_detail) for d in slow.dead]
    assert [d.error_class for d in fast.dead].count("not_an_object") == 3


def test_a_contract_with_a_field_validator_or_private_state_keeps_the_models_validator(
        shipped: dict[str, Pipeline], message: Any) -> None:
    # The fields' validator is made from the fields alone: whatever the model adds to them
    # (a field validator, a model_post_init that private attributes bring) would be lost.
    from pydantic import PrivateAttr, field_validator

    from kafka_ingest.contracts import base

    pipeline = shipped["telemetry_metrics"]

    class Checked(pipeline.model):  # type: ignore[name-defined]
        @field_validator("device_id")
        @classmethod
        def _known(cls, value: str) -> str:
            if not value.startswith("device-"):
                raise ValueError("an unknown device")
            return value

    class Stateful(pipeline.model):  # type: ignore[name-defined]
        _seen: int = PrivateAttr(default=0)

    assert (base.hot_validation(Checked).by_key, base.hot_validation(Stateful).by_key) == (
        False, False)
    checked = pipeline.model_copy()
    object.__setattr__(checked, "_model", Checked)  # the pipeline's contract, as if declared so
    event = make_event(pipeline, 1, "chk", random.Random(4))
    msgs = [message(json.dumps({**event, "device_id": d}).encode(), offset_=i)
            for i, d in enumerate(("device-1", "sensor-1"))]
    result = validate_chunk(msgs, checked)
    assert [row_source(r).offset for r in result.rows] == [0]
    assert [d.error_detail for d in result.dead] == [
        "device_id: Value error, an unknown device [value_error]"]


def test_rows_are_made_without_generated_code_or_pydantic_core_internals() -> None:
    # Rows and validators come from plain Python and pydantic's public API: nothing read out
    # of a model's core schema, and no function compiled from made-up source but the flat
    # Avro reader's (measured, and checked in test_formats: its code calls only the names
    # it is given, whatever the schema's names).
    import ast
    from pathlib import Path

    import kafka_ingest

    core = Path(kafka_ingest.__file__).parent
    found, compiled = [], []
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        owner = {child: f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 for child in ast.walk(f)}  # the innermost function wins: walked last
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("exec", "eval", "compile")):
                compiled.append((str(path.relative_to(core)), owner.get(node), node.func.id))
            elif (isinstance(node, ast.Attribute) and node.attr == "__pydantic_core_schema__"
                  ) or (isinstance(node, ast.Constant)
                        and node.value in ("model-fields", "post_init")):
                found.append(f"{path.relative_to(core)}:{node.lineno}")
    assert found == []
    assert sorted(compiled) == [("decode/codecs/avro.py", "_flat_reader", "compile"),
                                ("decode/codecs/avro.py", "_flat_reader", "exec")]


def test_the_latest_event_time_by_field_or_kafka_timestamp(shipped: dict[str, Pipeline],
                                                           message: Any) -> None:
    # orders' timestamp is an ISO-8601 datetime as the row holds it (not converted)
    orders = shipped["orders_created"].model_copy(update={"event_time": "timestamp"})
    rng = random.Random(7)
    events = [make_event(orders, i, "t", rng) for i in range(3)]
    msgs = [message(json.dumps(e).encode(), offset_=i, timestamp_=(1, 1_000 + i))
            for i, e in enumerate(events)]
    result = validate_chunk([*msgs, message(b"[]", offset_=9, timestamp_=(1, 5_000))], orders)
    assert len(result.rows) == 3 and len(result.dead) == 1
    latest = max(datetime.fromisoformat(e["timestamp"]) for e in events)
    assert latest_event_ms(result, orders) == int(latest.timestamp() * 1000)
    # by the Kafka timestamp: the dead letter's counts too (it was handled)
    kafka = orders.model_copy(update={"event_time": None})
    assert latest_event_ms(result, kafka) == 5_000
    assert latest_event_ms(validate_chunk([], orders), orders) is None


def test_event_times_that_cannot_be_compared_hold_the_watermark_back_not_the_chunk(
        shipped: dict[str, Pipeline], caplog: pytest.LogCaptureFixture) -> None:
    # none should reach a row; if one did, the chunk still loads, without a watermark
    orders = shipped["orders_created"].model_copy(update={"event_time": "timestamp"})
    at = orders.event_time_index
    naive, aware = datetime(2026, 1, 1), datetime(2026, 1, 1, tzinfo=UTC)
    rows = [tuple(v if i != at else t for i, v in enumerate(range(12))) for t in (naive, aware)]
    result = ValidationResult(rows=rows)
    assert latest_event_ms(result, orders) is None
    assert "does not advance the watermark" in caplog.text
