"""The soak's short variant (``make soak`` runs 60 minutes): two minutes of mixed faults,
and on until every kind has come once, under Airflow's real scheduler, triggerer and
Celery workers, on a stack of its own (three Kafka nodes behind Toxiproxy, Postgres with a
streaming standby), then the pipeline drained and everything checked exactly
(:mod:`kafka_ingest_dev.soak`).

It runs as its own process, as ``make soak`` does: its environment (state dir, ports) is
its own, and a hang is bounded by the soak's own time-outs plus this test's margin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_ingest_dev import soak

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.soak]

MINUTES = 2.0
SETTINGS = soak.Settings(minutes=MINUTES, min_gap_s=6, max_gap_s=12, every_kind=True)
#: The soak's own bounds: set-up (stack up and Airflow's services) + the faults + the
#: nemesis and producer joins + the drain + the last runs + the check + the stack's
#: take-down; beyond them it is stopped (SIGTERM: it takes its stack down) and fails.
BOUND_S = 900 + SETTINGS.fault_bound_s() + 900 + SETTINGS.drain_timeout_s + 600 + 600 + 300


@pytest.mark.timeout(BOUND_S + 400)
def test_minutes_of_mixed_faults_of_every_kind_lose_and_duplicate_nothing(
        tmp_path: Path) -> None:
    report_path = tmp_path / "soak.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kafka_ingest_dev.soak", "--minutes", str(MINUTES),
         "--min-gap", str(SETTINGS.min_gap_s), "--max-gap", str(SETTINGS.max_gap_s),
         "--every-kind", "--rate", "200", "--report", str(report_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the soak takes its stack down
        out, err = proc.communicate(timeout=300)
        pytest.fail(f"the soak overran {BOUND_S:.0f} s: {err[-3000:]}")
    print(out[-4000:])
    assert report_path.is_file(), err[-4000:]
    report = json.loads(report_path.read_text())
    assert "error" not in report, report  # the soak itself did not finish: why, and where
    check = report["check"]
    assert proc.returncode == 0 and check["exact"], (check, err[-3000:])
    # every kind of fault came at least once, and the stream and the runs were real
    assert set(report["faults"]) == set(soak.FAULTS), report["fault_log"]
    assert report["messages"]["poison"] > 0 and report["messages"]["undelivered"] == 0
    assert check["rows"] == report["messages"]["distinct_events"]
    assert check["dead_letters"] == report["messages"]["poison"]
    assert report["runs"].get("success", 0) >= MINUTES - 1
