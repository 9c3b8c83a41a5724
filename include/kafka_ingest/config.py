"""Pipeline definitions: one YAML entry per pipeline (topic -> contract -> table).

The file is ``include/pipelines.yaml`` unless ``KAFKA_INGEST_PIPELINES`` names another.
Loading validates everything at once: an unknown key, a wrong type or a contract that is
not registered raises ``ValueError`` naming the pipeline and the key, before any DAG or
run is built from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kafka_ingest.contracts import REGISTRY, Contract, get_contract
from kafka_ingest.contracts.columns import Column, contract_columns, refuse_system_column
from kafka_ingest.contracts.declared import (
    RESERVED_COLUMNS,
    ContractSpec,
    build_versions,
    declared_model,
)

DEFAULT_PIPELINES_FILE = Path(__file__).resolve().parent.parent / "pipelines.yaml"
_NAME = r"^[a-z][a-z0-9_]{0,62}$"
_TOPIC = r"^[A-Za-z0-9._-]{1,249}$"
_DOTTED = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
_POOL = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}$"
#: Airflow's own pool, used when a pipeline names none.
DEFAULT_POOL = "default_pool"
#: The size of a pipeline's pool when no pipeline naming it says ``pool_slots``.
DEFAULT_POOL_SLOTS = 8


class StartPolicy(StrEnum):
    """Where a partition with no stored offset starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


class OnOffsetGap(StrEnum):
    """What to do when retention deleted offsets that were never ingested."""

    FAIL = "fail"
    SKIP = "skip"


class OnTombstone(StrEnum):
    """What to do with a record whose value is null. ``delete``: the record key's row is
    deleted (``latest`` pipelines keyed by the record key, in log order)."""

    SKIP = "skip"
    DEAD_LETTER = "dead_letter"
    DELETE = "delete"


class KeyFormat(StrEnum):
    """How the record key is read: UTF-8 text, JSON (a string or integer, or one ``field``
    of a JSON object), or ``registry``: the pipeline's registry format (Avro, Protobuf or
    JSON Schema in the wire format: a primitive, or one ``field`` of a record)."""

    STRING = "string"
    JSON = "json"
    REGISTRY = "registry"


class KeyType(StrEnum):
    TEXT = "text"
    BIGINT = "bigint"


#: The order of a pipeline's log: ``upsert.order_by`` may name it instead of a field.
LOG_ORDER = "source_offset"


class Format(StrEnum):
    """How a record's value is encoded. ``avro``, ``protobuf`` and ``json_schema`` are the
    Confluent wire format (magic byte 0, a 4-byte schema id, the payload) with the writer's
    schema in a schema registry. Each is read by its codec
    (:func:`kafka_ingest.decode.codecs.codec_for`), which knows everything else about it."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "json_schema"

    @property
    def registry(self) -> bool:
        """Whether writer schemas come from a schema registry: every format but plain
        JSON. (The one fact about formats kept here: the pipelines file is checked
        against it when it loads, below the codecs.)"""
        return self is not Format.JSON


class SubjectStrategy(StrEnum):
    """The registry subject a topic's schemas are under: ``topic``: ``<topic>-value``
    (TopicNameStrategy, the default); ``record``: the record's full name
    (RecordNameStrategy); ``topic_record``: ``<topic>-<record>``."""

    TOPIC = "topic"
    RECORD = "record"
    TOPIC_RECORD = "topic_record"


class UpsertMode(StrEnum):
    """``append``: events are immutable, ``ON CONFLICT (event_id) DO NOTHING``.
    ``latest``: keep the newest event per key (by event timestamp, then source offset)."""

    APPEND = "append"
    LATEST = "latest"


class DlqHeaderStyle(StrEnum):
    """Header names of dead letters: ours, Kafka Connect's ``__connect.errors.*``, or both."""

    NATIVE = "native"
    CONNECT = "connect"
    BOTH = "both"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContractRef(_Strict):
    event_type: str
    version: Annotated[int, Field(ge=1)]


