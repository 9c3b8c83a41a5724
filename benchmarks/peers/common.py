"""What the peers share: the telemetry table's columns as they write them, the loader of
the Python peers, the run's shared inputs (:class:`PeerData`), the sample stream
re-encoded to a topic of a peer's own, and fetching a peer's jars with Maven once."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import BASE_PIPELINE, Bench, pipeline_of
from psycopg import sql

from kafka_ingest.contracts import get_contract
from kafka_ingest.kafka.clients import KafkaClients

CONTRACT = ("metric_event", 2)

#: The telemetry table's columns and their types, as the peers write them (their own code,
#: as a user would write it: it does not follow the project's internal row shapes).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("event_id", "text"), ("device_id", "text"), ("timestamp", "timestamptz"),
    ("metric_value", "float8"), ("status", "text"), ("unit", "text"),
    ("source_topic", "text"), ("source_partition", "int4"), ("source_offset", "int8"),
    ("kafka_key", "bytea"), ("kafka_timestamp", "timestamptz"),
)


def insert_sql(table: str) -> sql.Composed:
    names = [name for name, _ in COLUMNS]
    return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (event_id) DO NOTHING").format(
        sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder() * len(names)))


class Loader:
    """What the provider's and the seeds' callables do with one message: size limit and
    contract (else drop it: these peers have no DLQ), then the row with its provenance."""

    def __init__(self, max_bytes: int) -> None:
        from pydantic import ValidationError

        self.parse: Callable[[bytes], Any] = get_contract(*CONTRACT).model_validate_json
        self.invalid = ValidationError
        self.max_bytes = max_bytes
        self.read = self.dropped = 0

    def row(self, msg: Any) -> tuple[Any, ...] | None:
        self.read += 1
        value = msg.value()
        if value is None or len(value) > self.max_bytes:
            self.dropped += 1
            return None
        try:
            event = self.parse(value)
        except self.invalid:
            self.dropped += 1
            return None
        kind, ms = msg.timestamp()
        ts = datetime.fromtimestamp(ms / 1000, tz=UTC) if kind and ms >= 0 else None
        return (event.event_id, event.device_id, datetime.fromtimestamp(event.timestamp, tz=UTC),
                event.metric_value, event.status, event.unit,
                msg.topic(), msg.partition(), msg.offset(), msg.key(), ts)


@dataclass
class PeerData:
    """What the peers share in one run: the jars, the Connect topics, the Spark warm-up
    topic (each only when a row that needs it runs)."""

    seeds_cap: int
    #: Kafka Connect's jars (``connect.fetch_connect_jars``)
    cache: Path = field(default_factory=Path)
    connect_topic: str = ""
    connect_produced: int = 0
    connect_value_mb: float = 0.0
    warm_topic: str = ""
    warm_rows: int = 0
    spark_jars: tuple[str, ...] = ()
    spark_warm_topic: str = ""
    spark_warm_produced: int = 0
    spark_warm_rows: int = 0


def wanted(b: Bench, keys: set[str]) -> bool:
    """Whether this run measures a row of ``keys`` (``--only``, ``--skip``)."""
    keys = keys - set(getattr(b.args, "skip", ()))
    return bool(keys) and (b.args.only is None or bool(keys & set(b.args.only)))


def warm_count(b: Bench) -> int:
    """Events in a warm-up topic: half the sample, at least 1,000, at most 50,000."""
    return max(1000, min(b.args.events // 2, 50_000))


def size_limit(b: Bench) -> int:
    """The pipeline's ``max_message_bytes``: the peers refuse what the project refuses."""
    return pipeline_of((BASE_PIPELINE, b.base_body)).max_message_bytes


def sink_timeout(b: Bench) -> float:
    """How long a JVM peer may take to load the sample (at least 3 minutes)."""
    return max(180.0, b.produced / 500)


def produce_topic(clients: KafkaClients, doc: tuple[str, dict[str, Any]], topic: str,
                  *, count: int, partitions: int, tag: str,
                  value_of: Callable[[Any], bytes | None]) -> dict[str, Any]:
    """The sample ``produce_sample`` wrote (same generator, tag, seed, keys, partitions),
    each value as ``value_of`` makes it (``connect.connect_value``: JsonConverter's envelope);
    returns what to expect."""
    from kafka_ingest.kafka.topics import ensure_topics
    from kafka_ingest_dev.samples import Outgoing, produce_records, sample_stream

    ensure_topics(clients, {topic: partitions})
    expect: dict[str, int] = {}
    size = 0

    def records() -> Iterator[Outgoing]:
        nonlocal size
        for s in sample_stream(pipeline_of(doc), count, 1, tag=tag, partitions=partitions):
            value = value_of(s)
            size += len(value or b"")
            expect[s.expect] = expect.get(s.expect, 0) + 1
            yield s.key, value, s.partition, None

    produce_records(clients.producer(), topic, records())
    return {"produced": sum(expect.values()), "expect": expect, "value_mb": size / 1e6}


def fetch_once(cache: Path, peer: str, fetch: Callable[[str, Path], str]) -> str:
    """``fetch(mvn, cache)`` once per cache (under a lock: concurrent runs wait for one
    fetch); what it returns is kept in a marker file, which also says the fetch finished.
    Returns the marker's text."""
    marker = cache / ".complete"
    if not marker.is_file():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RuntimeError(f"the {peer} peer needs Maven (apt-get install maven)")
        cache.mkdir(parents=True, exist_ok=True)
        with (cache / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.is_file():
                t0 = time.perf_counter()
                text = fetch(mvn, cache)
                marker.write_text(text, encoding="utf-8")
                print(f"fetched the {peer} peer's jars into {cache} in "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
    return marker.read_text(encoding="utf-8")


def run_mvn(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"mvn could not fetch {what}: {tail}")
