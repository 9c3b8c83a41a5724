"""Shared by the fault tests: a stack of their own, databases, topics and pipelines on it,
faults injected at a precise step of a chunk, and timing.

The fault tests never touch the stack the other tests share: each module runs an
independent one (``kafka_ingest_dev.stack`` with its own state dir under /tmp and free
loopback ports), with Toxiproxy in front of Kafka and Postgres (``up(faults=True)``) or
three Kafka nodes (``up(brokers=3)``), and takes it down at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kafka_ingest.config import Pipeline, load_pipelines, parse_pipelines
from kafka_ingest.db import Database
from kafka_ingest.engine.slices import SliceReport
from kafka_ingest.kafka.clients import KafkaClients
from kafka_ingest.kafka.topics import create_pipeline_topics
from kafka_ingest_dev import stack
from kafka_ingest_dev.databases import create_database, drop_database
from kafka_ingest_dev.faults import Toxiproxy
from kafka_ingest_dev.samples import produce_sample
from tests.support.fault_injection import Injector
from tests.support.ingest import Expected, expected_from_sample, run

#: Whether the slow fault tests run too (``-m faults_full`` also turns this on, see
#: tests/chaos/conftest.py).
FULL_ENV = "KAFKA_INGEST_FAULTS_FULL"
#: The markers of slow fault tests: a ``-m`` expression that asks for one runs them.
SLOW_MARKERS = ("faults_full", "soak")


def slow_tests_asked(markexpr: str, environ: Mapping[str, str]) -> bool:
    """Whether the slow fault tests run: :data:`FULL_ENV` set to 1, or a ``-m`` expression
    that names one of :data:`SLOW_MARKERS` other than after ``not`` (``-m soak`` runs the
    soak's test, ``-m "faults and not soak"`` asks for none)."""
    return environ.get(FULL_ENV) == "1" or any(
        re.search(rf"(?<!\bnot )\b{marker}\b", markexpr) for marker in SLOW_MARKERS)


@dataclass
class FaultStack:
    """An independent local stack and what the fault tests need of it."""

    state: Path
    env: dict[str, str]
    faults: bool

    @property
    def direct_env(self) -> dict[str, str]:
        return stack.env()

    @property
    def proxied_env(self) -> dict[str, str]:
        return stack.env(faults=True)

    @property
    def toxiproxy(self) -> Toxiproxy:
        return stack.toxiproxy()

    @property
    def admin_dsn(self) -> str:
        return self.direct_env["KAFKA_INGEST_PG_DSN"]

    def direct_clients(self, **extra: Any) -> KafkaClients:
        return KafkaClients({"bootstrap.servers": self.direct_env["KAFKA_BOOTSTRAP_SERVERS"],
                             **extra})

    def proxied_clients(self, **extra: Any) -> KafkaClients:
        """Clients whose every connection goes through Toxiproxy (``extra``: librdkafka
        settings on top, e.g. shorter time-outs)."""
        config = json.loads(self.proxied_env["KAFKA_INGEST_KAFKA_CONFIG"])
        return KafkaClients({**config, **extra})

    def new_database(self) -> tuple[str, str]:
        """A fresh migrated database: (direct DSN, DSN through the Postgres proxy)."""
        direct = create_database(self.admin_dsn, prefix="f")
        name = conninfo_to_dict(direct)["dbname"]
        proxied = (make_conninfo(self.proxied_env["KAFKA_INGEST_PG_DSN"], dbname=name)
                   if self.faults else direct)
        return direct, proxied

    def drop_database(self, dsn: str) -> None:
        drop_database(self.admin_dsn, dsn)

    def pipeline(self, base: str = "telemetry_metrics", *, partitions: int = 3,
                 **overrides: Any) -> Pipeline:
        """A shipped pipeline on fresh topics, created as ``kafka-ingest topics create``
        does (the pipeline's partitions, replication factor and topic settings)."""
        body = load_pipelines()[base].model_dump(mode="json", exclude={"name"})
        tag = uuid.uuid4().hex[:10]
        body.update(topic=f"src-{tag}", dlq_topic=f"dlq-{tag}", partitions=partitions)
        body.update(overrides)
        pipeline = parse_pipelines({"pipelines": {base: body}})[base]
        create_pipeline_topics(self.direct_clients(), [pipeline])
        return pipeline

    def produce(self, pipeline: Pipeline, *, count: int, poison: int = 1) -> Expected:
        sample = produce_sample(self.direct_clients(), pipeline, count=count, poison=poison,
                                partitions=pipeline.partitions)
        return expected_from_sample(pipeline, sample, count=count, poison=poison,
                                    partitions=pipeline.partitions)


@contextlib.contextmanager
def independent_stack(*, brokers: int = 1, faults: bool = False) -> Iterator[FaultStack]:
    """A stack of its own from nothing (jar and Toxiproxy caches stay warm), on free ports
    and a fresh state dir directly under /tmp (as root the ``postgres`` user must traverse
    every parent), taken down and removed afterwards."""
    state = Path(tempfile.mkdtemp(prefix="kafka-ingest-faults-"))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in stack.isolated_env(state, brokers=brokers).items():
            mp.setenv(name, value)
        try:
            started = time.monotonic()
            env = stack.up(report=print, brokers=brokers, faults=faults)
            print(f"independent stack ({brokers} broker(s), faults={faults}) up in "
                  f"{time.monotonic() - started:.1f} s")
            yield FaultStack(state, env, faults)
        finally:
            try:
                stack.down(report=print)
            finally:
                shutil.rmtree(state, ignore_errors=True)


def write_pipelines(path: Path, *pipelines: Pipeline) -> Path:
    doc = {"pipelines": {p.name: p.model_dump(mode="json", exclude={"name"}) for p in pipelines}}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- running


@dataclass
class Outcome:
    """One run: its slice reports or the error it ended with, and how long it took."""

    reports: list[SliceReport]
    error: BaseException | None
    seconds: float
    #: seconds from the fault's injection to the end of the run
    after_fault: float | None = None


def timed_run(pipeline: Pipeline, clients: KafkaClients, db: Database, *, run_id: str,
              injector: Injector | None = None) -> Outcome:
    """Plan and run like ``kafka-ingest run`` (the DAG's path); an error ends the run as it
    ends a task."""
    started = time.monotonic()
    reports: list[SliceReport] = []
    error: BaseException | None = None
    try:
        reports = run(pipeline, clients, db, run_id=run_id)
    except Exception as exc:
        error = exc
    ended = time.monotonic()
    fired = injector.fired_at if injector is not None else None
    return Outcome(reports, error, ended - started, None if fired is None else ended - fired)


def log_timing(name: str, **figures: Any) -> None:
    """One line per measured fault, collected in docs/faults.md by hand (``-s`` shows it)."""
    shown = ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in figures.items())
    print(f"\nFAULT-TIMING {name}: {shown}")


def full_set() -> bool:
    return os.environ.get(FULL_ENV) == "1"
