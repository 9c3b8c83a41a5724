"""Pipeline definitions: one YAML entry per pipeline (topic -> contract -> table).

The file is ``include/pipelines.yaml`` unless ``KAFKA_INGEST_PIPELINES`` names another.
Loading validates everything at once: an unknown key, a wrong type or a contract that is
not registered raises ``ValueError`` naming the pipeline and the key, before any DAG or
run is built from it.

- :mod:`~kafka_ingest.config.modes`: the choices a pipeline makes by name, the name patterns;
- :mod:`~kafka_ingest.config.sections`: the sections of an entry, each a strict model;
- :mod:`~kafka_ingest.config.pipeline`: one pipeline, validated whole;
- :mod:`~kafka_ingest.config.loading`: the file, and the checks across pipelines.
"""

from kafka_ingest.config.loading import (
    DEFAULT_PIPELINES_FILE,
    airflow_pools,
    declared_contracts,
    get_pipeline,
    load_declared_contracts,
    load_pipelines,
    parse_pipelines,
    pipelines_file,
    pool_import_document,
    shared_tables,
)
from kafka_ingest.config.modes import (
    DEFAULT_POOL,
    DEFAULT_POOL_SLOTS,
    DOTTED_PATTERN,
    KEPT_ARRAYS,
    KEY_VALUE_TYPES,
    LOG_ORDER,
    NAME_PATTERN,
    POOL_PATTERN,
    SOURCE_POSITION_COLUMNS,
    TOPIC_PATTERN,
    UNAVAILABLE,
    UNAVAILABLE_DATES,
    UNAVAILABLE_JSON,
    UNAVAILABLE_UUID,
    DlqHeaderStyle,
    Envelope,
    Format,
    IdentitySource,
    KeyFormat,
    KeyType,
    OnOffsetGap,
    OnTombstone,
    OnTruncate,
    ReplicaIdentity,
    StartPolicy,
    SubjectStrategy,
    UpsertMode,
)
from kafka_ingest.config.pipeline import (
    Pipeline,
)
from kafka_ingest.config.sections import (
    ON_DATA,
    Alerts,
    ContractRef,
    HeaderColumn,
    Identity,
    NotifierClass,
    OnData,
    Partitioning,
    RecordKey,
    Retention,
    SchemaRegistry,
    Upsert,
)

__all__ = [
    "DEFAULT_PIPELINES_FILE",
    "DEFAULT_POOL",
    "DEFAULT_POOL_SLOTS",
    "DOTTED_PATTERN",
    "KEPT_ARRAYS",
    "KEY_VALUE_TYPES",
    "LOG_ORDER",
    "NAME_PATTERN",
    "ON_DATA",
    "POOL_PATTERN",
    "SOURCE_POSITION_COLUMNS",
    "TOPIC_PATTERN",
    "UNAVAILABLE",
    "UNAVAILABLE_DATES",
    "UNAVAILABLE_JSON",
    "UNAVAILABLE_UUID",
    "Alerts",
    "ContractRef",
    "DlqHeaderStyle",
    "Envelope",
    "Format",
    "HeaderColumn",
    "Identity",
    "IdentitySource",
    "KeyFormat",
    "KeyType",
    "NotifierClass",
    "OnData",
    "OnOffsetGap",
    "OnTombstone",
    "OnTruncate",
    "Partitioning",
    "Pipeline",
    "RecordKey",
    "ReplicaIdentity",
    "Retention",
    "SchemaRegistry",
    "StartPolicy",
    "SubjectStrategy",
    "Upsert",
    "UpsertMode",
    "airflow_pools",
    "declared_contracts",
    "get_pipeline",
    "load_declared_contracts",
    "load_pipelines",
    "parse_pipelines",
    "pipelines_file",
    "pool_import_document",
    "shared_tables",
]
