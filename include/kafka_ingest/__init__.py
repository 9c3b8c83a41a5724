"""kafka_ingest: micro-batch ingestion from Apache Kafka into PostgreSQL.

The core is plain Python (no Airflow import): contracts, pipeline config, typed run
requests, range planning, bounded reads, validation, the Postgres sink, the dead-letter
queue, and one slice engine that ingest, backfill and replay share. Airflow DAGs, the
Kafka hook and the ``kafka-ingest`` CLI are thin wiring over it.
"""

from kafka_ingest.config import Pipeline, get_pipeline, load_pipelines
from kafka_ingest.contracts import REGISTRY, Contract, get_contract
from kafka_ingest.db import Database, UnitOfWork, migrate
from kafka_ingest.errors import DataError, IngestError, PermanentError, TransientError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.dlq import DeadLetter
from kafka_ingest.ranges import Mode, OffsetRange

__all__ = [
    "REGISTRY",
    "Contract",
    "DataError",
    "Database",
    "DeadLetter",
    "IngestError",
    "KafkaClients",
    "Mode",
    "OffsetRange",
    "PermanentError",
    "Pipeline",
    "TransientError",
    "UnitOfWork",
    "get_contract",
    "get_pipeline",
    "load_pipelines",
    "migrate",
]
