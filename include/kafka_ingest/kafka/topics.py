"""Topics: create the ones the pipelines need (the broker never auto-creates them)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from kafka_ingest.config import Pipeline
from kafka_ingest.errors import KafkaUnavailable
from kafka_ingest.kafka.clients import KafkaClients, map_kafka_error
from kafka_ingest.kafka.metadata import topic_partitions

#: How often a topic just created is looked for in the cluster's metadata.
VISIBLE_POLL_S = 0.1


def ensure_topics(clients: KafkaClients, topics: dict[str, int], *, replication_factor: int = 1,
                  config: dict[str, str] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics (name -> partitions); return the ones created, once the
    cluster's metadata shows them.

    A broker answers a creation once its controller has recorded it and learns of the
    topic a moment later, so a run started right after ``topics create`` could be told
    the topic does not exist. Listing the topics waits at most the clients'
    ``request_timeout_s``; creating them and seeing them listed, ``timeout_s`` (the
    brokers' own operation, which may take longer than one request), then
    :class:`KafkaUnavailable`.
    """
    admin = clients.admin()
    deadline = time.monotonic() + timeout_s
    existing = topic_partitions(admin, timeout_s=clients.request_timeout_s)
    wanted = [NewTopic(t, num_partitions=n, replication_factor=replication_factor,
                       config=dict(config or {}))
              for t, n in topics.items() if t not in existing]
    if not wanted:
        return []
    for future in admin.create_topics(wanted, operation_timeout=timeout_s).values():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise map_kafka_error("create topics", exc) from exc
    while True:  # a creation appears in the metadata whole, with all its partitions
        listed = topic_partitions(admin, timeout_s=clients.request_timeout_s)
        unseen = [t.topic for t in wanted if t.topic not in listed]
        if not unseen:
            return [t.topic for t in wanted]
        if time.monotonic() >= deadline:
            raise KafkaUnavailable("create topics", f"{', '.join(unseen)} created, and not "
                                   f"in the cluster's metadata after {timeout_s:g} s")
        time.sleep(VISIBLE_POLL_S)


def create_pipeline_topics(clients: KafkaClients, pipelines: list[Pipeline]
                           ) -> tuple[list[str], list[str]]:
    """Create the missing source and dead-letter topics of ``pipelines``, each with its
    pipeline's partitions, replication factor and topic settings; idempotent.

    Returns (created, already there). Pipelines sharing a topic share its creation.
    """
    created: list[str] = []
    existed: list[str] = []
    done: set[str] = set()
    for p in pipelines:
        for topic, config in ((p.topic, {**p.topic_config, **p.source_topic_config}),
                              (p.dlq_topic, p.topic_config)):
            if topic in done:
                continue
            made = ensure_topics(clients, {topic: p.partitions},
                                 replication_factor=p.replication_factor, config=config)
            (created if made else existed).append(topic)
            done.add(topic)
    return created, existed
