# ruff: noqa: S101  (pytest asserts; the per-file ignore in pyproject.toml covers tests/ only)
"""The benchmark tables' CPU-per-event column: the process's, Postgres' and the broker's
CPU seconds over the events, in core-microseconds, and how many times the project's each
contender spends; unknown (``-``) when a server's CPU could not be read."""

from __future__ import annotations

from harness import PROJECT_PATH, Measure, scale_table, table


def _measure(path: str, events: int, cpu_s: float, pg: float, kafka: float) -> Measure:
    return Measure(path=path, events=events, seconds=2.0, peak_rss_mb=100, start_rss_mb=50,
                   cpu_s=cpu_s, server_cpu_s={"postgres": pg, "kafka": kafka})


def test_core_microseconds_per_event_count_the_servers_too() -> None:
    m = _measure(PROJECT_PATH, 1_000_000, 8.0, 6.1, 0.5)
    assert m.core_us_per_event is not None
    assert abs(m.core_us_per_event - 14.6) < 1e-9
    assert Measure("x", 10, 1.0, 1, 1, cpu_s=1.0).core_us_per_event is None


def test_the_table_shows_each_contenders_cpu_per_event_against_the_projects() -> None:
    project = _measure(PROJECT_PATH, 200_000, 1.0, 0.8, 0.2)   # 10 core-µs per event
    peer = _measure("a peer", 200_000, 6.0, 3.0, 1.0)          # 50 core-µs per event
    blind = Measure("no servers", 200_000, 2.0, 1, 1, cpu_s=1.0)
    rows = table([project, peer, blind], None).splitlines()
    assert rows[0].endswith("| core-µs/event | this ÷ project (CPU) |")
    assert rows[2].endswith("| 10.0 | - |")
    assert rows[3].endswith("| 50.0 | 5.00x |")
    assert rows[4].endswith("| - | - |")
    scale = scale_table([{"events": 200_000, "partitions": 1, "measure": project}])
    assert scale.splitlines()[2].endswith("| 10.0 |")
