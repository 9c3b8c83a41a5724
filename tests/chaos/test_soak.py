"""The soak's short variant (``make soak`` runs 60 minutes): two minutes of mixed faults,
and on until every kind has come once, under Airflow's real scheduler, triggerer and
Celery workers, on a stack of its own (three Kafka nodes behind Toxiproxy, Postgres with a
streaming standby), then the pipeline drained and everything checked exactly
(:mod:`kafka_ingest_dev.soak`).

It runs as its own process, as ``make soak`` does: its environment (state dir, ports) is
its own, and a hang is bounded by the soak's own time-outs plus this test's margin. Being
its own, and mostly waiting on its faults and on Airflow's timers, it starts in the
background as soon as the session has collected it (``tests/conftest.py``), while the
unit and integration tests run; this test, ordered after them, waits for its end and
checks its report. With xdist (``make test``) this test comes first and starts it, on a
worker of its own, while the other worker runs the rest (``tests/support/workers.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
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


class SoakRun:
    """The soak's process, its output in files: nobody reads a pipe while other tests run."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.report = directory, directory / "soak.json"
        self._out, self._err = directory / "soak.out", directory / "soak.err"
        with self._out.open("w") as out, self._err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kafka_ingest_dev.soak", "--minutes", str(MINUTES),
                 "--min-gap", str(SETTINGS.min_gap_s), "--max-gap", str(SETTINGS.max_gap_s),
                 "--every-kind", "--rate", "200", "--report", str(self.report)],
                stdout=out, stderr=err, text=True)
        self.started = time.monotonic()

    def output(self) -> tuple[str, str]:
        return (self._out.read_text(errors="replace"), self._err.read_text(errors="replace"))

    def finish(self) -> int:
        """The soak's exit code, once it ends within its bound from its start."""
        left = BOUND_S - (time.monotonic() - self.started)
        try:
            return self.proc.wait(max(0.0, left))
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"the soak overran {BOUND_S:.0f} s: {self.output()[1][-3000:]}")

    def stop(self) -> None:
        """SIGTERM: the soak takes its stack down on the way out."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(300)


_background: list[SoakRun] = []


def start_in_background() -> None:
    """Start the soak now (the session's collection calls it); its test takes it over."""
    _background.append(SoakRun(Path(tempfile.mkdtemp(prefix="kafka-ingest-soak-run-"))))


def stop_background() -> None:
    """The session ends (also on Ctrl-C): a soak still running is stopped, stack and all."""
    while _background:
        _background.pop().stop()


@pytest.mark.timeout(BOUND_S + 400)
def test_minutes_of_mixed_faults_of_every_kind_lose_and_duplicate_nothing(
        tmp_path: Path) -> None:
    if not _background:  # with xdist: started now, on this worker (stopped as it ends)
        start_in_background()
    run = _background[-1]
    returncode = run.finish()
    _background.remove(run)
    out, err = run.output()
    print(out[-4000:])
    assert run.report.is_file(), err[-4000:]
    report = json.loads(run.report.read_text())
    assert "error" not in report, report  # the soak itself did not finish: why, and where
    check = report["check"]
    assert returncode == 0 and check["exact"], (check, err[-3000:])
    # every kind of fault came at least once, and the stream and the runs were real
    assert set(report["faults"]) == set(soak.FAULTS), report["fault_log"]
    assert report["messages"]["poison"] > 0 and report["messages"]["undelivered"] == 0
    assert check["rows"] == report["messages"]["distinct_events"]
    assert check["dead_letters"] == report["messages"]["poison"]
    assert report["runs"].get("success", 0) >= MINUTES - 1
