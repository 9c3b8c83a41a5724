"""The time-outs that keep a task from hanging on a silent Kafka or Postgres, without
services: where each comes from (setting, default) and that what waits on it gives up.

The faults themselves (a black-holed connection through Toxiproxy, a broker killed) are
in tests/chaos/test_network_faults.py and test_cluster_faults.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kafka_ingest.clients import KafkaClients
from kafka_ingest.config import DlqHeaderStyle
from kafka_ingest.db import Database
from kafka_ingest.db.connection import (
    DEFAULT_REPLY_TIMEOUT_S,
    REPLY_TIMEOUT_ENV,
    reply_timeout_from_env,
)
from kafka_ingest.dlq import DEFAULT_DELIVERY_WAIT_S, DeadLetter, produce_dead_letters
from kafka_ingest.errors import DeliveryFailed, SettingsError
from kafka_ingest.reader import commit_offset

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


def test_a_group_commit_nobody_answers_gives_up_after_socket_timeout() -> None:
    # librdkafka's synchronous commit waits for a coordinator forever (and leaves close()
    # waiting forever). Ours gives up after socket.timeout.ms, and close() is immediate.
    clients = KafkaClients({**NOWHERE, "socket.timeout.ms": 500})
    consumer = clients.consumer("kafka-ingest.test")
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        consumer.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
    waited = time.monotonic() - started
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert "socket.timeout.ms" in raised.value.args[0].str()
    assert 0.4 < waited < 3.0
    started = time.monotonic()
    consumer.close()
    assert time.monotonic() - started < 2.0


def test_a_commit_waits_for_an_unanswered_one_so_no_older_offset_lands_after_a_newer() -> None:
    # One commit in flight per group: the next one waits for it (as long again) instead of
    # racing it from another connection, where an old offset could land last.
    config = {**NOWHERE, "socket.timeout.ms": 300}
    consumer = KafkaClients(config).consumer("kafka-ingest.order")
    with pytest.raises(KafkaException, match="did not answer the commit"):
        consumer.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
    started = time.monotonic()
    with pytest.raises(KafkaException, match="earlier commit to the group is still not "
                                             "answered"):
        consumer.commit(offsets=[TopicPartition("t", 0, 6)], asynchronous=False)
    assert 0.25 < time.monotonic() - started < 2.0
    # Every KafkaClients of the process with that config shares the group's committer.
    assert KafkaClients(config).consumer("kafka-ingest.order").committer is consumer.committer
    consumer.close()


class _TimingOutConsumer:
    """A consumer whose every commit ends in librdkafka's local time-out."""

    def __init__(self) -> None:
        self.commits = 0

    def commit(self, **_: Any) -> None:
        self.commits += 1
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "not answered"))


def test_a_commit_the_coordinator_left_unanswered_is_not_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Retrying would cost each chunk three time-outs while the coordinator is silent; the
    # next chunk's commit, or the next live run's re-sync, catches up instead.
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    consumer = _TimingOutConsumer()
    assert commit_offset(consumer, "t", 0, 42) is False
    assert consumer.commits == 1


def test_clients_cross_to_another_process_without_their_committers() -> None:
    # Partitions may be ingested in worker processes: the clients are pickled there, and a
    # committer (a consumer, a lock) must not go with them.
    import pickle

    clients = KafkaClients(dict(NOWHERE))
    clients.consumer("kafka-ingest.test").close()
    copy = pickle.loads(pickle.dumps(clients))  # noqa: S301 - our own bytes
    assert copy.config == clients.config
    assert copy.consumer("kafka-ingest.test") is not None


def test_a_forked_worker_starts_without_its_parents_committers() -> None:
    # `kafka-ingest run --workers N` forks: a committer (a consumer whose librdkafka
    # threads stay in the parent) must not be inherited.
    import os

    from kafka_ingest import clients as clients_module

    consumer = KafkaClients({**NOWHERE, "socket.timeout.ms": 200}).consumer("kafka-ingest.fork")
    with pytest.raises(KafkaException):  # leaves a commit in flight: the committer stays
        consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
    assert clients_module._COMMITTERS
    pid = os.fork()
    if pid == 0:  # the child: exit at once, 0 if it starts with no committer
        os._exit(1 if clients_module._COMMITTERS else 0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    consumer.close()
