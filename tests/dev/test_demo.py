"""What ``make demo`` prints of a run: figures a person reads, and an install of only what
the demo uses (the tests' browser and the Celery broker come with ``make test``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kafka_ingest_dev.demo import report_line, sums_text
from tests.support import ROOT

#: Lines of a real `airflow dags test` run of an ingest DAG: the report task prints the
#: run's sums, a dict with the raw float the run measured; a slice logs its own report.
SUMS_LINE = (
    "telemetry_metrics: {'read': 20061, 'inserted': 20001, 'duplicates': 40, 'stale': 0, "
    "'dead_lettered': 19, 'known_dead': 0, 'tombstones': 1, 'bytes': 3669972, "
    "'seconds': 0.2777378900000258, 'partitions': 3, 'lag_after': 0, 'dlq_rate': 0.000947}")
SLICE_LINE = (
    "2026-12-01T09:21:01.653419Z [info     ] telemetry_metrics src-f21c4eef4d[0] [0, 207) "
    "live: read 207, inserted 199, duplicates 1, stale 0, dead-lettered 7, already "
    "dead-lettered 0, tombstones 0, lag after 0, 0.05s [kafka_ingest.engine.slices] "
    "loc=slices.py:227")


def test_the_runs_sums_are_rounded_for_a_person() -> None:
    assert report_line(SUMS_LINE, "telemetry_metrics") == (
        "telemetry_metrics: read 20061, inserted 20001, duplicates 40, stale 0, "
        "dead-lettered 19, already dead-lettered 0, tombstones 1, 3.7 MB, 0.28s, "
        "partitions 3, lag after 0, DLQ rate 0.09%")


def test_a_slices_report_is_shown_as_the_slice_wrote_it() -> None:
    assert report_line(SLICE_LINE, "telemetry_metrics") == (
        "telemetry_metrics src-f21c4eef4d[0] [0, 207) live: read 207, inserted 199, "
        "duplicates 1, stale 0, dead-lettered 7, already dead-lettered 0, tombstones 0, "
        "lag after 0, 0.05s")


@pytest.mark.parametrize("line", [
    "[...] INFO - Running <TaskInstance: telemetry_metrics_ingest.plan ...>",  # other output
    "telemetry_metrics: {not a dict}",  # shaped like the sums, but not: shown, not parsed
])
def test_other_lines_are_left_out_or_shown_as_they_are(line: str) -> None:
    shown = report_line(line, "telemetry_metrics")
    assert shown is None or shown == line


def test_the_cli_runs_sums_leave_the_run_id_out() -> None:
    # `kafka-ingest demo --cli` prints run_ingest's sums, which carry the run id first
    assert sums_text("p", {"run_id": "cli__x", "read": 3, "seconds": 1.0, "dlq_rate": 0.0}) \
        == "p: read 3, 1.00s, DLQ rate 0.00%"


def _missing(tmp_path: Path, *args: str) -> list[str]:
    """What ``scripts/bootstrap.sh`` would install on a machine with none of the system
    packages: its PATH holds only the tools the script itself runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("python3", "ls", "id", "cat", "sha256sum", "cut"):
        found = shutil.which(tool)
        assert found, tool
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash") or "/bin/bash"
    done = subprocess.run([bash, str(ROOT / "scripts" / "bootstrap.sh"), *args, "--dry-run"],
                          env={**os.environ, "PATH": str(bin_dir)}, capture_output=True,
                          text=True, check=True)
    line = done.stdout.strip()
    assert line.startswith("bootstrap: missing: "), line
    return line.removeprefix("bootstrap: missing: ").split()


def test_the_demo_installs_only_what_the_demo_uses(tmp_path: Path) -> None:
    full, demo = _missing(tmp_path), _missing(tmp_path, "--demo")
    # the tests' browser and the Celery executor's broker: `make test` only
    assert {"chromium", "redis-server"} <= set(full)
    assert not {"chromium", "redis-server"} & set(demo)
    # what the demo runs: a JVM and Maven for Kafka (PostgreSQL may be on this machine)
    assert {"openjdk-17-jre-headless", "maven"} <= set(demo)


def test_make_demo_and_make_test_ask_for_what_they_need() -> None:
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    tests = (ROOT / "scripts" / "test.sh").read_text()
    assert "bash scripts/bootstrap.sh --demo" in demo
    assert "bash scripts/bootstrap.sh\n" in tests  # everything, for the whole suite
