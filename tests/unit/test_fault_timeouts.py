"""The time-outs that keep a task from hanging on a silent Kafka or Postgres, without
services: where each comes from (setting, default) and that what waits on it gives up.

The faults themselves (a black-holed connection through Toxiproxy, a broker killed) are
in tests/chaos/test_network_faults.py and test_cluster_faults.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from kafka_ingest.config import DlqHeaderStyle
from kafka_ingest.db import Database
from kafka_ingest.db.connection import (
    DEFAULT_REPLY_TIMEOUT_S,
    REPLY_TIMEOUT_ENV,
    reply_timeout_from_env,
)
from kafka_ingest.errors import DeliveryFailed, SettingsError
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.dlq import DEFAULT_DELIVERY_WAIT_S, DeadLetter, produce_dead_letters

# Nothing listens on port 1: a client of it never reaches a broker. Its log goes nowhere.
NOWHERE = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}


# --------------------------------------------------------------------------- Postgres


def test_the_reply_timeout_defaults_to_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REPLY_TIMEOUT_ENV, raising=False)
    assert DEFAULT_REPLY_TIMEOUT_S == 60.0
    assert reply_timeout_from_env() == 60.0
    assert Database("host=db dbname=x").reply_timeout_s == 60.0


@pytest.mark.parametrize(("raw", "seconds"), [("7.5", 7.5), (" 20 ", 20.0), ("0", None),
                                              ("", 60.0)])
def test_the_reply_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                      raw: str, seconds: float | None) -> None:
    monkeypatch.setenv(REPLY_TIMEOUT_ENV, raw)
    assert Database("host=db dbname=x").reply_timeout_s == seconds


def test_an_explicit_reply_timeout_wins_and_zero_turns_it_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPLY_TIMEOUT_ENV, "7")
    assert Database("host=db dbname=x", reply_timeout_s=3).reply_timeout_s == 3
    assert Database("host=db dbname=x", reply_timeout_s=0).reply_timeout_s is None


@pytest.mark.parametrize("raw", ["soon", "-1"])
def test_a_bad_reply_timeout_is_a_settings_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(REPLY_TIMEOUT_ENV, raw)
    with pytest.raises(SettingsError, match=REPLY_TIMEOUT_ENV):
        Database("host=db dbname=x")


# --------------------------------------------------------------------------- Kafka


@pytest.mark.parametrize(("config", "seconds"), [
    ({}, 30.0),  # PRODUCER_DEFAULTS
    ({"message.timeout.ms": 5000}, 5.0),
    ({"delivery.timeout.ms": 7000}, 7.0),  # librdkafka's alias, as a connection may say it
])
def test_the_dlq_producer_knows_its_delivery_timeout(config: dict[str, Any],
                                                     seconds: float) -> None:
    producer = KafkaClients({**NOWHERE, **config}).producer()
    assert getattr(producer, "delivery_timeout_s", None) == seconds


class _SilentProducer:
    """Queues records and never reports a delivery; remembers how long flush waited."""

    def __init__(self, delivery_timeout_s: float | None) -> None:
        if delivery_timeout_s is not None:
            self.delivery_timeout_s = delivery_timeout_s
        self.flush_timeouts: list[float] = []

    def produce(self, *_: Any, **__: Any) -> None:
        pass

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.flush_timeouts.append(timeout)
        return 1


def _letter() -> DeadLetter:
    return DeadLetter(source_topic="t", source_partition=0, source_offset=1, key=None,
                      value=b"x", timestamp_ms=None, error_class="undecodable",
                      error_detail="d", contract="c.v1", dlq_topic="t-dlq")


@pytest.mark.parametrize(("delivery_timeout_s", "waited"), [
    (5.0, 10.0),  # message.timeout.ms + 5 s: librdkafka has given every verdict by then
    (120.0, 125.0),  # a longer delivery time-out is not cut short at 30 s any more
    (None, DEFAULT_DELIVERY_WAIT_S + 5.0),  # a producer that does not say
])
def test_the_dlq_wait_for_delivery_reports_follows_message_timeout(
        delivery_timeout_s: float | None, waited: float) -> None:
    producer = _SilentProducer(delivery_timeout_s)
    with pytest.raises(DeliveryFailed, match="no delivery report"):
        produce_dead_letters(producer, [_letter()], "p", DlqHeaderStyle.NATIVE)
    assert producer.flush_timeouts == [waited]
