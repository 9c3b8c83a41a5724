"""Fixtures of the integration tests that more than one module uses."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from kafka_ingest.kafka.clients import KafkaClients


@pytest.fixture
def dlq_topics(clients: KafkaClients) -> Iterator[list[str]]:
    """The dead-letter topics ``topics create`` makes (the test appends each), deleted
    afterwards (best effort)."""
    made: list[str] = []
    yield made
    if made:
        for future in clients.admin().delete_topics(made, operation_timeout=30).values():
            with contextlib.suppress(Exception):
                future.result(30)