class Upsert(_Strict):
    mode: UpsertMode = UpsertMode.APPEND
    #: ``latest`` only: the entity key column (the table's primary key): a field of the
    #: contract, or the ``record_key`` column.
    key: str | None = None
    #: ``latest`` only: the event-time column that orders versions of an entity, or
    #: ``source_offset``: the log's order (what a compacted topic means by "latest").
    order_by: str = "timestamp"

    @model_validator(mode="after")
    def _key_for_latest(self) -> Upsert:
        if self.mode is UpsertMode.LATEST and not self.key:
            raise ValueError("upsert.mode 'latest' needs upsert.key (the entity key column)")
        if self.mode is UpsertMode.APPEND and self.key:
            raise ValueError("upsert.key is only used with upsert.mode 'latest'")
        return self


class RecordKey(_Strict):
    """The record key as a column (Kafka Connect's ``pk.mode=record_key``)."""

    column: Annotated[str, Field(pattern=_NAME)]
    format: KeyFormat = KeyFormat.STRING
    #: ``json`` only: the key is a JSON object and this field of it is the value.
    field: str | None = None
    type: KeyType = KeyType.TEXT
    max_length: Annotated[int, Field(ge=1, le=10_000)] = 128

    @model_validator(mode="after")
    def _consistent(self) -> RecordKey:
        if self.field is not None and self.format is KeyFormat.STRING:
            raise ValueError("record_key.field picks a field of a structured key: set "
                             "format: json or registry")
        if self.type is KeyType.BIGINT and self.format is KeyFormat.STRING:
            raise ValueError("a bigint record key is read from JSON or the registry format: "
                             "set format: json or registry")
        return self

    def as_column(self) -> Column:
        ddl = "bigint" if self.type is KeyType.BIGINT else f"character varying({self.max_length})"
        copy = "int8" if self.type is KeyType.BIGINT else "text"
        return Column(name=self.column, ddl=ddl, copy_type=copy, nullable=False)


class HeaderColumn(_Strict):
    """A record header as a text column (UTF-8, no NUL, at most ``max_length``)."""

    column: Annotated[str, Field(pattern=_NAME)]
    max_length: Annotated[int, Field(ge=1, le=10_000)] = 256
    #: A record without the header is a dead letter; otherwise its column is NULL.
    required: bool = False

    def as_column(self) -> Column:
        return Column(name=self.column, ddl=f"character varying({self.max_length})",
                      copy_type="text", nullable=not self.required)


class Partitioning(_Strict):
    """The target table is partitioned by range of a timestamp column (declarative
    partitioning). Its partitions are the operator's (e.g. pg_partman's): a row no
    partition takes is dead-lettered as ``rejected_by_database`` and can be replayed once
    the partition exists."""

    column: Annotated[str, Field(pattern=_NAME)]


def _header_column(value: Any) -> Any:
    """``trace-id: trace_id`` is short for ``trace-id: {column: trace_id}``."""
    return {"column": value} if isinstance(value, str) else value


class SchemaRegistry(_Strict):
    """Where a registry-encoded pipeline's writer schemas are, and under which subject."""

    #: The Airflow connection of the registry (``http``/``https``; login and password are
    #: basic auth; the extra holds the client's other settings, e.g. ``ssl.ca.location``).
    #: The CLI reads ``KAFKA_INGEST_SCHEMA_REGISTRY_URL`` and ``..._CONFIG`` instead.
    conn_id: str = "schema_registry_default"
    subject_strategy: SubjectStrategy = SubjectStrategy.TOPIC
    #: ``record``/``topic_record``: the record's full name (``com.acme.Balance``).
    record: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")] | None = None

    @model_validator(mode="after")
    def _record(self) -> SchemaRegistry:
        if (self.subject_strategy is SubjectStrategy.TOPIC) is not (self.record is None):
            raise ValueError("schema_registry.record (the record's full name) goes with "
                             "subject_strategy 'record' or 'topic_record', and only with them")
        return self

    def subject(self, topic: str) -> str:
        """The subject the pipeline's contract is checked against at plan time."""
        if self.subject_strategy is SubjectStrategy.TOPIC:
            return f"{topic}-value"
        if self.subject_strategy is SubjectStrategy.RECORD:
            return self.record or ""
        return f"{topic}-{self.record}"


