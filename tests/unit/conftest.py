"""Unit-test helpers: a message double and the shipped pipelines. No service is touched.

The fixtures of ``tests/conftest.py`` (stack_env, pg_dsn, topics, ...) start the real
stack; nothing under ``tests/unit`` may request them, so these tests run anywhere in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kafka_ingest.config import DEFAULT_PIPELINES_FILE, Pipeline, load_pipelines


@dataclass(frozen=True)
class FakeMessage:
    """What validation and the DLQ parser read of a ``confluent_kafka.Message``.

    A data holder, not a mock of Kafka: it implements the read-only accessors a message
    exposes after it was consumed (``timestamp()`` as ``(type, ms)``, type 0 = none).
    """

    value_: bytes | None
    topic_: str = "source-topic"
    partition_: int = 0
    offset_: int = 0
    key_: bytes | None = None
    timestamp_: tuple[int, int] = (1, 1_767_225_600_123)
    headers_: tuple[tuple[str, bytes | None], ...] | None = None

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes | None:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def timestamp(self) -> tuple[int, int]:
        return self.timestamp_

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return None if self.headers_ is None else list(self.headers_)


@pytest.fixture(scope="session")
def shipped() -> dict[str, Pipeline]:
    """The pipelines of the shipped ``include/pipelines.yaml`` (not the env override)."""
    return load_pipelines(DEFAULT_PIPELINES_FILE)


@pytest.fixture(scope="session")
def message() -> type[FakeMessage]:
    """The message class (a fixture, so test modules need not import a conftest)."""
    return FakeMessage
