"""One pipeline: its entry in the pipelines file, validated whole (its sections, its
contract, and how they fit together), and what follows from it (columns, keys, names).
"""

from __future__ import annotations

from functools import cached_property
from typing import Annotated, Any

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kafka_ingest.config.modes import (
    KEPT_ARRAYS,
    KEY_VALUE_TYPES,
    LOG_ORDER,
    NAME_PATTERN,
    POOL_PATTERN,
    SOURCE_POSITION_COLUMNS,
    TOPIC_PATTERN,
    DlqHeaderStyle,
    Envelope,
    Format,
    IdentitySource,
    KeyFormat,
    OnOffsetGap,
    OnTombstone,
    OnTruncate,
    ReplicaIdentity,
    StartPolicy,
    UpsertMode,
)
from kafka_ingest.config.sections import (
    ON_DATA,
    Alerts,
    ContractRef,
    HeaderColumn,
    Identity,
    OnData,
    Partitioning,
    RecordKey,
    Retention,
    SchemaRegistry,
    Strict,
    Upsert,
    header_column,
    identity_shorthand,
)
from kafka_ingest.contracts import Contract, get_contract
from kafka_ingest.contracts.columns import (
    Column,
    contract_columns,
    payload_paths,
    refuse_system_column,
)
from kafka_ingest.contracts.declared import (
    IMPLICIT_ID,
    RESERVED_COLUMNS,
    declared_model,
    optional_event_id,
)
from kafka_ingest.records import Provenance


