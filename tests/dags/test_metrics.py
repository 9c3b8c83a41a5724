"""Airflow metrics arrive where StatsD listens: a UDP listener in the test receives the
report task's gauges under the documented names when the ingest DAG runs for real."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafka_ingest_dev.samples import produce_sample
from tests.support.airflow_api import poll
from tests.support.dag_runs import run_dag
from tests.support.pipelines import dag_env

pytestmark = pytest.mark.integration

#: How long datagrams sent on loopback before the sender ended may take to be read: one
#: timed-out ``recv`` of the listener (0.2 s) and its thread's turn on a busy machine.
RECEIVE_S = 10.0


class StatsdListener:
    """Collects StatsD lines (``name:value|type``) sent to a UDP port on loopback."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            self.lines += data.decode("utf-8", "replace").splitlines()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()

    def gauges(self) -> dict[str, float]:
        out = {}
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            value, _, kind = rest.partition("|")
            if kind.startswith("g"):
                out[name] = float(value)
        return out


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


def test_the_report_task_sends_its_sums_as_statsd_gauges(
        stack_env: dict[str, str], statsd: StatsdListener, clients: Any, make_pipeline: Any,
        pg_dsn: str, tmp_path: Path) -> None:
    pipeline = make_pipeline("telemetry_metrics", chunk_size=500)
    sample = produce_sample(clients, pipeline, count=900, poison=1)
    env = {**stack_env, **dag_env(tmp_path, pg_dsn, pipeline),
           "AIRFLOW__METRICS__STATSD_ON": "True",
           "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
           "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"}
    proc = run_dag(f"{pipeline.name}_ingest", env, log_file=tmp_path / "run.log")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]

    dead = sum(n for k, n in sample["expect"].items()
               if k not in {"row", "duplicate", "tombstone"})
    expected = {"read": sample["produced"], "inserted": sample["expect"]["row"],
                "dead_lettered": dead, "lag_after": 0}
    # Sent before the DAG's process ended; the listener's thread reads them from the socket.
    names = [*(f"airflow.kafka_ingest.ingest.{pipeline.name}.{n}" for n in [*expected, "dlq_rate"]),
             *(f"airflow.kafka_ingest.ingest.{n}" for n in expected)]

    def arrived() -> dict[str, float] | None:
        gauges = statsd.gauges()
        return gauges if all(name in gauges for name in names) else None

    gauges = poll("the report task's gauges to reach the listener", arrived, RECEIVE_S,
                  interval_s=0.1)
    for name, value in expected.items():
        # plain StatsD drops tags: the pipeline is in the name
        assert gauges.get(f"airflow.kafka_ingest.ingest.{pipeline.name}.{name}") == value, name
        # the tagged name (the pipeline is a tag for OpenTelemetry and DogStatsD)
        assert gauges.get(f"airflow.kafka_ingest.ingest.{name}") == value, name
    assert 0 < gauges[f"airflow.kafka_ingest.ingest.{pipeline.name}.dlq_rate"] < 1
