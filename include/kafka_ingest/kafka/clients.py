"""Kafka clients from one librdkafka config, and the one place Kafka's errors are mapped.

Whatever the connection says, consumers run with ``enable.auto.commit=false``,
``enable.auto.offset.store=false`` and ``auto.offset.reset=error`` (librdkafka's defaults
commit behind our back and silently jump to the end on a retention gap), and the DLQ
producer with ``acks=all`` and idempotence. Every other setting the user gives (TLS,
SASL, time-outs, ...) reaches the client unchanged.

Every wait on the cluster is bounded by a librdkafka time-out of the config: requests by
``socket.timeout.ms`` (default here 10 s), a dead letter's delivery by
``message.timeout.ms`` (alias ``delivery.timeout.ms``; default here 30 s), and a
wait for a group commit by ``socket.timeout.ms`` too (see :mod:`kafka_ingest.kafka.commits`:
librdkafka's own would wait forever for a coordinator that does not answer).

librdkafka's log lines go through Python logging, to the ``kafka_ingest.librdkafka``
logger at their own level (unless the connection names a ``logger`` of its own, by name),
served when the client is polled: never raw ``%4|...`` lines on stderr.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import AdminClient

from kafka_ingest.errors import (
    IngestError,
    KafkaRefused,
    KafkaUnavailable,
    OffsetOutOfRange,
    SettingsError,
    TopicMissing,
)
from kafka_ingest.kafka.commits import GroupCommitter
from kafka_ingest.kafka.registry import RegistrySettings

log = logging.getLogger(__name__)
#: Where librdkafka's own log lines go (see the module docstring).
LIBRDKAFKA_LOG = logging.getLogger("kafka_ingest.librdkafka")

FORCED_CONSUMER = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
}
# Defaults we choose; the connection may override them.
CONSUMER_DEFAULTS: dict[str, Any] = {
    # librdkafka idles 1 s once its queue is full (default 1000 ms): 166k -> 600k msg/s here.
    "fetch.queue.backoff.ms": 10,
    "enable.partition.eof": False,
    # An idle fetch waits at most this long (default 500 ms): the end of a range and the
    # watermark query behind it come back quickly.
    "fetch.wait.max.ms": 100,
    "socket.timeout.ms": 10_000,
    # librdkafka prefetches until this many messages wait (default 100,000): two chunks
    # of the default size keep the reader fed as well, and a slice's peak RSS is 30 MB
    # lower (200 -> 171 MB over 1M events, the same CPU and events/s).
    "queued.min.messages": 40_000,
}
FORCED_PRODUCER = {"acks": "all", "enable.idempotence": True}
PRODUCER_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "message.timeout.ms": 30_000,
                                     "compression.type": "lz4"}
# Keys librdkafka accepts only on consumers; dropped for producers and admin clients.
_CONSUMER_ONLY = {
    "group.id", "group.instance.id", "auto.offset.reset", "enable.auto.commit",
    "enable.auto.offset.store", "auto.commit.interval.ms", "fetch.queue.backoff.ms",
    "enable.partition.eof", "isolation.level", "session.timeout.ms", "max.poll.interval.ms",
    "fetch.min.bytes", "fetch.max.bytes", "fetch.wait.max.ms", "queued.min.messages",
    "queued.max.messages.kbytes", "max.partition.fetch.bytes", "partition.assignment.strategy",
    "group.protocol", "heartbeat.interval.ms", "check.crcs", "on_commit",
}
_PRODUCER_ONLY = {"acks", "enable.idempotence", "linger.ms", "message.timeout.ms",
                  "compression.type", "batch.size", "retries", "delivery.timeout.ms"}


class EachLineOnce(logging.Filter):
    """Lets a log line through the first time only. librdkafka logs a connection that
    fails on every attempt, about twenty a second while a request waits for the cluster:
    a broker out of reach would bury the one line that says so."""

    def __init__(self, *, limit: int = 1000) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._limit = limit  # distinct lines remembered (a long run's memory stays bounded)

    def filter(self, record: logging.LogRecord) -> bool:
        line = record.getMessage()
        if line in self._seen:
            return False
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(line)
        return True


#: Added to :data:`LIBRDKAFKA_LOG` by long-lived processes that ask an unreachable cluster
#: again and again (the CLI, the metrics of the Airflow plugin).
LIBRDKAFKA_ONCE = EachLineOnce()


class _Refusals:
    """The refusals librdkafka reports only through ``error_cb`` (a wrong password, a CA
    that does not vouch for the broker): the request that failed says no more than
    "transport failure" after its time-out."""

    def __init__(self) -> None:
        self.last: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.fatal() or err.code() in REFUSED_CODES:
            self.last = err


class _Consumer(Consumer):
    """A consumer that remembers whether the cluster refused it (see :func:`refusal`)."""

    refusals: _Refusals


class _Producer(Producer):
    """A producer that knows how long librdkafka may take to report each delivery
    (``message.timeout.ms``), so waiting for the reports never gives up earlier."""

    delivery_timeout_s: float


def _seconds(config: dict[str, Any], *keys: str, default_ms: int) -> float:
    """The first of ``keys`` set in a librdkafka config (milliseconds), in seconds."""
    for key in keys:
        if config.get(key) is not None:
            return float(config[key]) / 1000.0
    return default_ms / 1000.0


class KafkaClients:
    """Builds confluent-kafka clients from one librdkafka config dict (the connection's)."""

    def __init__(self, config: dict[str, Any], *,
                 registry: RegistrySettings | None = None) -> None:
        if not config.get("bootstrap.servers"):
            raise ValueError("the Kafka config needs 'bootstrap.servers'")
        self.config = dict(config)
        #: The schema registry of the cluster's registry-encoded topics, if any.
        self.registry = registry
        if isinstance(self.config.get("logger"), str):  # a connection's JSON can only name one
            self.config["logger"] = logging.getLogger(self.config["logger"])
        overridden = {k: config[k] for k in FORCED_CONSUMER if k in config
                      and config[k] != FORCED_CONSUMER[k]}
        if overridden:
            log.warning("ignoring %s from the Kafka connection: offsets are committed only "
                        "after the database commit", overridden)

    def with_registry(self, registry: RegistrySettings | None) -> KafkaClients:
        """The same clients, with this schema registry."""
        clients = copy.copy(self)
        clients.registry = registry
        return clients

    def _common(self) -> dict[str, Any]:
        return {"logger": LIBRDKAFKA_LOG, **{k: v for k, v in self.config.items()
                                             if k not in _CONSUMER_ONLY
                                             and k not in _PRODUCER_ONLY}}

    def _consumer_config(self, group_id: str) -> dict[str, Any]:
        return {**CONSUMER_DEFAULTS, "logger": LIBRDKAFKA_LOG,
                **{k: v for k, v in self.config.items() if k not in _PRODUCER_ONLY},
                **FORCED_CONSUMER, "group.id": group_id}

    def consumer(self, group_id: str) -> Consumer:
        """A consumer of ``group_id`` that assigns (never subscribes) and never commits by
        itself; its group commits go through :meth:`committer`."""
        refusals = _Refusals()
        consumer = _configured("consumer", _Consumer,
                               {**self._consumer_config(group_id), "error_cb": refusals})
        consumer.refusals = refusals
        return consumer

    @property
    def request_timeout_s(self) -> float:
        """How long one request to the cluster may wait, in seconds: the config's
        ``socket.timeout.ms`` (the consumers' default when unset).

        A command's metadata and watermark requests, and a wait for the group commits,
        take this long at most, so a cluster that cannot be reached fails the command after
        the time-out its config chose, not after a longer one of the command's own.
        """
        raw = self.config.get("socket.timeout.ms", CONSUMER_DEFAULTS["socket.timeout.ms"])
        try:
            return float(raw) / 1000.0
        except (TypeError, ValueError):
            raise SettingsError(f"the Kafka config's socket.timeout.ms is {raw!r}, not a "
                                "number of milliseconds") from None

    def committer(self, group_id: str, *,
                  on_commit: Callable[[], None] | None = None) -> GroupCommitter:
        """Background, bounded commits to ``group_id`` (see :mod:`kafka_ingest.kafka.commits`);
        each wait for them at most :attr:`request_timeout_s`."""
        return GroupCommitter(lambda: self.consumer(group_id), group_id,
                              timeout_s=self.request_timeout_s, on_commit=on_commit)

    def producer(self) -> Producer:
        conf = {**PRODUCER_DEFAULTS, "logger": LIBRDKAFKA_LOG,
                **{k: v for k, v in self.config.items() if k not in _CONSUMER_ONLY},
                **FORCED_PRODUCER}
        producer = _configured("producer", _Producer, conf)
        producer.delivery_timeout_s = _seconds(conf, "delivery.timeout.ms", "message.timeout.ms",
                                               default_ms=300_000)
        return producer

    def admin(self) -> AdminClient:
        return _configured("admin client", AdminClient, self._common())

    def topic_id(self, topic: str, *, role: str = "topic") -> str:
        """Kafka's id of the topic now under this name (KIP-516), as ``kafka-topics
        --describe`` prints it: a topic deleted and created again has a new one. One
        request, bounded by :attr:`request_timeout_s`; :class:`TopicMissing` if there is
        no such topic."""
        wait_s = self.request_timeout_s
        operation = f"describe {topic!r}"
        refusals = _Refusals()
        # held until the answer: a client let go cancels its requests
        admin = _configured("admin client", AdminClient, {**self._common(),
                                                          "error_cb": refusals})
        future = admin.describe_topics(TopicCollection([topic]), request_timeout=wait_s)[topic]
        try:
            return str(future.result(wait_s + 1).topic_id)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicMissing(topic, role) from exc
            raise _refused(admin, refusals, operation) or map_kafka_error(operation,
                                                                          exc) from exc
        except TimeoutError as exc:
            raise _refused(admin, refusals, operation) or KafkaUnavailable(
                operation, f"no answer within {wait_s:g} s") from exc


C = TypeVar("C")


def _configured(kind: str, client: Callable[[dict[str, Any]], C], conf: dict[str, Any]) -> C:
    """``client(conf)``; a setting librdkafka refuses (an unknown key, a bad value) is a
    permanent :class:`KafkaRefused` naming it, not a raw ``KafkaException``."""
    try:
        return client(conf)
    except KafkaException as exc:
        raise map_kafka_error(f"{kind} configuration", exc) from exc


#: librdkafka codes that no retry can cure: credentials, permissions, TLS, configuration.
#: (A fatal error, ``err.fatal()``, is refused too, whatever its code.)
REFUSED_CODES = frozenset({
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError._INVALID_ARG,
    KafkaError._NOT_CONFIGURED,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
    KafkaError.ILLEGAL_SASL_STATE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.INVALID_CONFIG,
})
_OUT_OF_RANGE = frozenset({KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET})


def _refused(client: Any, refusals: _Refusals, operation: str) -> KafkaRefused | None:
    """The refusal ``client`` (an admin client) was told of, its error events served now."""
    client.poll(0)
    return _as_refused(refusals.last, operation)


def _as_refused(err: KafkaError | None, operation: str) -> KafkaRefused | None:
    if err is None:
        return None
    kind = "fatal" if err.fatal() else "refused"
    return KafkaRefused(operation, f"{err.name()} [{kind}]: {err.str()}")


def refusal(client: Any, operation: str) -> KafkaRefused | None:
    """Whether the cluster refused ``client`` (an unassigned consumer of ours): its queued
    error events are served first, so a refusal is seen as soon as the request fails."""
    refusals = getattr(client, "refusals", None)
    if not isinstance(refusals, _Refusals):
        return None
    if refusals.last is None and not client.assignment():
        client.poll(0)  # serves error_cb; an unassigned consumer has no message to lose
    return _as_refused(refusals.last, operation)


def map_kafka_error(operation: str, err: Any, client: Any = None) -> IngestError:
    """Map a confluent-kafka ``KafkaError`` (or ``KafkaException``) onto the error tree.

    Broker-side failures are infrastructure: transient, raised for Airflow to retry, never
    dead-lettered. Refusals (credentials, permissions, TLS, fatal client state) and offsets
    out of range (with ``auto.offset.reset=error``: retention deleted the range, or the
    topic was recreated) are permanent. With ``client``, a refusal it was told of (see
    :func:`refusal`) explains a failure the request itself reports only as a time-out.
    """
    refused = refusal(client, operation) if client is not None else None
    if refused is not None:
        return refused
    if isinstance(err, KafkaException):
        err = err.args[0] if err.args else err
    if not isinstance(err, KafkaError):
        return KafkaUnavailable(operation, repr(err))
    code = err.code()
    if code in _OUT_OF_RANGE:
        return OffsetOutOfRange(f"Kafka {operation}", f"offset out of range ({err.str()}); "
                                "retention may have deleted the planned range")
    if err.fatal() or code in REFUSED_CODES:
        kind = "fatal" if err.fatal() else "refused"
        return KafkaRefused(operation, f"{err.name()} [{kind}]: {err.str()}")
    kind = "retriable" if err.retriable() else "error"
    return KafkaUnavailable(operation, f"{err.name()} [{kind}]: {err.str()}")


__all__ = [
    "CONSUMER_DEFAULTS",
    "FORCED_CONSUMER",
    "FORCED_PRODUCER",
    "LIBRDKAFKA_LOG",
    "PRODUCER_DEFAULTS",
    "REFUSED_CODES",
    "KafkaClients",
    "map_kafka_error",
    "refusal",
]