class Pipeline(Strict):
    """One pipeline. Field names are the YAML keys."""

    #: The pipeline's name: its key under ``pipelines`` (set from it). DAG ids, locks,
    #: the bookkeeping rows and the default consumer group are named after it.
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    #: The source topic.
    topic: Annotated[str, Field(pattern=TOPIC_PATTERN)]
    #: The contract every record is validated with.
    contract: ContractRef
    #: The target table (made by ``kafka-ingest schema apply`` or ``migrate`` from the
    #: contract, or by ``auto_create``).
    table: Annotated[str, Field(pattern=NAME_PATTERN)]
    #: The dead-letter topic (another topic than ``topic``; it must exist before a run:
    #: ``kafka-ingest topics create`` makes both).
    dlq_topic: Annotated[str, Field(pattern=TOPIC_PATTERN)]
    #: A cron expression, ``on_data`` (see :class:`OnData`), or None (manual runs only).
    schedule: str | None = "*/5 * * * *"
    #: When a ``schedule: on_data`` pipeline runs (only for that schedule).
    on_data: OnData = OnData()
    #: The DLQ-replay DAG's schedule: a cron expression, or None (manual runs only).
    replay_schedule: str | None = None
    #: The most one live run (or one replay from its cursor) reads of a partition; a
    #: backfill's window is read whole.
    max_records_per_partition: Annotated[int, Field(ge=1, le=100_000_000)] = 200_000
    #: Messages per chunk: one chunk is one Postgres transaction (bounds memory).
    chunk_size: Annotated[int, Field(ge=1, le=500_000)] = 20_000
    #: A chunk also ends once its keys and values pass this many bytes (bounds memory).
    max_chunk_bytes: Annotated[int, Field(ge=1, le=2**40)] = 64 * 2**20
    #: Where a partition with no stored offset starts (applied once, then the stored
    #: offset rules).
    start_policy: StartPolicy = StartPolicy.EARLIEST
    #: Retention deleted offsets that were never ingested: fail the run, or skip them,
    #: recorded in ``offset_gaps`` and logged as an error.
    on_offset_gap: OnOffsetGap = OnOffsetGap.FAIL
    #: Records whose value is null: skip them (counted), dead-letter them, or ``delete``
    #: the record key's row (``latest`` pipelines keyed by the record key, in log order).
    on_tombstone: OnTombstone = OnTombstone.SKIP
    #: How values are encoded; the registry formats need ``schema_registry``.
    format: Format = Format.JSON
    #: What values are wrapped in: ``debezium`` for change events (the contract validates
    #: their ``after`` row; a delete deletes the record key's row). Such a pipeline is a
    #: ``latest`` table keyed by the record key in log order (the default ``upsert``), or,
    #: for a primary key of several columns, by ``identity``'s fields (the record key's).
    envelope: Envelope | None = None
    #: ``envelope: debezium``: what a truncate of the source table does to the table.
    on_truncate: OnTruncate = OnTruncate.SKIP
    #: ``envelope: debezium``: the source table's ``REPLICA IDENTITY``; ``full`` lets the
    #: contract take arrays of any type (an update that carries no old row then stops the
    #: run: the source is not ``FULL``).
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    #: The registry of a registry format's writer schemas (``{}`` takes the defaults).
    schema_registry: SchemaRegistry | None = None
    #: The record key as a column.
    record_key: RecordKey | None = None
    #: Headers as columns: header name -> column (``{trace-id: trace_id}``) or its
    #: settings (``{trace-id: {column: trace_id, max_length: 64, required: true}}``).
    headers: dict[Annotated[str, Field(min_length=1, max_length=255)], HeaderColumn] = {}
    #: The target table partitioned by range of a timestamp column.
    partition_by: Partitioning | None = None
    #: The contract's field holding a record's event time (its path in the payload: a
    #: ``timestamptz`` field), which the run's event-time watermark in the table's Asset
    #: event is by (docs/lineage.md). None: the records' Kafka timestamps.
    event_time: str | None = None
    #: At plan time, create a missing table / add the columns a new optional field needs
    #: (the role running the pipeline must be allowed to; ``kafka-ingest schema apply``
    #: does it as the migrating role instead).
    auto_create: bool = False
    #: At plan time, add the columns of new optional fields to the table (as
    #: ``auto_create``, for an existing table).
    auto_evolve: bool = False
    #: A record value larger than this is dead-lettered as ``too_large``.
    max_message_bytes: Annotated[int, Field(ge=1, le=50_000_000)] = 262_144
    #: The header names of the records produced to the dead-letter topic.
    dlq_header_style: DlqHeaderStyle = DlqHeaderStyle.BOTH
    #: How rows are written: once per event, or the latest version per key.
    upsert: Upsert = Upsert()
    #: What makes a record the same record twice, so a replay or a backfill writes it
    #: once (see :class:`Identity`): a payload field (``order_id``, ``order.id``), several
    #: (``[region, order_no]``), ``record_key`` or ``source_position``. None: the record
    #: key for a latest pipeline keyed by it (``upsert.key`` = ``record_key.column``),
    #: else ``event_id``.
    identity: Identity | None = None
    #: The Kafka consumer group stored offsets are copied to, for lag tools (None:
    #: ``kafka-ingest.<name>``).
    consumer_group: str | None = None
    #: The Airflow connection of the Kafka cluster (its extra is the librdkafka config).
    kafka_conn_id: str = "kafka_default"
    #: The Airflow connection of the Postgres database (every libpq keyword of its extra
    #: is kept).
    postgres_conn_id: str = "postgres_default"
    #: The owner of the pipeline's DAG tasks.
    owner: str = "data-platform"
    #: Where the table lives, for the Airflow Asset URI (lineage); not used to connect.
    asset_host: str = "localhost:5432"
    #: The database named in the Airflow Asset URI (lineage); not used to connect.
    asset_database: str = "kafka_ingest"
    #: Airflow's retries of a failed task (transient errors only; backing off from 10 s
    #: to 10 min); a permanent error fails at once.
    retries: Annotated[int, Field(ge=0, le=20)] = 3
    #: A task running longer than this is failed by Airflow (and retried): a backstop for
    #: anything hung that no time-out of Kafka's or Postgres' caught.
    task_timeout_minutes: Annotated[int, Field(ge=1, le=24 * 60)] = 60
    #: The Airflow pool of the mapped ingest and replay tasks (None: ``default_pool``). A
    #: pool shared by pipelines bounds their Postgres writers together, across DAG runs.
    pool: Annotated[str, Field(pattern=POOL_PATTERN)] | None = None
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
    #: The partitions ``kafka-ingest topics create`` makes the source and dead-letter
    #: topics with.
    partitions: Annotated[int, Field(ge=1, le=100_000)] = 3
    #: The replication factor ``kafka-ingest topics create`` gives both topics.
    replication_factor: Annotated[int, Field(ge=1, le=32)] = 1
    #: Topic settings for both, e.g. ``{min.insync.replicas: "2"}``.
    topic_config: dict[str, str] = {}
    #: Settings for the source topic only, over ``topic_config`` (e.g. ``cleanup.policy:
    #: compact`` for a state topic: a compacted dead-letter topic would lose letters).
    source_topic_config: dict[str, str] = {}

    _model: type[Contract] = PrivateAttr()
    _identity: Identity = PrivateAttr()
    _identity_columns: tuple[str, ...] = PrivateAttr()

    @field_validator("identity", mode="before")
    @classmethod
    def _identity_shorthand(cls, value: Any) -> Any:
        return identity_shorthand(value)

    @field_validator("headers", mode="before")
    @classmethod
    def _headers(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: header_column(v) for k, v in value.items()}
        return value

    def __getstate__(self) -> dict[Any, Any]:
        """A declared contract travels as its declaration (``run --workers`` pickles the
        pipeline into other processes, where its model class does not exist by name)."""
        state = super().__getstate__()
        model = self._model
        if model.DECLARATION is not None:
            private = dict(state["__pydantic_private__"])
            private["_model"] = (model.EVENT_TYPE, model.VERSION, model.DECLARATION,
                                 model.model_fields[IMPLICIT_ID].is_required())
            state["__pydantic_private__"] = private
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        declared = state["__pydantic_private__"]["_model"]
        if isinstance(declared, tuple):
            private = dict(state["__pydantic_private__"])
            event_type, version, spec, id_required = declared
            private["_model"] = declared_model(event_type, version, spec,
                                               id_required=id_required)
            state = {**state, "__pydantic_private__": private}
        super().__setstate__(state)

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> Pipeline:
        declared = (info.context or {}).get("contracts")
        self._model = get_contract(self.contract.event_type, self.contract.version, declared)
        if self.dlq_topic == self.topic:
            raise ValueError("dlq_topic must differ from topic")
        self._check_envelope()
        self._resolve_identity()
        self._check_columns()
        if self.upsert.mode is UpsertMode.LATEST:
            self._check_latest_columns()
        self._check_tombstones()
        self._check_log_order()
        self._check_partitioning()
        self._check_event_time()
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

    def _resolve_identity(self) -> None:
        """The identity as declared, or its default, checked against the contract and the
        mode; a declared contract's implicit ``event_id`` is optional when it identifies
        nothing (the pipeline's payloads need not carry it)."""
        identity = self.identity or self._default_identity()
        if identity.source is IdentitySource.RECORD_KEY:
            columns = self._record_key_identity()
        elif identity.source is IdentitySource.SOURCE_POSITION:
            if self.upsert.mode is UpsertMode.LATEST:
                raise ValueError("identity 'source_position' is for append pipelines: a "
                                 "latest table keeps one row per upsert.key, whose versions "
                                 "are different records by their place in the log")
            columns = SOURCE_POSITION_COLUMNS
        else:
            columns = tuple(self._identity_field(path) for path in identity.paths)
        if IMPLICIT_ID not in columns:
            self._model = optional_event_id(self._model)
        self._identity, self._identity_columns = identity, columns

    def _default_identity(self) -> Identity:
        if self.upsert.mode is UpsertMode.LATEST and self.record_key is not None \
                and self.upsert.key == self.record_key.column:
            return Identity(source=IdentitySource.RECORD_KEY)
        if IMPLICIT_ID not in payload_paths(self._model):
            raise ValueError(f"contract {self._model.key()} has no event_id: say what "
                             "identifies a record with `identity` (a field such as "
                             "order_id, several fields, record_key or source_position)")
        return Identity()

    def _record_key_identity(self) -> tuple[str, ...]:
        if self.record_key is None:
            raise ValueError("identity 'record_key' needs record_key (the record key as a "
                             "column)")
        if self.upsert.mode is UpsertMode.LATEST and self.upsert.key != self.record_key.column:
            raise ValueError(f"identity 'record_key' of a latest pipeline needs upsert.key to "
                             f"be the record key's column ({self.record_key.column!r}), not "
                             f"{self.upsert.key!r}")
        return (self.record_key.column,)

    def _identity_field(self, path: str) -> str:
        """The column of one identity field, which must be a required field."""
        paths = payload_paths(self._model)
        column = paths.get(path)
        if column is None:
            raise ValueError(f"identity field {path!r} is not a field of contract "
                             f"{self._model.key()} ({', '.join(sorted(paths))})")
        if not self._model.model_fields[column].is_required():
            raise ValueError(f"identity field {path!r} must be a required field of contract "
                             f"{self._model.key()}: a record without it (or with null) "
                             "could not be told from another")
        return column

    @property
    def identity_source(self) -> IdentitySource:
        """Where the pipeline's identity comes from (the payload, the record key, the
        source position)."""
        return self._identity.source

    @property
    def identity_fields(self) -> tuple[str, ...]:
        """The payload paths of a ``payload`` identity (empty for the others)."""
        return self._identity.paths

    @property
    def identity_columns(self) -> tuple[str, ...]:
        """The columns that identify a record (:class:`Identity`), in key order: an
        append table's primary key (with ``partition_by``'s column), its ``ON CONFLICT``
        target and its in-chunk dedup key."""
        return self._identity_columns

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
        if len(self.upsert.keys) > 1 and self.envelope is None:
            raise ValueError(f"upsert.key of several columns ({list(self.upsert.keys)}) is for "
                             "envelope: debezium (a source table's composite primary key)")
        roles = [*(("key", k) for k in self.upsert.keys), ("order_by", self.upsert.order_by)]
        for role, column in roles:
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
        if self.upsert.mode is not UpsertMode.LATEST or self.upsert.order_by != LOG_ORDER \
                or self.composite_key:  # its record key's fields: checked as it loads
            return
        if self.record_key is None or self.upsert.key != self.record_key.column:
            raise ValueError(f"upsert.order_by {LOG_ORDER!r} (the log's order) needs upsert.key "
                             "to be the record key's column (record_key.column): offsets "
                             "order a key's records only within the one partition its record "
                             "key sends it to")

    def _check_envelope(self) -> None:
        """A change-event pipeline mirrors a table: one row per record key, in log order,
        deleted by its change events (the tombstones that follow them are skipped)."""
        if self.envelope is None:
            if self.on_truncate is not OnTruncate.SKIP:
                raise ValueError("on_truncate is for change events: set envelope: debezium")
            if self.replica_identity is not ReplicaIdentity.DEFAULT:
                raise ValueError("replica_identity is a mirror's source table's: set "
                                 "envelope: debezium")
            return
        if not self.format.change_events:
            raise ValueError(
                f"envelope 'debezium' reads change events in JSON (Kafka Connect's "
                f"JsonConverter) or in Avro through the registry (a Connect converter's, "
                f"whose schema keeps the Connect schema Debezium's column types and a "
                f"column added at the source are read from); format {self.format.value!r} "
                f"keeps no such schema here, so its changes would be mirrored unchecked")
        if self.replica_identity is ReplicaIdentity.DEFAULT:
            self._check_left_out_arrays()
        if self.composite_key:
            self._check_composite_envelope()
            return
        if self.record_key is None or self.record_key.format is KeyFormat.STRING:
            raise ValueError("envelope 'debezium' reads the row's primary key from the record "
                             "key: set record_key with format json (or registry) and field "
                             "(the key column, e.g. {column: id, format: json, field: id, "
                             "type: bigint}), or, for a primary key of several columns, "
                             "identity: [its fields] (read from the record key)")
        key = self.record_key
        if key.column not in self.contract_column_names:
            raise ValueError(f"envelope 'debezium': record_key.column {key.column!r} must be "
                             "the source table's primary key, a field of the contract "
                             f"({', '.join(self.contract_column_names)})")
        if key.field is None:  # the key struct's field of that name
            object.__setattr__(self, "record_key", key.model_copy(update={"field": key.column}))
        self._check_mirror_upsert((key.column,), f"the record key ({key.column!r})")

    def _check_mirror_upsert(self, keys: tuple[str, ...], keyed_by: str) -> None:
        """A mirror's upsert: ``latest`` keyed by the source's primary key (``keys``) in
        log order, set so when left out; its deletes are change events, so the tombstones
        after them are skipped."""
        if "upsert" not in self.model_fields_set:  # the mirror's own: frozen, so set once
            object.__setattr__(self, "upsert", Upsert(
                mode=UpsertMode.LATEST, key=keys if len(keys) > 1 else keys[0],
                order_by=LOG_ORDER))
        if (self.upsert.mode is not UpsertMode.LATEST or self.upsert.order_by != LOG_ORDER
                or self.upsert.keys != keys):
            raise ValueError("envelope 'debezium' mirrors a table: upsert.mode 'latest' keyed "
                             f"by {keyed_by} in log order ({LOG_ORDER!r}); leave upsert out "
                             "for that")
        if self.on_tombstone is not OnTombstone.SKIP:
            raise ValueError("envelope 'debezium': a delete is its change event (op 'd'); the "
                             "tombstone after it is skipped, so on_tombstone must stay 'skip'")

    def _check_left_out_arrays(self) -> None:
        """A mirror's array column keeps its value when an update leaves it out only if
        Debezium's placeholder for it is told apart from a value (:data:`KEPT_ARRAYS`)."""
        for column in contract_columns(self._model):  # uncached
            kind = column.value_type
            if kind.endswith("[]") and kind not in KEPT_ARRAYS:
                raise ValueError(
                    f"envelope 'debezium': column {column.name!r} is a {kind}: Debezium "
                    "sends null for such an array an update leaves out (stored out of line "
                    "and unchanged, under the source table's REPLICA IDENTITY DEFAULT), "
                    "which the mirror cannot tell from a NULL; leave the column out of the "
                    "contract (and of the connector: column.exclude.list), declare it "
                    f"as one of {', '.join(KEPT_ARRAYS)}, or give the source table REPLICA "
                    "IDENTITY FULL and the pipeline replica_identity: full")

    @property
    def composite_key(self) -> bool:
        """Whether a change-event pipeline is keyed by its ``identity``'s fields, read from
        its record key (a JSON object or a registry format's record of them: a source
        table's primary key of several columns, or of one named by ``identity``), instead
        of by ``record_key``."""
        return (self.envelope is not None and self.record_key is None
                and self.identity is not None and bool(self.identity.fields))

    def _check_composite_envelope(self) -> None:
        """A mirror keyed by several columns: the ``identity``'s fields (required fields of
        the contract) are the table's primary key, in that order; its record keys are JSON
        objects of them (Kafka Connect's JsonConverter, with its schema or without)."""
        paths = self.identity.fields if self.identity is not None else None
        columns = tuple(self._identity_field(path) for path in paths or ())
        kinds = {c.name: c.value_type for c in contract_columns(self._model)}  # uncached
        odd = [c for c in columns if kinds[c] not in KEY_VALUE_TYPES]
        if odd:
            raise ValueError(f"envelope 'debezium': primary key column {odd[0]!r} is a "
                             f"{kinds[odd[0]]}; a key of several fields takes integer, text "
                             "and uuid columns")
        self._check_mirror_upsert(columns, f"its primary key (identity: {list(columns)})")

    @property
    def deletes(self) -> bool:
        """Whether records delete rows (tombstones, or change events' deletes): the table
        keeps deletion markers."""
        return self.on_tombstone is OnTombstone.DELETE or self.envelope is not None

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

    def _check_event_time(self) -> None:
        if self.event_time is None:
            return
        column = payload_paths(self.model).get(self.event_time)
        found = next((c for c in self.sink_columns if c.name == column), None)
        if found is None or found.ddl != "timestamp with time zone":
            raise ValueError(f"event_time {self.event_time!r} must be a timestamptz field of "
                             f"contract {self.model.key()} (its path in the payload); leave it "
                             "out for the records' Kafka timestamps")

    @property
    def event_time_column(self) -> str:
        """The table's column of the event time the watermark is by: ``event_time``'s, or
        ``kafka_timestamp``."""
        if self.event_time is None:
            return "kafka_timestamp"
        return payload_paths(self.model)[self.event_time]

    @property
    def event_time_index(self) -> int:
        """Where a row holds its event time: ``event_time``'s column, or the Kafka
        timestamp (the last provenance column). Read once a chunk; not cached, so a copy
        with another ``event_time`` (``model_copy``) cannot keep the first one's."""
        if self.event_time is None:  # counted from the row's end
            return Provenance._fields.index("kafka_timestamp") - len(Provenance._fields)
        return self.column_names.index(self.event_time_column)

    @property
    def model(self) -> type[Contract]:
        return self._model

    @property
    def contract_column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.model.SINK_COLUMNS)

    @property
    def key_column(self) -> RecordKey | None:
        """The record key as a column of its own: a change event's key is its row's
        primary key, which its ``after`` row carries (read for deletes only)."""
        return self.record_key if self.envelope is None else None

    @property
    def message_columns(self) -> tuple[Column, ...]:
        """The columns filled from the record key and headers, in row order (after the
        contract's)."""
        key = (self.key_column.as_column(),) if self.key_column else ()
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
            return self.upsert.keys
        if self.partition_by is not None \
                and self.partition_by.column not in self.identity_columns:
            return (*self.identity_columns, self.partition_by.column)
        return self.identity_columns

    @property
    def asset_uri(self) -> str:
        return f"postgres://{self.asset_host}/{self.asset_database}/public/{self.table}"

    @property
    def group_id(self) -> str:
        """The Kafka consumer group offsets are committed to (for lag tools)."""
        return self.consumer_group or f"kafka-ingest.{self.name}"
