"""``kafka-ingest run --workers N``: the partitions' slices in worker processes that never
outlive the run that started them, on the real stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest_dev.samples import produce_sample
from tests.support.ingest import assert_invariants, expected_from_sample, run
from tests.support.pipelines import write_pipelines_file

pytestmark = pytest.mark.integration

COUNT = 30_000
#: Spawning a worker imports the package afresh: seconds on a busy machine, not minutes.
SPAWN_DEADLINE_S = 120.0


def _wait(condition: Any, what: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {deadline_s:g} s: {what}"
        time.sleep(0.05)


def test_workers_die_with_a_killed_run_and_the_next_run_is_exact(
        make_pipeline: Any, clients: KafkaClients, db: Any, pg_dsn: str,
        stack_env: dict[str, str], tmp_path: Path) -> None:
    # An OOM kill or a supervisor's SIGKILL of `kafka-ingest run` must not leave its
    # workers behind: a busy one would go on writing as a slice nobody owns, an idle one
    # would wait on its pipe for good (measured before: 110 orphans after 55 kills).
    pipeline = make_pipeline("telemetry_metrics", chunk_size=200)
    sample = produce_sample(clients, pipeline, count=COUNT, poison=1)
    env = {**os.environ,
           "KAFKA_INGEST_PIPELINES": str(write_pipelines_file(tmp_path / "p.yaml", pipeline)),
           "KAFKA_INGEST_PG_DSN": pg_dsn,
           "KAFKA_BOOTSTRAP_SERVERS": stack_env["KAFKA_BOOTSTRAP_SERVERS"]}
    env.pop("KAFKA_INGEST_KAFKA_CONFIG", None)
    parent = subprocess.Popen([sys.executable, "-m", "kafka_ingest.cli", "run", pipeline.name,
                               "--workers", "2"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        proc = psutil.Process(parent.pid)
        _wait(lambda: len(proc.children(recursive=True)) >= 2,
              "the run to start its workers", SPAWN_DEADLINE_S)
        children = proc.children(recursive=True)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], [p.cmdline() for p in alive]
        assert len(gone) == len(children)
    finally:
        if parent.poll() is None:
            parent.kill()

    run(pipeline, clients, db)  # the next run finishes what the killed one left
    assert_invariants(pipeline, clients, pg_dsn,
                      expected_from_sample(pipeline, sample, count=COUNT, poison=1),
                      dlq_exactly_once=False)
