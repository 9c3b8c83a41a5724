"""Pipeline config: the shipped file loads, and every mistake is a ValueError naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kafka_ingest.config import (
    DEFAULT_PIPELINES_FILE,
    DEFAULT_POOL_SLOTS,
    OnOffsetGap,
    OnTombstone,
    Pipeline,
    StartPolicy,
    UpsertMode,
    airflow_pools,
    get_pipeline,
    load_pipelines,
    parse_pipelines,
    pipelines_file,
    pool_import_document,
)
from kafka_ingest.contracts import MetricEventV2, OrderCreatedV1

GOOD: dict[str, Any] = {
    "topic": "t-in",
    "contract": {"event_type": "metric_event", "version": 2},
    "table": "t_rows",
    "dlq_topic": "t-in-dlq",
}


def document(**body: Any) -> dict[str, Any]:
    return {"pipelines": {"p1": {**GOOD, **body}}}


def test_the_shipped_file_loads(shipped: dict[str, Pipeline]) -> None:
    assert set(shipped) >= {"telemetry_metrics", "orders_created"}
    telemetry, orders = shipped["telemetry_metrics"], shipped["orders_created"]
    assert (telemetry.topic, telemetry.table, telemetry.dlq_topic) == (
        "telemetry-metrics", "telemetry_metrics", "telemetry-metrics-dlq")
    assert telemetry.model is MetricEventV2
    assert (orders.topic, orders.table, orders.dlq_topic) == (
        "pedidos-criados", "orders_created", "pedidos-criados-dlq")
    assert orders.model is OrderCreatedV1
    for name, p in shipped.items():
        assert p.name == name
        assert p.start_policy is StartPolicy.EARLIEST  # from the file's defaults
        assert p.on_offset_gap is OnOffsetGap.FAIL
        # from the file's defaults, but for the state pipeline that deletes
        assert p.on_tombstone is (OnTombstone.DELETE if name == "account_balances"
                                  else OnTombstone.SKIP)
        assert p.asset_uri == f"postgres://{p.asset_host}/{p.asset_database}/public/{p.table}"
        assert p.group_id == f"kafka-ingest.{name}"


def test_shipped_latest_upsert_pipeline(shipped: dict[str, Pipeline]) -> None:
    state = shipped["device_state"]
    assert state.upsert.mode is UpsertMode.LATEST
    assert state.upsert.key in state.column_names


def test_the_shipped_declared_pipeline_needs_no_python(shipped: dict[str, Pipeline]) -> None:
    balances = shipped["account_balances"]
    assert balances.model.DECLARATION is not None and balances.model.key() == "account_balance.v1"
    assert balances.column_names == ("event_id", "balance", "currency", "updated_at",
                                     "limits", "account_id", "trace_id")
    assert balances.conflict_columns == ("account_id",)
    assert balances.source_topic_config == {"cleanup.policy": "compact"}
    assert balances.topic_config == {}  # its dead letters are never compacted away


def test_defaults_apply_and_an_entry_overrides_them() -> None:
    doc = {"defaults": {"chunk_size": 7, "on_tombstone": "dead_letter"},
           "pipelines": {"p1": {**GOOD, "chunk_size": 9}, "p2": {**GOOD, "dlq_topic": "x"}}}
    pipelines = parse_pipelines(doc)
    assert pipelines["p1"].chunk_size == 9
    assert pipelines["p2"].chunk_size == 7
    assert pipelines["p2"].on_tombstone is OnTombstone.DEAD_LETTER


BAD_ENTRIES = [
    # a typo in a key is an error, not a silently ignored setting
    ({"chunk_sise": 10}, r"pipelines\.p1\.chunk_sise: unknown key"),
    # a typo inside a nested mapping names the full path
    ({"contract": {"event_type": "metric_event", "version": 2, "verison": 2}},
     r"pipelines\.p1\.contract\.verison: unknown key"),
    # wrong type: not a number
    ({"chunk_size": "many"}, r"pipelines\.p1\.chunk_size: Input should be a valid integer"),
    # out of bounds
    ({"chunk_size": 0}, r"pipelines\.p1\.chunk_size: Input should be greater than or equal to 1"),
    # wrong type: a list where a mapping belongs
    ({"contract": ["metric_event", 2]}, r"pipelines\.p1\.contract: Input should be"),
    # an enum value that does not exist
    ({"start_policy": "newest"}, r"pipelines\.p1\.start_policy: Input should be 'earliest'"),
    # a topic name Kafka would refuse
    ({"topic": "has space"}, r"pipelines\.p1\.topic: String should match pattern"),
    # a table name that is not a safe identifier
    ({"table": "Rows; DROP"}, r"pipelines\.p1\.table: String should match pattern"),
    # a missing required key
    ({"table": None}, r"pipelines\.p1\.table: Input should be a valid string"),
    # a contract that is not registered
    ({"contract": {"event_type": "metric_event", "version": 9}},
     r"pipelines\.p1.*unknown contract 'metric_event\.v9'"),
    # upsert latest needs the entity key
    ({"upsert": {"mode": "latest"}}, r"pipelines\.p1\.upsert: .*needs upsert\.key"),
    # an upsert key that is not a column of the contract
    ({"upsert": {"mode": "latest", "key": "nope"}},
     r"pipelines\.p1.*upsert\.key 'nope' is not a column"),
    # an order_by that is not a column (a typo would fail only at the first chunk)
    ({"upsert": {"mode": "latest", "key": "device_id", "order_by": "timestmap"}},
     r"pipelines\.p1.*upsert\.order_by 'timestmap' is not a column"),
    # an optional (nullable) ordering column: null versions could not be ordered
    ({"upsert": {"mode": "latest", "key": "device_id", "order_by": "unit"}},
     r"upsert\.order_by 'unit' must be a required field"),
    # an entity key with a default is not a key
    ({"upsert": {"mode": "latest", "key": "status"}},
     r"upsert\.key 'status' must be a required field"),
    # append with a key is a contradiction
    ({"upsert": {"key": "device_id"}}, r"pipelines\.p1\.upsert: .*only used with upsert\.mode"),
    # the DLQ must not be the source topic (the pipeline would read its own dead letters)
    ({"dlq_topic": "t-in"}, r"pipelines\.p1.*dlq_topic must differ from topic"),
    # a pool's size without a pool sizes nothing
    ({"pool_slots": 4}, r"pipelines\.p1.*pool_slots is the size of the pipeline's pool"),
    # a pool name Airflow's CLI and URLs could not carry
    ({"pool": "pg writers"}, r"pipelines\.p1\.pool: String should match pattern"),
    # no slice could ever run
    ({"max_parallel_partitions": 0},
     r"pipelines\.p1\.max_parallel_partitions: .*greater than or equal to 1"),
    ({"pool": "w", "pool_slots": 0}, r"pipelines\.p1\.pool_slots: .*greater than or equal to 1"),
    # an event time that is not a field, or not a time (the watermark could not be read)
    ({"event_time": "timestmap"}, r"pipelines\.p1.*event_time 'timestmap' must be a "
                                   r"timestamptz field of contract metric_event\.v2"),
    ({"event_time": "metric_value"}, r"event_time 'metric_value' must be a timestamptz"),
]


def test_event_time_names_a_timestamptz_field_or_is_the_kafka_timestamp() -> None:
    [by_field] = parse_pipelines(document(event_time="timestamp")).values()
    [by_kafka] = parse_pipelines(document()).values()
    # the row's place of the field's column; of the Kafka timestamp, the last
    assert by_field.event_time_index == by_field.column_names.index("timestamp")
    assert (by_field.event_time_column, by_kafka.event_time_column) == (
        "timestamp", "kafka_timestamp")
    assert (by_field.event_time, by_kafka.event_time, by_kafka.event_time_index) == (
        "timestamp", None, -1)


@pytest.mark.parametrize(("change", "message"), BAD_ENTRIES)
def test_bad_entry_names_pipeline_and_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_pipelines(document(**change), source="pipes.yaml")
    assert str(info.value).startswith("pipes.yaml: ")


def test_a_required_key_left_out_is_named() -> None:
    body = {k: v for k, v in GOOD.items() if k != "dlq_topic"}
    with pytest.raises(ValueError, match=r"pipelines\.p1\.dlq_topic: Field required"):
        parse_pipelines({"pipelines": {"p1": body}})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2], "top level must be a mapping"),  # a list at the top
        ({"pipelines": {}, "pipeline": {}}, "top level must be a mapping"),  # unknown top key
        ({"pipelines": [GOOD]}, "'pipelines' and 'defaults' must be mappings"),  # a list
        ({"pipelines": {"p1": "topic"}}, "pipelines.p1 must be a mapping"),  # scalar entry
        ({"defaults": {"chunk_sise": 1}, "pipelines": {"p1": GOOD}},  # typo in defaults
         r"pipelines\.p1\.chunk_sise: unknown key"),
        ({"pipelines": {"Bad-Name": GOOD}}, r"pipelines\.Bad-Name\.name"),  # unsafe name
    ],
)
def test_bad_document_shape(doc: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pipelines(doc)


def test_bad_yaml(tmp_path: Path) -> None:
    file = tmp_path / "pipelines.yaml"
    file.write_text("pipelines:\n  p1: {topic: [unclosed\n", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid YAML") as info:
        load_pipelines(file)
    assert str(file) in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    file = tmp_path / "absent.yaml"
    with pytest.raises(ValueError, match="cannot read pipelines file") as info:
        load_pipelines(file)
    assert str(file) in str(info.value)


def test_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "other.yaml"
    file.write_text(yaml.safe_dump(document(chunk_size=123)), encoding="utf-8")
    monkeypatch.setenv("KAFKA_INGEST_PIPELINES", str(file))
    assert pipelines_file() == file
    pipelines = load_pipelines()
    assert list(pipelines) == ["p1"]
    assert pipelines["p1"].chunk_size == 123
    assert get_pipeline("p1").topic == "t-in"
    monkeypatch.delenv("KAFKA_INGEST_PIPELINES")
    assert pipelines_file() == DEFAULT_PIPELINES_FILE


def test_get_pipeline_unknown_name_lists_the_defined_ones(tmp_path: Path) -> None:
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(document()), encoding="utf-8")
    with pytest.raises(ValueError, match=r"unknown pipeline 'nope'; defined: p1"):
        get_pipeline("nope", file)


def test_pipelines_are_frozen(shipped: dict[str, Pipeline]) -> None:
    with pytest.raises(ValueError, match="frozen"):
        shipped["orders_created"].chunk_size = 1  # type: ignore[misc]


def test_slices_share_default_pool_eight_at_a_time_unless_told(
        shipped: dict[str, Pipeline]) -> None:
    for p in shipped.values():
        assert (p.pool, p.pool_slots, p.max_parallel_partitions) == (None, None, 8)
    assert airflow_pools(shipped) == {}  # Airflow's default_pool is left alone


def _pools_doc(**bodies: dict[str, Any]) -> dict[str, Any]:
    return {"pipelines": {name: {**GOOD, "topic": f"t-{name}", "dlq_topic": f"d-{name}",
                                 **body} for name, body in bodies.items()}}


def test_pools_named_by_pipelines_and_their_sizes() -> None:
    pipelines = parse_pipelines(_pools_doc(
        a={"pool": "pg_writers", "pool_slots": 4},
        b={"pool": "pg_writers"},  # shares a's pool, and its size
        c={"pool": "solo"},  # sized by nobody: the documented default
        d={},  # default_pool
        e={"pool": "default_pool"},  # Airflow's own, sized by nobody: left alone
    ))
    assert airflow_pools(pipelines) == {"pg_writers": 4, "solo": DEFAULT_POOL_SLOTS}
    assert DEFAULT_POOL_SLOTS == 8
    assert pool_import_document(pipelines) == {
        "pg_writers": {"slots": 4, "include_deferred": False,
                       "description": "kafka-ingest: slices of a, b"},
        "solo": {"slots": 8, "include_deferred": False,
                 "description": "kafka-ingest: slices of c"},
    }


def test_default_pool_is_sized_only_when_a_pipeline_says_so() -> None:
    pipelines = parse_pipelines(_pools_doc(a={"pool": "default_pool", "pool_slots": 16}))
    assert airflow_pools(pipelines) == {"default_pool": 16}


def test_two_sizes_for_one_pool_is_an_error_naming_both_pipelines() -> None:
    with pytest.raises(ValueError, match=r"pipes\.yaml: pipelines a, b give the pool 'pg' "
                                         r"different sizes \(2, 3\)"):
        parse_pipelines(_pools_doc(a={"pool": "pg", "pool_slots": 2},
                                   b={"pool": "pg", "pool_slots": 3}), source="pipes.yaml")


LATEST = {"upsert": {"mode": "latest", "key": "device_id"}}
DELETING = {"record_key": {"column": "entity"}, "on_tombstone": "delete",
            "upsert": {"mode": "latest", "key": "entity", "order_by": "source_offset"}}


@pytest.mark.parametrize(("a", "b"), [
    # two topics into one latest table: their offsets order nothing against each other
    ({**LATEST, "table": "state"}, {**LATEST, "table": "state", "topic": "other-in"}),
    # an append and a latest pipeline: one keeps every event, the other one per key
    ({"table": "state"}, {**LATEST, "table": "state"}),
    # the same topic and upsert, but only one deletes on tombstones: the other, knowing
    # nothing of the deletion markers, would write a deleted key's older version back
    ({**DELETING, "table": "state"},
     {**DELETING, "table": "state", "on_tombstone": "skip"}),
])
def test_a_latest_table_written_from_two_topics_or_two_ways_is_refused(
        a: dict[str, Any], b: dict[str, Any]) -> None:
    doc = {"pipelines": {"a": {**GOOD, **a}, "b": {**GOOD, "dlq_topic": "b-dlq", **b}}}
    with pytest.raises(ValueError, match=r"pipelines a \(.*\), b \(.*\) all write table "
                                         r"'state'.*cannot be ordered"):
        parse_pipelines(doc)


def test_append_pipelines_may_share_a_table_across_topics() -> None:
    # event_id decides what is stored, whichever topic an event came from
    doc = {"pipelines": {"a": {**GOOD, "table": "events"},
                         "b": {**GOOD, "table": "events", "topic": "other-in",
                               "dlq_topic": "b-dlq"}}}
    assert set(parse_pipelines(doc)) == {"a", "b"}
