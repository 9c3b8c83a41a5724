"""Fixtures of the integration tests that more than one module uses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_ingest.kafka.clients import KafkaClients
from tests.support.topics import delete_topics


@pytest.fixture
def dlq_topics(clients: KafkaClients) -> Iterator[list[str]]:
    """The dead-letter topics ``topics create`` makes (the test appends each), deleted
    afterwards (best effort)."""
    made: list[str] = []
    yield made
    delete_topics(clients, made)
