"""Kafka clients from one librdkafka config, and the one place Kafka's errors are mapped.

Whatever the connection says, consumers run with ``enable.auto.commit=false``,
``enable.auto.offset.store=false`` and ``auto.offset.reset=error`` (librdkafka's defaults
commit behind our back and silently jump to the end on a retention gap), and the DLQ
producer with ``acks=all`` and idempotence. Every other setting the user gives (TLS,
SASL, time-outs, ...) reaches the client unchanged.

Every wait on the cluster is bounded by a librdkafka time-out of the config: requests by
``socket.timeout.ms`` (default here 10 s), a dead letter's delivery by
``message.timeout.ms`` (alias ``delivery.timeout.ms``; default here 30 s), and a
synchronous group commit by ``socket.timeout.ms`` too (see :meth:`_Consumer.commit`:
librdkafka's own would wait forever for a coordinator that does not answer).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_ingest.errors import IngestError, KafkaRefused, KafkaUnavailable, OffsetOutOfRange

log = logging.getLogger(__name__)

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
    """A consumer that remembers whether the cluster refused it (see :func:`refusal`), and
    whose synchronous commits are bounded in time (see :meth:`commit`)."""

    refusals: _Refusals
    committer: GroupCommitter

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        """A synchronous commit of explicit offsets (``commit(offsets=[...],
        asynchronous=False)``, the only commit kafka_ingest makes) waits at most
        ``socket.timeout.ms`` (:class:`GroupCommitter`) and raises ``KafkaException`` like
        librdkafka's when it fails or times out. Any other commit is librdkafka's."""
        offsets = kwargs.get("offsets")
        if (args or offsets is None or kwargs.get("asynchronous", True)
                or kwargs.get("message") is not None):
            return super().commit(*args, **kwargs)
        return self.committer.commit(offsets)

    def close(self, *args: Any, **kwargs: Any) -> None:
        """Close, and let go of the group's committer (closed with its last user, unless a
        commit of it is still in flight: then when that one ends)."""
        committer, self.committer = self.committer, _RELEASED
        committer.release()
        super().close(*args, **kwargs)


class _Producer(Producer):
    """A producer that knows how long librdkafka may take to report each delivery
    (``message.timeout.ms``), so waiting for the reports never gives up earlier."""

    delivery_timeout_s: float


class GroupCommitter:
    """Commits offsets to one consumer group, one commit at a time, waiting at most
    ``timeout_s`` for each.

    librdkafka's synchronous commit has no time-out: it waits for the group coordinator
    forever, and a coordinator that is connected but silent (a black-holed connection, a
    hung broker) never answers. Worse, a commit left pending in a consumer makes its
    ``close()`` wait forever too (librdkafka issue #3740): the task would hang until its
    Airflow time-out.

    So commits are made by a consumer of the committer's own (same config and group; ours
    never join the group, they assign), in a thread the caller waits for at most
    ``timeout_s``: the reading consumer never has a commit pending, and its ``close()``
    stays immediate. A commit not answered in time raises ``_TIMED_OUT`` and stays in
    flight; the next commit first waits (as long again) for it to end, then goes through
    the same consumer, so commits reach the coordinator in the order they were made and
    an old offset can never land after a newer one. There is one committer per group and
    config in a process (:func:`group_committer`), shared by every consumer of every
    ``KafkaClients`` and closed with the last of them (or, if a commit of it is still in
    flight then, when that commit ends).
    (The admin API's AlterConsumerGroupOffsets would be bounded, but librdkafka 2.16
    aborts the process when the coordinator dies under it.)
    """

    def __init__(self, config: dict[str, Any], timeout_s: float, key: Any = None) -> None:
        self._config = config
        self.timeout_s = timeout_s
        self._key = key
        self._consumer: Consumer | None = None
        self._in_flight: threading.Event | None = None
        self._lock = threading.Lock()  # one commit at a time
        self.users = 0  # consumers using it; guarded by _COMMITTERS_LOCK

    def _timed_out(self, what: str) -> KafkaException:
        return KafkaException(KafkaError(
            KafkaError._TIMED_OUT, f"{what} within {self.timeout_s:g} s (socket.timeout.ms)"))

    def commit(self, offsets: Sequence[TopicPartition]) -> Any:
        with self._lock:
            if self._in_flight is not None:
                if not self._in_flight.wait(self.timeout_s):
                    raise self._timed_out("an earlier commit to the group is still not "
                                          "answered")
                self._in_flight = None
            if self._consumer is None:
                self._consumer = Consumer(self._config)
            consumer = self._consumer
            outcome: dict[str, Any] = {}
            finished = threading.Event()

            def work() -> None:
                try:
                    outcome["result"] = consumer.commit(offsets=list(offsets),
                                                        asynchronous=False)
                except BaseException as exc:  # handed to the caller
                    outcome["error"] = exc
                finally:
                    finished.set()
                    self._retire_if_unused()

            threading.Thread(target=work, name="kafka-group-commit", daemon=True).start()
            if not finished.wait(self.timeout_s):
                self._in_flight = finished
                raise self._timed_out("the group coordinator did not answer the commit")
            if "error" in outcome:
                raise outcome["error"]
            return outcome.get("result")

    def _busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.is_set()

    def release(self) -> None:
        """One user less; the last one closes it, unless a commit is still in flight."""
        with _COMMITTERS_LOCK:
            self.users -= 1
        self._retire_if_unused()

    def _retire_if_unused(self) -> None:
        with _COMMITTERS_LOCK:
            if self.users > 0 or self._busy() or _COMMITTERS.get(self._key) is not self:
                return
            del _COMMITTERS[self._key]
            consumer, self._consumer = self._consumer, None
        if consumer is not None:  # nothing pending in it: closing is immediate
            consumer.close()


class _Released(GroupCommitter):
    """What a closed consumer holds instead of its committer."""

    def __init__(self) -> None:
        super().__init__({}, 0.0)

    def commit(self, offsets: Sequence[TopicPartition]) -> Any:
        raise RuntimeError("the consumer is closed")

    def release(self) -> None:
        pass


_COMMITTERS: dict[tuple[str, str], GroupCommitter] = {}
_COMMITTERS_LOCK = threading.Lock()
_RELEASED = _Released()


def _forget_committers_in_child() -> None:
    """A forked worker (``kafka-ingest run --workers``) has none of its parent's librdkafka
    threads: it makes committers of its own."""
    global _COMMITTERS_LOCK
    _COMMITTERS.clear()
    _COMMITTERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_committers_in_child)


def group_committer(group_id: str, conf: dict[str, Any]) -> GroupCommitter:
    """The process's committer for ``group_id`` on the cluster and credentials ``conf``
    names, one more user of it (created on first use, closed with its last user; see
    :class:`GroupCommitter`)."""
    plain = {k: v for k, v in conf.items() if not callable(v)}
    key = (group_id, json.dumps(plain, sort_keys=True, default=repr))
    with _COMMITTERS_LOCK:
        committer = _COMMITTERS.get(key)
        if committer is None:
            committer = GroupCommitter(plain, _seconds(plain, "socket.timeout.ms",
                                                       default_ms=60_000), key)
            _COMMITTERS[key] = committer
        committer.users += 1
        return committer


def _seconds(config: dict[str, Any], *keys: str, default_ms: int) -> float:
    """The first of ``keys`` set in a librdkafka config (milliseconds), in seconds."""
    for key in keys:
        if config.get(key) is not None:
            return float(config[key]) / 1000.0
    return default_ms / 1000.0


class KafkaClients:
    """Builds confluent-kafka clients from one librdkafka config dict (the connection's)."""

    def __init__(self, config: dict[str, Any]) -> None:
        if not config.get("bootstrap.servers"):
            raise ValueError("the Kafka config needs 'bootstrap.servers'")
        self.config = dict(config)
        overridden = {k: config[k] for k in FORCED_CONSUMER if k in config
                      and config[k] != FORCED_CONSUMER[k]}
        if overridden:
            log.warning("ignoring %s from the Kafka connection: offsets are committed only "
                        "after the database commit", overridden)

    def _common(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items()
                if k not in _CONSUMER_ONLY and k not in _PRODUCER_ONLY}

    def consumer(self, group_id: str) -> Consumer:
        refusals = _Refusals()
        conf = {**CONSUMER_DEFAULTS, **{k: v for k, v in self.config.items()
                                        if k not in _PRODUCER_ONLY},
                **FORCED_CONSUMER, "group.id": group_id, "error_cb": refusals}
        consumer = _Consumer(conf)
        consumer.refusals = refusals
        consumer.committer = group_committer(group_id, conf)
        return consumer

    def producer(self) -> Producer:
        conf = {**PRODUCER_DEFAULTS, **{k: v for k, v in self.config.items()
                                        if k not in _CONSUMER_ONLY}, **FORCED_PRODUCER}
        producer = _Producer(conf)
        producer.delivery_timeout_s = _seconds(conf, "delivery.timeout.ms", "message.timeout.ms",
                                               default_ms=300_000)
        return producer

    def admin(self) -> AdminClient:
        return AdminClient(self._common())


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


def refusal(client: Any, operation: str) -> KafkaRefused | None:
    """Whether the cluster refused ``client`` (an unassigned consumer of ours): its queued
    error events are served first, so a refusal is seen as soon as the request fails."""
    refusals = getattr(client, "refusals", None)
    if not isinstance(refusals, _Refusals):
        return None
    if refusals.last is None and not client.assignment():
        client.poll(0)  # serves error_cb; an unassigned consumer has no message to lose
    err = refusals.last
    if err is None:
        return None
    kind = "fatal" if err.fatal() else "refused"
    return KafkaRefused(operation, f"{err.name()} [{kind}]: {err.str()}")


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
    "PRODUCER_DEFAULTS",
    "REFUSED_CODES",
    "GroupCommitter",
    "KafkaClients",
    "group_committer",
    "map_kafka_error",
    "refusal",
]
