"""The bounded reader's state machine against a fake consumer: no broker, no sleeps to speak of.

``FakeConsumer`` (in ``tests/support/fakes.py``, shared with the slice engine's tests) is a
fake at the port, not a mock of calls: it holds one partition's log (messages and error
events, in offset order, with the gaps compaction and transaction markers leave) and serves
it the way ``confluent_kafka.Consumer`` does: ``assign`` sets the position, ``consume(n)``
hands out what is queued after it (a batch may run past the chunk's end), ``position``
moves past missing offsets once they were fetched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import KafkaError

from kafka_ingest.errors import IngestError, KafkaUnavailable, OffsetGapError, TransientError
from kafka_ingest.kafka.reader import Chunk, read_range
from tests.support.fakes import PARTITION, TOPIC, FakeConsumer, Msg


def msgs(offsets: Iterable[int]) -> list[Msg]:
    """Ten-byte values, no keys: one message per offset."""
    return [Msg(o) for o in offsets]


def error_event(offset: int, code: int) -> Msg:
    return Msg(offset, value_=None, error_=KafkaError(code))


def read(consumer: FakeConsumer, start: int, end: int, chunk_size: int,
         **kwargs: Any) -> list[Chunk]:
    kwargs.setdefault("poll_timeout_s", 0.01)
    kwargs.setdefault("idle_timeout_s", 2.0)
    return list(read_range(consumer, TOPIC, PARTITION, start, end, chunk_size=chunk_size,
                           **kwargs))


def layout(chunks: list[Chunk]) -> list[tuple[int, int, list[int]]]:
    """(start, end, offsets of the messages) of each chunk."""
    return [(c.start, c.end, [m.offset() for m in c.messages]) for c in chunks]


# --------------------------------------------------------------------------- chunk boundaries


def test_chunks_cover_start_to_end_by_offset_and_assign_at_start() -> None:
    # Chunks are the unit of a database transaction: [start, end) must be tiled exactly.
    log = msgs(range(12))
    consumer = FakeConsumer(log)
    chunks = read(consumer, 3, 10, chunk_size=3)
    assert chunks == [Chunk(TOPIC, PARTITION, 3, 6, log[3:6]),
                      Chunk(TOPIC, PARTITION, 6, 9, log[6:9]),
                      Chunk(TOPIC, PARTITION, 9, 10, log[9:10])]
    assert consumer.assigned == [(TOPIC, PARTITION, 3)]
    assert consumer.unassigned == 1


@pytest.mark.parametrize("batch", [4, 8, 10])
def test_a_batch_overshooting_the_chunk_end_is_carried_into_the_next_chunk(batch: int) -> None:
    # consume(n) returns what is queued: the overshoot must open the next chunk, once.
    consumer = FakeConsumer(msgs(range(10)), batch=batch)
    assert layout(read(consumer, 0, 10, chunk_size=3)) == [
        (0, 3, [0, 1, 2]), (3, 6, [3, 4, 5]), (6, 9, [6, 7, 8]), (9, 10, [9])]


def test_carried_messages_are_served_without_consuming_them_again() -> None:
    # One queued batch covering three chunks: re-consuming would skip or duplicate offsets.
    consumer = FakeConsumer(msgs(range(20)), batch=20)
    assert layout(read(consumer, 0, 9, chunk_size=3)) == [
        (0, 3, [0, 1, 2]), (3, 6, [3, 4, 5]), (6, 9, [6, 7, 8])]
    assert len(consumer.consume_calls) == 1


def test_messages_past_end_are_discarded() -> None:
    # The next range belongs to another run: a message at or past `end` must never be yielded.
    consumer = FakeConsumer(msgs(range(20)), batch=10)
    chunks = read(consumer, 2, 7, chunk_size=4)
    assert layout(chunks) == [(2, 6, [2, 3, 4, 5]), (6, 7, [6])]
    assert consumer.unassigned == 1


@pytest.mark.parametrize(("start", "end"), [(5, 5), (6, 5)])
def test_an_empty_range_yields_nothing_and_never_assigns(start: int, end: int) -> None:
    # A caught-up partition must not touch the broker at all.
    consumer = FakeConsumer(msgs(range(10)))
    assert read(consumer, start, end, chunk_size=3) == []
    assert consumer.assigned == []
    assert consumer.unassigned == 0
    assert consumer.consume_calls == []


# --------------------------------------------------------------------------- offset gaps


@pytest.mark.parametrize("stop_at_gaps", [False, True])
def test_gaps_inside_chunks_leave_the_chunk_bounds_by_offset(stop_at_gaps: bool) -> None:
    # Compaction removed 2, 3 and 6: chunks stay [pos, pos + chunk_size), only sparser.
    consumer = FakeConsumer(msgs([0, 1, 4, 5, 7, 8, 9]), high=10, stop_at_gaps=stop_at_gaps)
    assert layout(read(consumer, 0, 10, chunk_size=5)) == [
        (0, 5, [0, 1, 4]), (5, 10, [5, 7, 8, 9])]


def test_an_overshoot_past_a_gap_ends_the_chunk_without_consuming_more() -> None:
    # 5 and 6 arrive with the batch that reveals the gap 3, 4; consuming again would drop them.
    consumer = FakeConsumer(msgs([0, 1, 2, 5, 6, 7, 8, 9]))
    assert layout(read(consumer, 0, 10, chunk_size=5)) == [
        (0, 5, [0, 1, 2]), (5, 10, [5, 6, 7, 8, 9])]


def test_a_gap_at_the_end_of_a_chunk_is_detected_by_position() -> None:
    # Markers 3, 4 end the first chunk; with idle_timeout_s=0 any wait for them raises.
    consumer = FakeConsumer(msgs([0, 1, 2, 5, 6, 7]), stop_at_gaps=True)
    chunks = read(consumer, 0, 8, chunk_size=5, idle_timeout_s=0.0)
    assert layout(chunks) == [(0, 5, [0, 1, 2]), (5, 8, [5, 6, 7])]


def test_a_gap_at_the_end_of_the_range_is_detected_by_position() -> None:
    # A transaction's commit markers (3, 4) sit below the high watermark; nothing follows.
    consumer = FakeConsumer(msgs([0, 1, 2]), high=5)
    chunks = read(consumer, 0, 5, chunk_size=10, idle_timeout_s=0.0)
    assert layout(chunks) == [(0, 5, [0, 1, 2])]


def test_a_range_of_only_markers_yields_one_empty_chunk() -> None:
    # The next run's range may hold nothing but the last markers: its offset must still move.
    consumer = FakeConsumer(msgs([0, 1, 2]), high=5)
    chunks = read(consumer, 3, 5, chunk_size=10, idle_timeout_s=0.0)
    assert chunks == [Chunk(TOPIC, PARTITION, 3, 5, [])]
    assert consumer.assigned == [(TOPIC, PARTITION, 3)]


# --------------------------------------------------------------------------- byte cap


def sized() -> list[Msg]:
    """Offsets 0-5 whose key + value bytes are 5, 4, 3, 10, 3, 2."""
    return [Msg(0, key_=b"k", value_=b"aaaa"), Msg(1, value_=b"bbbb"),
            Msg(2, key_=b"kk", value_=b"c"), Msg(3, value_=b"d" * 10),
            Msg(4, key_=b"k", value_=b"ee"), Msg(5, value_=b"ff")]


@pytest.mark.parametrize("batch", [1, None])
def test_the_byte_cap_ends_a_chunk_after_the_message_reaching_it(batch: int | None) -> None:
    # Memory is bounded by bytes too; keys count, and the cut is by offset so nothing is lost.
    # batch=1: the cut falls on freshly consumed messages; None: on carried ones.
    consumer = FakeConsumer(sized(), batch=batch)
    chunks = read(consumer, 0, 6, chunk_size=10, max_chunk_bytes=10)
    # 5+4+3 = 12 reaches 10 at offset 2; offset 3 alone is 10; 3+2 = 5 ends with the range.
    assert layout(chunks) == [(0, 3, [0, 1, 2]), (3, 4, [3]), (4, 6, [4, 5])]


def test_carried_bytes_count_towards_the_next_chunks_budget() -> None:
    # A carried-over message must be counted once, in the chunk it lands in.
    consumer = FakeConsumer(msgs(range(10)), batch=5)
    chunks = read(consumer, 0, 10, chunk_size=4, max_chunk_bytes=25)
    # 10-byte messages: the third one reaches 25. Chunk 2 starts with carried 3, 4 (20
    # bytes) and is cut by freshly consumed 5; chunk 3 is cut inside the carry alone.
    assert layout(chunks) == [
        (0, 3, [0, 1, 2]), (3, 6, [3, 4, 5]), (6, 9, [6, 7, 8]), (9, 10, [9])]


def test_a_byte_cut_chunk_never_reaches_past_end() -> None:
    # The cut end is an offset + 1 of a message inside the range, never beyond it.
    consumer = FakeConsumer(msgs(range(10)), batch=10)
    chunks = read(consumer, 0, 4, chunk_size=10, max_chunk_bytes=15)
    assert layout(chunks) == [(0, 2, [0, 1]), (2, 4, [2, 3])]


# --------------------------------------------------------------------------- failures


def test_nothing_arriving_within_the_idle_timeout_is_kafka_unavailable() -> None:
    # A silent broker must fail the task (to be retried), naming what never came.
    consumer = FakeConsumer(msgs(range(10)), stall_at=6)
    gen = read_range(consumer, TOPIC, PARTITION, 0, 10, chunk_size=4,
                     poll_timeout_s=0.01, idle_timeout_s=0.05)
    started = time.monotonic()
    assert layout([next(gen)]) == [(0, 4, [0, 1, 2, 3])]
    with pytest.raises(KafkaUnavailable, match=r"no message for offsets \[6, 8\)"):
        next(gen)
    assert time.monotonic() - started < 1.0
    assert consumer.unassigned == 1


def test_offset_out_of_range_below_the_low_watermark_is_an_offset_gap() -> None:
    # Retention deleted [5, 10) before it was read: permanent, not a retry.
    consumer = FakeConsumer([error_event(5, KafkaError.OFFSET_OUT_OF_RANGE), *msgs(range(10, 15))],
                            low=10, high=15)
    with pytest.raises(OffsetGapError) as caught:
        read(consumer, 5, 15, chunk_size=4)
    gap = caught.value
    assert (gap.topic, gap.partition, gap.start, gap.low) == (TOPIC, PARTITION, 5, 10)
    assert consumer.watermark_calls == [(TOPIC, PARTITION, 10.0, False)]  # asked, not cached
    assert consumer.unassigned == 1


def test_retention_overtaking_the_reader_mid_range_is_a_gap_from_the_next_offset() -> None:
    # Chunk [0, 4) was read; the gap reported must start where reading stopped, not at 0.
    consumer = FakeConsumer([*msgs(range(4)), error_event(4, KafkaError.OFFSET_OUT_OF_RANGE),
                             *msgs(range(10, 15))], low=10, high=15)
    gen = read_range(consumer, TOPIC, PARTITION, 0, 15, chunk_size=4,
                     poll_timeout_s=0.01, idle_timeout_s=2.0)
    assert layout([next(gen)]) == [(0, 4, [0, 1, 2, 3])]
    with pytest.raises(OffsetGapError) as caught:
        next(gen)
    assert (caught.value.start, caught.value.low) == (4, 10)
    assert consumer.unassigned == 1


def test_offset_out_of_range_at_or_above_the_low_watermark_is_not_an_offset_gap() -> None:
    # Only a start below the low watermark is retention's gap (skippable by config); anything
    # else goes through the Kafka error mapping, whose classes are tested with the error tree.
    consumer = FakeConsumer([error_event(5, KafkaError.OFFSET_OUT_OF_RANGE)], low=0, high=5)
    with pytest.raises(IngestError) as caught:
        read(consumer, 5, 9, chunk_size=4)
    assert not isinstance(caught.value, OffsetGapError)
    assert consumer.watermark_calls == [(TOPIC, PARTITION, 10.0, False)]
    assert consumer.unassigned == 1


def test_a_transport_error_mid_range_is_transient_and_unassigns() -> None:
    # Chunks already yielded stand (they were committed); the task retries from the next one.
    consumer = FakeConsumer([*msgs(range(4)), error_event(4, KafkaError._TRANSPORT)])
    gen = read_range(consumer, TOPIC, PARTITION, 0, 8, chunk_size=4,
                     poll_timeout_s=0.01, idle_timeout_s=2.0)
    assert layout([next(gen)]) == [(0, 4, [0, 1, 2, 3])]
    with pytest.raises(TransientError) as caught:
        next(gen)
    assert isinstance(caught.value, KafkaUnavailable)
    assert consumer.watermark_calls == []
    assert consumer.unassigned == 1


def test_an_end_of_partition_event_is_neither_an_error_nor_a_message() -> None:
    # A connection may turn enable.partition.eof on: EOF after the range's markers is benign.
    consumer = FakeConsumer([*msgs([0, 1]), error_event(3, KafkaError._PARTITION_EOF)],
                            high=3)
    assert layout(read(consumer, 0, 3, chunk_size=10)) == [(0, 3, [0, 1])]


def test_stopping_the_generator_early_unassigns() -> None:
    # A caller that fails between chunks must not leave the partition assigned (fetching).
    consumer = FakeConsumer(msgs(range(10)))
    gen = read_range(consumer, TOPIC, PARTITION, 0, 10, chunk_size=3, poll_timeout_s=0.01)
    assert layout([next(gen)]) == [(0, 3, [0, 1, 2])]
    assert consumer.unassigned == 0
    gen.close()
    assert consumer.assigned == [(TOPIC, PARTITION, 0)]
    assert consumer.unassigned == 1