class NotifierClass(_Strict):
    """An Airflow notifier by the dotted path of its class (a ``BaseNotifier`` subclass,
    e.g. ``airflow.providers.smtp.notifications.smtp.SmtpNotifier``) and its keyword
    arguments. The monitor DAG imports and builds it when a rule is breached, never when
    the file loads (the core imports no Airflow), so a wrong path shows in the task log."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    class_path: Annotated[str, Field(alias="class")]
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("class_path")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not re.fullmatch(_DOTTED, value):
            raise ValueError(f"{value!r} is not a dotted path to a class "
                             "(package.module.ClassName)")
        return value


def _webhook_url(index: int, value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"entry {index} is not an http(s) URL with a host: a webhook URL is "
                         "'https://host/path'")
    return value


def _notifier(index: int, value: Any) -> str | NotifierClass:
    """One entry of ``alerts.notifiers``: a webhook URL, or ``{class, kwargs}``."""
    if isinstance(value, str):
        return _webhook_url(index, value)
    if isinstance(value, NotifierClass):
        return value
    if isinstance(value, dict):
        try:
            return NotifierClass.model_validate(value)
        except ValidationError as exc:
            raise ValueError(_format_error(f"entry {index}", exc)) from None
    raise ValueError(f"entry {index} must be a webhook URL or {{class: <dotted path>, "
                     f"kwargs: {{...}}}}, not {type(value).__name__}")


class Alerts(_Strict):
    """When the monitor DAG (``kafka_ingest_monitor``) alerts about a pipeline. Each key is
    a rule; a figure strictly above its limit breaches it. See the README's runbook."""

    #: Messages not yet ingested, summed over the partitions (from the stored offsets).
    max_lag: Annotated[int, Field(ge=0)] = 100_000
    #: Consecutive monitor checks at which the total lag grew (strictly), i.e. the last
    #: ``lag_growth_checks + 1`` recorded totals are strictly increasing.
    lag_growth_checks: Annotated[int, Field(ge=1, le=1000)] = 3
    #: Dead letters / messages read, over the live chunks committed in the window.
    max_dlq_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    #: The window of ``max_dlq_rate``, in minutes.
    window_minutes: Annotated[int, Field(ge=1, le=7 * 24 * 60)] = 60
    #: Minutes without a committed live chunk while the lag is above 0.
    freshness_minutes: Annotated[int, Field(ge=1, le=7 * 24 * 60)] = 30
    #: Dead letters still parked (not recovered by a replay).
    max_parked: Annotated[int, Field(ge=0)] = 1000
    #: Called at each breaching check: webhook URLs (POSTed JSON ``{pipeline, rule,
    #: message, figures}``) and Airflow notifier classes ``{class, kwargs}``.
    notifiers: tuple[str | NotifierClass, ...] = ()

    @field_validator("notifiers", mode="before")
    @classmethod
    def _notifiers(cls, value: Any) -> Any:
        if value is None:
            return ()
        if not isinstance(value, list | tuple):
            raise ValueError("must be a list of webhook URLs and/or {class: <dotted path>, "
                             "kwargs: {...}}")
        return tuple(_notifier(i, v) for i, v in enumerate(value))


#: Days: how long retention may be (a hundred years: "for ever" is ``null``).
_DAYS = Annotated[int, Field(ge=1, le=36_500)] | None


class Retention(_Strict):
    """How long the monitor DAG (``kafka_ingest_monitor``) keeps a pipeline's bookkeeping,
    in days (``null``: for ever). Rows older go in bounded batches at each check; what the
    guarantees and the rules read never goes, whatever the setting (see the README's
    "Retention"). The counters the page and the metrics show are kept apart
    (``ingest_totals``, ``dead_letter_totals``): a prune never changes them."""

    #: The audit of committed chunks (``kafka-ingest status``'s recent chunks, the DLQ
    #: rate's window, which it must cover: at least ``alerts.window_minutes``).
    ingest_runs_days: _DAYS = 30
    #: The ranges pinned to runs; a plan with a range its cursor has not reached (a run
    #: that may still be retried) is kept however old.
    run_plans_days: _DAYS = 30
    #: The monitor's checks (the page's lag history); the newest ``lag_growth_checks``,
    #: the first and the newest alert are kept however old.
    monitor_checks_days: _DAYS = 30
    #: Dead letters a replay recovered, counted from the recovery; parked ones are kept.
    recovered_letters_days: _DAYS = 30


