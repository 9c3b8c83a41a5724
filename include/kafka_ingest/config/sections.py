"""The sections of a pipeline's entry (``upsert``, ``record_key``, ``headers``,
``schema_registry``, ``alerts``, ``retention``, ``on_data``, ...), each a strict model.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kafka_ingest.config.modes import (
    DOTTED_PATTERN,
    NAME_PATTERN,
    IdentitySource,
    KeyFormat,
    KeyType,
    SubjectStrategy,
    UpsertMode,
)
from kafka_ingest.contracts.columns import Column
from kafka_ingest.contracts.declared import IMPLICIT_ID


def format_error(where: str, exc: ValidationError) -> str:
    """A validation error as one line per key: ``where.key: what is wrong``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown key (check its spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"{where}.{loc}: {msg}")
    return "; ".join(lines)



class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContractRef(Strict):
    """The contract a pipeline validates its records with: declared under ``contracts`` in
    the pipelines file, or written in Python (``kafka_ingest.contracts``)."""

    #: The contract's event type (its key under ``contracts``, or a Python contract's
    #: ``EVENT_TYPE``).
    event_type: str
    #: The newest version the pipeline accepts: payloads of versions 1 to this one pass; a
    #: higher one is dead-lettered as ``unknown_version`` (replayable once it is raised).
    version: Annotated[int, Field(ge=1)]


class Upsert(Strict):
    """How rows are written into the target table."""

    #: ``append``: once per identity (``identity``); ``latest``: the newest version per
    #: ``key``.
    mode: UpsertMode = UpsertMode.APPEND
    #: ``latest`` only: the entity key column (the table's primary key): a field of the
    #: contract, or the ``record_key`` column; several (a list) only for ``envelope:
    #: debezium``, whose source table has a composite primary key.
    key: str | tuple[str, ...] | None = None
    #: ``latest`` only: the event-time column that orders versions of an entity, or
    #: ``source_offset``: the log's order (what a compacted topic means by "latest").
    order_by: str = "timestamp"

    @model_validator(mode="after")
    def _key_for_latest(self) -> Upsert:
        if self.mode is UpsertMode.LATEST and not self.key:
            raise ValueError("upsert.mode 'latest' needs upsert.key (the entity key column)")
        if self.mode is UpsertMode.APPEND and self.key:
            raise ValueError("upsert.key is only used with upsert.mode 'latest'")
        if isinstance(self.key, tuple) and len(set(self.key)) != len(self.key):
            raise ValueError(f"upsert.key names a column twice: {list(self.key)}")
        return self

    @property
    def keys(self) -> tuple[str, ...]:
        """The entity key's columns, in key order (one, unless a composite key)."""
        if self.key is None:
            return ()
        return (self.key,) if isinstance(self.key, str) else self.key


class RecordKey(Strict):
    """The record key as a column (Kafka Connect's ``pk.mode=record_key``)."""

    #: The column the key fills (``upsert.key`` names it to make it the table's key).
    column: Annotated[str, Field(pattern=NAME_PATTERN)]
    #: How the key's bytes are read.
    format: KeyFormat = KeyFormat.STRING
    #: ``json`` or ``registry`` only: the key is a structured value (a JSON object, a
    #: record) and this field of it is the column's value.
    field: str | None = None
    #: The column's type.
    type: KeyType = KeyType.TEXT
    #: A ``text`` key's column width; a longer key is dead-lettered as ``bad_key``.
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

    def unwrapped(self, value: Any) -> Any:
        """A decoded JSON key as its producer meant it: Kafka Connect's JsonConverter with
        its schema writes ``{"schema": ..., "payload": key}``, whose ``payload`` is the key
        (unless ``field`` names one of those two)."""
        if isinstance(value, dict) and value.keys() == {"schema", "payload"} \
                and self.field not in value:
            return value["payload"]
        return value

    def as_column(self) -> Column:
        ddl = "bigint" if self.type is KeyType.BIGINT else f"character varying({self.max_length})"
        copy = "int8" if self.type is KeyType.BIGINT else "text"
        return Column(name=self.column, ddl=ddl, value_type=copy, nullable=False)


