# ruff: noqa: S101  (pytest asserts; the per-file ignore in pyproject.toml covers tests/ only)
"""The table-growth benchmark's pure parts: the rows it writes and the table it prints."""

from __future__ import annotations

from bench_table_growth import report, rows

from kafka_ingest.records import row_source


def test_rows_are_valid_telemetry_rows_with_unique_keys_of_either_kind() -> None:
    seq, rnd = rows(10, 500, "seq", "t"), rows(10, 500, "random", "t")
    for batch in (seq, rnd):
        assert len({r[0] for r in batch}) == 500
        assert [row_source(r).offset for r in batch] == list(range(10, 510))
    assert [r[0] for r in seq] == sorted(r[0] for r in seq)  # rising: the index's right edge
    assert [r[0] for r in rnd] != sorted(r[0] for r in rnd)


def test_the_report_has_a_row_per_bucket() -> None:
    point = {"keys": "seq", "path": "new", "rows_before": 0, "rows_after": 1_000_000,
             "backend_us_per_row": 2.5, "server_us_per_row": 2.75, "client_us_per_row": 1.0,
             "wall_us_per_row": 3.5, "wal_bytes_per_row": 310, "table_mb": 180.4,
             "index_mb": 60.2}
    lines = report([point, {**point, "rows_before": 1_000_000, "rows_after": 2_000_000}])
    assert lines.splitlines()[2] == (
        "| seq | new | 0 to 1,000,000 | 2.50 | 2.75 | 3.50 | 310 | 180 | 60 |")
    assert len(lines.splitlines()) == 4