#: ``schedule: on_data``: the ingest DAG runs when the lag trigger sees new data.
ON_DATA = "on_data"


class OnData(_Strict):
    """When a ``schedule: on_data`` pipeline runs: its lag trigger (in Airflow's triggerer)
    compares the high watermarks with the stored offsets every ``poll_seconds`` and starts
    a run as soon as the lag reaches ``min_batch`` messages, or has stayed above zero for
    ``max_wait_seconds``. It then stays quiet until that run has moved the stored offsets
    (or ``rearm_seconds`` passed without: a failed run, or a paused DAG, whose asset
    events Airflow drops), so a run in flight causes at most one follow-up. Keep
    ``rearm_seconds`` above the pipeline's longest run. ``safety_schedule`` also runs the
    DAG on a slow cron, so a broken trigger cannot stop the pipeline for good."""

    min_batch: Annotated[int, Field(ge=1, le=100_000_000)] = 10_000
    max_wait_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = 30.0
    poll_seconds: Annotated[float, Field(ge=0.2, le=3600)] = 2.0
    rearm_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = 300.0
    safety_schedule: str = "0 * * * *"

    @model_validator(mode="after")
    def _check(self) -> OnData:
        if self.poll_seconds > self.max_wait_seconds:
            raise ValueError(f"poll_seconds ({self.poll_seconds:g}) must not exceed "
                             f"max_wait_seconds ({self.max_wait_seconds:g})")
        if len(self.safety_schedule.split()) != 5:
            raise ValueError(f"safety_schedule {self.safety_schedule!r} is not a cron "
                             "expression of five fields")
        return self


