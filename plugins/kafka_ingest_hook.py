"""Airflow's connections made kafka_ingest's clients: the Kafka hook, the schema registry's
settings, the Postgres database.

``KafkaIngestHook`` subclasses the Kafka provider's ``KafkaBaseHook`` and overrides only
``_get_client``: the connection's extra (the librdkafka dict) becomes a
:class:`kafka_ingest.kafka.clients.KafkaClients`, which forces ``enable.auto.commit=false``,
``enable.auto.offset.store=false`` and ``auto.offset.reset=error`` whatever the connection
says. It never uses ``KafkaConsumerHook.get_consumer()``: that subscribes; we assign.

No side effects at import time (the plugin manager imports every file here).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.sdk import BaseHook

from kafka_ingest.db import Database, libpq_dsn
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.registry import RegistrySettings, registry_settings_from


class KafkaIngestHook(KafkaBaseHook):
    """The Kafka clients (:class:`~kafka_ingest.kafka.clients.KafkaClients`: bounded reads,
    DLQ produce, group commits) of an Airflow Kafka connection, whose extra is the
    librdkafka config; the core reads and commits through them.

    :param kafka_config_id: the Kafka connection.
    """

    hook_name = "Apache Kafka (kafka-ingest)"

    def __init__(self, kafka_config_id: str = KafkaBaseHook.default_conn_name) -> None:
        super().__init__(kafka_config_id=kafka_config_id)

    def _get_client(self, config: dict[str, Any]) -> KafkaClients:
        self.log.info("Kafka clients for %s: auto commit and auto offset reset are off; "
                      "offsets are committed after the database commit", self.kafka_config_id)
        return KafkaClients(config)

    @property
    def clients(self) -> KafkaClients:
        client: KafkaClients = self.get_conn
        return client


def pipeline_clients(pipeline: Any) -> KafkaClients:
    """The Kafka clients of a pipeline's Kafka connection, with its schema registry (from
    ``schema_registry.conn_id``) when its format reads one."""
    clients = KafkaIngestHook(pipeline.kafka_conn_id).clients
    registry = pipeline.schema_registry  # set whenever the format is not JSON (config)
    if not pipeline.format.registry or registry is None:
        return clients
    return clients.with_registry(registry_settings(registry.conn_id))


def registry_settings(conn_id: str) -> RegistrySettings:
    """The schema registry of an Airflow ``http`` connection (see
    :func:`kafka_ingest.kafka.registry.registry_settings_from`)."""
    conn = BaseHook.get_connection(conn_id)
    return registry_settings_from(source=f"Airflow connection {conn_id!r}", host=conn.host,
                                  port=conn.port, scheme=conn.schema, login=conn.login,
                                  password=conn.password, extra=conn.extra_dejson)


def postgres_database(conn_id: str) -> Database:
    """A :class:`Database` for an Airflow Postgres connection: host, port, login, password,
    database (the connection's schema), and every libpq keyword of its extra (``sslmode``,
    ``sslrootcert``, ``sslcert``, ``sslkey``, ``options``, ...). No host or no database is
    a permanent error naming the connection.

    Writes go through psycopg 3 in one transaction per chunk, never through
    ``DbApiHook.insert_rows`` (it commits per batch on its own connection).
    """
    conn = BaseHook.get_connection(conn_id)
    return Database(libpq_dsn(source=f"Airflow connection {conn_id!r}", host=conn.host,
                              port=conn.port, user=conn.login, password=conn.password,
                              dbname=conn.schema, extra=conn.extra_dejson))
