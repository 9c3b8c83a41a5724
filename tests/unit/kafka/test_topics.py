"""Creating topics: done once the cluster's metadata shows them (kafka/topics.py)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from kafka_ingest.errors import KafkaUnavailable
from kafka_ingest.kafka import topics
from kafka_ingest.kafka.topics import ensure_topics


class _Admin:
    """A cluster whose metadata shows a created topic only after ``lag`` more listings
    (a broker learns of a topic after its controller answered the creation)."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.created: dict[str, int] = {}
        self.listings_after_create = 0

    def list_topics(self, timeout: float) -> Any:
        if self.created:
            self.listings_after_create += 1
        shown = self.created if self.listings_after_create > self.lag else {}
        return SimpleNamespace(topics={
            name: SimpleNamespace(partitions={p: None for p in range(n)}, error=None)
            for name, n in shown.items()})

    def create_topics(self, wanted: list[Any], operation_timeout: float) -> dict[str, Any]:
        futures = {}
        for topic in wanted:
            self.created[topic.topic] = topic.num_partitions
            futures[topic.topic] = future = Future()
            future.set_result(None)
        return futures


def _clients(admin: _Admin) -> Any:
    return SimpleNamespace(admin=lambda: admin, request_timeout_s=1.0)


def test_a_created_topic_is_returned_once_the_metadata_shows_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `topics create` then `run` at once: the run was told the dead-letter topic just made
    # did not exist (a clean-clone run's Debezium test), as the broker had not learnt of it
    monkeypatch.setattr(topics, "VISIBLE_POLL_S", 0.001)
    admin = _Admin(lag=3)
    assert ensure_topics(_clients(admin), {"t": 3}) == ["t"]
    assert admin.listings_after_create == 4  # three without it, then the one with it


def test_a_topic_never_shown_is_a_kafka_failure_after_the_time_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(topics, "VISIBLE_POLL_S", 0.001)
    with pytest.raises(KafkaUnavailable, match="t created, and not in the cluster's metadata"):
        ensure_topics(_clients(_Admin(lag=10**9)), {"t": 1}, timeout_s=0.05)