class Pipeline(_Strict):
    """One pipeline. Field names are the YAML keys."""

    name: Annotated[str, Field(pattern=_NAME)]
    topic: Annotated[str, Field(pattern=_TOPIC)]
    contract: ContractRef
    table: Annotated[str, Field(pattern=_NAME)]
    dlq_topic: Annotated[str, Field(pattern=_TOPIC)]
    #: A cron expression, ``on_data`` (see :class:`OnData`), or None (manual runs only).
    schedule: str | None = "*/5 * * * *"
    on_data: OnData = OnData()
    replay_schedule: str | None = None
    max_records_per_partition: Annotated[int, Field(ge=1, le=100_000_000)] = 200_000
    chunk_size: Annotated[int, Field(ge=1, le=500_000)] = 20_000
    #: A chunk also ends once its keys and values pass this many bytes (bounds memory).
    max_chunk_bytes: Annotated[int, Field(ge=1, le=2**40)] = 64 * 2**20
    start_policy: StartPolicy = StartPolicy.EARLIEST
    on_offset_gap: OnOffsetGap = OnOffsetGap.FAIL
    on_tombstone: OnTombstone = OnTombstone.SKIP
    #: How values are encoded; the registry formats need ``schema_registry``.
    format: Format = Format.JSON
    schema_registry: SchemaRegistry | None = None
    #: The record key as a column, and headers as columns (header name -> column).
    record_key: RecordKey | None = None
    headers: dict[Annotated[str, Field(min_length=1, max_length=255)], HeaderColumn] = {}
    #: The target table partitioned by range of a timestamp column.
    partition_by: Partitioning | None = None
    #: At plan time, create a missing table / add the columns a new optional field needs
    #: (the role running the pipeline must be allowed to; ``kafka-ingest schema apply``
    #: does it as the migrating role instead).
    auto_create: bool = False
    auto_evolve: bool = False
    max_message_bytes: Annotated[int, Field(ge=1, le=50_000_000)] = 262_144
    dlq_header_style: DlqHeaderStyle = DlqHeaderStyle.BOTH
    upsert: Upsert = Upsert()
    consumer_group: str | None = None
    kafka_conn_id: str = "kafka_default"
    postgres_conn_id: str = "postgres_default"
    owner: str = "data-platform"
    #: Where the table lives, for the Airflow Asset URI (lineage); not used to connect.
    asset_host: str = "localhost:5432"
    asset_database: str = "kafka_ingest"
    retries: Annotated[int, Field(ge=0, le=20)] = 3
    #: A task running longer than this is failed by Airflow (and retried): a backstop for
    #: anything hung that no time-out of Kafka's or Postgres' caught.
    task_timeout_minutes: Annotated[int, Field(ge=1, le=24 * 60)] = 60
    #: The Airflow pool of the mapped ingest and replay tasks (None: ``default_pool``). A
    #: pool shared by pipelines bounds their Postgres writers together, across DAG runs.
    pool: Annotated[str, Field(pattern=_POOL)] | None = None
    #: The size of ``pool``, as the local stack (and ``kafka-ingest pools``) creates it;
    #: None: ``DEFAULT_POOL_SLOTS``. Not Airflow's per-task ``pool_slots``: each slice
    #: takes one slot.
    pool_slots: Annotated[int, Field(ge=1, le=10_000)] | None = None
    #: Slices of one DAG run running at once (``max_active_tis_per_dagrun`` of the mapped
    #: task): each holds a Kafka consumer and a Postgres connection for its whole length,
    #: so a 64-partition topic does not open 64 writers at once.
    max_parallel_partitions: Annotated[int, Field(ge=1, le=1024)] = 8
    #: The monitor DAG's rules and notifiers for this pipeline.
    alerts: Alerts = Alerts()
    #: How long the monitor DAG keeps this pipeline's bookkeeping.
    retention: Retention = Retention()
    #: What `kafka-ingest topics create` makes the source and dead-letter topics with.
    partitions: Annotated[int, Field(ge=1, le=100_000)] = 3
    replication_factor: Annotated[int, Field(ge=1, le=32)] = 1
    #: Topic settings for both, e.g. ``{min.insync.replicas: "2"}``.
    topic_config: dict[str, str] = {}
    #: Settings for the source topic only, over ``topic_config`` (e.g. ``cleanup.policy:
    #: compact`` for a state topic: a compacted dead-letter topic would lose letters).
    source_topic_config: dict[str, str] = {}

    _model: type[Contract] = PrivateAttr()

    @field_validator("headers", mode="before")
    @classmethod
    def _headers(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: _header_column(v) for k, v in value.items()}
        return value

    def __getstate__(self) -> dict[Any, Any]:
        """A declared contract travels as its declaration (``run --workers`` pickles the
        pipeline into other processes, where its model class does not exist by name)."""
        state = super().__getstate__()
        model = self._model
        if model.DECLARATION is not None:
            private = dict(state["__pydantic_private__"])
            private["_model"] = (model.EVENT_TYPE, model.VERSION, model.DECLARATION)
            state["__pydantic_private__"] = private
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        declared = state["__pydantic_private__"]["_model"]
        if isinstance(declared, tuple):
            private = dict(state["__pydantic_private__"])
            private["_model"] = declared_model(*declared)
            state = {**state, "__pydantic_private__": private}
        super().__setstate__(state)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Pipeline:
        declared = (info.context or {}).get("contracts")
        self._model = get_contract(self.contract.event_type, self.contract.version, declared)
        if self.dlq_topic == self.topic:
            raise ValueError("dlq_topic must differ from topic")
        self._check_columns()
        if self.upsert.mode is UpsertMode.LATEST:
            self._check_latest_columns()
        self._check_tombstones()
        self._check_log_order()
        self._check_partitioning()
        if (self.record_key is not None and self.record_key.format is KeyFormat.REGISTRY
                and not self.format.registry):
            raise ValueError("record_key.format 'registry' reads the key in the pipeline's "
                             "registry format: set format to avro, protobuf or json_schema")
        if self.format.registry and self.schema_registry is None:
            raise ValueError(f"format {self.format.value!r} reads writer schemas from a schema "
                             "registry: set schema_registry (at least {} for the defaults)")
        if self.pool_slots is not None and self.pool is None:
            raise ValueError("pool_slots is the size of the pipeline's pool: set pool too")
        if self.on_data != OnData() and not self.event_driven:  # set, but never used
            raise ValueError(f"on_data is for `schedule: {ON_DATA}`; this pipeline's schedule "
                             f"is {self.schedule!r}")
        self._check_retention()
        return self

    def _check_retention(self) -> None:
        days = self.retention.ingest_runs_days
        if days is not None and days * 24 * 60 < self.alerts.window_minutes:
            raise ValueError(f"retention.ingest_runs_days ({days}) must cover "
                             f"alerts.window_minutes ({self.alerts.window_minutes}): the DLQ "
                             "rate is read from the chunks of that window")

    @property
    def event_driven(self) -> bool:
        """Whether the lag trigger starts this pipeline's runs (``schedule: on_data``)."""
        return self.schedule == ON_DATA

    def _check_columns(self) -> None:
        seen = set(self.contract_column_names)
        for name in self.contract_column_names:  # declared: checked as they load; Python: here
            refuse_system_column(name, f"contract {self.model.key()}", "rename the field")
        for column in self.message_columns:
            if column.name in seen or column.name in RESERVED_COLUMNS:
                raise ValueError(f"column {column.name!r} (from the record key or a header) "
                                 "is already a column of the contract or of every table")
            refuse_system_column(column.name, "the record key or a header",
                                 "choose another column name")
            seen.add(column.name)

    def _check_latest_columns(self) -> None:
        """The entity key and the ordering column must exist and never be null: a null
        compares as unknown, so the newest version of an entity could not be told."""
        key_column = self.record_key.column if self.record_key else None
        for role, column in (("key", self.upsert.key), ("order_by", self.upsert.order_by)):
            if (role, column) in (("key", key_column), ("order_by", LOG_ORDER)):
                continue
            if column not in self.contract_column_names:
                choices = [*self.contract_column_names,
                           *([key_column] if role == "key" and key_column else []),
                           *([LOG_ORDER] if role == "order_by" else [])]
                raise ValueError(f"upsert.{role} {column!r} is not a column of the contract "
                                 f"({', '.join(choices)})")
            field = self.model.model_fields.get(column or "")
            if field is None or not field.is_required():
                raise ValueError(f"upsert.{role} {column!r} must be a required field of the "
                                 "contract (it may not be missing or null)")

    def _check_log_order(self) -> None:
        """Offsets order a key's records only within one partition, which is where the
        producer's partitioner keeps a key: the record key's, not a payload field's."""
        if self.upsert.mode is not UpsertMode.LATEST or self.upsert.order_by != LOG_ORDER:
            return
        if self.record_key is None or self.upsert.key != self.record_key.column:
            raise ValueError(f"upsert.order_by {LOG_ORDER!r} (the log's order) needs upsert.key "
                             "to be the record key's column (record_key.column): offsets "
                             "order a key's records only within the one partition its record "
                             "key sends it to")

    def _check_tombstones(self) -> None:
        if self.on_tombstone is not OnTombstone.DELETE:
            return
        if (self.upsert.mode is not UpsertMode.LATEST or self.record_key is None
                or self.upsert.key != self.record_key.column):
            raise ValueError("on_tombstone 'delete' needs upsert.mode 'latest' keyed by the "
                             "record key (record_key.column = upsert.key): a tombstone "
                             "carries nothing but its key")
        if self.upsert.order_by != LOG_ORDER:
            raise ValueError(f"on_tombstone 'delete' needs upsert.order_by {LOG_ORDER!r}: a "
                             "tombstone has no event time, so an update and a delete of a "
                             "key can only be ordered by their place in the log")

    def _check_partitioning(self) -> None:
        if self.partition_by is None:
            return
        if self.upsert.mode is UpsertMode.LATEST:
            raise ValueError("partition_by is for append pipelines: a latest-state table "
                             "would have to move a key's row between partitions")
        column = next((c for c in self.sink_columns if c.name == self.partition_by.column),
                      None)
        if column is None or column.ddl != "timestamp with time zone" or column.nullable:
            raise ValueError(f"partition_by.column {self.partition_by.column!r} must be a "
                             "required timestamptz field of the contract")

    @property
    def model(self) -> type[Contract]:
        return self._model

    @property
    def contract_column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.model.SINK_COLUMNS)

    @property
    def message_columns(self) -> tuple[Column, ...]:
        """The columns filled from the record key and headers, in row order (after the
        contract's)."""
        key = (self.record_key.as_column(),) if self.record_key else ()
        return (*key, *(h.as_column() for h in self.headers.values()))

    @cached_property
    def sink_columns(self) -> tuple[Column, ...]:
        """The columns a row fills, in row order (the provenance columns follow)."""
        return (*contract_columns(self.model), *self.message_columns)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.sink_columns)

    @property
    def conflict_columns(self) -> tuple[str, ...]:
        """The target table's primary key: what ``ON CONFLICT`` names."""
        if self.upsert.mode is UpsertMode.LATEST:
            return (self.upsert.key or "",)
        if self.partition_by is not None:
            return ("event_id", self.partition_by.column)
        return ("event_id",)

    @property
    def asset_uri(self) -> str:
        return f"postgres://{self.asset_host}/{self.asset_database}/public/{self.table}"

    @property
    def group_id(self) -> str:
        """The Kafka consumer group offsets are committed to (for lag tools)."""
        return self.consumer_group or f"kafka-ingest.{self.name}"


