"""Unit-test helpers: a message maker and the shipped pipelines. No service is touched.

The fixtures of ``tests/conftest.py`` (stack_env, pg_dsn, topics, ...) start the real
stack; nothing under ``tests/unit`` may request them, so these tests run anywhere in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kafka_ingest.config import DEFAULT_PIPELINES_FILE, Pipeline, load_pipelines
from tests.support.fakes import Msg


@pytest.fixture(scope="session")
def shipped() -> dict[str, Pipeline]:
    """The pipelines of the shipped ``include/pipelines.yaml`` (not the env override)."""
    return load_pipelines(DEFAULT_PIPELINES_FILE)


def _message(value_: bytes | None, **fields: Any) -> Msg:
    """A consumed message of ``source-topic`` [0] at offset 0 unless ``fields`` say
    otherwise (``topic_``, ``partition_``, ``offset_``, ``key_``, ``timestamp_`` as
    ``(type, ms)`` with type 0 = none, ``headers_``)."""
    return Msg(**{"topic_": "source-topic", "partition_": 0, "offset_": 0,
                  "timestamp_": (1, 1_767_225_600_123), **fields, "value_": value_})


@pytest.fixture(scope="session")
def message() -> Callable[..., Msg]:
    """Makes a message (a data holder with the read-only accessors of a consumed
    ``confluent_kafka.Message``; a fixture, so test modules need not import it)."""
    return _message
