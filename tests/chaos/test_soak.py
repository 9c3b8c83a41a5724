"""The soak's short variant (``make soak`` runs 60 minutes): two minutes of mixed faults,
and on until every kind has come once, under Airflow's real scheduler, triggerer and
Celery workers, on a stack of its own (three Kafka nodes behind Toxiproxy, Postgres with a
streaming standby), then the pipeline drained and everything checked exactly
(:mod:`kafka_ingest_dev.soak`).

It runs as its own process, as ``make soak`` does: its environment (state dir, ports) is
its own, and a hang is bounded by the soak's own time-outs plus this test's margin. Being
its own, and mostly waiting on its faults and on Airflow's timers, it is background work
(:mod:`tests.support.background`): the session starts it as soon as it knows this test is
selected; this test (without xdist after the unit and integration tests, which run beside
it; with xdist first, on a worker it holds meanwhile: ``tests/support/workers.py``) waits
for its end and checks its report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kafka_ingest_dev import soak
from tests.support import background

#: A slow fault test (``tests/chaos/conftest.py``): ``make soak-short`` or ``make faults-full``.
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.soak,
              pytest.mark.faults_full]

MINUTES = 2.0
SETTINGS = soak.Settings(minutes=MINUTES, min_gap_s=6, max_gap_s=12, every_kind=True)
#: The soak's own bounds: set-up (stack up and Airflow's services) + the faults + the
#: nemesis and producer joins + the drain + the last runs + the check + the stack's
#: take-down; beyond them it is stopped (SIGTERM: it takes its stack down) and fails.
BOUND_S = 900 + SETTINGS.fault_bound_s() + 900 + SETTINGS.drain_timeout_s + 600 + 600 + 300


def background_command(directory: Path) -> list[str]:
    """The soak, as ``make soak`` runs it, its report in ``directory``."""
    return [sys.executable, "-m", "kafka_ingest_dev.soak", "--minutes", str(MINUTES),
            "--min-gap", str(SETTINGS.min_gap_s), "--max-gap", str(SETTINGS.max_gap_s),
            "--every-kind", "--rate", "200", "--report", str(directory / "soak.json")]


@pytest.mark.timeout(BOUND_S + 400)
def test_minutes_of_mixed_faults_of_every_kind_lose_and_duplicate_nothing() -> None:
    run = background.taken_over(__file__)
    returncode = run.finish(BOUND_S)
    out, err = run.output()
    if returncode is None:
        pytest.fail(f"the soak overran {BOUND_S:.0f} s: {err[-3000:]}")
    print(out[-4000:])
    report_file = run.dir / "soak.json"
    assert report_file.is_file(), err[-4000:]
    report = json.loads(report_file.read_text())
    assert "error" not in report, report  # the soak itself did not finish: why, and where
    check = report["check"]
    assert returncode == 0 and check["exact"], (check, err[-3000:])
    # every kind of fault came at least once, and the stream and the runs were real
    assert set(report["faults"]) == set(soak.FAULTS), report["fault_log"]
    assert report["messages"]["poison"] > 0 and report["messages"]["undelivered"] == 0
    assert check["rows"] == report["messages"]["distinct_events"]
    assert check["dead_letters"] == report["messages"]["poison"]
    assert report["runs"].get("success", 0) >= MINUTES - 1