def _format_error(where: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key (check its spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{where}.{loc}: {msg}")
    return "; ".join(lines)


def declared_contracts(document: Any, *, source: str) -> dict[str, type[Contract]]:
    """Every version of every contract under the file's ``contracts`` key, by registry
    key (see :mod:`kafka_ingest.contracts.declared`)."""
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ValueError(f"{source}: 'contracts' must be a mapping of event type -> contract")
    found: dict[str, type[Contract]] = {}
    for event_type, body in document.items():
        where = f"contracts.{event_type}"
        if not isinstance(event_type, str) or not re.fullmatch(_NAME, event_type):
            raise ValueError(f"{source}: {where}: an event type is lower case, digits and _")
        try:
            spec = ContractSpec.model_validate(body)
        except ValidationError as exc:
            raise ValueError(f"{source}: {_format_error(where, exc)}") from None
        for model in build_versions(event_type, spec):
            found[model.key()] = model
    return found


def _merge(defaults: dict[str, Any], body: dict[str, Any], name: str) -> dict[str, Any]:
    """A pipeline's keys over the defaults; ``alerts`` and ``retention`` merge key by key,
    so a pipeline may change one limit and keep the shared notifiers."""
    merged = {**defaults, **body, "name": name}
    for block in ("alerts", "retention"):
        shared, own = defaults.get(block), body.get(block)
        if isinstance(shared, dict) and isinstance(own, dict):
            merged[block] = {**shared, **own}
    return merged


def airflow_pools(pipelines: Mapping[str, Pipeline]) -> dict[str, int]:
    """The Airflow pools the pipelines name, with their size: the ``pool_slots`` of the
    pipelines naming one (they must agree), else ``DEFAULT_POOL_SLOTS``. Airflow's own
    ``default_pool`` is listed only when a pipeline sizes it explicitly."""
    sizes: dict[str, set[int]] = {}
    for pipeline in pipelines.values():
        if pipeline.pool is not None:
            said = sizes.setdefault(pipeline.pool, set())
            if pipeline.pool_slots is not None:
                said.add(pipeline.pool_slots)
    for name, said in sizes.items():
        if len(said) > 1:
            users = sorted(p.name for p in pipelines.values() if p.pool == name)
            raise ValueError(f"pipelines {', '.join(users)} give the pool {name!r} different "
                             f"sizes ({', '.join(map(str, sorted(said)))}): say one")
    return {name: (min(said) if said else DEFAULT_POOL_SLOTS)
            for name, said in sorted(sizes.items()) if name != DEFAULT_POOL or said}


def pool_import_document(pipelines: Mapping[str, Pipeline]) -> dict[str, dict[str, Any]]:
    """The pipelines' pools as ``airflow pools import <file>`` reads them."""
    return {name: {"slots": slots, "include_deferred": False,
                   "description": "kafka-ingest: slices of "
                   + ", ".join(sorted(p.name for p in pipelines.values() if p.pool == name))}
            for name, slots in airflow_pools(pipelines).items()}


def parse_pipelines(document: Any, *, source: str = "<pipelines>") -> dict[str, Pipeline]:
    """Validate a loaded YAML document ``{pipelines: {name: {...}}}`` (with ``defaults``
    and declared ``contracts``)."""
    if not isinstance(document, dict) or set(document) - {"pipelines", "defaults", "contracts"}:
        raise ValueError(f"{source}: top level must be a mapping with 'pipelines' (and "
                         "'defaults', 'contracts')")
    contracts = declared_contracts(document.get("contracts"), source=source)
    if clash := sorted(set(contracts) & set(REGISTRY)):
        raise ValueError(f"{source}: contracts {', '.join(clash)} are declared here and written "
                         "in Python: rename the declared event type")
    defaults = document.get("defaults") or {}
    entries = document.get("pipelines") or {}
    if not isinstance(entries, dict) or not isinstance(defaults, dict):
        raise ValueError(f"{source}: 'pipelines' and 'defaults' must be mappings")
    pipelines: dict[str, Pipeline] = {}
    for name, body in entries.items():
        if not isinstance(body, dict):
            raise ValueError(f"{source}: pipelines.{name} must be a mapping")
        try:
            pipelines[name] = Pipeline.model_validate(_merge(defaults, body, name),
                                                      context={"contracts": contracts})
        except ValidationError as exc:
            raise ValueError(f"{source}: {_format_error(f'pipelines.{name}', exc)}") from None
        except ValueError as exc:
            raise ValueError(f"{source}: pipelines.{name}: {exc}") from None
    try:
        airflow_pools(pipelines)
        shared_tables(pipelines)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return pipelines


def shared_tables(pipelines: Mapping[str, Pipeline]) -> None:
    """A ``latest`` table keeps one version per key, ordered within its topic: pipelines
    writing it must read the same topic with the same upsert (append pipelines may share a
    table across topics: ``event_id`` decides). Raise ``ValueError`` otherwise."""
    by_table: dict[str, list[Pipeline]] = {}
    for pipeline in pipelines.values():
        by_table.setdefault(pipeline.table, []).append(pipeline)
    for table, writers in sorted(by_table.items()):
        if len(writers) < 2 or all(p.upsert.mode is UpsertMode.APPEND for p in writers):
            continue
        if len({(p.topic, p.upsert) for p in writers}) > 1:
            names = ", ".join(sorted(f"{p.name} ({p.topic}, {p.upsert.mode.value})"
                                     for p in writers))
            raise ValueError(
                f"pipelines {names} all write table {table!r}: a latest table keeps one "
                "version per key, and records of two topics (or two ways of choosing the "
                "newest) cannot be ordered against each other; give each its own table")


def pipelines_file() -> Path:
    return Path(os.environ.get("KAFKA_INGEST_PIPELINES") or DEFAULT_PIPELINES_FILE)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's problem and where, on one line (its own message quotes the source
    over several)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None:
        return " ".join(str(exc).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def _load_document(path: Path | str | None) -> tuple[Any, Path]:
    file = Path(path) if path else pipelines_file()
    try:
        return yaml.safe_load(file.read_text(encoding="utf-8")), file
    except OSError as exc:
        raise ValueError(f"cannot read pipelines file {file}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{file}: not valid YAML: {_yaml_problem(exc)}") from None


def load_pipelines(path: Path | str | None = None) -> dict[str, Pipeline]:
    """Load and validate the pipelines file."""
    document, file = _load_document(path)
    return parse_pipelines(document, source=str(file))


def load_declared_contracts(path: Path | str | None = None) -> dict[str, type[Contract]]:
    """The contracts the pipelines file declares, by registry key."""
    document, file = _load_document(path)
    body = document.get("contracts") if isinstance(document, dict) else None
    return declared_contracts(body, source=str(file))


def get_pipeline(name: str, path: Path | str | None = None) -> Pipeline:
    pipelines = load_pipelines(path)
    try:
        return pipelines[name]
    except KeyError:
        raise ValueError(
            f"unknown pipeline {name!r}; defined: {', '.join(sorted(pipelines))}"
        ) from None


def safe_identifier(name: str) -> str:
    """Guard for identifiers that reach SQL through ``psycopg.sql.Identifier`` anyway."""
    if not re.fullmatch(_NAME, name):
        raise ValueError(f"not a safe identifier: {name!r}")
    return name
