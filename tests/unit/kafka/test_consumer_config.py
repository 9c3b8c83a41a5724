"""What a slice's consumer is configured with: our defaults, the connection's settings over
them, and the settings no connection may change."""

from __future__ import annotations

from kafka_ingest.kafka.clients import KafkaClients


def test_the_prefetch_holds_two_default_chunks_unless_the_connection_says_otherwise() -> None:
    # librdkafka's default (100,000 messages) kept 30 MB more of a slice's peak RSS in
    # its queue for no speed; a connection that sets it keeps its own value.
    ours = KafkaClients({"bootstrap.servers": "127.0.0.1:1"})._consumer_config("g")
    assert ours["queued.min.messages"] == 2 * 20_000
    theirs = KafkaClients({"bootstrap.servers": "127.0.0.1:1", "queued.min.messages": 5,
                           "enable.auto.commit": True})._consumer_config("g")
    assert theirs["queued.min.messages"] == 5
    assert theirs["enable.auto.commit"] is False and theirs["group.id"] == "g"
