"""What the cluster says of topics and groups, one bounded request each: partitions, a
topic's watermarks, offsets for a time, the committed offsets of consumer groups, and the
timestamp of the first message at an offset. Nothing here reads a range (that is
:mod:`kafka_ingest.kafka.reader`) or commits (:mod:`kafka_ingest.kafka.commits`)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from kafka_ingest.errors import KafkaUnavailable, TopicMissing
from kafka_ingest.kafka.clients import map_kafka_error


def partitions_of(consumer: Any, topic: str, *, timeout_s: float = 10.0,
                  role: str = "topic") -> list[int]:
    """The topic's partition ids; :class:`TopicMissing` if the topic does not exist."""
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise map_kafka_error("metadata", exc, consumer) from exc
    meta = md.topics.get(topic)
    if meta is None or (meta.error is not None
                        and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise TopicMissing(topic, role)
    if meta.error is not None:
        raise map_kafka_error("metadata", meta.error)
    return sorted(meta.partitions)


def topic_partitions(consumer: Any, *, timeout_s: float = 10.0) -> dict[str, list[int]]:
    """Every topic of the cluster and its partition ids, in one metadata request (which,
    unlike asking for one topic by name, never makes a broker auto-create it)."""
    try:
        md = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise map_kafka_error("metadata", exc, consumer) from exc
    return {name: sorted(meta.partitions) for name, meta in md.topics.items()
            if meta.error is None}


def watermarks(consumer: Any, topic: str, partitions: list[int],
               *, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """(low, high) per partition, asked of the broker (not cached)."""
    out: dict[int, tuple[int, int]] = {}
    for p in partitions:
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout_s, cached=False)
        except KafkaException as exc:
            raise map_kafka_error(f"watermarks of {topic}[{p}]", exc, consumer) from exc
        out[p] = (int(low), int(high))
    return out


def offsets_for_time(consumer: Any, topic: str, partitions: list[int], when_ms: int,
                     *, timeout_s: float = 10.0) -> dict[int, int]:
    """Per partition: the first offset whose timestamp is >= ``when_ms``.

    Where no such message exists yet the high watermark is returned, so ``[t0, t1)``
    windows built from two calls are half-open, adjacent windows neither overlap nor gap.
    """
    tps = [TopicPartition(topic, p, when_ms) for p in partitions]
    try:
        found = consumer.offsets_for_times(tps, timeout=timeout_s)
    except KafkaException as exc:
        raise map_kafka_error("offsets_for_times", exc, consumer) from exc
    marks = None
    out: dict[int, int] = {}
    for tp in found:
        if tp.error is not None:
            raise map_kafka_error(f"offsets_for_times {topic}[{tp.partition}]", tp.error)
        if tp.offset < 0:  # no message at or after the time: the end of the log
            marks = marks or watermarks(consumer, topic, partitions, timeout_s=timeout_s)
            out[tp.partition] = marks[tp.partition][1]
        else:
            out[tp.partition] = tp.offset
    return out


def group_offsets(admin: Any, wanted: Sequence[tuple[str, str, list[int]]], *,
                  timeout_s: float = 10.0) -> dict[tuple[str, str], dict[int, int | None]]:
    """Committed offsets of several consumer groups, by ``(group, topic)`` then partition
    (``None``: none committed); ``wanted``: ``(group, topic, partitions)``. One admin request
    per group (what the protocol allows), sent together and each waited ``timeout_s``."""
    if not wanted:
        return {}
    requests = {(g, t): ConsumerGroupTopicPartitions(g, [TopicPartition(t, p) for p in parts])
                for g, t, parts in wanted}
    out: dict[tuple[str, str], dict[int, int | None]] = {}
    try:
        futures = [(key, admin.list_consumer_group_offsets([req], request_timeout=timeout_s))
                   for key, req in requests.items()]
        deadline = time.monotonic() + timeout_s  # all of them together, not each
        for key, by_group in futures:
            found = next(iter(by_group.values())).result(
                timeout=max(0.0, deadline - time.monotonic()))
            out[key] = {tp.partition: (tp.offset if tp.offset >= 0 else None)
                        for tp in found.topic_partitions}
    except KafkaException as exc:
        raise map_kafka_error("committed offsets of the consumer groups", exc) from exc
    except concurrent.futures.TimeoutError:
        raise KafkaUnavailable("committed offsets of the consumer groups",
                               f"no answer within {timeout_s:g} s") from None
    return out


def first_timestamps(consumer: Any, positions: Mapping[tuple[str, int], int], *,
                     timeout_s: float) -> dict[tuple[str, int], float]:
    """The timestamp (seconds since the epoch) of the first message at or after each
    ``(topic, partition) -> offset``; reads one fetch's worth per partition, assign +
    seek, and stops at ``timeout_s`` with what it has (a partition whose message did not
    arrive in time is absent). Nothing is committed."""
    if not positions:
        return {}
    consumer.assign([TopicPartition(t, p, o) for (t, p), o in positions.items()])
    found: dict[tuple[str, int], float] = {}
    done: set[tuple[str, int]] = set()  # answered: a message, or an error (out of range)
    deadline = time.monotonic() + timeout_s
    while len(done) < len(positions) and (left := deadline - time.monotonic()) > 0:
        for msg in consumer.consume(num_messages=500, timeout=min(left, 0.5)):
            key = (msg.topic(), msg.partition())
            if key in done or key not in positions:
                continue
            if msg.error() is None:
                kind, ms = msg.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE and ms >= 0:
                    found[key] = ms / 1000.0
            done.add(key)
            consumer.pause([TopicPartition(*key)])
    return found


def committed_offsets(consumer: Any, topic: str, partitions: list[int],
                      *, timeout_s: float = 10.0) -> dict[int, int | None]:
    """The consumer group's committed offset per partition (``None``: none committed)."""
    try:
        tps = consumer.committed([TopicPartition(topic, p) for p in partitions],
                                 timeout=timeout_s)
    except KafkaException as exc:
        raise map_kafka_error(f"committed offsets of {topic}", exc, consumer) from exc
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}


__all__ = ["committed_offsets", "first_timestamps", "group_offsets", "offsets_for_time",
           "partitions_of", "topic_partitions", "watermarks"]
