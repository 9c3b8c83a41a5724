"""The typed lag row (:class:`kafka_ingest.ops.lag.LagRow`): its two lags, the totals every
reader of the lag shares, and ``kafka-ingest lag``'s columns."""

from __future__ import annotations

from kafka_ingest.ops.lag import LagRow, total_group_lag, total_lag


def row(partition: int, stored: int | None, group: int | None, *, low: int = 10,
        high: int = 100) -> LagRow:
    return LagRow(pipeline="p", topic="t", partition=partition, stored_offset=stored,
                  group_offset=group, low=low, high=high)


def test_the_lag_is_from_the_stored_offset_or_the_low_watermark() -> None:
    assert (row(0, 40, 30).lag, row(0, 40, 30).group_lag) == (60, 70)
    # nothing stored yet: from the low watermark; no group offset: no group lag
    assert (row(0, None, None).lag, row(0, None, None).group_lag) == (90, None)
    # the stored offset past the high watermark (a topic created again): negative
    assert row(0, 105, None).lag == -5
    # the first message not ingested: the low watermark when retention passed the cursor
    assert (row(0, 5, None).next_unread, row(0, 40, None).next_unread) == (10, 40)


def test_the_totals_count_a_negative_lag_as_zero_and_a_missing_group_lag_as_unknown() -> None:
    rows = [row(0, 40, 40), row(1, 105, 100), row(2, 100, 90)]
    assert (total_lag(rows), total_group_lag(rows)) == (60, 70)
    assert total_group_lag([*rows, row(3, 0, None)]) is None
    assert (total_lag([]), total_group_lag([])) == (0, None)


def test_as_a_dict_it_has_kafka_ingest_lags_columns_in_order() -> None:
    assert list(row(0, 40, 30).to_dict().items()) == [
        ("pipeline", "p"), ("topic", "t"), ("partition", 0), ("stored_offset", 40),
        ("group_offset", 30), ("low", 10), ("high", 100), ("lag", 60), ("group_lag", 70)]
