# ruff: noqa: S101  (pytest asserts; the per-file ignore in pyproject.toml covers tests/ only)
"""Unit tests of the benchmark peers' pure parts: ``pytest benchmarks/test_connect.py``.

No stack needed, and no timings asserted: the figures are measured, never tested.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import expected_dead
from peers import connect


def test_envelope_is_jsonconverter_schema_and_payload() -> None:
    value = b'{"event_id": "e-1", "device_id": "d", "timestamp": 1.5, "metric_value": 2.0, ' \
            b'"status": "OK", "version": 2, "unit": "celsius", "extra": 1}'
    doc = json.loads(connect.envelope(value))
    assert set(doc) == {"schema", "payload"}
    assert doc["payload"] == json.loads(value)  # byte for byte the same event
    fields = {f["field"]: f for f in doc["schema"]["fields"]}
    assert fields["event_id"]["optional"] is False
    assert fields["timestamp"]["type"] == "double"
    assert fields["unit"]["optional"] is True


def test_only_loadable_events_are_wrapped() -> None:
    def sample(value: bytes | None, expect: str) -> SimpleNamespace:
        return SimpleNamespace(value=value, expect=expect)

    assert (connect.connect_value(sample(b'{"event_id": "x"}', "row")) or b"").startswith(
        b'{"schema":')
    assert (connect.connect_value(sample(b'{"event_id": "x"}', "duplicate")) or b"").startswith(
        b'{"sch')
    poison = b'{"event_id": "x", "metric_value": "12"}'
    assert connect.connect_value(sample(poison, "contract_violation")) == poison
    assert connect.connect_value(sample(None, "tombstone")) is None


def test_properties_fill_every_placeholder(tmp_path: Path) -> None:
    values = {"name": "n", "tasks": 3, "topic": "t", "table": "tbl", "dlq": "d", "host": "h",
              "port": 1, "dbname": "db", "user": "u", "password": "p"}
    sink = connect.read_properties(connect.CONNECT_DIR / "jdbc-sink.properties", values)
    assert sink["connection.url"] == "jdbc:postgresql://h:1/db?reWriteBatchedInserts=true"
    assert sink["tasks.max"] == "3"
    assert sink["batch.size"] == sink["consumer.override.max.poll.records"] == "5000"
    assert sink["transforms.provenance.type"].endswith("InsertField$Value")
    worker = connect.read_properties(connect.CONNECT_DIR / "worker.properties", {
        "bootstrap": "b:1", "work": tmp_path, "plugins": tmp_path, "rest_port": 9})
    assert worker["listeners"] == "http://127.0.0.1:9"
    assert worker["connector.client.config.override.policy"] == "All"
    for props in (sink, worker):
        assert not any("{" in v for v in props.values()), props
    written = connect.write_properties(tmp_path / "w.properties", worker)
    assert connect.read_properties(written, {}) == worker


def test_expected_dead_counts_poison_only() -> None:
    expect = {"row": 10, "duplicate": 2, "tombstone": 1, "undecodable": 3, "too_large": 1}
    assert expected_dead(expect) == 4


def test_cache_dir_is_named_after_the_pom(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = connect.connect_cache()
    assert cache.parent == tmp_path / "kafka-ingest"
    assert cache.name.startswith("connect-") and len(cache.name) == len("connect-") + 12