class HeaderColumn(Strict):
    """A record header as a text column (UTF-8, no NUL, at most ``max_length``)."""

    #: The column the header fills.
    column: Annotated[str, Field(pattern=NAME_PATTERN)]
    #: The column's width; a longer value is dead-lettered as ``bad_header``.
    max_length: Annotated[int, Field(ge=1, le=10_000)] = 256
    #: A record without the header is a dead letter; otherwise its column is NULL.
    required: bool = False

    def as_column(self) -> Column:
        return Column(name=self.column, ddl=f"character varying({self.max_length})",
                      value_type="text", nullable=not self.required)


class Partitioning(Strict):
    """The target table is partitioned by range of a timestamp column (declarative
    partitioning). Its partitions are the operator's (e.g. pg_partman's): a row no
    partition takes is dead-lettered as ``rejected_by_database`` and can be replayed once
    the partition exists."""

    #: A required ``timestamptz`` field of the contract (its column); the primary key
    #: becomes the identity's columns and this one.
    column: Annotated[str, Field(pattern=NAME_PATTERN)]


#: A payload field's path: its name, or names joined by dots (``order.id``).
PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z_][A-Za-z0-9_-]*)*$"


class Identity(Strict):
    """What makes two records the same record (a replay, a backfill, a producer's retry):
    an append table's primary key, what its ``ON CONFLICT`` names and what a chunk's copies
    are dropped by; what a latest table tells a replayed version by; what a replay's
    ``identity`` filter matches. Short forms: ``identity: order_id`` (one field),
    ``identity: [region, order_no]`` (several), ``identity: record_key``, ``identity:
    source_position``."""

    #: ``payload``: the payload's ``fields``; ``record_key``: the record key's column
    #: (``record_key``; a latest pipeline keyed by it); ``source_position``: the record's
    #: place in the log (topic, incarnation, partition, offset: append pipelines only).
    source: IdentitySource = IdentitySource.PAYLOAD
    #: ``payload`` only: the fields that identify a record together, each by its name in
    #: the payload or a dotted path (``order.id``); required fields of the contract. None:
    #: ``event_id``.
    fields: tuple[Annotated[str, Field(pattern=PATH_PATTERN, max_length=255)], ...] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Identity:
        if self.fields is None:
            return self
        if self.source is not IdentitySource.PAYLOAD:
            raise ValueError(f"identity.fields names payload fields: it goes with source "
                             f"'payload', not {self.source.value!r}")
        if not self.fields:
            raise ValueError("identity.fields needs at least one field")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError(f"identity.fields names a field twice: {list(self.fields)}")
        return self

    @property
    def paths(self) -> tuple[str, ...]:
        """The payload paths of a ``payload`` identity (empty for the others)."""
        if self.source is not IdentitySource.PAYLOAD:
            return ()
        return self.fields or (IMPLICIT_ID,)


def identity_shorthand(value: Any) -> Any:
    """``record_key``/``source_position``, a field's path, or a list of them -> the long
    form (``{source, fields}``). A field whose name is one of the two words is written
    ``{fields: [record_key]}``."""
    if isinstance(value, str):
        if value in (IdentitySource.RECORD_KEY, IdentitySource.SOURCE_POSITION):
            return {"source": value}
        return {"fields": [value]}
    if isinstance(value, list | tuple):
        return {"fields": list(value)}
    return value


def header_column(value: Any) -> Any:
    """``trace-id: trace_id`` is short for ``trace-id: {column: trace_id}``."""
    return {"column": value} if isinstance(value, str) else value


class SchemaRegistry(Strict):
    """Where a registry-encoded pipeline's writer schemas are, and under which subject."""

    #: The Airflow connection of the registry (``http``/``https``; login and password are
    #: basic auth; the extra holds the client's other settings, e.g. ``ssl.ca.location``).
    #: The CLI reads ``KAFKA_INGEST_SCHEMA_REGISTRY_URL`` and ``..._CONFIG`` instead.
    conn_id: str = "schema_registry_default"
    #: Which subject the contract is checked against at plan time.
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


