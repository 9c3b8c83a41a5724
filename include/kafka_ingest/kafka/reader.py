"""Bounded reads: assign + seek, ``consume(n)``, stop by position; watermarks, times, commits.

No ``subscribe()`` anywhere, so no consumer-group rebalance: each task assigns exactly
its partition at exactly its start offset and stops at the planned end. The group id is
used only to commit offsets (after the database commit, by :mod:`kafka_ingest.kafka.commits`)
so lag tools see them. The clients come from :class:`kafka_ingest.kafka.clients.KafkaClients`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_not, methodcaller
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from kafka_ingest.errors import KafkaUnavailable, OffsetGapError, TopicMissing
from kafka_ingest.kafka.clients import map_kafka_error

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class Chunk:
    """Messages of ``[start, end)`` of one partition; offsets inside may have gaps."""

    topic: str
    partition: int
    start: int
    end: int
    messages: list[Any]


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


def read_range(consumer: Any, topic: str, partition: int, start: int, end: int, *,
               chunk_size: int, max_chunk_bytes: int | None = None,
               poll_timeout_s: float = 1.0, idle_timeout_s: float = 30.0) -> Generator[Chunk]:
    """Yield chunks covering exactly ``[start, end)`` of one partition, in order.

    Chunks are bounded by offsets, not counts: a chunk is ``[pos, min(pos + chunk_size,
    end))`` and ends when a message at or past its end arrives or the consumer's position
    reaches it (gaps from compaction or transaction markers). A chunk whose keys and
    values pass ``max_chunk_bytes`` ends early, after the message that passed it, so memory
    is bounded by bytes too (give or take one ``consume`` batch). Messages past ``end`` are
    discarded. Nothing arriving for ``idle_timeout_s`` is an infrastructure error.
    """
    if start >= end:
        return
    consumer.assign([TopicPartition(topic, partition, start)])
    try:
        reader = _PartitionReader(consumer, topic, partition, poll_timeout_s, idle_timeout_s,
                                  max_chunk_bytes or 2**62)
        pos = start
        while pos < end:
            messages, chunk_end = reader.chunk(pos, min(pos + chunk_size, end))
            yield Chunk(topic, partition, pos, chunk_end, messages)
            pos = chunk_end
    finally:
        consumer.unassign()


@dataclass
class _PartitionReader:
    """Reads consecutive chunks of one assigned partition; keeps what overshot a chunk."""

    consumer: Any
    topic: str
    partition: int
    poll_timeout_s: float
    idle_timeout_s: float
    max_bytes: int
    carry: list[Any] = field(default_factory=list)

    def _split(self, messages: list[Any], chunk_end: int) -> list[Any]:
        """Keep the messages before ``chunk_end``; the rest wait for the next chunk."""
        if not messages or messages[-1].offset() < chunk_end:
            self.carry = []  # the usual case (offsets rise): no message to look at
            return messages
        inside = [m for m in messages if m.offset() < chunk_end]
        self.carry = [m for m in messages if m.offset() >= chunk_end]
        return inside

    def _cap(self, messages: list[Any], budget: int) -> tuple[list[Any], int, bool]:
        """Keep messages until their bytes reach ``budget``; the rest wait.

        Returns (kept, their bytes, whether the budget cut them short).
        """
        total = _size(messages)  # summed in C; the walk below only when over budget
        if total < budget:
            return messages, total, False
        total = 0
        for i, m in enumerate(messages):
            total += len(m.value() or b"") + len(m.key() or b"")
            if total >= budget:
                self.carry = messages[i + 1:] + self.carry
                return messages[: i + 1], total, True
        return messages, total, False

    def chunk(self, start: int, chunk_end: int) -> tuple[list[Any], int]:
        """The messages of ``[start, chunk_end)``, and the offset the chunk ends at.

        The chunk ends (the cursor moves to) just past the message whose bytes reached
        the budget, if one did (the rest wait for the next chunk); otherwise at
        ``chunk_end``, as soon as any of these shows that nothing before it is left:

        - a message at or past ``chunk_end`` arrived (it waits for the next chunk);
        - the message at ``chunk_end - 1`` was read;
        - a fetch brought nothing, yet the consumer's position passed ``chunk_end``
          (only transaction markers or compacted-away offsets were left).

        Nothing arriving for ``idle_timeout_s`` is an infrastructure error.
        """
        batch: list[Any] = []
        size = 0
        pending, fetched = self.carry, False  # what overshot the last chunk comes first
        last, idle_since = start - 1, time.monotonic()
        while True:
            kept, added, cut = self._cap(self._split(pending, chunk_end), self.max_bytes - size)
            batch.extend(kept)
            if cut:
                return batch, kept[-1].offset() + 1
            if kept:
                size += added
                last, idle_since = kept[-1].offset(), time.monotonic()
            if self.carry or last + 1 >= chunk_end:
                return batch, chunk_end
            if fetched and not kept:
                if _position(self.consumer, self.topic, self.partition) >= chunk_end:
                    return batch, chunk_end
                if time.monotonic() - idle_since > self.idle_timeout_s:
                    raise KafkaUnavailable(
                        f"read {self.topic}[{self.partition}]",
                        f"no message for offsets [{last + 1}, {chunk_end}) "
                        f"within {self.idle_timeout_s}s")
            pending, fetched = self._fetch(last + 1, chunk_end), True

    def _fetch(self, position: int, chunk_end: int) -> list[Any]:
        """One ``consume`` of at most what the chunk still lacks; an error event raises,
        an end-of-partition event (neither data nor an error) is dropped."""
        got = self.consumer.consume(num_messages=max(1, min(chunk_end - position, 10_000)),
                                    timeout=self.poll_timeout_s)
        if _has_events(got):
            got = [m for m in got if not _raise_on_error(
                self.consumer, m, self.topic, self.partition, position)]
        return got


_value = methodcaller("value")
_key = methodcaller("key")
_error = methodcaller("error")


def _has_events(messages: list[Any]) -> bool:
    """Whether any of ``messages`` is an event (an error, an end of partition) rather than
    a message: checked in C, once per ``consume`` batch."""
    return any(map(is_not, map(_error, messages), repeat(None)))


def _size(messages: list[Any]) -> int:
    """Bytes of the messages' values and keys (a null one counts 0)."""
    return (sum(map(len, filter(None, map(_value, messages))))
            + sum(map(len, filter(None, map(_key, messages)))))


def _raise_on_error(consumer: Any, msg: Any, topic: str, partition: int, position: int) -> bool:
    """Raise for an error event (a range deleted under us is an offset gap, not a retry);
    return whether ``msg`` is an end-of-partition event rather than a message."""
    err = msg.error()
    if err is None:
        return False
    if err.code() == KafkaError._PARTITION_EOF:
        return True
    if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):
        low, _ = watermarks(consumer, topic, [partition])[partition]
        if position < low:
            raise OffsetGapError(topic, partition, position, low)
    raise map_kafka_error(f"read {topic}[{partition}]", err)


def _position(consumer: Any, topic: str, partition: int) -> int:
    (tp,) = consumer.position([TopicPartition(topic, partition)])
    return int(tp.offset)


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
