"""Topics: create the ones a pipeline needs (topics are never auto-created)."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from kafka_ingest.clients import KafkaClients, map_kafka_error


def ensure_topics(clients: KafkaClients, topics: dict[str, int], *, replication_factor: int = 1,
                  timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics (name -> partitions); return the ones created."""
    admin = clients.admin()
    try:
        existing = set(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise map_kafka_error("list topics", exc) from exc
    wanted = [NewTopic(t, num_partitions=n, replication_factor=replication_factor)
              for t, n in topics.items() if t not in existing]
    if not wanted:
        return []
    for future in admin.create_topics(wanted, operation_timeout=timeout_s).values():
        try:
            future.result(timeout_s)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise map_kafka_error("create topics", exc) from exc
    return [t.topic for t in wanted]
