"""The soak's short variant (``make soak`` runs 60 minutes): five minutes of mixed faults
under Airflow's real scheduler, triggerer and Celery workers, on a stack of its own (three
Kafka nodes behind Toxiproxy, Postgres with a streaming standby), then the pipeline
drained and everything checked exactly (:mod:`kafka_ingest_dev.soak`).

It runs as its own process, as ``make soak`` does: its environment (state dir, ports) is
its own, and a hang is bounded by the soak's own time-outs plus this test's margin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_ingest_dev import soak

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.faults]

MINUTES = 5.0
#: set-up (three brokers, two Postgres servers, Airflow with Celery) + the soak + its
#: drain and last-run waits (the soak's own bounds) + the stack's take-down
BOUND_S = 600 + MINUTES * 60 + soak.Settings().drain_timeout_s + 600 + 300


@pytest.mark.timeout(BOUND_S + 60)
def test_five_minutes_of_mixed_faults_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "kafka_ingest_dev.soak", "--minutes", str(MINUTES),
         "--min-gap", "12", "--max-gap", "25", "--rate", "200", "--report", str(report_path)],
        capture_output=True, text=True, timeout=BOUND_S, check=False)
    print(done.stdout[-4000:])
    assert report_path.is_file(), done.stderr[-4000:]
    report = json.loads(report_path.read_text())
    check = report["check"]
    assert done.returncode == 0 and check["exact"], (check, done.stderr[-3000:])
    # every kind of fault came at least once, and the stream and the runs were real
    assert set(report["faults"]) == set(soak.FAULTS), report["fault_log"]
    assert report["messages"]["poison"] > 0 and report["messages"]["undelivered"] == 0
    assert check["rows"] == report["messages"]["distinct_events"]
    assert check["dead_letters"] == report["messages"]["poison"]
    assert report["runs"].get("success", 0) >= MINUTES - 1
