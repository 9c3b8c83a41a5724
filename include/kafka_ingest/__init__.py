"""kafka_ingest: micro-batch ingestion from Apache Kafka into PostgreSQL.

The core is plain Python (no Airflow import): contracts, pipeline config, range planning,
bounded reads, validation, the Postgres sink and the dead-letter queue. Airflow DAGs,
the Kafka hook and the ``kafka-ingest`` CLI are thin wiring over :mod:`kafka_ingest.service`.
"""

from kafka_ingest.config import Pipeline, get_pipeline, load_pipelines
from kafka_ingest.contracts import REGISTRY, Contract, get_contract
from kafka_ingest.dlq import DeadLetter
from kafka_ingest.errors import DataError, IngestError, TransientError
from kafka_ingest.ranges import Mode, OffsetRange
from kafka_ingest.reader import KafkaClients
from kafka_ingest.service import RangeReport, ingest_range, plan_run, summarize
from kafka_ingest.sink import Database, UnitOfWork, migrate

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
    "Pipeline",
    "RangeReport",
    "TransientError",
    "UnitOfWork",
    "get_contract",
    "get_pipeline",
    "ingest_range",
    "load_pipelines",
    "migrate",
    "plan_run",
    "summarize",
]
