"""Bounded reads: assign + seek, ``consume(n)``, stop by position.

No ``subscribe()`` anywhere, so no consumer-group rebalance: each task assigns exactly
its partition at exactly its start offset and stops at the planned end. The group id is
used only to commit offsets (after the database commit, by :mod:`kafka_ingest.kafka.commits`)
so lag tools see them. The clients come from :class:`kafka_ingest.kafka.clients.KafkaClients`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from itertools import repeat
from operator import is_not, methodcaller
from typing import Any

from confluent_kafka import (
    KafkaError,
    TopicPartition,
)

from kafka_ingest.errors import KafkaUnavailable, OffsetGapError
from kafka_ingest.kafka.clients import map_kafka_error
from kafka_ingest.kafka.metadata import partitions_of, watermarks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chunk:
    """Messages of ``[start, end)`` of one partition; offsets inside may have gaps."""

    topic: str
    partition: int
    start: int
    end: int
    messages: list[Any]


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


def sample(consumer: Any, topic: str, n: int, *, idle_timeout_s: float = 30.0) -> list[Any]:
    """Up to ``n`` of the oldest messages the topic holds, spread over its partitions
    (each partition's share read from its low watermark with :func:`read_range`); fewer
    when the topic holds fewer. :class:`~kafka_ingest.errors.TopicMissing` when there is
    no such topic."""
    partitions = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, partitions)
    held = {p: high - low for p, (low, high) in marks.items() if high > low}
    out: list[Any] = []
    for i, p in enumerate(sorted(held)):
        share = -(-(n - len(out)) // (len(held) - i))  # what is left, over the partitions left
        low = marks[p][0]
        for chunk in read_range(consumer, topic, p, low, low + min(share, held[p]),
                                chunk_size=max(1, share), idle_timeout_s=idle_timeout_s):
            out.extend(chunk.messages)
    return out[:n]


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