class NotifierClass(Strict):
    """An Airflow notifier by the dotted path of its class (a ``BaseNotifier`` subclass,
    e.g. ``airflow.providers.smtp.notifications.smtp.SmtpNotifier``) and its keyword
    arguments. The monitor DAG imports and builds it when a rule is breached, never when
    the file loads (the core imports no Airflow), so a wrong path shows in the task log."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)

    #: The notifier's class, as a dotted path (``package.module.ClassName``).
    class_path: Annotated[str, Field(alias="class")]
    #: The keyword arguments it is built with; its templates may use ``{{ message }}``.
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("class_path")
    @classmethod
    def _dotted(cls, value: str) -> str:
        if not re.fullmatch(DOTTED_PATTERN, value):
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
            raise ValueError(format_error(f"entry {index}", exc)) from None
    raise ValueError(f"entry {index} must be a webhook URL or {{class: <dotted path>, "
                     f"kwargs: {{...}}}}, not {type(value).__name__}")


class Alerts(Strict):
    """When the monitor DAG (``kafka_ingest_monitor``) alerts about a pipeline. Each key is
    a rule; a figure strictly above its limit breaches it. What each rule means and what to
    do: the runbook (``docs/runbook.md``)."""

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
Days = Annotated[int, Field(ge=1, le=36_500)] | None


class Retention(Strict):
    """How long the monitor DAG (``kafka_ingest_monitor``) keeps a pipeline's bookkeeping,
    in days (``null``: for ever). Rows older go in bounded batches at each check; what the
    guarantees and the rules read never goes, whatever the setting (see "Retention of the
    bookkeeping" in ``docs/operations.md``). The counters the page and the metrics show are
    kept apart (``ingest_totals``, ``dead_letter_totals``): a prune never changes them."""

    #: The audit of committed chunks (``kafka-ingest status``'s recent chunks, the DLQ
    #: rate's window, which it must cover: at least ``alerts.window_minutes``).
    ingest_runs_days: Days = 30
    #: The ranges pinned to runs; a plan with a range its cursor has not reached (a run
    #: that may still be retried) is kept however old.
    run_plans_days: Days = 30
    #: The monitor's checks (the page's lag history); the newest ``lag_growth_checks``,
    #: the first and the newest alert are kept however old.
    monitor_checks_days: Days = 30
    #: Dead letters a replay recovered, counted from the recovery; parked ones are kept.
    recovered_letters_days: Days = 30


#: ``schedule: on_data``: the ingest DAG runs when the lag trigger sees new data.
ON_DATA = "on_data"


class OnData(Strict):
    """When a ``schedule: on_data`` pipeline runs: its lag trigger (in Airflow's triggerer)
    compares the high watermarks with the stored offsets every ``poll_seconds`` and starts
    a run as soon as the lag reaches ``min_batch`` messages, or has stayed above zero for
    ``max_wait_seconds``. It then stays quiet until that run has moved the stored offsets
    (or ``rearm_seconds`` passed without: a failed run, or a paused DAG, whose asset
    events Airflow drops), so a run in flight causes at most one follow-up. Keep
    ``rearm_seconds`` above the pipeline's longest run. ``safety_schedule`` also runs the
    DAG on a slow cron, so a broken trigger cannot stop the pipeline for good."""

    #: A run starts as soon as the lag (summed over the partitions) reaches this many
    #: messages.
    min_batch: Annotated[int, Field(ge=1, le=100_000_000)] = 10_000
    #: ... or once the lag has stayed above zero this long.
    max_wait_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = 30.0
    #: How often the trigger compares the high watermarks with the stored offsets (at
    #: most ``max_wait_seconds``).
    poll_seconds: Annotated[float, Field(ge=0.2, le=3600)] = 2.0
    #: After firing, the trigger fires again after this long if the run it caused moved
    #: no stored offset (a failed run, a paused DAG) and the lag is still there.
    rearm_seconds: Annotated[float, Field(gt=0, le=7 * 24 * 3600)] = 300.0
    #: A slow cron (five fields) that runs the DAG whatever the trigger does.
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
